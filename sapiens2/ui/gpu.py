"""The app's one GPU entry: the device work of any task, for any number of photos, tasks or frames.

``sapiens2.zerogpu.entry.GpuEntry`` runs it through ``spaces.GPU`` on ZeroGPU as a generator, in a
worker that holds the server's current models (the model cache reports every change), with the
reservation of ``serving.gpu_time.reservation`` passed as its last argument; elsewhere it is a
plain call. One call is one GPU admission, whatever it streams back:

- ``"infer"`` / ``"detect"``: one task's batch forward (or a video batch's person boxes);
- ``"many"``: "All tasks", each task's raws yielded as soon as its forward is done;
- ``"video"``: a whole clip, its progress yielded per batch, then the result.

The worker gets the model cache by id (it is not picklable; a forked worker has its own copy) and
returns small values; package errors reach the server as the same exception objects, and a
refusal by ZeroGPU (quota) as ``GpuUnavailableError``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..serving import DeviceCall, ModelManager
from ..serving.runner import DeviceMany, many_on_device
from ..serving.video import DeviceVideo, VideoDeviceCall, run_step, video_on_device
from ..zerogpu.entry import GpuEntry

_MANAGERS: dict[int, ModelManager] = {}


def _on_device(
    manager_id: int,
    task: str,
    size: str,
    items: Any,
    opts: dict[str, Any],
    step: str,
    seconds: int,
) -> Iterator[Any]:
    manager = _MANAGERS[manager_id]
    if step == "many":
        yield from many_on_device(manager, items)
    elif step == "video":
        yield from video_on_device(manager, task, size, items, opts, seconds)
    else:
        yield run_step(manager, task, size, items, opts, step)


def _seconds(*args: Any) -> int:
    """ZeroGPU's duration function: the reservation, passed as the entry's last argument."""
    return args[-1]


run_on_gpu: GpuEntry[Any] = GpuEntry(_on_device, duration=_seconds, generator=True)


def _register(manager: ModelManager) -> int:
    _MANAGERS[id(manager)] = manager
    return id(manager)


def device_call(manager: ModelManager) -> DeviceCall | VideoDeviceCall:
    """A ``device_call`` (one task, one admission) for :class:`~sapiens2.serving.RequestRunner`
    and :class:`~sapiens2.serving.video.VideoRequests` that goes through the GPU entry."""
    key = _register(manager)

    def call(
        task: str, size: str, items: list[Any], opts: dict[str, Any], seconds: int, step: str = "infer"
    ) -> Any:
        [value] = list(run_on_gpu(key, task, size, items, opts, step, seconds))
        return value

    return call


def device_many(manager: ModelManager) -> DeviceMany:
    """``(jobs, seconds) -> iterator of (index, raws or error)``: every task in one admission."""
    key = _register(manager)

    def call(jobs: list[tuple[str, str, list[Any], dict[str, Any]]], seconds: int) -> Iterator[Any]:
        return iter(run_on_gpu(key, "", "", jobs, {}, "many", seconds))

    return call


def device_video(manager: ModelManager) -> DeviceVideo:
    """``(task, size, spec, opts, seconds) -> iterator of progress, then the result``: a clip in
    one admission."""
    key = _register(manager)

    def call(task: str, size: str, spec: dict[str, Any], opts: dict[str, Any], seconds: int) -> Iterator[Any]:
        return iter(run_on_gpu(key, task, size, spec, opts, "video", seconds))

    return call
