"""Surface normals per pixel: the pipeline and its picture.

The task's declaration is ``TASK``; ``sapiens2.tasks.registry`` finds it by listing the task
folders of ``sapiens2.tasks``."""

from __future__ import annotations

from .normal_pipeline import TASK, NormalPipeline, NormalRaw, NormalResult

__all__ = ["NormalPipeline", "NormalRaw", "NormalResult", "TASK"]
