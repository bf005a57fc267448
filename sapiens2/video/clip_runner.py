"""A clip through a task pipeline, in batches: decode, prepare, one forward per batch, finish,
render, VP8/WebM, and the downloads, into one folder (the stages: docs/DESIGN.md).

A task with a detection hook (pose) runs its detector on every K-th frame before the batch's
prepare, so every frame reaches the model with caller boxes and the forward stays one per batch.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputImageError, OptionError, Sapiens2Error
from ..inputs.intake import Intake, load_image
from ..outputs.export import file_stem, safe_path
from ..outputs.webm_writer import VIDEO_SUFFIX, VideoWriter
from ..tasks import registry
from ..tasks.base import finish_batch, prepare_batch
from ..tasks.clip_arrays import RAW_CAP_BYTES
from ..tasks.clip_frames import Detect, DetectMany, FrameHandler, handler_class
from ..tasks.pose.pose_tracking import TrackingOptions
from ..tasks.registry import Task
from .clip_plan import VideoPlan, VideoResult, has_audio, plan_video
from .clip_steps import ClipStopped, Infer, LocalSteps, Steps, budget_stop, staged
from .reader import VideoLimits, iter_frames

MAX_BATCH = 64


@dataclass
class _Frame:
    """One decoded frame on its way through the server: its intake, per-frame options and prep."""

    index: int  # source frame index
    rgb: np.ndarray
    intake: Intake | None = None
    extra: dict[str, Any] | None = None  # per-frame options; None: nothing to infer
    prep: Any = None


class ClipRun:
    """One clip through a task, in this process except the device steps (:class:`Steps`):
    decode and prepare, then per batch the forwards (streamed, or sent batch by batch when the
    frames' options follow the results, as pose's boxes follow its keypoints), finish, render
    and encode. :func:`iter_video` is the whole run; a server runs :meth:`process` with the
    steps of its one GPU call (``sapiens2.serving.clip_call``)."""

    def __init__(
        self, pipe: Any, source: str | Path, out_dir: str | Path, *, decl: Task, opts: dict[str, Any],
        stride: int, limits: VideoLimits, batch_size: int, handler: FrameHandler, source_video: bool,
        name: str | None, take: int | None, budget_s: float | None,
    ) -> None:  # fmt: skip
        """``decl``, ``opts``, ``batch_size``: the task's declaration, the inference options and
        the frames per forward as :func:`clip_run` checked them."""
        self.t_start = time.perf_counter()
        self.decl, self.opts = decl, opts
        self.plan = _taken(plan_video(source, stride=stride, limits=limits), take)
        self.limits, self.batch_size, self.take, self.budget_s = limits, batch_size, take, budget_s
        self.stages, self.handler = staged(pipe), handler
        self.out, self.stem = Path(out_dir), name or file_stem(self.plan.info.path.name, "clip")
        self.writer = VideoWriter(safe_path(self.out, self.stem, f"_{self.decl.name}{VIDEO_SUFFIX}"),
                                  self.plan.fps_out)  # fmt: skip
        self.source = (
            VideoWriter(safe_path(self.out, self.stem, f"_source{VIDEO_SUFFIX}"), self.plan.fps_out)
            if source_video
            else None
        )
        self.timing = {"decode_s": 0.0, "infer_s": 0.0, "model_s": 0.0}
        self.done, self.size, self.stopped = 0, (0, 0), None
        self.frames: list[_Frame] | None = None  # all of them, once :meth:`load` ran
        #: this run's device steps are the last of the call (a loaded run tells it so)
        self.last_steps = True

    @property
    def independent(self) -> bool:
        """Whether every frame's prep is known before any result (no per-frame options)."""
        kind = type(self.handler)
        return kind.options_for is FrameHandler.options_for and kind.prefetch is FrameHandler.prefetch

    def load(self, frames_from: ClipRun | None = None) -> None:
        """Decode (and prepare, for a task without per-frame options) every frame now: CPU work
        a server does before the device call opens. Without it, :meth:`process` decodes
        ``batch_size`` frames at a time. ``frames_from``: a loaded run of the same frames (clip,
        stride, limits, take) not yet processed, whose decoded frames are taken instead of
        decoding the clip again: new frames sharing its pixels (each run only rebinds its own
        frames' ``rgb``, never writes into it)."""
        if frames_from is None:
            self.frames = next(self._windows(None))
            return
        mine, theirs = ((r.plan.info.path, r.plan.stride, r.limits, r.take) for r in (self, frames_from))
        if frames_from.frames is None or mine != theirs:
            raise ValueError("frames_from must be a loaded run of the same clip, stride, limits and take.")
        t0 = time.perf_counter()
        self.frames = self._prepared([_Frame(f.index, f.rgb) for f in frames_from.frames])
        self.timing["decode_s"] += time.perf_counter() - t0

    def _windows(self, window: int | None) -> Iterator[list[_Frame]]:
        """The frames, decoded (and prepared) ``window`` at a time (None: all at once)."""
        frames = islice(iter_frames(self.plan.info, stride=self.plan.stride, limits=self.limits), self.take)
        while True:
            t0 = time.perf_counter()
            part = self._prepared([_Frame(i, rgb) for i, rgb in islice(frames, window)])
            self.timing["decode_s"] += time.perf_counter() - t0
            yield part
            if not part or window is None:
                return

    def _prepared(self, part: list[_Frame]) -> list[_Frame]:
        """Decoded frames, the clip's size noted from the first; for a task without per-frame
        options, with their intakes and preps."""
        if part and not self.size[0]:
            self.size = (part[0].rgb.shape[1], part[0].rgb.shape[0])
        if self.independent:
            for f in part:
                f.intake, f.extra = load_image(f.rgb), {}
            preps = prepare_batch(self.stages, [f.intake for f in part], self.opts)
            for f, prep in zip(part, preps, strict=True):
                f.prep = prep
        return part

    def process(self, steps: Steps) -> Iterator[int]:
        """The clip's batches through ``steps`` and into the videos; yields the frames done
        after each batch. A device error after some frames, or the device call stopping, keeps
        the frames done (``stopped`` says why)."""
        try:
            with self.writer, self.source or contextlib.nullcontext():
                with contextlib.closing(self._work(steps)) as work:
                    yield from self._kept(work)
                for rendered in self.handler.deferred():
                    self.writer.write(rendered)
                self.video = self.writer.close()
                self.source_path = self.source.close() if self.source is not None else None
        except BaseException:
            for w in (self.writer, self.source):
                if w is not None:
                    with contextlib.suppress(OSError):
                        w.path.unlink(missing_ok=True)  # never leave a half-written video behind
            raise

    def _work(self, steps: Steps) -> Iterator[int]:
        loaded = self.frames is not None  # one window: its last step is the run's last
        windows = iter([self.frames]) if loaded else self._windows(self.batch_size)
        k0 = 0
        for frames in windows:
            size = self.batch_size
            batches = [frames[a : a + size] for a in range(0, len(frames), size)]
            each = self._streamed if self.independent else self._sent
            yield from each(batches, steps, k0, self.last_steps and loaded)
            k0 += len(frames)

    def _kept(self, work: Iterator[int]) -> Iterator[int]:
        """``work``'s progress, ending early (frames kept) on a device failure after some frames,
        the device call stopping, or ``budget_s`` about to pass (a local run's own check)."""
        t0 = tb = time.perf_counter()
        try:
            for done in work:
                self.done = done
                yield done
                now = time.perf_counter()
                if reason := budget_stop(self.budget_s, now - t0, now - tb):
                    self.stopped = reason
                    return
                tb = now
        except ClipStopped as stop:
            self.stopped = stop.reason
        except (Sapiens2Error, RuntimeError, MemoryError) as err:
            if not self.done or isinstance(err, InputImageError):
                raise
            self.stopped = f"the device failed ({err})"

    def _streamed(self, batches: list[list[_Frame]], steps: Steps, k0: int, last: bool) -> Iterator[int]:
        """Frames prepared in advance: every batch's forward streamed, each finished as it comes."""
        raws_in = steps.stream([[f.prep for f in b] for b in batches], self.opts, last)
        for batch in batches:
            t0 = time.perf_counter()
            raws = next(raws_in)
            self.timing["infer_s"] += time.perf_counter() - t0
            self._encode(self._finish(batch, raws, k0))
            k0 += len(batch)
            yield k0

    def _sent(self, batches: list[list[_Frame]], steps: Steps, k0: int, last: bool) -> Iterator[int]:
        """Frames whose options follow the results: per batch, the options (pose: detections,
        tracker), the preps, the forward; the previous batch is encoded while it runs."""
        pending: list[tuple[_Frame, Any]] = []
        try:
            for n, batch in enumerate(batches, 1):
                self.handler.prefetch([(k0 + j, f.rgb) for j, f in enumerate(batch)])
                for j, f in enumerate(batch):
                    f.intake, f.extra = load_image(f.rgb), self.handler.options_for(k0 + j, f.rgb)
                todo = [f for f in batch if f.extra is not None]
                preps = prepare_batch(
                    self.stages, [f.intake for f in todo], self.opts, [f.extra for f in todo]
                )
                t0 = time.perf_counter()
                steps.send(preps, self.opts, last and n == len(batches))
                self._encode(pending)  # while the forward runs
                pending = []
                raws = steps.receive()
                self.timing["infer_s"] += time.perf_counter() - t0
                pending = self._finish(batch, raws, k0)
                k0 += len(batch)
                yield k0
        finally:
            self._encode(pending)  # the last batch, or the frames done before a stop

    def _finish(self, batch: list[_Frame], raws: list[Any], k0: int) -> list[tuple[_Frame, Any]]:
        """A batch's results from its raws, consumed in order by the handler: (frame, rendered
        frame or None) to write."""
        todo = [f for f in batch if f.extra is not None]
        done = iter(
            finish_batch(self.stages, raws, [f.intake for f in todo], self.opts, [f.extra for f in todo])
        )
        fps, out = self.plan.info.fps, []
        for j, f in enumerate(batch):
            result = None if f.extra is None else next(done)
            info = getattr(result, "info", None)
            self.timing["model_s"] += float(getattr(info, "model_s", 0.0) or 0.0)
            out.append((f, self.handler.consume(k0 + j, f.index, f.index / fps, f.rgb, result)))
            f.intake = f.prep = None  # done: release the frame's copies
        return out

    def _encode(self, frames: list[Any]) -> None:
        for f, rendered in frames:
            if rendered is not None:
                self.writer.write(rendered)
            if self.source is not None:
                self.source.write(f.rgb)
            f.rgb = f.rgb[:0]  # written: release the frame

    def result(self) -> VideoResult:
        """The :class:`VideoResult` of a processed clip: the downloads written, the notices."""
        files = [
            self.video,
            *self.handler.exports(self.out, self.stem, fps=self.plan.fps_out, size=self.size),
        ]
        self.timing["total_s"] = time.perf_counter() - self.t_start
        notices = _notices(self.plan, self.size, self.handler)
        if self.stopped:
            planned = "" if self.plan.frames is None else f" of {self.plan.frames}"
            notices.insert(0, f"Only the first {self.done}{planned} frames were processed: {self.stopped}.")
        return VideoResult(
            task=self.decl.name, video=self.video, files=files, source=self.plan.info, frames=self.done,
            fps=self.plan.fps_out, size=self.size, codec=self.writer.codec or "", notices=notices,
            timing=self.timing, source_video=self.source_path,
            details={**self.handler.summary(), **({"stopped": self.stopped} if self.stopped else {})},
        )  # fmt: skip


def _taken(plan: VideoPlan, take: int | None) -> VideoPlan:
    """The plan cut to its first ``take`` frames (a plan cut to the quota)."""
    if take is None:
        return plan
    if isinstance(take, bool) or not isinstance(take, int) or take < 1:
        raise OptionError(f"take must be a whole number of frames >= 1, got {take!r}.")
    return VideoPlan(plan.info, plan.stride, take if plan.frames is None else min(plan.frames, take))


def run_video(pipe: Any, source: str | Path, out_dir: str | Path, **kwargs: Any) -> VideoResult:
    """Run ``pipe`` on the clip at ``source``; see :func:`iter_video` for the arguments.
    ``progress(done, planned)`` after every batch."""
    progress = kwargs.pop("progress", None)
    result = None
    for item in iter_video(pipe, source, out_dir, **kwargs):
        if isinstance(item, VideoResult):
            result = item
        elif progress is not None:
            progress(item[0], item[1])
    assert result is not None
    return result


def clip_run(
    pipe: Any,
    source: str | Path,
    out_dir: str | Path,
    *,
    task: Task | str | None = None,
    stride: int = 1,
    limits: VideoLimits = VideoLimits(),
    batch_size: int = 8,
    options: Mapping[str, Any] | None = None,
    render_options: Mapping[str, Any] | None = None,
    tracking: TrackingOptions = TrackingOptions(),
    detect: Detect | None = None,
    depth_percentiles: tuple[float, float] = (1.0, 99.0),
    raw_cap_bytes: int = RAW_CAP_BYTES,
    detect_many: DetectMany | None = None,
    source_video: bool = False,
    name: str | None = None,
    budget_s: float | None = None,
    take: int | None = None,
    handler: FrameHandler | None = None,
) -> ClipRun:
    """A checked :class:`ClipRun` (see :func:`iter_video` for the arguments); nothing decoded yet."""
    decl, opts = _checked(task or getattr(pipe, "task", None), batch_size, options)
    handler = handler or handler_class(decl).build(
        decl, pipe, opts, render_options or {}, detect=detect, detect_many=detect_many, tracking=tracking,
        raw_cap=raw_cap_bytes, depth_percentiles=depth_percentiles,
    )  # fmt: skip
    return ClipRun(
        pipe, source, out_dir, decl=decl, opts=opts, stride=stride, limits=limits, batch_size=batch_size,
        handler=handler, source_video=source_video, name=name, take=take, budget_s=budget_s,
    )  # fmt: skip


def iter_video(
    pipe: Any, source: str | Path, out_dir: str | Path, *, infer: Infer | None = None, **kwargs: Any
) -> Iterator[tuple[int, int | None] | VideoResult]:
    """Run ``pipe`` (a task pipeline) on every ``stride``-th frame of the clip at ``source``,
    yielding ``(frames done, frames planned)`` after every batch, then the :class:`VideoResult`.
    ``budget_s``: stop before the next batch would pass this many seconds. ``take``: process
    only the first ``take`` frames (after the stride). A device error after
    some frames, or the budget, ends the clip early: the frames done are kept (a playable video
    and its downloads) with a notice saying why.

    ``options``: the task's inference options, passed to prepare/infer/finish (pose: flip_test,
    score_threshold, max_people for the detector; normal: remove_background; pointmap:
    use_segmentation). ``render_options``: pose: threshold, show_face, body_only, show_boxes,
    show_ids; seg/normal/matting: their result's ``render`` options. ``infer``: runs a batch's
    device work instead of ``pipe.infer`` (e.g. a function taking the picklable preps;
    ``detect`` is pose's other device hook, and ``detect_many(rgbs)`` detects all of a batch's
    detection frames in one call instead). ``source_video``: also write the frames read (after
    stride and downscaling) as ``<name>_source.webm`` (``VideoResult.source_video``), for a
    side-by-side view that plays. ``handler``: the frame handler to use instead of the one the
    task's declaration names (a caller that needs more of each frame, e.g.
    :mod:`sapiens2.video.clip_motion`). ``depth_percentiles``, ``raw_cap_bytes``, ``tracking``,
    ``batch_size`` (frames per forward), ``name`` (the files' stem): as named.
    Writes ``<name>_<task>.webm`` and the downloads into ``out_dir``.
    Raises InputVideoError (bad clip, limits), OptionError, VideoEncodeError.
    """
    run = clip_run(pipe, source, out_dir, **kwargs)
    for done in run.process(LocalSteps(infer or run.stages.infer)):
        yield done, run.plan.frames
    yield run.result()


def _checked(task: Any, batch_size: Any, options: Mapping[str, Any] | None) -> tuple[Task, dict[str, Any]]:
    """The task's declaration and the inference options, after checking the task (it declares
    ``video``), the batch size and the options. A name (the library's ``run_video(pipe, ...)``,
    whose pipeline names its task) is looked up here, once."""
    decl = task if isinstance(task, Task) else None
    if isinstance(task, str):
        decl = registry.declared().get(task)
    if decl is None or decl.video is None:
        names = ", ".join(registry.video_tasks())
        raise OptionError(f"Video runs the tasks {names}; got {task!r}.")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_BATCH:
        raise OptionError(f"batch_size must be a whole number from 1 to {MAX_BATCH}, got {batch_size!r}.")
    opts = dict(options or {})
    if "boxes" in opts:
        raise OptionError("Video finds the boxes itself (detector and tracker); remove the 'boxes' option.")
    return decl, opts


def _notices(plan: VideoPlan, size: tuple[int, int], handler: FrameHandler) -> list[str]:
    info = plan.info
    notes = list(info.notices)
    if size != (info.width, info.height):
        notes.append(
            f"Frames were downscaled from {info.width}x{info.height} to {size[0]}x{size[1]} for inference "
            "and the output video."
        )
    if plan.stride > 1:
        notes.append(
            f"One frame in {plan.stride} was processed; the output plays at {plan.fps_out:.3g} fps so its "
            "duration matches the clip."
        )
    if has_audio(info.path):
        notes.append("The output video has no sound: the clip's audio is not carried over.")
    if handler.dropped_notices:
        notes_more = f"... and {handler.dropped_notices} more notice(s) from other frames (not listed)."
        return [*notes, *handler.notices, notes_more]
    return notes + handler.notices
