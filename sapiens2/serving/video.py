"""Video requests for a server: a clip through a task with ONE device call (one GPU admission).

The clip is checked and planned here and its models loaded here. This process decodes, prepares,
finishes, renders and writes the clip (:class:`~sapiens2.video.clip_runner.ClipRun`); only the
batch forwards and pose's person detections go to the one device call
(:class:`~sapiens2.serving.clip_call.ClipCall`), whose reservation :mod:`sapiens2.models.cost`
prices. A plan that would not fit a visitor's quota is reduced up front (a larger stride, then
fewer frames) and the page says so; a refusal for quota runs the frames that fit the seconds left,
and a device failure partway keeps the frames done. :meth:`VideoRequests.estimate` says first what
a run will cost: the GPU seconds requested, or the time on a CPU.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..errors import GpuUnavailableError, InputVideoError, OptionError
from ..models import cost
from ..tasks.clip_frames import handler_class
from ..tasks.pose.pose_tracking import TrackingOptions
from ..tasks.registry import Task, Video
from ..video.clip_plan import VideoPlan, VideoResult, plan_video
from ..video.clip_runner import ClipRun, clip_run
from ..video.reader import VideoLimits
from ..zerogpu.quota import cost_notice, gpu_request
from .cache import ModelManager
from .clip_call import ClipCall
from .device import Device, local_device
from .folders import RequestFolders
from .frame_cost import forward_macs, frame_macs, frame_network_pixels, served_frame_macs
from .request_runner import model_sizes

#: Frames per forward inside the clip's call.
MAX_BATCH = 8
#: The largest stride a reduced plan uses before it cuts frames instead.
MAX_AUTO_STRIDE = 10


@dataclass
class VideoJob:
    """A checked video request (nothing loaded yet)."""

    task: Task
    size: str
    clip: str
    plan: VideoPlan
    limits: VideoLimits
    infer_opts: dict[str, Any]
    render_opts: dict[str, Any]
    tracking: TrackingOptions
    reduced: str | None = None  # why the plan was reduced to fit the GPU quota (said before it runs)
    take: int | None = None  # only the first frames (after the stride): a plan cut to the quota
    handler: Any = None  # a frame handler instead of the declaration's (motion's pointmap pass)

    @property
    def frames(self) -> int:
        """Frames the run will process (the server's limit when the header gives no count)."""
        n = self.plan.frames or self.limits.max_frames
        return n if self.take is None else min(n, self.take)

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
    batch: int  # frames per forward
    gpu_call_s: int  # seconds the clip's one GPU call requests (on a GPU)
    calls: int | None  # GPU calls (admissions): 1
    cpu_s: float | None  # whole-run seconds on this CPU (None on a GPU or when unknown)
    basis: str  # where the CPU figure comes from
    reduced: str | None = None  # the plan was reduced to fit the quota: why and how

    def line(self, gpu: bool) -> str:
        n = "an unknown number of" if self.frames is None else str(self.frames)
        if gpu:
            charged = gpu_request(self.gpu_call_s).charged_s
            text = (
                f"{n} frames in one GPU call, {self.batch} per forward: requests {self.gpu_call_s} s of GPU "
                f"(up to {charged} s of ZeroGPU quota on the slowest node)."
            )
            return f"{self.reduced} {text}" if self.reduced else text
        if self.cpu_s is None:
            return f"{n} frames on the CPU; no time estimate ({self.basis})."
        return f"{n} frames on the CPU: about {_duration(self.cpu_s)} ({self.basis})."


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def _video(task: Task) -> Video:
    """The task's video declaration (OptionError when it runs no video)."""
    handler_class(task)
    assert task.video is not None
    return task.video


def video_render_options(task: Task, render_opts: Mapping[str, Any]) -> dict[str, Any]:
    """A task's rendering options as its video handler takes them (``Task.video.handler``)."""
    return handler_class(task).render_kwargs(task, render_opts)


class VideoRequests:
    """Runs video requests for a server (the app; the CLI runs pipelines directly)."""

    def __init__(
        self,
        manager: ModelManager,
        folders: RequestFolders | None = None,
        device: Device | None = None,
        limits: VideoLimits = VideoLimits(),
        announce: Callable[[str], None] | None = None,
    ) -> None:
        self.manager = manager
        self.folders = folders or RequestFolders()
        self.device = device or local_device(manager)  # runs the clip's one unit of device work
        self.limits = limits
        self.announce = announce
        self._lock = threading.Lock()
        self._measured: dict[tuple[str, str], float] = {}  # (task, size) -> seconds per frame here

    def job(
        self,
        task: Task,
        clip: Any,
        size: str | None = None,
        *,
        stride: int = 1,
        max_frames: int | None = None,
        tracking: TrackingOptions = TrackingOptions(),
        options: Mapping[str, Any] | None = None,
        fit: bool = True,
    ) -> VideoJob:
        """Check a request and plan the clip (cheap: reads the header only); on a GPU ``fit``
        reduces the plan to what one call may request (:meth:`fitted`)."""
        handler_class(task, self.manager.video_tasks())  # OptionError unless it declares video
        if clip is None or (isinstance(clip, str) and not clip.strip()):
            raise InputVideoError("No clip given: upload an MP4, WebM, MOV or GIF clip.")
        limits = self.request_limits(max_frames)
        size = self.manager.resolve_size(task, size)
        infer_opts, render_opts = task.split(options or {}, gpu=self.manager.cuda)
        plan = plan_video(clip, stride=stride, limits=limits)
        job = VideoJob(task, size, str(clip), plan, limits, infer_opts, render_opts, tracking)
        return self.fitted(job) if self.manager.cuda and fit else job

    def fitted(self, job: VideoJob, quota_s: int | None = None, also: tuple[VideoJob, ...] = ()) -> VideoJob:
        """``job``, or a reduced plan when its one GPU call (with the jobs ``also`` in the same
        call, over the same frames) would request more than ``quota_s`` seconds of quota
        (default: what a visitor without an account can start): a larger stride first (the
        whole clip stays covered), then only the first frames."""
        if self._fits(job, job.frames, quota_s, also):
            return job
        total = job.plan.frames or job.limits.max_frames
        stride, frames = job.plan.stride, job.frames
        plan = job.plan
        if quota_s is None:
            while stride < MAX_AUTO_STRIDE and not self._fits(job, frames, quota_s, also):
                stride += 1
                frames = math.ceil(total * job.plan.stride / stride)
            plan = plan_video(job.clip, stride=stride, limits=job.limits)
        while frames > 1 and not self._fits(job, frames, quota_s, also):
            frames -= 1
        why = (
            f"your ZeroGPU quota has {quota_s} s left"
            if quota_s is not None
            else "one GPU call must fit the 120 s of ZeroGPU quota a visitor without an account has"
        )
        take = frames if frames < (plan.frames or job.limits.max_frames) else None
        first = f"the first {frames}" if take else str(frames)
        reduced = (
            f"Reduced to {first} frames (every {stride} frame(s)) from {job.frames} "
            f"(every {job.plan.stride}): {why}."
        )
        return replace(job, plan=plan, reduced=reduced, take=take)

    def _fits(self, job: VideoJob, frames: int, quota_s: int | None, also: tuple[VideoJob, ...] = ()) -> bool:
        jobs = (job, *also)
        return cost.call_fits(sum(self.clip_work(j, frames) for j in jobs), self._resident(*jobs), quota_s)

    def request_limits(self, max_frames: int | None) -> VideoLimits:
        """The server's limits, with ``max_frames`` lowered to the caller's when given."""
        if max_frames is None:
            return self.limits
        top = self.limits.max_frames
        if isinstance(max_frames, bool) or not isinstance(max_frames, int) or not 1 <= max_frames <= top:
            raise OptionError(f"max_frames must be a whole number from 1 to {top} (this server's limit).")
        return replace(self.limits, max_frames=max_frames)

    # -- cost ------------------------------------------------------------------------------

    def _resident(self, *jobs: VideoJob) -> int:
        sizes = [s for j in jobs for s in model_sizes(j.task, j.size, j.infer_opts)]
        return cost.resident_for(self.manager.resident_bytes(), sizes)

    def clip_work(self, job: VideoJob, frames: int) -> float:
        """Seconds of device work of the clip's one call for ``frames`` frames (start excluded):
        ``sapiens2.models.cost.clip_seconds`` of the task's shape of work, in batches of
        :data:`MAX_BATCH` frames."""
        work = job.task.work(job.infer_opts)
        return cost.clip_seconds(job.size, work, frames, MAX_BATCH, job.tracking.detect_every)

    def clip_seconds(self, job: VideoJob, also: tuple[VideoJob, ...] = ()) -> int:
        """The GPU seconds the clip's one call requests (the one reservation function), with
        the jobs ``also`` in the same call over the same frames."""
        jobs = (job, *also)
        return cost.reservation(sum(self.clip_work(j, job.frames) for j in jobs), self._resident(*jobs))

    def estimate(self, job: VideoJob) -> Estimate:
        frames = job.frames if job.plan.frames is not None else None
        cpu_s, basis = (None, "GPU") if self.manager.cuda else self.cpu_seconds(job)
        return Estimate(frames, MAX_BATCH, self.clip_seconds(job), 1, cpu_s, basis, job.reduced)

    def cpu_seconds(self, job: VideoJob) -> tuple[float | None, str]:
        """Whole-run CPU seconds and where the figure comes from."""
        frames = job.plan.frames
        if frames is None:
            return None, "the clip's header gives no frame count"
        with self._lock:
            measured = self._measured.get((job.task.name, job.size))
        if measured is not None:
            return frames * measured, "measured on this server's last clip of this task and size"
        macs, why = served_frame_macs(self.manager, job.task, job.size, job.infer_opts)
        if macs is None:
            return None, why
        pixels = frame_network_pixels(job.task, job.size, job.infer_opts)
        per_frame = cost.cpu_frame_seconds(macs, pixels, job.frame_pixels)
        basis = (
            "from the model's size and attention at a CPU rate measured on a 2-core machine, plus "
            "per-pixel costs of its outputs and of each frame's decode, render and encode; expect +-50%"
        )
        if _video(job.task).detect:
            basis += "; one person per frame assumed, each more person adds as much again"
        return frames * per_frame, basis

    def _remember(self, job: VideoJob, result: VideoResult) -> None:
        if result.frames and not self.manager.cuda:
            with self._lock:
                self._measured[(job.task.name, job.size)] = result.timing["total_s"] / result.frames

    # -- running ---------------------------------------------------------------------------

    def run(self, job: VideoJob, progress: Callable[[int, int | None], None] | None = None) -> VideoResult:
        """Load (here), then the whole clip in one device call (one GPU admission). A refusal for
        quota runs the frames that fit in the seconds left (said on the result); anything else
        the device reports is raised."""
        self._tell(job, self.estimate(job))
        with self.manager.holding(self.manager.prepare(job.task, job.size, **job.infer_opts)):
            try:
                result = self._run_clip(job, progress)
            except GpuUnavailableError as err:
                [smaller] = self.refitted(err, (job,))
                result = self.refused(self._run_clip(smaller, progress), job.frames, err)
        self._remember(job, result)
        return result

    def refitted(self, err: GpuUnavailableError, jobs: tuple[VideoJob, ...]) -> tuple[VideoJob, ...]:
        """After a refusal for quota: ``jobs`` (one call; the first leads, the others run on its
        frames) on the plan whose call fits the seconds left, the reduction announced. ``err``
        itself when it is another refusal or when not even one frame fits."""
        lead, *rest = jobs
        if not (err.quota and err.left_s):
            raise err
        fewer = self.fitted(lead, err.left_s, also=tuple(rest))
        same = {"plan": fewer.plan, "take": fewer.take, "reduced": fewer.reduced}
        others = tuple(replace(j, **same) for j in rest)
        if not self._fits(fewer, fewer.frames, err.left_s, also=others):
            raise err
        if self.announce is not None and fewer.reduced:
            self.announce(fewer.reduced)
        return (fewer, *others)

    @staticmethod
    def refused(result: Any, planned: int, err: GpuUnavailableError) -> Any:
        """``result`` (of the refitted run) saying that only its frames ran, and why."""
        result.notices.insert(0, f"Only {result.frames} of {planned} frames were processed. {err}")
        result.details["gpu_refused"] = str(err)
        return result

    def _run_clip(self, job: VideoJob, progress: Callable[[int, int | None], None] | None) -> VideoResult:
        seconds = self.clip_seconds(job)
        with ClipCall(self.device, (job.task.name,), seconds, self.call_budget(job, seconds)) as call:
            run = self.clip_run(job, call, str(self.folders.new()))
            run.load()  # decode and prepare before the call opens
            for done in run.process(call.steps(job.task, job.size)):
                if progress is not None:
                    progress(done, run.plan.frames)
        if not call.jobs:
            raise InputVideoError("The clip's GPU call ended without a result; try again.")
        result = run.result()
        if job.reduced:
            result.notices.insert(0, job.reduced)
        return result

    def call_budget(self, job: VideoJob, seconds: int, also: tuple[VideoJob, ...] = ()) -> float | None:
        """Seconds of work the call may do before it stops (its reservation less a fresh worker's
        start), on a GPU; None elsewhere. SAPIENS2_NO_GPU_BUDGET=1 turns it off where "cuda" is
        emulated on a CPU whose wall time says nothing about a GPU's."""
        timed = self.manager.cuda and not os.environ.get("SAPIENS2_NO_GPU_BUDGET")
        return cost.work_budget(self._resident(job, *also), seconds) if timed else None

    def clip_run(self, job: VideoJob, call: ClipCall, out_dir: str, name: str | None = None) -> ClipRun:
        """The server's side of ``job``'s clip (nothing decoded yet): the pipeline's CPU stages
        here, its device steps (forwards, pose's detections) in ``call``."""
        steps = call.steps(job.task, job.size)
        steps.detect_options = job.infer_opts
        pipe = self.manager.get(job.task, job.size, load=False)
        return clip_run(
            pipe, job.clip, out_dir, task=job.task, stride=job.plan.stride, limits=job.limits,
            batch_size=MAX_BATCH, options=job.infer_opts, tracking=job.tracking, take=job.take,
            render_options=video_render_options(job.task, job.render_opts), detect_many=steps.detect_many,
            source_video=True, handler=job.handler, name=name,
        )  # fmt: skip

    def _tell(self, job: VideoJob, estimate: Estimate) -> None:
        if self.announce is None:
            return
        if self.manager.cuda:
            if job.reduced:
                self.announce(job.reduced)
            notice = cost_notice(estimate.gpu_call_s, f"This {job.task.tab.lower()} video run (one GPU call)")
            if notice:
                self.announce(notice)
        elif estimate.cpu_s is not None:
            self.announce(f"Running on the CPU: {estimate.line(False)}")


__all__ = [
    "MAX_BATCH",
    "Estimate",
    "VideoJob",
    "VideoRequests",
    "forward_macs",
    "frame_macs",
    "video_render_options",
]
