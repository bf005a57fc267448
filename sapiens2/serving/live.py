"""Live: a camera's frames through a task, one at a time, always the newest.

A :class:`LiveSession` is one viewer's stream: per frame it loads the models (a cache hit after
the first), prepares, runs the device step, finishes and renders the way the task's video
declaration says (pose: tracked and smoothed people; pointmap: depth on a slowly following
colour scale; the others: the result's own rendering). Only the newest frame ever waits
(:class:`~sapiens2.serving.live_stream.LatestFrame`), so a frame's latency is at most the time
of the frame before it plus its own. The device step is the server's
:data:`~sapiens2.serving.device.Device`, each unit priced by :mod:`sapiens2.models.cost`.
docs/LIVE.md has the knobs and the figures. Nothing here imports Gradio.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import cv2
import numpy as np

from ..data.keypoint_sets import BY_NAME, GOLIATH308
from ..inputs.intake import load_image
from ..models import cost
from ..models.zoo import ARCHS
from ..tasks.base import finish_batch, prepare_batch
from ..tasks.clip_frames import handler_class
from ..tasks.pointmap.frame_depth_colours import DepthScale, foreground_depth, render_depth_frame
from ..tasks.pointmap.pointmap_clip import DepthFrames
from ..tasks.pose.pose_clip import PoseFrames
from ..tasks.pose.pose_tracking import FramePeople, PoseTracking, draw_people
from ..tasks.registry import Task
from .cache import ModelManager
from .device import Batch, Detect, Device, OneTask, local_device
from .frame_cost import frame_macs, served_frame_macs
from .live_setup import (
    INPUTS,
    LIVE_SIZE,
    MAX_SIDE,
    RESTART_AFTER_S,
    LiveOptions,
    LiveSetup,
    input_label,
    live_setup,
    live_size,
    model_label,
)
from .live_stream import LatestFrame, LiveFrame, LiveStats
from .present import Stages
from .request_runner import model_sizes


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
        self._setup: LiveSetup | None = None
        self._k = 0  # frames processed with this setup
        self._last_done: float | None = None  # when the previous frame was rendered
        self._args: tuple[str, dict[str, Any]] | None = None

    # -- options ---------------------------------------------------------------------------

    def _price(self, setup: LiveSetup) -> LiveSetup:
        """The reservations of the setup's device calls (:mod:`sapiens2.models.cost`). They walk
        the resident models' weights (a millisecond a frame), so a stream prices each choice once,
        with its models loaded (:meth:`step`), and keeps the prices while the choice stands."""
        setup.seconds = frame_seconds(self.manager, setup.decl, setup.size, setup.infer_opts)
        setup.detect_seconds = cost.detect_reservation(1, self.manager.resident_bytes())
        return setup

    def _configure(self, options: LiveOptions, at: float) -> LiveSetup:
        setup = live_setup(self.manager, options)
        restart = self._last_done is not None and at - self._last_done > RESTART_AFTER_S
        if self._setup is None or setup.key != self._setup.key or restart:
            # the state a stream keeps is its declared handler's (tracks: people; depth: colour scale)
            handler = handler_class(setup.decl) if setup.decl.video else None
            if handler is not None and issubclass(handler, PoseFrames):
                threshold = float({**setup.decl.video_render_defaults(), **setup.given}["threshold"])
                setup.people = PoseTracking(options.tracking, threshold)
            elif handler is not None and issubclass(handler, DepthFrames):
                setup.scale = DepthScale()
            self.stats, self._k = LiveStats(), 0
        else:  # same model and stream: keep the tracks and the colour scale, take the new rendering
            setup.people, setup.scale = self._setup.people, self._setup.scale
            setup.keypoints = self._setup.keypoints  # named still on a frame with nobody in it
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
        # body parts and the borrowed foreground: the network's argmax enlarged nearest-neighbour,
        # not the photo tab's exact resize (tasks/seg/seg_nearest.py; tasks without labels ignore it)
        opts["nearest_labels"] = True
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
        kset = getattr(result, "keypoint_set", None)  # a Sapiens v1 17 / 133 model's, lifted to 308
        if kset and kset != GOLIATH308.name:
            setup.keypoints = BY_NAME[kset].label
        with stages.timed("render"):
            image = self._render(setup, intake.rgb, result, people, at)
        done = self.clock()
        model_s = float(getattr(getattr(result, "info", None), "model_s", 0.0) or 0.0)
        self.stats.add(done, done - at, model_s, done - t0, dropped)
        self._k += 1
        self._last_done = done
        readout = f"{model_label(setup)} · input {setup.input_note} · {self.stats.line()}"
        return LiveFrame(image, readout, model_s, done - t0, done - at, stages.seconds)

    def _infer(
        self,
        pipe: Any,
        setup: LiveSetup,
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

    def _people(self, setup: LiveSetup, rgb: np.ndarray) -> FramePeople | None:
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
        self, setup: LiveSetup, rgb: np.ndarray, result: Any, people: FramePeople | None, at: float
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

    def _render_args(self, setup: LiveSetup) -> dict[str, Any]:
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
    resident = cost.resident_for(manager.resident_bytes(), model_sizes(task, size, infer_opts))
    return cost.frame_reservation(size, task.work(infer_opts), resident)


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
    return None if macs is None else cost.cpu_forward_seconds(macs)


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
    "model_label",
]
