"""Video: a clip through a task pipeline in batches, rendered back to a browser-playable video.

Modules, each usable alone: ``reader`` (checked decoding, limits; the VP8/WebM writer is ``outputs/webm_writer``),
``clip_plan`` and ``clip_runner`` (:func:`run_video`), ``clip_steps``, ``clip_motion`` (pose +
pointmap -> 3D motion). What a task does with each frame (its clip handler, tracking, smoothing,
depth colours) lives in its folder under ``sapiens2/tasks/``. No UI code here.

Public names are imported lazily, so ``import sapiens2.video`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "VideoLimits": ".reader",
    "VideoInfo": ".reader",
    "probe_video": ".reader",
    "iter_frames": ".reader",
    "VideoWriter": "..outputs.webm_writer",
    "IoUTracker": "..tasks.pose.track_matching",
    "OneEuroFilter": "..tasks.pose.keypoint_smoothing",
    "KeypointSmoother": "..tasks.pose.keypoint_smoothing",
    "global_depth_bounds": "..tasks.pointmap.frame_depth_colours",
    "TrackingOptions": "..tasks.pose.pose_tracking",
    "PoseTracking": "..tasks.pose.pose_tracking",
    "DepthScale": "..tasks.pointmap.frame_depth_colours",
    "VideoPlan": ".clip_plan",
    "VideoResult": ".clip_plan",
    "plan_video": ".clip_plan",
    "run_video": ".clip_runner",
    "DepthAligner": "..tasks.pointmap.clip_depth_align",
    "MotionOptions": ".clip_motion",
    "run_motion": ".clip_motion",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'sapiens2.video' has no attribute {name!r}")
