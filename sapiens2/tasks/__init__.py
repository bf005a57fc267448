"""One pipeline per task; :func:`pipeline` builds one by task name.

Each task lives in its own folder (``pose/``, ``seg/`` ...) whose ``TASK`` declaration names its
pipeline (``sapiens2.tasks.registry``); the modules at this package's root are the machinery the
tasks share. The task folders are imported on the first lookup, so that ``import sapiens2.tasks``
stays cheap.
"""

from __future__ import annotations

from typing import Any

from .base import Pipeline, RunInfo, TaskResult


def pipeline_class(task: str) -> type[Pipeline]:
    """The pipeline class of the task named ``task`` (the one look-up, at the public entry)."""
    from . import registry

    return registry.get(task).pipeline


def pipeline(task: str, size: str | None = None, **kwargs: Any) -> Pipeline:
    """Build the pipeline for ``task`` (e.g. ``pipeline("pose", "0.4b", device="cuda")``).

    ``kwargs`` go to the pipeline's constructor (``model=``, ``checkpoint=``, ``device=``,
    ``dtype=`` and task-specific ones such as pose's ``detector=``).
    """
    return pipeline_class(task)(size, **kwargs)


__all__ = ["Pipeline", "RunInfo", "TaskResult", "pipeline", "pipeline_class"]
