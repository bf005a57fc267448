"""Top-down pose (308 keypoints): everything only pose has, from crops and heatmap decoding to its
files and 3D keypoints.

The task's declaration is ``TASK``; ``sapiens2.tasks.registry`` finds it by listing the task
folders of ``sapiens2.tasks``."""

from __future__ import annotations

from .pose_pipeline import (
    TASK,
    PosePipeline,
    PosePrep,
    PoseRaw,
    PoseResult,
    decode_heatmaps,
    flip_back,
    merge_flip,
)

__all__ = [
    "PosePipeline",
    "PosePrep",
    "PoseRaw",
    "PoseResult",
    "TASK",
    "decode_heatmaps",
    "flip_back",
    "merge_flip",
]
