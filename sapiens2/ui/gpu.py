"""The app's one GPU entry: any unit of device work (``sapiens2.serving.device``: a task's batch,
"All tasks", a clip) runs through one ``spaces.GPU`` function, in a worker that holds the server's
current models (``sapiens2.zerogpu.entry.GpuEntry``), reserving the unit's own seconds; off
ZeroGPU it is a plain call. One call is one GPU admission, whatever the unit streams back.

The worker finds the model cache by its key (the cache is not picklable; a forked worker has its
own copy of it); units and their values cross the boundary pickled.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..serving import ModelManager
from ..serving.device import Device, Unit
from ..zerogpu.entry import GpuEntry

_CACHES: dict[int, ModelManager] = {}


def _run(cache: int, unit: Unit) -> Iterator[Any]:
    yield from unit.run(_CACHES[cache])


run_on_gpu: GpuEntry[Any] = GpuEntry(_run, duration=lambda cache, unit: unit.seconds, generator=True)


def gpu_device(manager: ModelManager) -> Device:
    """A :data:`~sapiens2.serving.device.Device` that runs each unit through the GPU entry."""
    _CACHES[id(manager)] = manager
    return lambda unit: iter(run_on_gpu(id(manager), unit))
