"""A clip through a task pipeline, in batches: decode -> prepare -> ONE infer per batch -> finish
-> render -> VP8/WebM, plus the downloads, into one folder.

The pipeline is used through its three stages (docs: the pipeline contract)::

    prep = pipe.prepare(intake, **options, **frame_options)   # per frame (CPU)
    raws = pipe.infer([prep, ...], **options)                  # once per batch (device)
    result = pipe.finish(raw, intake, **options, **frame_options)  # per frame (CPU)

``frame_options`` are what differs per frame (pose: the person boxes the detector or the
tracker chose), so ``infer`` must take them from each ``prep``. A pipeline without the three
stages is wrapped by :class:`OneCallPerFrame` (one forward per frame, no batching), which keeps
the runner usable with the single-call pipelines.

Which tasks run and how their frames are handled comes from each task's declaration
(``Task.video``: handler kind, raw fields, render defaults, detection hook). A task with a
detection hook (pose) runs its detector itself, on every K-th frame, BEFORE the batch's prepare:
the frames after a detection in the same batch already get its boxes, and every frame reaches the
model with caller boxes, so the forward stays one per batch.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputImageError, OptionError, Sapiens2Error
from ..inputs.intake import Intake, load_image
from ..outputs.export import file_stem, safe_path
from ..tasks import registry
from ..tasks.base import run_batch
from ..tasks.registry import Task
from .exports import RAW_CAP_BYTES
from .handlers import Detect, DetectMany, FrameHandler, TrackingOptions, handler_class
from .reader import VideoInfo, VideoLimits, check_stride, iter_frames, planned_frames, probe_video
from .writer import VIDEO_SUFFIX, VideoWriter

Progress = Callable[[int, int | None], None]  # (frames done, frames planned or None if unknown)
Infer = Callable[..., list]  # (preps, **options) -> raws: the batch's device work
MAX_BATCH = 64


class OneCallPerFrame:
    """The three stages over a single-call pipeline ``pipe(intake, **options) -> result``."""

    def __init__(self, pipe: Any) -> None:
        self.pipe = pipe

    def prepare(self, intake: Intake, **options: Any) -> tuple[Intake, dict[str, Any]]:
        return intake, options

    def infer(self, preps: list[tuple[Intake, dict[str, Any]]], **_: Any) -> list[Any]:
        return [self.pipe(intake, **options) for intake, options in preps]

    def finish(self, raw: Any, intake: Intake, **_: Any) -> Any:
        return raw


def staged(pipe: Any) -> Any:
    """The pipeline itself when it has prepare/infer/finish, else :class:`OneCallPerFrame`."""
    if all(callable(getattr(pipe, n, None)) for n in ("prepare", "infer", "finish")):
        return pipe
    return OneCallPerFrame(pipe)


@dataclass
class VideoPlan:
    """A checked clip before any inference: what the UI shows (and estimates time from) first."""

    info: VideoInfo
    stride: int
    frames: int | None  # frames that will be processed by the header (None: header gives no count)

    @property
    def fps_out(self) -> float:
        return self.info.fps / self.stride


def plan_video(source: str | Path, *, stride: int = 1, limits: VideoLimits = VideoLimits()) -> VideoPlan:
    """Probe and check a clip; raises InputVideoError (not a video, too big, too long, too many
    frames by its header) before anything expensive runs."""
    info = probe_video(source, limits)
    n = planned_frames(info, check_stride(stride), limits) if info.frame_count else None
    return VideoPlan(info, stride, n)


@dataclass
class VideoResult:
    """A processed clip: the rendered video and the downloads, all inside ``out_dir``."""

    task: str
    video: Path  # rendered clip, VP8 in WebM, silent
    files: list[Path]  # downloads: the video first, then JSON / ZIP / NPZ
    source: VideoInfo
    frames: int  # frames processed (= frames in the output video)
    fps: float  # output frame rate = source fps / stride (so the duration is kept)
    size: tuple[int, int]  # (width, height) of the output frames (even-padded in the video)
    codec: str  # fourcc actually used ("VP80"; "VP90" only if VP8 cannot be opened)
    notices: list[str] = field(default_factory=list)
    timing: dict[str, float] = field(default_factory=dict)  # decode_s, infer_s, model_s, total_s
    details: dict[str, Any] = field(default_factory=dict)  # pose: tracks; pointmap: depth bounds
    source_video: Path | None = None  # the frames read, as a playable WebM (``source_video=True``)

    def summary(self) -> dict[str, Any]:
        """JSON-friendly description for UIs, logs and the API."""
        return {
            "task": self.task,
            "frames": self.frames,
            "fps": round(self.fps, 4),
            "source_fps": round(self.source.fps, 4),
            "size": list(self.size),
            "codec": self.codec,
            "audio": "dropped",
            "files": [p.name for p in self.files],
            "notices": list(self.notices),
            "timing": {k: round(v, 3) for k, v in self.timing.items()},
            **self.details,
        }


def _batches(frames: Iterator[tuple[int, np.ndarray]], size: int, timing: dict[str, float]) -> Iterator[list]:
    while True:
        t0 = time.perf_counter()
        batch = list(islice(frames, size))
        timing["decode_s"] += time.perf_counter() - t0
        if not batch:
            return
        yield batch


def _run_batch(
    stages: Any,
    infer: Infer,
    handler: FrameHandler,
    batch: list,
    k0: int,
    fps: float,
    opts: dict,
    timing: dict,
) -> list:
    """Infer one batch; returns the rendered frames to write now (in order)."""
    items = []
    handler.prefetch([(k0 + j, rgb) for j, (_, rgb) in enumerate(batch)])
    for j, (frame, rgb) in enumerate(batch):
        frame_opts = handler.options_for(k0 + j, rgb)
        items.append((frame, rgb, load_image(rgb), frame_opts))
    todo = [(intake, fo) for _, _, intake, fo in items if fo is not None]

    def timed(preps: list, **options: Any) -> list:
        t0 = time.perf_counter()
        raws = list(infer(preps, **options))
        timing["infer_s"] += time.perf_counter() - t0
        return raws

    done = iter(run_batch(stages, [i for i, _ in todo], opts, timed, [fo for _, fo in todo]))
    out = []
    for j, (frame, rgb, _, fo) in enumerate(items):
        result = None if fo is None else next(done)
        info = getattr(result, "info", None)
        timing["model_s"] += float(getattr(info, "model_s", 0.0) or 0.0)
        rendered = handler.consume(k0 + j, frame, frame / fps, rgb, result)
        if rendered is not None:
            out.append(rendered)
    return out


def _process(
    plan: VideoPlan,
    limits: VideoLimits,
    stages: Any,
    infer: Infer,
    handler: FrameHandler,
    writers: tuple[VideoWriter, VideoWriter | None],
    opts: dict,
    timing: dict,
    batch_size: int,
    state: dict[str, Any],
    budget_s: float | None,
    take: int | None = None,
) -> Iterator[int]:
    """Every batch through the pipeline into the writer (and the frames read into the source
    writer, when there is one), yielding the frames done after each; ``state`` keeps the frames
    done and their (w, h), and why the run stopped early (``stopped``): a device error after some
    frames, or ``budget_s`` (seconds) about to run out."""
    writer, source = writers
    t0 = time.perf_counter()
    frames = iter_frames(plan.info, stride=plan.stride, limits=limits)
    if take is not None:
        frames = islice(frames, take)  # the first ``take`` frames (a plan cut to the quota)
    for batch in _batches(frames, batch_size, timing):
        done = state["done"]
        state["size"] = state["size"] if done else (batch[0][1].shape[1], batch[0][1].shape[0])
        tb = time.perf_counter()
        try:
            rendered_frames = _run_batch(stages, infer, handler, batch, done, plan.info.fps, opts, timing)
        except (Sapiens2Error, RuntimeError, MemoryError) as err:
            if not done or isinstance(err, InputImageError):
                raise
            state["stopped"] = f"the device failed ({err})"
            break
        for rendered in rendered_frames:
            writer.write(rendered)
        for _, rgb in batch if source is not None else ():
            source.write(rgb)  # type: ignore[union-attr]
        state["done"] = done + len(batch)
        yield state["done"]
        now = time.perf_counter()
        if budget_s is not None and (now - t0) + 1.5 * (now - tb) > budget_s:
            state["stopped"] = f"the GPU time reserved ({budget_s:.0f} s of work) was about to run out"
            break
    for rendered in handler.deferred():
        writer.write(rendered)


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


def iter_video(
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
    infer: Infer | None = None,
    detect_many: DetectMany | None = None,
    source_video: bool = False,
    name: str | None = None,
    budget_s: float | None = None,
    take: int | None = None,
    handler: FrameHandler | None = None,
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
    show_ids; seg/normal/matting: their result's ``render`` options. ``progress(done, planned)``
    after every batch. ``infer``: runs a batch's device work instead of ``pipe.infer`` (e.g. a
    ZeroGPU function taking the picklable preps; ``detect`` is pose's other device hook, and
    ``detect_many(rgbs)`` detects all of a batch's detection frames in one call instead).
    ``source_video``: also write the frames read (after stride and downscaling) as
    ``<name>_source.webm`` (``VideoResult.source_video``), for a side-by-side view that plays.
    ``handler``: the frame handler to use instead of the one the task's declaration names (a
    caller that needs more of each frame, e.g. :mod:`sapiens2.video.motion`).
    Writes ``<name>_<task>.webm`` and the downloads into ``out_dir``.
    Raises InputVideoError (bad clip, limits), OptionError, VideoEncodeError.
    """
    t_start = time.perf_counter()
    decl, opts = _checked(task or getattr(pipe, "task", None), batch_size, options)
    task = decl.name
    plan = plan_video(source, stride=stride, limits=limits)
    if take is not None:
        if isinstance(take, bool) or not isinstance(take, int) or take < 1:
            raise OptionError(f"take must be a whole number of frames >= 1, got {take!r}.")
        plan = VideoPlan(plan.info, plan.stride, take if plan.frames is None else min(plan.frames, take))
    stages = staged(pipe)
    handler = handler or handler_class(decl).build(
        decl, pipe, opts, render_options or {}, detect=detect, detect_many=detect_many, tracking=tracking,
        raw_cap=raw_cap_bytes, depth_percentiles=depth_percentiles,
    )  # fmt: skip
    out = Path(out_dir)
    stem = name or file_stem(plan.info.path.name, "clip")
    writer = VideoWriter(safe_path(out, stem, f"_{task}{VIDEO_SUFFIX}"), plan.fps_out)
    source = (
        VideoWriter(safe_path(out, stem, f"_source{VIDEO_SUFFIX}"), plan.fps_out) if source_video else None
    )
    timing = {"decode_s": 0.0, "infer_s": 0.0, "model_s": 0.0}
    state: dict[str, Any] = {"done": 0, "size": (0, 0), "stopped": None}
    try:
        with writer, source or contextlib.nullcontext():
            for done in _process(
                plan, limits, stages, infer or stages.infer, handler, (writer, source), opts, timing,
                batch_size, state, budget_s, take,
            ):  # fmt: skip
                yield done, plan.frames
            video = writer.close()
            source_path = source.close() if source is not None else None
    except BaseException:
        for w in (writer, source):
            if w is not None:
                with contextlib.suppress(OSError):
                    w.path.unlink(missing_ok=True)  # never leave a half-written video behind
        raise
    done, size = state["done"], state["size"]
    files = [video, *handler.exports(out, stem, fps=plan.fps_out, size=size)]
    timing["total_s"] = time.perf_counter() - t_start
    notices = _notices(plan, size, handler)
    if state["stopped"]:
        planned = "" if plan.frames is None else f" of {plan.frames}"
        notices.insert(0, f"Only the first {done}{planned} frames were processed: {state['stopped']}.")
    yield VideoResult(
        task=task, video=video, files=files, source=plan.info, frames=done, fps=plan.fps_out,
        size=size, codec=writer.codec or "", notices=notices, timing=timing,
        details={**handler.summary(), **({"stopped": state["stopped"]} if state["stopped"] else {})},
        source_video=source_path,
    )  # fmt: skip


#: Byte patterns of an audio track: MP4/MOV's sound handler ("hdlr" box, then "soun") and the
#: Matroska/WebM codec ids of audio tracks. GIFs never have sound.
_AUDIO = re.compile(rb"hdlr.{8}soun|A_(?:OPUS|VORBIS|AAC|MPEG|AC3|EAC3|FLAC|PCM)", re.DOTALL)


def has_audio(path: str | Path, chunk: int = 4 * 1024 * 1024) -> bool:
    """Whether the clip's container declares an audio track (a scan of its bytes, no decoder)."""
    try:
        with open(path, "rb") as fh:
            tail = b""
            while block := fh.read(chunk):
                if _AUDIO.search(tail + block):
                    return True
                tail = block[-32:]
    except OSError:
        return False
    return False


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
