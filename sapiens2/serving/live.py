"""Live: a camera's frames through a task, one at a time, always the newest.

A :class:`LiveSession` is one viewer's stream. Per frame (:meth:`LiveSession.step`): load the
models here (``ModelManager.prepare``, a cache hit after the first frame), prepare, the device
step, finish, then render the way the task's video declaration says (``Task.video.handler``):

* ``tracks`` (pose): the person detector every K-th frame, the tracker's boxes in between, the
  keypoints smoothed along each track (:class:`sapiens2.video.people.PoseTracking`, the same
  state a clip uses), drawn with ``#id`` labels;
* ``depth`` (pointmap): turbo on one colour scale that follows the frames slowly
  (:class:`sapiens2.video.depth.DepthScale`) instead of re-stretching every frame;
* ``frames`` (body parts, normals, matting, albedo): the result's own rendering with the task's
  rendering options (matting: the background colour or picture, a live virtual background).

**Never a backlog.** Only the newest frame is ever waiting: :class:`LatestFrame` is a mailbox of
one, where a frame that arrives before the previous one was taken replaces it and is counted as
dropped. :meth:`LiveSession.run` serves a :class:`LatestFrame` until it is closed (the library's
and ``bench/live.py``'s loop); in the app, Gradio's streaming event is the mailbox (a frame posted
while the handler runs replaces the pending one: ``gradio/routes.py``, ``/stream/{event_id}``)
and the page counts what it replaced (``sapiens2.ui.live_tab``). Either way the latency of a
frame is at most the time of the frame before it plus its own, however slow the model is.

**The device step** is the server's :data:`~sapiens2.serving.device.Device` running units of
device work like any request: each frame's forward is a :class:`~sapiens2.serving.device.OneTask`
of a ``Batch``, pose's person detection (every K-th frame) one of a ``Detect``, each priced
by :mod:`sapiens2.models.cost` (:func:`~sapiens2.models.cost.frame_seconds`). In the app that is
the one GPU entry; the tab is a notice on ZeroGPU, where a unit per frame is an admission per
frame (docs/LIVE.md).

**Speed knobs.** The model size (default :data:`LIVE_SIZE` where the task offers it), the network
input (:data:`INPUTS`: the release's, or a smaller one that is not what the weights were trained
on, said in its label), and flip test off (the task's default on a CPU; pose's flip test doubles
its forward). Nothing here imports Gradio.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np

from ..errors import OptionError
from ..inputs.intake import load_image
from ..models import cost
from ..models.zoo import ARCHS
from ..tasks.base import finish_batch, prepare_batch
from ..tasks.registry import Task
from ..video.depth import DepthScale, foreground_depth, render_depth_frame
from ..video.frame_handlers import HANDLERS, DepthFrames, PoseFrames
from ..video.people import FramePeople, PoseTracking, TrackingOptions, draw_people
from .cache import ModelManager
from .device import Batch, Detect, Device, OneTask, local_device
from .frame_cost import frame_macs, served_frame_macs
from .present import Stages
from .request_runner import model_sizes

#: The model size a live view starts with where the task offers it (else the task's default).
LIVE_SIZE = "0.4b"
#: The network inputs offered: key -> (H, W), None = the checkpoint's own (the release's
#: 1024x768). The others run faster but are not what the weights were trained on.
INPUTS: dict[str, tuple[int, int] | None] = {"release": None, "768x576": (768, 576), "512x384": (512, 384)}
#: Frames with a longer side are downscaled first (INTER_AREA): a webcam's 1080p gains nothing.
MAX_SIDE = 1280
#: A frame arriving this long after the previous one was rendered starts the stream afresh (tracks,
#: colour scale, figures): the camera was stopped and started again.
RESTART_AFTER_S = 3.0
#: Frames the readout's rates and percentiles are taken over.
WINDOW = 30


def input_label(key: str) -> str:
    """How the knob names an input: the release's, or faster and not the release's."""
    hw = INPUTS.get(key)
    if hw is None:
        return "1024x768 (the release's input)"
    return f"{hw[0]}x{hw[1]} (faster; not the release's input)"


@dataclass(frozen=True)
class LiveOptions:
    """What a viewer chose. ``task``: a task that declares ``video`` (looked up by the caller);
    ``size``: None = :data:`LIVE_SIZE` where offered; ``input``: a key of :data:`INPUTS`;
    ``task_options``: the task's own options (e.g. matting's ``background_color`` or
    ``background_image``, pointmap's ``use_segmentation``), checked against its declaration;
    names the task does not declare are left out (one viewer's knobs serve every task);
    ``tracking``: pose over time."""

    task: Task
    size: str | None = None
    input: str = "release"
    flip_test: bool = False
    task_options: Mapping[str, Any] = field(default_factory=dict)
    tracking: TrackingOptions = TrackingOptions()


class LatestFrame:
    """A mailbox of one frame: :meth:`put` replaces a frame nobody took yet (counted in
    ``dropped``), :meth:`take` waits for the newest. Thread-safe; :meth:`close` ends a waiting
    :meth:`take` (it then returns None)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._item: tuple[np.ndarray, float] | None = None
        self._closed = False
        self.put_count = 0
        self.dropped = 0

    def put(self, frame: np.ndarray, at: float | None = None) -> None:
        """Offer ``frame`` (captured at ``at``, ``time.perf_counter()`` seconds; default now)."""
        with self._cond:
            if self._item is not None:
                self.dropped += 1
            self._item = (frame, time.perf_counter() if at is None else float(at))
            self.put_count += 1
            self._cond.notify()

    def take(self, timeout: float | None = None) -> tuple[np.ndarray, float] | None:
        """The newest frame and its capture time, or None when closed or after ``timeout`` s."""
        with self._cond:
            self._cond.wait_for(lambda: self._item is not None or self._closed, timeout)
            item, self._item = self._item, None
            return item

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed


def _percentile(values: deque[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


class LiveStats:
    """What the readout says: frames done and dropped since the stream (re)started, and over the
    last :data:`WINDOW` frames the rate, the latency (capture to rendered), the model's share and
    the rest (``overhead``: everything but the forward)."""

    def __init__(self, window: int = WINDOW) -> None:
        self.frames = 0
        self.dropped = 0
        self.done_at: deque[float] = deque(maxlen=window)
        self.latency_ms: deque[float] = deque(maxlen=window)
        self.model_ms: deque[float] = deque(maxlen=window)
        self.overhead_ms: deque[float] = deque(maxlen=window)

    def add(self, done_at: float, latency_s: float, model_s: float, step_s: float, dropped: int) -> None:
        self.frames += 1
        self.dropped = max(0, self.dropped + int(dropped))  # a caller may correct an early count (-1)
        self.done_at.append(done_at)
        self.latency_ms.append(1e3 * latency_s)
        self.model_ms.append(1e3 * model_s)
        self.overhead_ms.append(1e3 * max(0.0, step_s - model_s))

    @property
    def fps(self) -> float:
        """Frames per second over the window (NaN before two frames)."""
        if len(self.done_at) < 2 or self.done_at[-1] <= self.done_at[0]:
            return float("nan")
        return (len(self.done_at) - 1) / (self.done_at[-1] - self.done_at[0])

    def summary(self) -> dict[str, Any]:
        """JSON-friendly figures over the window, for a caller to log or store (docs/LIVE.md)."""
        return {
            "frames": self.frames,
            "dropped": self.dropped,
            "fps": round(self.fps, 3),
            "model_ms_p50": round(_percentile(self.model_ms, 50), 2),
            "overhead_ms_p50": round(_percentile(self.overhead_ms, 50), 2),
            "latency_ms_p50": round(_percentile(self.latency_ms, 50), 2),
            "latency_ms_p95": round(_percentile(self.latency_ms, 95), 2),
        }

    def line(self) -> str:
        fps = self.fps
        rate = "-" if fps != fps else f"{fps:.1f}"
        return (
            f"{rate} frames/s · latency {_percentile(self.latency_ms, 50):.0f} ms "
            f"(p95 {_percentile(self.latency_ms, 95):.0f}) · model {_percentile(self.model_ms, 50):.0f} ms · "
            f"{self.frames} frames, {self.dropped} dropped"
        )


@dataclass
class LiveFrame:
    """One rendered frame and the readout after it."""

    image: np.ndarray  # (H, W, 3) uint8 RGB
    readout: str
    model_s: float  # the forwards' time of this frame
    step_s: float  # this frame's time in :meth:`LiveSession.step`
    latency_s: float  # capture (or arrival) to rendered
    stages: dict[str, float] = field(default_factory=dict)  # seconds: decode, load, people, prepare, ...


@dataclass
class _Setup:
    """What a choice of options resolves to (kept until the options change)."""

    key: tuple[Any, ...]
    decl: Task
    size: str
    size_label: str
    hw: tuple[int, int] | None
    input_note: str
    infer_opts: dict[str, Any]
    render_opts: dict[str, Any]  # every rendering option, defaults filled in
    given: dict[str, Any]  # the rendering options the viewer gave
    seconds: int = 0  # what a frame's call reserves (models/cost.py); 0: not priced yet
    detect_seconds: int = 0  # what a detection call reserves
    people: PoseTracking | None = None
    scale: DepthScale | None = None


def live_size(manager: ModelManager, task: Task, size: str | None = None) -> str:
    """The model size a live view of ``task`` runs: ``size`` when given (checked; OptionError
    names the sizes), else :data:`LIVE_SIZE` where the task offers it, else the task's default."""
    if not size:
        size = LIVE_SIZE if LIVE_SIZE in manager.sizes(task) else None
    return manager.resolve_size(task, size)


def live_setup(manager: ModelManager, options: LiveOptions) -> _Setup:
    """Check ``options`` (OptionError naming the bad one) into what a frame needs, not yet priced
    (:meth:`LiveSession.step` prices it once its models are loaded)."""
    decl = options.task
    if not isinstance(decl, Task) or decl.video is None:
        names = ", ".join(t.name for t in manager.video_tasks().values())
        raise OptionError(f"Live runs the tasks {names}; got {getattr(decl, 'name', decl)!r}.")
    if options.input not in INPUTS:
        raise OptionError(f"The live input must be one of {', '.join(INPUTS)}; got {options.input!r}.")
    if not isinstance(options.flip_test, bool):
        raise OptionError(f"flip_test must be true or false; got {options.flip_test!r}.")
    size = live_size(manager, decl, options.size)
    declared = {o.name for o in decl.options}
    values = {k: v for k, v in options.task_options.items() if v is not None and k in declared}
    if "flip_test" in declared:
        values["flip_test"] = options.flip_test
    infer_opts, render_opts = decl.split(values, gpu=manager.cuda)
    hw, note = INPUTS[options.input], input_label(options.input)
    if hw is not None and getattr(decl.pipeline, "fixed_input", False):
        hw, note = None, f"1024x768 ({decl.tab} runs only at the release's input)"
    key = (decl, size, hw, infer_opts.get("flip_test"), options.tracking)
    given = {k: render_opts[k] for k in values if k in render_opts}
    label = manager.key(decl, size)[1]
    return _Setup(key, decl, size, label, hw, note, infer_opts, render_opts, given)


class LiveSession:
    """One viewer's stream (see the module docstring). ``device``: runs the units of device work
    (default :func:`~sapiens2.serving.device.local_device`: in this process, models resident,
    never loading). Not thread-safe: one stream calls :meth:`step` one frame at a time."""

    def __init__(
        self,
        manager: ModelManager,
        device: Device | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.manager = manager
        self.device = device or local_device(manager)
        self.clock = clock
        self.stats = LiveStats()
        self._setup: _Setup | None = None
        self._k = 0  # frames processed with this setup
        self._last_done: float | None = None  # when the previous frame was rendered
        self._args: tuple[str, dict[str, Any]] | None = None

    # -- options ---------------------------------------------------------------------------

    def _price(self, setup: _Setup) -> _Setup:
        """The reservations of the setup's device calls (:mod:`sapiens2.models.cost`). They walk
        the resident models' weights (a millisecond a frame), so a stream prices each choice once,
        with its models loaded (:meth:`step`), and keeps the prices while the choice stands."""
        setup.seconds = frame_seconds(self.manager, setup.decl, setup.size, setup.infer_opts)
        setup.detect_seconds = cost.reservation(cost.detect_seconds(1), self.manager.resident_bytes())
        return setup

    def _configure(self, options: LiveOptions, at: float) -> _Setup:
        setup = live_setup(self.manager, options)
        restart = self._last_done is not None and at - self._last_done > RESTART_AFTER_S
        if self._setup is None or setup.key != self._setup.key or restart:
            # the state a stream keeps is its declared handler's (tracks: people; depth: colour scale)
            handler = HANDLERS[setup.decl.video.handler] if setup.decl.video else None
            if handler is not None and issubclass(handler, PoseFrames):
                threshold = float({**setup.decl.video_render_defaults(), **setup.given}["threshold"])
                setup.people = PoseTracking(options.tracking, threshold)
            elif handler is not None and issubclass(handler, DepthFrames):
                setup.scale = DepthScale()
            self.stats, self._k = LiveStats(), 0
        else:  # same model and stream: keep the tracks and the colour scale, take the new rendering
            setup.people, setup.scale = self._setup.people, self._setup.scale
            if repr(sorted(setup.infer_opts.items())) == repr(sorted(self._setup.infer_opts.items())):
                setup.seconds, setup.detect_seconds = self._setup.seconds, self._setup.detect_seconds
        self._setup = setup
        return setup

    # -- one frame -------------------------------------------------------------------------

    def step(
        self,
        frame: np.ndarray | bytes,
        options: LiveOptions,
        *,
        captured_at: float | None = None,
        dropped: int = 0,
    ) -> LiveFrame:
        """Process one frame: an RGB array or an image file's bytes (a JPEG from the page), any
        size (a long side above :data:`MAX_SIDE` is downscaled).
        ``captured_at``: when the frame was captured or arrived (``clock`` seconds; default now);
        ``dropped``: frames replaced before this one was taken (added to the count; a caller that
        counted a frame one step early may give -1 to take it back)."""
        t0 = self.clock()
        at = t0 if captured_at is None else float(captured_at)
        setup = self._configure(options, at)
        stages = Stages()
        with stages.timed("decode"):
            intake = load_image(_bounded(frame))
        decl, size, opts = setup.decl, setup.size, dict(setup.infer_opts)
        if setup.hw is not None:
            opts["input_hw"] = setup.hw
        with stages.timed("load"):
            held = self.manager.prepare(decl, size, **setup.infer_opts)  # a cache hit, after the first
            if not setup.seconds:
                self._price(setup)
        with self.manager.holding(held):
            pipe = self.manager.get(decl, size)
            with stages.timed("people"):
                people = self._people(setup, intake.rgb)
            result = self._infer(pipe, setup, intake, opts, people, stages)
        with stages.timed("render"):
            image = self._render(setup, intake.rgb, result, people, at)
        done = self.clock()
        model_s = float(getattr(getattr(result, "info", None), "model_s", 0.0) or 0.0)
        self.stats.add(done, done - at, model_s, done - t0, dropped)
        self._k += 1
        self._last_done = done
        readout = f"{decl.tab} {setup.size_label} · input {setup.input_note} · {self.stats.line()}"
        return LiveFrame(image, readout, model_s, done - t0, done - at, stages.seconds)

    def _infer(
        self,
        pipe: Any,
        setup: _Setup,
        intake: Any,
        opts: dict[str, Any],
        people: FramePeople | None,
        stages: Stages,
    ) -> Any:
        """prepare -> the device step -> finish for one frame (None: pose with nobody to infer)."""
        per_item = None if people is None else people.pose_options()
        if people is not None and per_item is None:
            return None
        extra = None if per_item is None else [per_item]
        with stages.timed("prepare"):
            preps = prepare_batch(pipe, [intake], opts, extra)
        with stages.timed("device"):
            [raws] = self.device(OneTask(Batch(setup.decl, setup.size, tuple(preps), opts), setup.seconds))
        with stages.timed("finish"):
            [result] = finish_batch(pipe, raws, [intake], opts, extra)
        return result

    def _people(self, setup: _Setup, rgb: np.ndarray) -> FramePeople | None:
        """Pose: the people of this frame (the detector's every K-th frame, one
        :class:`~sapiens2.serving.device.Detect` in a ``OneTask`` unit; else the tracks')."""
        if setup.people is None:
            return None
        found = None
        if setup.people.detects(self._k):
            unit = OneTask(Detect(setup.decl, setup.size, (rgb,), setup.infer_opts), setup.detect_seconds)
            [[found]] = self.device(unit)
        return setup.people.people(self._k, rgb, found)

    def _render(
        self, setup: _Setup, rgb: np.ndarray, result: Any, people: FramePeople | None, at: float
    ) -> np.ndarray:
        if setup.people is not None and people is not None:
            kp = np.zeros((0, 308, 2), np.float32) if result is None else result.keypoints
            scores = np.zeros((0, 308), np.float32) if result is None else result.scores
            smooth = setup.people.follow(at, people, kp, scores)
            options = {**setup.decl.video_render_defaults(), **setup.given}
            return draw_people(rgb, people, smooth, np.asarray(scores, np.float32), options)
        if setup.scale is not None:
            depth = foreground_depth(result.depth, result.mask)
            return render_depth_frame(depth, setup.scale.update(depth, at))
        return result.render(**self._render_args(setup))

    def _render_args(self, setup: _Setup) -> dict[str, Any]:
        """The result's ``render`` keywords, made once per choice (a background picture is read
        once, not every frame)."""
        key = repr(sorted(setup.render_opts.items()))
        if self._args is None or self._args[0] != key:
            self._args = (key, setup.decl.render_args(setup.render_opts))
        return self._args[1]

    # -- a stream --------------------------------------------------------------------------

    def run(
        self,
        frames: LatestFrame,
        options: LiveOptions | Callable[[], LiveOptions],
        emit: Callable[[LiveFrame], None],
        idle_s: float = RESTART_AFTER_S,
    ) -> LiveStats:
        """Serve ``frames`` until it is closed or stays empty for ``idle_s`` seconds: each turn
        takes the newest frame (older ones were dropped by the mailbox) and hands the rendered
        frame to ``emit``. ``options``: fixed, or a function read every frame (a viewer's
        knobs). Returns the stats of the stream; its drops are all the mailbox's (one mailbox is
        one stream), those before the first frame was taken too."""
        counted = 0
        while True:
            item = frames.take(timeout=idle_s)
            if item is None:
                return self.stats
            frame, at = item
            dropped, counted = frames.dropped - counted, frames.dropped
            chosen = options() if callable(options) else options
            emit(self.step(frame, chosen, captured_at=at, dropped=dropped))


def _bounded(frame: Any) -> np.ndarray:
    """The frame as (H, W, 3) uint8 RGB with its long side at most :data:`MAX_SIDE`."""
    if (
        not isinstance(frame, np.ndarray)
        or frame.ndim != 3
        or frame.shape[2] not in (3, 4)
        or frame.dtype != np.uint8
    ):
        return load_image(frame, max_side=MAX_SIDE).work
    rgb = frame[..., :3]
    h, w = rgb.shape[:2]
    if max(h, w) <= MAX_SIDE:
        return rgb
    scale = MAX_SIDE / max(h, w)
    return cv2.resize(rgb, (max(1, round(w * scale)), max(1, round(h * scale))), interpolation=cv2.INTER_AREA)


def frame_seconds(manager: ModelManager, task: Task, size: str, infer_opts: dict[str, Any]) -> int:
    """What one frame's device call reserves: :func:`sapiens2.models.cost.reservation` of the
    frame's work (:func:`~sapiens2.models.cost.frame_seconds`) with at least its own models
    resident (the models it borrows at their default size where ``size`` is not theirs)."""
    resident = max(manager.resident_bytes(), cost.weight_bytes(model_sizes(task, size, infer_opts)))
    return cost.reservation(cost.frame_seconds(size, task.work(infer_opts)), resident)


def cpu_seconds_per_frame(
    task: Task,
    size: str,
    hw: tuple[int, int] | None,
    infer_opts: Mapping[str, Any] | None = None,
    manager: ModelManager | None = None,
) -> float | None:
    """What a frame costs on this project's 2-core CPU: the frame's multiply-accumulates
    (:func:`sapiens2.serving.video.frame_macs`: the task's own forwards, twice with pose's flip
    test, and the ones it borrows, at the network input ``hw``) at
    :data:`~sapiens2.models.cost.CPU_MACS_PER_S`; None for a size of no published backbone.
    ``infer_opts``: the task's inference options (default: its CPU defaults). Pose counts one
    person. ``manager``: the server's models instead (:func:`~sapiens2.serving.frame_cost.served_frame_macs`,
    the Video tab's figure: a loaded custom checkpoint counts its own weights)."""
    opts = task.defaults() if infer_opts is None else infer_opts
    if manager is not None:
        macs, _ = served_frame_macs(manager, task, size, opts, hw)
    else:
        macs = frame_macs(task, size, opts, hw) if size in ARCHS else None
    return None if macs is None else macs / cost.CPU_MACS_PER_S


__all__ = [
    "INPUTS",
    "LIVE_SIZE",
    "LatestFrame",
    "LiveFrame",
    "LiveOptions",
    "LiveSession",
    "LiveStats",
    "cpu_seconds_per_frame",
    "frame_seconds",
    "input_label",
    "live_setup",
    "live_size",
]
