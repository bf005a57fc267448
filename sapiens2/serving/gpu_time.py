"""How many seconds of GPU to ask for: a worker's start-up plus the task's own work estimate.

A fresh ZeroGPU worker initialises CUDA and moves every model resident in the server process to
the GPU before the task starts, and both are billed to the call; the task's work (forwards,
detector, resizes on the device) comes from its declaration (``Task.gpu_seconds``). None of the
constants below has been measured on a GPU yet (none was lent to this project): they are
deliberately generous, and ``bench/README.md`` lists the measurement still to do.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..tasks import registry
from ..zerogpu import DAILY_QUOTA_S, duration_factor
from ..zoo import ARCHS

#: CUDA context and library start in a fresh worker (seconds).
CUDA_INIT_S = 3.0
#: Bytes per second moved to the GPU at a worker's start (ZeroGPU reads packed weights from disk).
MOVE_BYTES_PER_S = 1.5e9
#: Never ask for less than a worker's bare start. Never ask for more than a visitor without an
#: account can start on the slowest node: ZeroGPU charges the request times the node's factor
#: (120 s of quota / 1.5 = 80 s); a larger request would be refused before it runs.
MIN_CALL_S = 5
MAX_CALL_S = int(DAILY_QUOTA_S["anonymous"] // duration_factor())


def work_seconds(task: str, size: str, pixels: Iterable[int], infer_opts: dict[str, Any]) -> float:
    """Seconds of GPU work for one call on images of these pixel counts (start-up excluded)."""
    decl = registry.get(task)
    return sum(decl.gpu_seconds(size, int(p), infer_opts) for p in pixels)


def start_seconds(resident_bytes: int) -> float:
    """A fresh worker's start: CUDA, then moving ``resident_bytes`` of weights to the GPU."""
    return CUDA_INIT_S + resident_bytes / MOVE_BYTES_PER_S


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
    return int(min(MAX_CALL_S, max(MIN_CALL_S, -(-seconds // 1))))


def gpu_seconds(
    task: str,
    size: str | None,
    pixels: int = 0,
    images: int = 1,
    resident_bytes: int | None = None,
    **opts: Any,
) -> int:
    """The duration to request for ``images`` photos of ``pixels`` each: start-up (for
    ``resident_bytes`` of resident weights; default: the request's own models) plus work."""
    size = size or registry.get(task).spec.default_size(True)
    resident = weight_bytes(task, size, opts) if resident_bytes is None else resident_bytes
    return clamp(start_seconds(resident) + work_seconds(task, size, [pixels] * images, opts))
