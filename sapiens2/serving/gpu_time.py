"""How many seconds of GPU to ask for: ONE reservation function (:func:`reservation`) for every
GPU call of the app (a photo task, "All tasks", a video clip), and its constants.

A fresh ZeroGPU worker initialises CUDA and moves every model resident in the server process to
the GPU before the call's work starts, and both are billed to the call; the work (forwards,
detector, resizes on the device) comes from each task's declaration (``Task.gpu_seconds``), which
counts FLOPs at :data:`SUSTAINED_TFLOPS`. None of the three constants below has been measured on
a GPU yet (none was lent to this project): each is an estimate with its basis, deliberately
generous, and ``bench/gpu.py`` compares them with measurements (keep their names).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ..tasks import registry
from ..zerogpu import DAILY_QUOTA_S, duration_factor
from ..zoo import ARCHS

#: ESTIMATE (not measured): seconds a fresh worker spends starting CUDA and its libraries (cuBLAS,
#: cuDNN handles) before the first tensor moves. Basis: a CUDA context takes 1-2 s on current
#: drivers; 3 s leaves room for the first kernels' lazy loading.
CUDA_INIT_S = 3.0
#: ESTIMATE (not measured): bytes per second a fresh worker moves to the GPU. Basis: ZeroGPU reads
#: the packed weights from local disk/page cache into pinned memory, then over PCIe (25+ GB/s);
#: the disk read bounds it, taken at a conservative NVMe-class 1.5 GB/s.
MOVE_BYTES_PER_S = 1.5e9
#: ESTIMATE (not measured): bf16 TFLOP/s a Sapiens2 forward sustains on a ZeroGPU slice. Basis:
#: the RTX PRO 6000's dense bf16 peak is several hundred TFLOP/s; ViT forwards at batch 1-16
#: reach a fraction of it, and 50 keeps the work estimates on the safe side.
SUSTAINED_TFLOPS = 50.0
#: Never ask for less than a worker's bare start. Never ask for more than a visitor without an
#: account can start on the slowest node: ZeroGPU charges the request times the node's factor
#: (120 s of quota / 1.5 = 80 s); a larger request would be refused before it runs.
MIN_CALL_S = 5
MAX_CALL_S = int(DAILY_QUOTA_S["anonymous"] // duration_factor())


def start_seconds(resident_bytes: int) -> float:
    """A fresh worker's start: CUDA, then moving ``resident_bytes`` of weights to the GPU."""
    return CUDA_INIT_S + resident_bytes / MOVE_BYTES_PER_S


def reservation(work_s: float, resident_bytes: int) -> int:
    """THE reservation of one GPU call: a fresh worker's start with ``resident_bytes`` resident,
    plus ``work_s`` seconds of device work; whole seconds, rounded up, within
    [MIN_CALL_S, MAX_CALL_S]. Every GPU call of the app asks for this (ZeroGPU then multiplies
    it by its node's duration factor when it checks the visitor's quota)."""
    return clamp(start_seconds(resident_bytes) + max(0.0, float(work_s)))


def work_seconds(task: str, size: str, pixels: Iterable[int], infer_opts: dict[str, Any]) -> float:
    """Seconds of GPU work for one call on images of these pixel counts (start-up excluded)."""
    decl = registry.get(task)
    return sum(decl.gpu_seconds(size, int(p), infer_opts) for p in pixels)


def weight_bytes(task: str, size: str, infer_opts: dict[str, Any]) -> int:
    """bf16 weight bytes a request uses: its model and the models it borrows (published sizes)."""
    total = 0.0
    for name in (task, *registry.get(task).needs(infer_opts)):
        spec = registry.get(name).spec
        arch = ARCHS.get(size if size in spec.sizes else spec.default_size(True))
        total += 2e9 * arch.params_b if arch else 0.0
    return int(total)


def clamp(seconds: float) -> int:
    """Whole seconds, rounded up, within [MIN_CALL_S, MAX_CALL_S]."""
    return int(min(MAX_CALL_S, max(MIN_CALL_S, math.ceil(seconds))))
