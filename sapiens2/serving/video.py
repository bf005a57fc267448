"""Video requests for a server: a clip through a task in batches, one device call per batch.

The same split as photos (``serving.runner``): the clip is read, checked and planned here, the
models are loaded here (``ModelManager.prepare``), each batch's ``prepare`` and ``finish`` run
here, and only ``infer`` goes through the server's device call, once per batch, with a GPU
duration from that batch's frame count. Pose's person detection is device work too: the
detection frames of a batch go in one device call of their own (step ``"detect"``) before the
batch's forward, so a pose batch makes at most two calls.

Before a run, :meth:`VideoRequests.estimate` says what it will cost: GPU seconds per call on a
GPU, or minutes on a CPU from the model's size and a CPU rate (measured here, see
:data:`CPU_MACS_PER_S`), replaced by this server's own measurement once it has run a clip.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..errors import InputVideoError, OptionError, Sapiens2Error
from ..loadguard import loading_forbidden
from ..tasks import registry
from ..video.handlers import TrackingOptions
from ..video.reader import VideoLimits
from ..video.runner import VIDEO_TASKS, VideoPlan, VideoResult, default_detect, plan_video, run_video
from ..zerogpu import cost_notice
from ..zoo import ARCHS
from .cache import CUSTOM, ModelManager
from .folders import RequestFolders
from .gpu_time import MAX_CALL_S, clamp, start_seconds, weight_bytes, work_seconds
from .runner import run_on_device

#: (task, size, items, inference options, seconds, step) -> one result per item; step "infer"
#: (items: preps) or "detect" (items: RGB frames, pose only)
VideoDeviceCall = Callable[..., list[Any]]
#: Frames per device call at most; fewer when a call would exceed the GPU duration cap.
MAX_BATCH = 8
#: Multiply-accumulates per second of a 0.4b forward on this project's 2-core CPU: pointmap at
#: 1024x768 (1.26 T MACs) took 41.5 s a frame in ``python bench/video.py`` (docs/VIDEO.md).
CPU_MACS_PER_S = 3.0e10
#: Seconds of GPU work for one person detection (DETR-ResNet-50), as in pose's gpu_seconds.
DETECT_GPU_S = 1.0


def run_step(
    manager: ModelManager, task: str, size: str, items: list[Any], opts: dict[str, Any], step: str = "infer"
) -> list[Any]:
    """The device work of one video call, models already resident (never loads)."""
    if step == "infer":
        return run_on_device(manager, task, size, items, opts)
    if step != "detect":
        raise OptionError(f"Unknown device step {step!r}.")
    with loading_forbidden():
        detect = default_detect(manager.get(task, size, load=False), opts)
        return [detect(rgb) for rgb in items]


@dataclass
class VideoJob:
    """A checked video request (nothing loaded yet)."""

    task: registry.Task
    size: str
    clip: str
    plan: VideoPlan
    limits: VideoLimits
    infer_opts: dict[str, Any]
    render_opts: dict[str, Any]
    tracking: TrackingOptions

    @property
    def frame_pixels(self) -> int:
        """Pixels of one processed frame (after the long-side downscale)."""
        w, h = self.plan.info.width, self.plan.info.height
        scale = min(1.0, self.limits.max_side / max(w, h))
        return round(w * scale) * round(h * scale)


@dataclass(frozen=True)
class Estimate:
    """What a run will cost, said before it starts."""

    frames: int | None  # frames to process (None: the header gives no count)
    batch: int  # frames per device call
    gpu_call_s: int  # seconds reserved per forward call (on a GPU)
    calls: int | None  # device calls (forwards and detections)
    cpu_s: float | None  # whole-run seconds on this CPU (None on a GPU or when unknown)
    basis: str  # where the CPU figure comes from

    def line(self, gpu: bool) -> str:
        n = "an unknown number of" if self.frames is None else str(self.frames)
        if gpu:
            calls = "" if self.calls is None else f" in {self.calls} GPU calls"
            return f"{n} frames, {self.batch} per call{calls}, up to {self.gpu_call_s} s reserved per call."
        if self.cpu_s is None:
            return f"{n} frames on the CPU; no time estimate ({self.basis})."
        return f"{n} frames on the CPU: about {_duration(self.cpu_s)} ({self.basis})."


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def video_render_options(task: registry.Task, render_opts: Mapping[str, Any]) -> dict[str, Any]:
    """A task's rendering options as the video handlers take them."""
    if task.name == "pose":
        return dict(render_opts)  # the pose video handler takes the photo's names
    if task.name == "pointmap":
        return {}  # depth frames are coloured with the clip's bounds, no options
    return task.render_args(render_opts)


class VideoRequests:
    """Runs video requests for a server (the app; the CLI runs pipelines directly)."""

    def __init__(
        self,
        manager: ModelManager,
        folders: RequestFolders | None = None,
        device_call: VideoDeviceCall | None = None,
        limits: VideoLimits = VideoLimits(),
        announce: Callable[[str], None] | None = None,
    ) -> None:
        self.manager = manager
        self.folders = folders or RequestFolders()
        self.device_call = device_call or (
            lambda t, s, i, o, _sec, step="infer": run_step(manager, t, s, i, o, step)
        )
        self.limits = limits
        self.announce = announce
        self._lock = threading.Lock()
        self._measured: dict[tuple[str, str], float] = {}  # (task, size) -> seconds per frame here

    def job(
        self,
        task: str,
        clip: Any,
        size: str | None = None,
        *,
        stride: int = 1,
        max_frames: int | None = None,
        tracking: TrackingOptions = TrackingOptions(),
        options: Mapping[str, Any] | None = None,
    ) -> VideoJob:
        """Check a request and plan the clip (cheap: reads the header only)."""
        decl = registry.get(task)
        if decl.name not in VIDEO_TASKS:
            names = ", ".join(registry.get(t).api_name for t in VIDEO_TASKS)
            raise OptionError(f"Video runs the tasks {names}; got {task!r}.")
        if clip is None or (isinstance(clip, str) and not clip.strip()):
            raise InputVideoError("No clip given: upload an MP4, WebM, MOV or GIF clip.")
        limits = self.request_limits(max_frames)
        size = self.manager.resolve_size(decl.name, size)
        infer_opts, render_opts = decl.split(options or {}, gpu=self.manager.cuda)
        plan = plan_video(clip, stride=stride, limits=limits)
        return VideoJob(decl, size, str(clip), plan, limits, infer_opts, render_opts, tracking)

    def request_limits(self, max_frames: int | None) -> VideoLimits:
        """The server's limits, with ``max_frames`` lowered to the caller's when given."""
        if max_frames is None:
            return self.limits
        top = self.limits.max_frames
        if isinstance(max_frames, bool) or not isinstance(max_frames, int) or not 1 <= max_frames <= top:
            raise OptionError(f"max_frames must be a whole number from 1 to {top} (this server's limit).")
        return replace(self.limits, max_frames=max_frames)

    # -- cost ------------------------------------------------------------------------------

    def call_seconds(self, job: VideoJob, frames: int) -> int:
        """GPU seconds to reserve for one forward call of ``frames`` frames."""
        name, opts = job.task.name, job.infer_opts
        resident = max(self.manager.resident_bytes(), weight_bytes(name, job.size, opts))
        work = work_seconds(name, job.size, [job.frame_pixels] * frames, opts)
        return clamp(start_seconds(resident) + work)

    def detect_seconds(self, job: VideoJob, frames: int) -> int:
        resident = max(self.manager.resident_bytes(), weight_bytes(job.task.name, job.size, job.infer_opts))
        return clamp(start_seconds(resident) + DETECT_GPU_S * frames)

    def batch_size(self, job: VideoJob) -> int:
        """The most frames (<= MAX_BATCH) whose forward call fits the GPU duration cap."""
        n = MAX_BATCH
        while n > 1 and self.call_seconds(job, n) >= MAX_CALL_S:
            n -= 1
        return n

    def estimate(self, job: VideoJob) -> Estimate:
        frames, batch = job.plan.frames, self.batch_size(job)
        calls = None
        if frames is not None:
            calls = math.ceil(frames / batch)
            if job.task.name == "pose":  # one detection call per batch holding a detection frame
                calls += len({(k // batch) for k in range(0, frames, job.tracking.detect_every)})
        cpu_s, basis = (None, "GPU") if self.manager.cuda else self.cpu_seconds(job)
        return Estimate(frames, batch, self.call_seconds(job, batch), calls, cpu_s, basis)

    def cpu_seconds(self, job: VideoJob) -> tuple[float | None, str]:
        """Whole-run CPU seconds and where the figure comes from."""
        frames = job.plan.frames
        if frames is None:
            return None, "the clip's header gives no frame count"
        with self._lock:
            measured = self._measured.get((job.task.name, job.size))
        if measured is not None:
            return frames * measured, "measured on this server's last clip of this task and size"
        if self.manager.key(job.task.name, job.size)[1] == CUSTOM and not self._loaded(job):
            return None, "a custom checkpoint whose size is known once loaded: run once for a measured rate"
        per_frame = self.frame_macs(job) / CPU_MACS_PER_S
        basis = "from the model's size at a CPU rate measured on a 2-core machine; expect +-50%"
        if job.task.name == "pose":
            basis += "; one person per frame assumed, each more person adds as much again"
        return frames * per_frame, basis

    def _loaded(self, job: VideoJob) -> bool:
        return self.manager.key(job.task.name, job.size) in self.manager.loaded()

    def frame_macs(self, job: VideoJob) -> float:
        """Multiply-accumulates of one frame's forwards: parameters x tokens per forward."""
        name, opts = job.task.name, job.infer_opts
        forwards = [name, *job.task.needs(opts)]
        if name == "pose" and opts.get("flip_test"):
            forwards.append(name)
        return sum(self._forward_macs(t, job.size) for t in forwards)

    def _forward_macs(self, task: str, size: str) -> float:
        """Parameters x tokens of one forward: of the loaded model when there is one, else of
        the size's published backbone at the checkpoint's input size."""
        decl = registry.get(task)
        size_arg = size if size in decl.spec.sizes else None
        try:
            pipe = self.manager.get(task, size_arg, load=False)
            params = float(sum(p.numel() for p in pipe.model.parameters()))
            h, w = pipe.network_hw
        except Sapiens2Error:  # not loaded yet
            arch = ARCHS.get(size_arg or "") or ARCHS[decl.spec.default_size(False)]
            params = arch.params_b * 1e9
            h, w = decl.spec.input_size(arch.size)
        return params * (h // 16) * (w // 16)

    def _remember(self, job: VideoJob, result: VideoResult) -> None:
        if result.frames and not self.manager.cuda:
            with self._lock:
                self._measured[(job.task.name, job.size)] = result.timing["total_s"] / result.frames

    # -- running ---------------------------------------------------------------------------

    def run(self, job: VideoJob, progress: Callable[[int, int | None], None] | None = None) -> VideoResult:
        """Load (here), then every batch: prepare (here), infer (one device call), finish (here)."""
        name, size, opts = job.task.name, job.size, job.infer_opts
        estimate = self.estimate(job)
        self._tell(job, estimate)
        with self.manager.holding(self.manager.prepare(name, size, **opts)):
            pipe = self.manager.get(name, size)

            def infer(preps: list[Any], **o: Any) -> list[Any]:
                return self.device_call(name, size, preps, o, self.call_seconds(job, len(preps)))

            def detect_many(frames: list[Any]) -> list[Any]:
                return self.device_call(
                    name, size, frames, opts, self.detect_seconds(job, len(frames)), "detect"
                )

            result = run_video(
                pipe, job.clip, self.folders.new(), task=name, stride=job.plan.stride, limits=job.limits,
                batch_size=estimate.batch, options=opts,
                render_options=video_render_options(job.task, job.render_opts), tracking=job.tracking,
                progress=progress, infer=infer, detect_many=detect_many if name == "pose" else None,
                source_video=True,
            )  # fmt: skip
        self._remember(job, result)
        return result

    def _tell(self, job: VideoJob, estimate: Estimate) -> None:
        if self.announce is None:
            return
        if self.manager.cuda:
            total = estimate.gpu_call_s * (estimate.calls or 1)
            notice = cost_notice(total, f"This {job.task.tab.lower()} video run ({estimate.calls} GPU calls)")
            if notice:
                self.announce(notice)
        elif estimate.cpu_s is not None:
            self.announce(f"Running on the CPU: {estimate.line(False)}")


__all__ = ["Estimate", "VideoJob", "VideoRequests", "run_step", "video_render_options"]
