"""One pipeline per task; :func:`pipeline` builds one by task name.

Each task lives in its own module (``pose.py``, ``seg.py`` ...) and is imported only when asked
for, so that ``import sapiens2.tasks`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import OptionError
from .base import Pipeline, RunInfo, TaskResult

# task name (as in zoo.TASKS, plus friendly aliases) -> (module, class)
_PIPELINES: dict[str, tuple[str, str]] = {
    "pose": ("pose", "PosePipeline"),
    "seg": ("seg", "SegPipeline"),
    "normal": ("normal", "NormalPipeline"),
    "pointmap": ("pointmap", "PointmapPipeline"),
    "matting": ("matting", "MattingPipeline"),
    "pretrain": ("features", "FeaturesPipeline"),
    "features": ("features", "FeaturesPipeline"),
}


def pipeline_class(task: str) -> type[Pipeline]:
    """The pipeline class for a task name (lazy import of its module)."""
    try:
        module, cls = _PIPELINES[task]
    except (KeyError, TypeError):
        raise OptionError(f"Unknown task {task!r}; choose one of: {', '.join(_PIPELINES)}.") from None
    return getattr(importlib.import_module(f".{module}", __name__), cls)


def pipeline(task: str, size: str | None = None, **kwargs: Any) -> Pipeline:
    """Build the pipeline for ``task`` (e.g. ``pipeline("pose", "0.4b", device="cuda")``).

    ``kwargs`` go to the pipeline's constructor (``model=``, ``checkpoint=``, ``device=``,
    ``dtype=`` and task-specific ones such as pose's ``detector=``).
    """
    return pipeline_class(task)(size, **kwargs)


__all__ = ["Pipeline", "RunInfo", "TaskResult", "pipeline", "pipeline_class"]
