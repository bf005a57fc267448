"""Body-part segmentation (29 classes): its pipeline, exact logits resize, renderers and files.

The task's declaration is ``TASK``; ``sapiens2.tasks.registry`` finds it by listing the task
folders of ``sapiens2.tasks``."""

from __future__ import annotations

from .seg_pipeline import TASK, SegLogits, SegPipeline, SegRaw, SegResult, person_masks_from_boxes

__all__ = ["SegLogits", "SegPipeline", "SegRaw", "SegResult", "TASK", "person_masks_from_boxes"]
