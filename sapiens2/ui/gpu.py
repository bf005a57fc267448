"""The app's one GPU entry: the device work of any task, for any number of photos.

``sapiens2.zerogpu.GpuEntry`` runs it through ``spaces.GPU`` on ZeroGPU, in a worker that holds
the server's current models (the model cache reports every change), and reserves the request's
own estimate (``RequestRunner.seconds``); elsewhere it is a plain call. The worker gets the model
cache by id (it is not picklable; a forked worker has its own copy) and returns small raws;
package errors reach the server as the same exception objects.
"""

from __future__ import annotations

from typing import Any

from ..serving import DeviceCall, ModelManager, run_on_device
from ..zerogpu import GpuEntry

_MANAGERS: dict[int, ModelManager] = {}


def _on_device(
    manager_id: int, task: str, size: str, preps: list[Any], opts: dict[str, Any], seconds: int
) -> Any:
    return run_on_device(_MANAGERS[manager_id], task, size, preps, opts)


def _seconds(
    manager_id: int, task: str, size: str, preps: list[Any], opts: dict[str, Any], seconds: int
) -> int:
    return seconds


run_on_gpu: GpuEntry[Any] = GpuEntry(_on_device, duration=_seconds)


def device_call(manager: ModelManager) -> DeviceCall:
    """A ``device_call`` for :class:`~sapiens2.serving.RequestRunner` that goes through the GPU entry."""
    _MANAGERS[id(manager)] = manager

    def call(task: str, size: str, preps: list[Any], opts: dict[str, Any], seconds: int) -> Any:
        return run_on_gpu(id(manager), task, size, preps, opts, seconds)

    return call
