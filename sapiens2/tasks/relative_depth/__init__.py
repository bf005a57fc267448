"""Relative depth (Sapiens v1 only) with a person foreground.

The task's declaration is ``TASK``; ``sapiens2.tasks.registry`` finds it by listing the task
folders of ``sapiens2.tasks``."""

from __future__ import annotations

from .relative_depth_pipeline import TASK, DepthPipeline, DepthRaw, DepthResult

__all__ = ["DepthPipeline", "DepthRaw", "DepthResult", "TASK"]
