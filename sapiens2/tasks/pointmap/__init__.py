"""Pointmap: metric XYZ per pixel, depth, mask and focal length; its mesh files.

The task's declaration is ``TASK``; ``sapiens2.tasks.registry`` finds it by listing the task
folders of ``sapiens2.tasks``."""

from __future__ import annotations

from .pointmap_pipeline import TASK, PointmapPipeline, PointmapRaw, PointmapResult

__all__ = ["PointmapPipeline", "PointmapRaw", "PointmapResult", "TASK"]
