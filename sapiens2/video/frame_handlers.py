"""What happens to each frame of a clip, per kind of task, around the shared batch loop.

A handler answers three questions for :func:`sapiens2.video.clip_runner.run_video`:

* ``options_for(k, rgb)``: the per-frame options for ``prepare``/``finish`` (pose: the person
  boxes from the detector or the tracker), or None when the frame has nothing to infer;
* ``consume(k, frame, time_s, rgb, result)``: the rendered frame to write now, or None when it
  can only be rendered at the end (depth: its colour scale needs the whole clip);
* ``deferred()`` and ``exports(...)``: frames rendered after the last batch, and the downloads.

Rendering reuses :mod:`sapiens2.outputs.render` and the results' own ``render``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import OptionError
from ..outputs.export import safe_path
from ..tasks import registry
from ..tasks.registry import Task
from .clip_depth_align import DepthAligner
from .depth import foreground_depth, global_depth_bounds, render_depth_frame
from .exports import (
    PoseFrame,
    RawArrays,
    cap_notice,
    pose_arrays,
    save_npz,
    write_coco_tracks,
    write_keypoints_csv,
    write_openpose_video,
    write_openpose_zip,
    write_pose_tracks,
    write_wholebody_tracks,
)
from .people import FramePeople, PoseTracking, TrackingOptions, draw_people

MAX_NOTICES = 8
#: Numbers in a notice (a per-frame value such as a scale): notices differing only there are alike.
_NUMBERS = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
Detect = Callable[[np.ndarray], Any]  # rgb -> sapiens2.models.detector.Detections (or anything with .boxes)
DetectMany = Callable[[list[np.ndarray]], list[Any]]  # several frames in one device call


class FrameHandler:
    """Base: every frame inferred, rendered at once by ``result.render(**render_options)``.

    A subclass is one kind of ``Task.video.handler`` (see :data:`HANDLERS`); :meth:`build` makes
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


def raw_fields(task: Task) -> dict[str, Any]:
    """The arrays a clip of ``task`` keeps per frame: result attribute -> dtype (None: as it is),
    from the task's declaration (``Task.video.raw_fields``)."""
    return dict(task.video.raw_fields) if task.video else {}


class DenseFrames(FrameHandler):
    """Each frame rendered as its photo result would be (``handler="frames"``)."""

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
        arrays = {}
        for key, dtype in self.fields.items():
            value = getattr(result, key, None)
            if value is not None:
                arr = np.asarray(value)
                if dtype is np.float16:
                    arr = np.nan_to_num(arr).astype(np.float16)  # as the photo exports: NaN -> 0
                elif dtype is not None:
                    arr = arr.astype(dtype)
                arrays[key] = arr
        return arrays

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


class DepthFrames(DenseFrames):
    """The clip-wide depth hook (``handler="depth"``): each result's ``depth`` and ``mask`` kept,
    every frame rendered at the end with the clip's 1st/99th percentiles. Every frame's depth is
    first aligned to the clip (:class:`sapiens2.video.clip_depth_align.DepthAligner`: one factor per
    frame against a running reference on still pixels), so the model's per-frame scale jitter
    does not make a still scene breathe; the video and the NPZ hold the aligned depth."""

    @classmethod
    def build(
        cls, task: Task, pipe: Any, options: Mapping[str, Any], render: Mapping[str, Any], **kw: Any
    ) -> FrameHandler:
        return cls(task, render, kw["raw_cap"], kw["depth_percentiles"])

    @staticmethod
    def render_kwargs(task: Task, render_opts: Mapping[str, Any]) -> dict[str, Any]:
        return {}  # coloured with the clip's bounds: no options

    def __init__(
        self, task: Task, render_options: Mapping[str, Any], raw_cap: int, percentiles: tuple[float, float]
    ) -> None:
        super().__init__(task, render_options, raw_cap)
        self.percentiles = percentiles
        self.depths: list[np.ndarray] = []
        self.bounds: tuple[float, float] | None = None
        self.aligner = DepthAligner()
        self._raw_depths: list[np.ndarray] = []  # the NPZ's depth arrays, scaled once aligned
        self._aligned = False

    def keep_raw(self, result: Any) -> None:
        arrays = self.raw_arrays(result)
        depth = arrays.get("depth")  # the result's depth array (an NPZ field, not the task's name)
        if depth is not None:
            self._raw_depths.append(depth)
        if arrays:
            self.raw.add(arrays)

    def consume(self, k: int, frame: int, time_s: float, rgb: np.ndarray, result: Any) -> np.ndarray | None:
        self.keep_raw(result)
        for n in getattr(result, "notices", []):
            self.note(n)
        self.aligner.update(result.depth, people_mask(result), getattr(result, "scale", None))
        self.depths.append(foreground_depth(result.depth, result.mask))
        return None

    def align(self) -> np.ndarray:
        """Scale every kept frame by its factor (once); returns the factors."""
        factors = self.aligner.factors()
        if not self._aligned:
            for arrs in (self.depths, self._raw_depths):
                for d, f in zip(arrs, factors, strict=False):
                    d *= d.dtype.type(f)
            self._aligned = True
        return factors

    def deferred(self) -> Iterator[np.ndarray]:
        self.align()
        self.bounds = global_depth_bounds(self.depths, self.percentiles)
        if self.bounds is None:
            self.note("No frame has foreground depth: every frame is shown as background.")
        for i, depth in enumerate(self.depths):
            yield render_depth_frame(depth, self.bounds)
            self.depths[i] = depth[:0]  # rendered: release the frame's memory

    def exports(self, out_dir: Path, name: str, *, fps: float, size: tuple[int, int]) -> list[Path]:
        self.align()
        return super().exports(out_dir, name, fps=fps, size=size)

    def summary(self) -> dict[str, Any]:
        return {
            "depth_bounds_m": None if self.bounds is None else list(self.bounds),
            "depth_alignment": self.aligner.summary(),
        }


def people_mask(result: Any) -> np.ndarray | None:
    """Where a pointmap result's people are: its mask when the segmentation made it (smaller
    than the valid points), None when the mask is just every valid point (no segmentation)."""
    mask = getattr(result, "mask", None)
    if mask is None:
        return None
    with np.errstate(invalid="ignore"):
        valid = np.isfinite(result.depth) & (result.depth > 0)
    return mask if int(mask.sum()) < int(valid.sum()) else None


class PoseFrames(FrameHandler):
    """Keypoints with tracks (``handler="tracks"``): the task's detection hook every K frames,
    tracker between, One-Euro on each track."""

    @classmethod
    def build(
        cls, task: Task, pipe: Any, options: Mapping[str, Any], render: Mapping[str, Any], **kw: Any
    ) -> FrameHandler:
        hook = task.video.detect if task.video else None
        detect = kw["detect"] or (hook(pipe, options) if hook else None)
        if detect is None:
            raise OptionError(
                f"The {task.api_name} video needs person boxes: its declaration has no detect hook."
            )
        return cls(task, render, kw["raw_cap"], kw["tracking"], detect, kw["detect_many"])

    @staticmethod
    def render_kwargs(task: Task, render_opts: Mapping[str, Any]) -> dict[str, Any]:
        return dict(render_opts)  # the photo's names, checked against the declaration's here

    def __init__(
        self,
        task: Task,
        render_options: Mapping[str, Any],
        raw_cap: int,
        tracking: TrackingOptions,
        detect: Detect,
        detect_many: DetectMany | None = None,
    ) -> None:
        self.task = task.name
        opts = task.video_render_defaults()  # the declaration's, plus video's
        unknown = set(render_options) - set(opts)
        if unknown:
            raise OptionError(
                f"Unknown {task.name} video render option(s) {sorted(unknown)}; allowed: {sorted(opts)}."
            )
        super().__init__({**opts, **render_options}, raw_cap)
        self.tracking, self.detect, self.detect_many = tracking, detect, detect_many
        self._detected: dict[int, Any] = {}  # k -> detections fetched for the batch
        self.people = PoseTracking(tracking, self.render_options["threshold"])
        self.frames: list[PoseFrame] = []
        self._pending: dict[int, FramePeople] = {}

    def prefetch(self, frames: list[tuple[int, np.ndarray]]) -> None:
        """With ``detect_many``: the batch's detection frames in one call (one GPU call)."""
        todo = [(k, rgb) for k, rgb in frames if self.people.detects(k)]
        if self.detect_many is None or not todo:
            return
        found = list(self.detect_many([rgb for _, rgb in todo]))
        if len(found) != len(todo):
            raise OptionError(f"Detection returned {len(found)} results for {len(todo)} frames.")
        self._detected.update((k, f) for (k, _), f in zip(todo, found, strict=True))

    def options_for(self, k: int, rgb: np.ndarray) -> dict[str, Any] | None:
        found = None
        if self.people.detects(k):
            found = self._detected.pop(k) if k in self._detected else self.detect(rgb)
            for n in getattr(found, "notices", []):
                self.note(n)
        people = self._pending[k] = self.people.people(k, rgb, found)
        return people.pose_options()

    def consume(self, k: int, frame: int, time_s: float, rgb: np.ndarray, result: Any) -> np.ndarray | None:
        people = self._pending.pop(k)
        raw = (
            np.zeros((0, 308, 2), np.float32) if result is None else np.asarray(result.keypoints, np.float32)
        )
        scores = np.zeros((0, 308), np.float32) if result is None else np.asarray(result.scores, np.float32)
        for n in getattr(result, "notices", []):
            self.note(n)
        smooth = self.people.follow(time_s, people, raw, scores)
        self.frames.append(
            PoseFrame(
                frame,
                time_s,
                people.ids,
                people.boxes.astype(np.float32),
                people.box_scores,
                smooth,
                raw,
                scores,
            )
        )
        return draw_people(rgb, people, smooth, scores, self.render_options)

    def exports(self, out_dir: Path, name: str, *, fps: float, size: tuple[int, int]) -> list[Path]:
        thr = float(self.render_options["threshold"])
        meta = {"tracking": {**self.tracking.__dict__}, "keypoint_threshold": thr}
        paths = [
            write_pose_tracks(out_dir, name, self.frames, size=size, fps=fps, meta=meta),
            write_coco_tracks(out_dir, name, self.frames, size=size, threshold=thr),
            write_wholebody_tracks(out_dir, name, self.frames, threshold=thr),
            write_openpose_zip(out_dir, name, self.frames, threshold=thr, size=size),
            write_openpose_zip(out_dir, name, self.frames, threshold=thr, size=size, coco18=True),
            write_keypoints_csv(out_dir, name, self.frames),
        ]
        video = write_openpose_video(out_dir, name, self.frames, size=size, fps=fps, threshold=thr)
        paths += [video] if video else []
        arrays = {**pose_arrays(self.frames), "fps": np.float64(fps)}
        needed = sum(int(a.nbytes) for a in arrays.values())
        if needed <= self.raw.cap_bytes:
            paths.append(save_npz(safe_path(out_dir, name, f"_{self.task}_frames.npz"), arrays))
        else:
            self.note(cap_notice(self.task, needed, self.raw.cap_bytes))
        return paths

    def summary(self) -> dict[str, Any]:
        return {
            "tracks": self.people.ids_issued,
            "people_max": max([len(f.track_ids) for f in self.frames] or [0]),
        }


#: ``Task.video.handler`` kind -> its handler class.
HANDLERS: dict[str, type[FrameHandler]] = {"frames": DenseFrames, "depth": DepthFrames, "tracks": PoseFrames}


def handler_class(task: Task, offered: Mapping[str, Task] | None = None) -> type[FrameHandler]:
    """The handler class a task's video declaration names; OptionError when it runs no video,
    naming the video tasks ``offered`` (default: every shown one)."""
    if task.video is None:
        names = ", ".join(offered if offered is not None else registry.video_tasks())
        raise OptionError(f"Video runs the tasks {names}; got {task.name!r}.")
    return HANDLERS[task.video.handler]
