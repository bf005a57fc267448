"""What happens to each frame of a clip, per kind of task, around the shared batch loop.

A handler answers three questions for :func:`sapiens2.video.clip_runner.run_video`:

* ``options_for(k, rgb)``: the per-frame options for ``prepare``/``finish`` (pose: the person
  boxes from the detector or the tracker), or None when the frame has nothing to infer;
* ``consume(k, frame, time_s, rgb, result)``: the rendered frame to write now, or None when it
  can only be rendered at the end (depth: its colour scale needs the whole clip);
* ``deferred()`` and ``exports(...)``: frames rendered after the last batch, and the downloads.

A task names its handler class in its declaration (``Task.video.handler``): pose's and the
pointmap's live in their folders; :class:`DenseFrames` (each frame rendered as its photo result)
is the default.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import OptionError
from ..outputs.export import safe_path
from . import registry
from .clip_arrays import RawArrays
from .registry import Task
from .result_record import ResultArray, clip_fields

MAX_NOTICES = 8
#: Numbers in a notice (a per-frame value such as a scale): notices differing only there are alike.
_NUMBERS = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
Detect = Callable[[np.ndarray], Any]  # rgb -> sapiens2.models.detector.Detections (or anything with .boxes)
DetectMany = Callable[[list[np.ndarray]], list[Any]]  # several frames in one device call


class FrameHandler:
    """Base: every frame inferred, rendered at once by ``result.render(**render_options)``.

    A subclass is what a task's ``Task.video.handler`` names; :meth:`build` makes
    it for a task from the run's arguments, :meth:`render_kwargs` turns the task's rendering
    options into the ones it takes."""

    @classmethod
    def build(
        cls, task: Task, pipe: Any, options: Mapping[str, Any], render: Mapping[str, Any], **kw: Any
    ) -> FrameHandler:
        """The handler for ``task``'s clip; ``kw``: raw_cap, tracking, detect, detect_many,
        depth_percentiles (each kind takes what it needs)."""
        raise NotImplementedError  # pragma: no cover - every kind overrides it

    @staticmethod
    def render_kwargs(task: Task, render_opts: Mapping[str, Any]) -> dict[str, Any]:
        """The task's rendering options as this handler takes them (the result's render())."""
        return task.render_args(render_opts)

    def __init__(self, render_options: Mapping[str, Any], raw_cap: int) -> None:
        self.render_options = dict(render_options)
        self.raw = RawArrays(raw_cap)
        self.notices: list[str] = []
        self.dropped_notices = 0
        # numbers-blind text -> (the first such text, its place in notices or None, others like it)
        self._alike: dict[str, tuple[str, int | None, int]] = {}

    def note(self, text: str) -> None:
        """Keep a notice once. One that differs from a kept one in its numbers only (a per-frame
        value) is counted on the kept one; past MAX_NOTICES distinct ones, only count."""
        key = _NUMBERS.sub("#", text)
        if key in self._alike:
            first, where, more = self._alike[key]
            if text != first:
                self._alike[key] = (first, where, more + 1)
                if where is not None:
                    self.notices[where] = f"{first} (and on {more + 1} more frame(s), with other values)"
            return
        where = len(self.notices) if len(self.notices) < MAX_NOTICES else None
        self._alike[key] = (text, where, 0)
        if where is not None:
            self.notices.append(text)
        else:
            self.dropped_notices += 1

    def prefetch(self, frames: list[tuple[int, np.ndarray]]) -> None:
        """Before a batch's ``options_for`` calls: (k, rgb) of each frame of the batch."""

    def options_for(self, k: int, rgb: np.ndarray) -> dict[str, Any] | None:
        return {}

    def consume(self, k: int, frame: int, time_s: float, rgb: np.ndarray, result: Any) -> np.ndarray | None:
        raise NotImplementedError  # pragma: no cover - every handler overrides it

    def deferred(self) -> Iterator[np.ndarray]:
        return iter(())

    def exports(self, out_dir: Path, name: str, *, fps: float, size: tuple[int, int]) -> list[Path]:
        return []

    def summary(self) -> dict[str, Any]:
        return {}


def raw_fields(task: Task) -> dict[str, ResultArray]:
    """The arrays a clip of ``task`` keeps per frame, by result attribute: its declared arrays
    (``Task.arrays``) that are ``in_clip``, kept as the photo's files and the batch keep them."""
    return clip_fields(task.arrays) if task.video else {}


class DenseFrames(FrameHandler):
    """Each frame rendered as its photo result would be (the default handler)."""

    @classmethod
    def build(
        cls, task: Task, pipe: Any, options: Mapping[str, Any], render: Mapping[str, Any], **kw: Any
    ) -> FrameHandler:
        return cls(task, render, kw["raw_cap"])

    def __init__(self, task: Task, render_options: Mapping[str, Any], raw_cap: int) -> None:
        super().__init__(render_options, raw_cap)
        self.task = task.name
        self.fields = raw_fields(task)

    def keep_raw(self, result: Any) -> None:
        arrays = self.raw_arrays(result)
        if arrays:
            self.raw.add(arrays)

    def raw_arrays(self, result: Any) -> dict[str, np.ndarray]:
        """The declared raw fields of one frame's result, in their clip dtypes."""
        kept = {key: array.kept(result) for key, array in self.fields.items()}
        return {key: arr for key, arr in kept.items() if arr is not None}

    def consume(self, k: int, frame: int, time_s: float, rgb: np.ndarray, result: Any) -> np.ndarray | None:
        self.keep_raw(result)
        for n in getattr(result, "notices", []):
            self.note(n)
        return result.render(**self.render_options)

    def exports(self, out_dir: Path, name: str, *, fps: float, size: tuple[int, int]) -> list[Path]:
        path = self.raw.write(safe_path(out_dir, name, f"_{self.task}_frames.npz"), {"fps": np.float64(fps)})
        notice = self.raw.notice(self.task)
        if notice:
            self.note(notice)
        return [path] if path else []


def handler_class(task: Task, offered: Mapping[str, Task] | None = None) -> type[FrameHandler]:
    """The handler class a task's video declaration names (None: :class:`DenseFrames`);
    OptionError when it runs no video, naming the video tasks ``offered`` (default: every shown one)."""
    if task.video is None:
        names = ", ".join(offered if offered is not None else registry.video_tasks())
        raise OptionError(f"Video runs the tasks {names}; got {task.name!r}.")
    return task.video.handler or DenseFrames
