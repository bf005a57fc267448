"""The app's one GPU entry: the device work of any task, for any number of photos.

On ZeroGPU, ``spaces.GPU`` runs it in a worker process that holds a GPU for the requested
duration (the request's own estimate, see ``sapiens2.serving.gpu_time``); elsewhere the decorator
does nothing and this is a plain call. The worker gets the model cache by id (it is not picklable;
a forked worker has its own copy), and returns small raws or a package error as a value.
"""

from __future__ import annotations

from typing import Any

import spaces

from ..serving import DeviceCall, ModelManager, run_on_device

_MANAGERS: dict[int, ModelManager] = {}


def _duration(
    manager_id: int, task: str, size: str, preps: list[Any], opts: dict[str, Any], seconds: int
) -> int:
    return seconds


@spaces.GPU(duration=_duration)
def run_on_gpu(
    manager_id: int, task: str, size: str, preps: list[Any], opts: dict[str, Any], seconds: int
) -> Any:
    return run_on_device(_MANAGERS[manager_id], task, size, preps, opts)


def device_call(manager: ModelManager) -> DeviceCall:
    """A ``device_call`` for :class:`~sapiens2.serving.RequestRunner` that goes through the GPU entry."""
    _MANAGERS[id(manager)] = manager

    def call(task: str, size: str, preps: list[Any], opts: dict[str, Any], seconds: int) -> Any:
        return run_on_gpu(id(manager), task, size, preps, opts, seconds)

    return call
