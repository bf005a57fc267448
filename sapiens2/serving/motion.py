"""Motion requests for a server: a clip's 3D motion as two clip calls and a CPU step.

The pose pass and the pointmap pass (:mod:`sapiens2.video.motion`) each run as an ordinary
video request of :class:`~sapiens2.serving.video.VideoRequests` (checks, loading, one device call
each; on ZeroGPU one admission each), over the same frames: both take the plan of the one that
had to be reduced more to fit the GPU quota. The pointmap call gets the motion's frame handler,
which carries the pose pass's arrays and leaves the lifted points beside its files; the motion
files are then made here, on the CPU. One device call for both passes is the next step (issue
36, item 4).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..outputs.export import file_stem
from ..video.handlers import TrackingOptions
from ..video.motion import (
    POINTMAP,
    POSE,
    MotionDepth,
    MotionOptions,
    MotionResult,
    finish_motion,
    pose_arrays_of,
)
from .video import VideoJob, VideoRequests

Progress = Callable[[int, int | None], None]


class MotionRequests:
    """Runs motion requests over a server's :class:`VideoRequests` (its models, folders, limits)."""

    def __init__(self, video: VideoRequests) -> None:
        self.video = video

    def jobs(
        self, clip: Any, size: str | None, *, stride: int, max_frames: int | None, tracking: TrackingOptions
    ) -> tuple[VideoJob, VideoJob]:
        """The two passes' checked jobs, on the same frames."""
        pm = self.video.job(
            POINTMAP, clip, size, stride=stride, max_frames=max_frames, options={"use_segmentation": True}
        )
        pose = self.video.job(POSE, clip, size, stride=stride, max_frames=max_frames, tracking=tracking)
        fewer = pose if pose.frames < pm.frames else pm
        same = {"plan": fewer.plan, "take": fewer.take, "reduced": fewer.reduced}
        return replace(pose, **same), replace(pm, **same)

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
        planned = 2 * pose_job.frames

        def step(offset: int) -> Progress:
            return lambda done, _: progress(offset + done, planned) if progress is not None else None

        pose = self.video.run(pose_job, step(0))
        if pose.frames < pm_job.frames:  # the pose call ended early: the pointmap takes its frames
            pm_job = replace(pm_job, take=max(1, pose.frames))
        handler = MotionDepth(pose_arrays_of(pose), options)
        pointmap = self.video.run(replace(pm_job, handler=handler), step(pose.frames))
        result = finish_motion(pose, pointmap, file_stem(Path(str(clip)).name, "clip"), options, t0)
        result.details["sizes"] = {"pose": pose_job.size, "pointmap": pm_job.size}
        return result


__all__ = ["MotionRequests"]
