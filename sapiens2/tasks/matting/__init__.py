"""Matting: alpha and foreground, the composite and the cut-out.

The task's declaration is ``TASK``; ``sapiens2.tasks.registry`` finds it by listing the task
folders of ``sapiens2.tasks``."""

from __future__ import annotations

from .matting_pipeline import TASK, MattingPipeline, MattingRaw, MattingResult

__all__ = ["MattingPipeline", "MattingRaw", "MattingResult", "TASK"]
