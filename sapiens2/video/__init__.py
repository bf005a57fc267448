"""Video: a clip through a task pipeline in batches, rendered back to a browser-playable video.

Modules, each usable alone: ``reader`` (checked decoding, limits), ``writer`` (VP8/WebM),
``tracking`` (IoU tracker, stable person ids), ``smoothing`` (One-Euro filter), ``depth``
(clip-wide depth colour bounds), ``clip_depth_align`` (depth held still over time), ``clip_motion``
(pose + pointmap -> 3D motion), ``exports`` (pose tracks JSON, NPZ under a cap),
``frame_handlers`` (per-task frame handling) and ``clip_runner`` (:func:`run_video`). No UI code here.

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
    "VideoWriter": ".writer",
    "IoUTracker": ".tracking",
    "OneEuroFilter": ".smoothing",
    "KeypointSmoother": ".smoothing",
    "global_depth_bounds": ".depth",
    "TrackingOptions": ".people",
    "PoseTracking": ".people",
    "DepthScale": ".depth",
    "VideoPlan": ".clip_plan",
    "VideoResult": ".clip_plan",
    "plan_video": ".clip_plan",
    "run_video": ".clip_runner",
    "DepthAligner": ".clip_depth_align",
    "MotionOptions": ".clip_motion",
    "run_motion": ".clip_motion",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'sapiens2.video' has no attribute {name!r}")
