"""Motion requests for a server: a clip's 3D motion in ONE device call (one GPU admission).

The pose pass and the pointmap pass (:mod:`sapiens2.video.clip_motion`) are two clip runs of this
server (:class:`~sapiens2.serving.video.VideoRequests`: checks, loading, the server's side of a
clip) over the same frames, sharing one :class:`~sapiens2.serving.clip_call.ClipCall`: the
clip is decoded once and the pointmap's inputs prepared before the call opens; in the call, pose's
detections and forwards run batch by batch (its boxes follow its keypoints), then every
pointmap forward back to back; the call ends with the last forward. Everything else -- tracking,
smoothing, rendering, encoding, the lifting and the motion files -- runs here, on the CPU.

The plan is fitted to the call as a whole (both passes' forwards and one worker start): a plan
that would not fit a visitor without an account is reduced up front (a larger stride, then
fewer frames); a refusal for quota runs the frames that fit in the seconds left.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import GpuUnavailableError, InputVideoError
from ..outputs.export import file_stem
from ..tasks.pose.pose_clip_files import pose_arrays
from ..tasks.pose.pose_tracking import TrackingOptions
from ..video.clip_motion import POINTMAP, POSE, MotionDepth, MotionOptions, MotionResult, finish_motion
from ..zerogpu.quota import cost_notice
from .clip_call import ClipCall
from .video import VideoJob, VideoRequests

Progress = Callable[[int, int | None], None]


class MotionRequests:
    """Runs motion requests over a server's :class:`VideoRequests` (its models, folders, limits)."""

    def __init__(self, video: VideoRequests) -> None:
        self.video = video

    def jobs(
        self, clip: Any, size: str | None, *, stride: int, max_frames: int | None, tracking: TrackingOptions
    ) -> tuple[VideoJob, VideoJob]:
        """The two passes' checked jobs, on the same frames, fitted to one call."""
        v = self.video
        pm = v.job(POINTMAP, clip, size, stride=stride, max_frames=max_frames,
                   options={"use_segmentation": True}, fit=False)  # fmt: skip
        pose = v.job(POSE, clip, size, stride=stride, max_frames=max_frames, tracking=tracking, fit=False)
        return self.fitted(pose, pm)

    def fitted(self, pose: VideoJob, pm: VideoJob) -> tuple[VideoJob, VideoJob]:
        """Both jobs on the plan that lets their one call fit (on a GPU; as they are elsewhere)."""
        if not self.video.manager.cuda:
            return pose, pm
        fewer = self.video.fitted(pose, also=(pm,))
        same = {"plan": fewer.plan, "take": fewer.take, "reduced": fewer.reduced}
        return replace(pose, **same), replace(pm, **same)

    def seconds(self, pose: VideoJob, pm: VideoJob) -> int:
        """The seconds the motion's one call requests."""
        return self.video.clip_seconds(pose, also=(pm,))

    def run(
        self,
        clip: Any,
        size: str | None = None,
        *,
        stride: int = 1,
        max_frames: int | None = None,
        tracking: TrackingOptions = TrackingOptions(),
        progress: Progress | None = None,
    ) -> MotionResult:
        t0 = time.perf_counter()
        pose_job, pm_job = self.jobs(clip, size, stride=stride, max_frames=max_frames, tracking=tracking)
        options = MotionOptions(smoothing=tracking.smoothing)
        v = self.video
        self._tell(pose_job, pm_job)
        with v.manager.holding(v.manager.prepare(POSE, pose_job.size, **pose_job.infer_opts)):
            with v.manager.holding(v.manager.prepare(POINTMAP, pm_job.size, **pm_job.infer_opts)):
                try:
                    return self._run(pose_job, pm_job, clip, options, progress, t0)
                except GpuUnavailableError as err:  # as a video's: the frames the quota left fits
                    smaller = v.refitted(err, (pose_job, pm_job))
                    return v.refused(self._run(*smaller, clip, options, progress, t0), pose_job.frames, err)

    def _tell(self, pose: VideoJob, pm: VideoJob) -> None:
        """On a GPU: the plan's reduction and what the call costs, before it runs."""
        say = self.video.announce
        if say is None or not self.video.manager.cuda:
            return
        if pose.reduced:
            say(pose.reduced)
        notice = cost_notice(self.seconds(pose, pm), "This motion run (one GPU call for pose and pointmap)")
        if notice:
            say(notice)

    def _run(
        self, pose_job: VideoJob, pm_job: VideoJob, clip: Any, options: MotionOptions, progress: Progress | None,
        t0: float,
    ) -> MotionResult:  # fmt: skip
        """Both passes in one call; the motion files from their results."""
        v, folder = self.video, str(self.video.folders.new())
        seconds = self.seconds(pose_job, pm_job)
        handler = MotionDepth(None, options)
        budget = v.call_budget(pose_job, seconds, also=(pm_job,))
        with ClipCall(v.device, (POSE.name, POINTMAP.name), seconds, budget) as call:
            pose_run = v.clip_run(pose_job, call, folder)
            pm_run = v.clip_run(replace(pm_job, handler=handler), call, folder)
            pose_run.load()  # the clip decoded once, before the call
            pm_run.load(frames_from=pose_run)  # its frames (pixels shared); the pointmap's inputs prepared
            pose_run.last_steps = False  # the pointmap's forwards follow in the same call
            planned = 2 * (pose_run.plan.frames or pose_job.frames)
            for done in pose_run.process(call.steps(POSE, pose_job.size)):
                if progress is not None:
                    progress(done, planned)
            if pose_run.stopped and not call.open:
                raise InputVideoError(
                    f"The GPU call ended during the pose pass ({pose_run.stopped}); try fewer frames."
                )
            pose_frames = pose_arrays(pose_run.handler.frames)
            handler.use_pose(pose_frames)
            if pose_run.done < len(pm_run.frames or ()):  # the pose pass ended early: the same frames
                pm_run.frames = (pm_run.frames or [])[: max(1, pose_run.done)]
            for done in pm_run.process(call.steps(POINTMAP, pm_job.size)):
                if progress is not None:
                    progress(pose_run.done + done, planned)
        pose, pointmap = pose_run.result(), pm_run.result()
        for result, job in ((pose, pose_job), (pointmap, pm_job)):
            if job.reduced:
                result.notices.insert(0, job.reduced)
        result = finish_motion(
            pose, pointmap, file_stem(Path(str(clip)).name, "clip"), options, t0, pose_frames
        )
        result.details["sizes"] = {"pose": pose_job.size, "pointmap": pm_job.size}
        result.details["gpu_calls"] = 1
        return result


__all__ = ["MotionRequests"]
