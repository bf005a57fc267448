"""The units of device work: what one GPU call (one ZeroGPU admission) runs, as typed values.

:class:`OneTask` (a photo, or two compared photos: one task's batch), :class:`AllTasks` ("Run all
tasks": every task's batch, each task's raws streamed as soon as its forward is done) and
:class:`Clip` (a clip's device work only: its forwards and detections, batch by batch, raws
streamed out; the server decodes, renders and encodes). Each is a frozen,
picklable dataclass (a task pickles by its name; a GPU worker is a fork of the server and holds
the same declarations) carrying the seconds its call reserves, and runs where the models are
with :meth:`run`: it never loads (a missing model is a ResidencyError), and package errors are
plain exceptions here (the GPU entry carries them across ZeroGPU's worker boundary intact).

A server runs a unit through its :data:`Device`: off ZeroGPU ``unit.run(manager)`` itself; on the
Space the app's one GPU entry (``sapiens2.ui.gpu``).
"""

from __future__ import annotations

import multiprocessing
import queue
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any

from ..errors import OptionError, Sapiens2Error
from ..tasks.registry import Task
from ..video.clip_steps import budget_stop
from ..zerogpu.loadguard import loading_forbidden
from .cache import ModelManager
from .memory_errors import out_of_memory, trim_after_out_of_memory


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
                if isinstance(err, Sapiens2Error) or not trim_after_out_of_memory(manager, err):
                    raise
                raise out_of_memory(self.task.spec, self.size) from err


@dataclass(frozen=True)
class OneTask:
    """A call running one job, yielding its outputs once: a task's batch (a photo, two compared
    photos, a live frame) or a :class:`Detect` (a live view's detection frame)."""

    batch: Job
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
class Detect:
    """A task's person detection on whole frames (pose's video hook: ``Task.video.detect``): a
    clip's detection frames inside its call, a live view's in a :class:`OneTask`."""

    task: Task
    size: str
    rgbs: tuple[Any, ...]
    options: Mapping[str, Any]

    def infer(self, manager: ModelManager) -> list[Any]:
        hook = self.task.video.detect if self.task.video else None
        if hook is None:  # said before residency: the request is wrong whatever is loaded
            raise OptionError(f"The {self.task.api_name} task has no person detection.")
        with loading_forbidden():
            find = hook(manager.get(self.task, self.size, load=False), self.options)
            return [find(rgb) for rgb in self.rgbs]


Job = Batch | Detect


@dataclass(frozen=True)
class Stopped:
    """What a clip's call yields instead of a job's outputs when its reservation is about to run
    out; the call then ends."""

    reason: str


#: What a clip's call yields first, once it runs where the models are (its feed is then live).
READY = "ready"


class Feed:
    """The requests a server sends into a clip's running call: a queue in this process (the
    call runs here, lazily), a pipe once the unit was pickled to a ZeroGPU worker (the pipe's
    reading end crosses the pickle; :func:`multiprocessing.reduction` hands its descriptor over).

    The call yields :data:`READY` before its first read, so by then the server knows which."""

    def __init__(self) -> None:
        self._local: queue.Queue[Any] = queue.Queue()
        self._reader: Any = None  # the pipe, made only when the unit crosses to another process
        self._writer: Any = None  # set once the unit is pickled: from then on the server writes to it

    def __getstate__(self) -> dict[str, Any]:
        if self._writer is None:
            self._reader, self._writer = multiprocessing.Pipe(duplex=False)
        return {"reader": bytes(ForkingPickler.dumps(self._reader))}  # its descriptor, shared

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._reader, self._writer, self._local = ForkingPickler.loads(state["reader"]), None, None

    def put(self, jobs: tuple[Job, ...] | None) -> None:
        """Send jobs to the call (None: no more; the call ends)."""
        if self._writer is not None:  # the unit was pickled: the call runs in another process
            self._writer.send(jobs)
        else:
            self._local.put(jobs)

    def get(self, timeout_s: float) -> tuple[Job, ...] | None:
        """The next jobs in the call; None when the server is done or silent for ``timeout_s``."""
        if self._local is None:  # this copy is the call's, in the worker (it came through a pickle)
            return self._reader.recv() if self._reader.poll(timeout_s) else None
        try:
            return self._local.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def close(self) -> None:
        for end in (self._reader, self._writer):
            if end is not None:
                end.close()


@dataclass(frozen=True)
class Clip:
    """A call serving a clip's device work and nothing else: the server decodes, prepares,
    tracks, finishes, renders and encodes (``sapiens2.serving.video``); the call runs the jobs
    it is given -- ``first`` (every batch known before the call: the frames' forwards of a task
    without per-frame options) and then what the server sends through ``feed`` (pose's
    detections and forwards, batch by batch, since its boxes follow the keypoints) -- and
    yields each job's outputs (the raws), in order. A :class:`Stopped` instead when the next job
    would pass ``budget_s`` seconds of work (the reservation's share)."""

    tasks: tuple[str, ...]  # the tasks it serves (what the call is named by)
    first: tuple[Job, ...]
    feed: Feed
    budget_s: float | None
    seconds: int
    #: seconds the call waits for the server's next jobs before it ends on its own
    idle_s: float = 120.0

    @property
    def what(self) -> str:
        return " + ".join(self.tasks)

    def run(self, manager: ModelManager) -> Iterator[Any]:
        yield READY
        t0, last = time.perf_counter(), 0.0
        jobs: tuple[Job, ...] | None = self.first
        while jobs is not None:
            for job in jobs:
                now = time.perf_counter()
                if last and (reason := budget_stop(self.budget_s, now - t0, last)):
                    yield Stopped(reason)
                    return
                out = job.infer(manager)
                last = time.perf_counter() - now
                yield out
            jobs = self.feed.get(self.idle_s)


Unit = OneTask | AllTasks | Clip
#: Runs a unit where the models are and streams what it yields (one GPU admission per unit).
Device = Callable[[Unit], Iterator[Any]]


def local_device(manager: ModelManager) -> Device:
    """Units run in this process, on the manager's device (a CPU, a local GPU)."""
    return lambda unit: unit.run(manager)


__all__ = [
    "READY", "AllTasks", "Batch", "Clip", "Detect", "Device", "Feed", "Job", "OneTask", "Stopped", "Unit",
    "local_device",
]  # fmt: skip
