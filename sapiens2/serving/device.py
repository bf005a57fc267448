"""The units of device work: what one GPU call (one ZeroGPU admission) runs, as typed values.

:class:`OneTask` (a photo, or two compared photos: one task's batch), :class:`AllTasks` ("Run all
tasks": every task's batch, each task's raws streamed as soon as its forward is done) and
:class:`Clip` (a whole video clip: progress per batch, then the result) and :class:`Detect` (the
people in a live view's frame, by the task's detection hook). Each is a frozen,
picklable dataclass (a task pickles by its name; a GPU worker is a fork of the server and holds
the same declarations) carrying the seconds its call reserves, and runs where the models are
with :meth:`run`: it never loads (a missing model is a ResidencyError), and package errors are
plain exceptions here (the GPU entry carries them across ZeroGPU's worker boundary intact).

A server runs a unit through its :data:`Device`: off ZeroGPU ``unit.run(manager)`` itself; on the
Space the app's one GPU entry (``sapiens2.ui.gpu``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import OptionError, Sapiens2Error
from ..tasks.registry import Task
from ..video.handlers import FrameHandler, TrackingOptions
from ..video.reader import VideoLimits
from ..video.runner import iter_video
from ..zerogpu.loadguard import loading_forbidden
from .cache import ModelManager
from .memory import is_out_of_memory, out_of_memory


@dataclass(frozen=True)
class Batch:
    """One task's forward over prepared inputs: ``pipeline.infer(preps, **options)``."""

    task: Task
    size: str
    preps: tuple[Any, ...]
    options: Mapping[str, Any]

    def infer(self, manager: ModelManager) -> list[Any]:
        """The raws, with the models already resident. An out-of-memory error trims the cache and
        becomes OutOfMemoryError with advice."""
        with loading_forbidden():
            pipe = manager.get(self.task, self.size, load=False)
            try:
                return list(pipe.infer(list(self.preps), **self.options))
            except Exception as err:
                if isinstance(err, Sapiens2Error) or not is_out_of_memory(err):
                    raise
                manager.trim()
                raise out_of_memory(self.task.spec, self.size) from err


@dataclass(frozen=True)
class OneTask:
    """A call running one task's batch; yields its raws once."""

    batch: Batch
    seconds: int  # the call's reservation (``sapiens2.models.cost.reservation``)

    @property
    def what(self) -> str:
        return self.batch.task.name

    def run(self, manager: ModelManager) -> Iterator[list[Any]]:
        yield self.batch.infer(manager)


@dataclass(frozen=True)
class AllTasks:
    """A call running every task's batch; yields (index, raws or the task's error object) as each
    is done, so a task that fails leaves the others running."""

    batches: tuple[Batch, ...]
    seconds: int

    @property
    def what(self) -> str:
        return "all tasks"

    def run(self, manager: ModelManager) -> Iterator[tuple[int, Any]]:
        for i, batch in enumerate(self.batches):
            try:
                yield i, batch.infer(manager)
            except Sapiens2Error as err:
                yield i, err


@dataclass(frozen=True)
class Clip:
    """A call running a whole clip through a task (decode, person detection and tracking, the
    batch forwards, rendering, writing into ``out_dir``); yields (frames done, planned) per
    batch, then the :class:`~sapiens2.video.runner.VideoResult`."""

    task: Task
    size: str
    options: Mapping[str, Any]
    clip: str
    out_dir: str
    stride: int
    limits: VideoLimits
    batch: int  # frames per forward
    render_options: Mapping[str, Any]
    tracking: TrackingOptions
    budget_s: float | None  # stop before this many seconds of work (the reservation's share)
    take: int | None  # only the first frames (a plan cut to the quota)
    seconds: int
    #: a frame handler instead of the declaration's (motion's pointmap pass keeps more per frame)
    handler: FrameHandler | None = None

    @property
    def what(self) -> str:
        return self.task.name

    def run(self, manager: ModelManager) -> Iterator[Any]:
        with loading_forbidden():
            pipe = manager.get(self.task, self.size, load=False)
            yield from iter_video(
                pipe, self.clip, self.out_dir, task=self.task, options=self.options, stride=self.stride,
                limits=self.limits, batch_size=self.batch, render_options=self.render_options,
                tracking=self.tracking, source_video=True, budget_s=self.budget_s, take=self.take,
                handler=self.handler,
            )  # fmt: skip


@dataclass(frozen=True)
class Detect:
    """A call finding the people in frames with the task's detection hook (``Task.video.detect``:
    pose's person detector at its options); yields one list, a result per frame. A live view's
    detection frames (``sapiens2.serving.live``); a clip detects inside its own call."""

    task: Task
    size: str
    frames: tuple[Any, ...]  # (H, W, 3) uint8 RGB each
    options: Mapping[str, Any]
    seconds: int

    @property
    def what(self) -> str:
        return f"{self.task.name} detection"

    def run(self, manager: ModelManager) -> Iterator[list[Any]]:
        video = self.task.video
        if video is None or video.detect is None:
            raise OptionError(f"The {self.task.name} task has no person detection.")
        with loading_forbidden():
            find = video.detect(manager.get(self.task, self.size, load=False), self.options)
            yield [find(frame) for frame in self.frames]


Unit = OneTask | AllTasks | Clip | Detect
#: Runs a unit where the models are and streams what it yields (one GPU admission per unit).
Device = Callable[[Unit], Iterator[Any]]


def local_device(manager: ModelManager) -> Device:
    """Units run in this process, on the manager's device (a CPU, a local GPU)."""
    return lambda unit: unit.run(manager)


__all__ = ["AllTasks", "Batch", "Clip", "Detect", "Device", "OneTask", "Unit", "local_device"]
