"""A clip's one GPU call, seen from the server: the device steps of one or more clip runs.

The server decodes, prepares, tracks, finishes, renders and encodes
(:class:`sapiens2.video.clip_runner.ClipRun`); only the forwards and pose's detections go to the
call (:class:`sapiens2.serving.device.Clip`). :class:`ClipCall` opens that call on the first
device step, with every batch already known (a task without per-frame options) as its first
jobs, so those run back to back at the device's pace while their raws stream out; pose sends
its detections and forwards batch by batch through the call's feed, since its boxes follow the
keypoints of the batch before. Several runs share one call (motion: pose, then the pointmap):
one admission. :meth:`ClipCall.close` ends the call (always: a call left waiting for jobs would
hold the GPU until its reservation ran out).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ..tasks.registry import Task
from ..video.clip_steps import ClipStopped
from .device import READY, Batch, Clip, Detect, Device, Feed, Job, Stopped


class ClipCall:
    """One GPU call (one admission) for a clip's device work; :meth:`steps` gives each task's
    :class:`~sapiens2.video.clip_steps.Steps`."""

    def __init__(self, device: Device, tasks: tuple[str, ...], seconds: int, budget_s: float | None) -> None:
        self.device, self.tasks, self.seconds, self.budget_s = device, tasks, seconds, budget_s
        self._feed: Feed | None = None
        self._stream: Iterator[Any] | None = None
        self._ended = False  # the call was told that no more jobs come
        self.stopped = False  # the call stopped on its own (its reservation)
        self.jobs = 0  # jobs run in the call (forwards and detections)

    def steps(self, task: Task, size: str) -> TaskSteps:
        return TaskSteps(self, task, size)

    @property
    def open(self) -> bool:
        """Whether the call runs and takes more jobs (not ended, not stopped)."""
        return self._stream is not None and not self._ended and not self.stopped

    def ask(self, jobs: tuple[Job, ...], last: bool = False) -> Iterator[Any]:
        """Send ``jobs`` now (the call opens with them when it is not open yet; ``last``: no
        more after them, so the call ends once they are done); returns their outputs, in order,
        as they come."""
        if self._stream is None:
            self._feed = Feed()
            unit = Clip(self.tasks, jobs, self._feed, self.budget_s, self.seconds)
            self._stream = iter(self.device(unit))
            if next(self._stream, None) != READY:
                raise RuntimeError("The clip's GPU call did not start.")
        else:
            assert self._feed is not None and not self._ended
            self._feed.put(jobs)
        if last:
            self._end()
        return self._outputs(self._stream, len(jobs))

    def _outputs(self, stream: Iterator[Any], n: int) -> Iterator[Any]:
        for _ in range(n):
            out = next(stream, None)
            if isinstance(out, Stopped):
                self.stopped = True
                raise ClipStopped(out.reason)
            if out is None:
                raise RuntimeError("The clip's GPU call ended before its work was done.")
            self.jobs += 1
            yield out

    def _end(self) -> None:
        if not self._ended:
            self._ended = True
            assert self._feed is not None
            self._feed.put(None)

    def close(self) -> None:
        """End the call if it is still open (what it still yields is drained)."""
        if self._stream is None:
            return
        stream, feed = self._stream, self._feed
        self._stream = None
        assert feed is not None
        try:
            self._end()
            for _ in stream:
                pass
        finally:
            feed.close()

    def __enter__(self) -> ClipCall:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TaskSteps:
    """One task's device steps in a :class:`ClipCall` (``sapiens2.video.clip_steps.Steps``), and
    its detections (``detect_many``, the pose handler's batch hook)."""

    def __init__(self, call: ClipCall, task: Task, size: str) -> None:
        self.call, self.task, self.size = call, task, size
        self._raws: Iterator[Any] | None = None
        self.detect_options: Mapping[str, Any] = {}

    def stream(
        self, batches: list[list[Any]], options: Mapping[str, Any], last: bool = False
    ) -> Iterator[list[Any]]:
        jobs = tuple(Batch(self.task, self.size, tuple(b), dict(options)) for b in batches)
        return (list(raws) for raws in self.call.ask(jobs, last))

    def send(self, preps: list[Any], options: Mapping[str, Any], last: bool = False) -> None:
        self._raws = self.call.ask((Batch(self.task, self.size, tuple(preps), dict(options)),), last)

    def receive(self) -> list[Any]:
        assert self._raws is not None
        [raws] = list(self._raws)
        return list(raws)

    def detect_many(self, rgbs: list[Any]) -> list[Any]:
        [found] = list(self.call.ask((Detect(self.task, self.size, tuple(rgbs), dict(self.detect_options)),)))
        return list(found)


__all__ = ["ClipCall", "TaskSteps"]
