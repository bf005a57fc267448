"""The app's one GPU entry: the device work of any task, for any number of photos or frames.

``sapiens2.zerogpu.GpuEntry`` runs it through ``spaces.GPU`` on ZeroGPU, in a worker that holds
the server's current models (the model cache reports every change), and reserves the request's
own estimate (``RequestRunner.seconds``; a video batch: ``VideoRequests.call_seconds``);
elsewhere it is a plain call. The worker gets the model cache by id (it is not picklable; a
forked worker has its own copy) and returns small raws; package errors reach the server as the
same exception objects. ``step`` is ``"infer"`` (the pipeline's batch forward) or ``"detect"``
(person boxes for a video batch's detection frames).
"""

from __future__ import annotations

from typing import Any

from ..serving import DeviceCall, ModelManager
from ..serving.video import VideoDeviceCall, run_step
from ..zerogpu import GpuEntry

_MANAGERS: dict[int, ModelManager] = {}


def _on_device(
    manager_id: int,
    task: str,
    size: str,
    items: list[Any],
    opts: dict[str, Any],
    step: str,
    seconds: int,
) -> Any:
    return run_step(_MANAGERS[manager_id], task, size, items, opts, step)


def _seconds(*args: Any) -> int:
    """ZeroGPU's duration function: the reservation, passed as the entry's last argument."""
    return args[-1]


run_on_gpu: GpuEntry[Any] = GpuEntry(_on_device, duration=_seconds)


def device_call(manager: ModelManager) -> DeviceCall | VideoDeviceCall:
    """A ``device_call`` for :class:`~sapiens2.serving.RequestRunner` and
    :class:`~sapiens2.serving.video.VideoRequests` that goes through the GPU entry."""
    _MANAGERS[id(manager)] = manager

    def call(
        task: str, size: str, items: list[Any], opts: dict[str, Any], seconds: int, step: str = "infer"
    ) -> Any:
        return run_on_gpu(id(manager), task, size, items, opts, step, seconds)

    return call
