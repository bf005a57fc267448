"""How many seconds of GPU to ask for: ONE reservation function (:func:`reservation`) for every
GPU call of the app (a photo task, "All tasks", a video clip), and its constants.

A fresh ZeroGPU worker initialises CUDA and moves every model resident in the server process to
the GPU before the call's work starts, and both are billed to the call; the work (forwards,
detector, resizes on the device) comes from each task's declaration (``Task.gpu_seconds``), which
counts FLOPs at :data:`SUSTAINED_TFLOPS`. Each constant below says what ``bench/gpu.py`` measured
on an H100 (2026-11-24, torch 2.11) and what is still an estimate: ZeroGPU's own worker start
and disk read cannot be measured outside ZeroGPU, so those keep a margin (keep the names: the
bench reads them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ..models.zoo import ARCHS
from ..tasks import registry
from ..zerogpu.entry import DAILY_QUOTA_S, duration_factor

#: Seconds a fresh worker spends starting CUDA before the first tensor moves. MEASURED: 0.26 s
#: for a context and a first matrix product in a fresh process on an H100 (import torch not
#: counted: ZeroGPU forks a process that has it). ESTIMATE: the rest of the 3 s covers ZeroGPU's
#: worker fork and the first kernels' lazy loading, which only ZeroGPU itself can show.
CUDA_INIT_S = 3.0
#: Bytes per second a fresh worker moves to the GPU. MEASURED: a pinned host -> GPU copy runs at
#: 54 GB/s on an H100, so PCIe is not the bound. ESTIMATE: ZeroGPU reads the packed weights from
#: local disk/page cache first; that read bounds it, taken at a conservative NVMe-class 1.5 GB/s.
MOVE_BYTES_PER_S = 1.5e9
#: Sustained rate of a Sapiens2 forward on a ZeroGPU slice, in the spec's FLOP figures
#: (zoo.ARCHS, about half the FLOPs counted at 2 per multiply-add). MEASURED: 126.8 for
#: back-to-back 1b forwards at 1024x768, batch 1, on a whole H100 (132 SMs); a ZeroGPU call gets
#: half a GPU (an H200 MIG 3g slice has 60 SMs: 126.8 x 60 / 132 = 57.6). 50 keeps ~15 % margin.
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
