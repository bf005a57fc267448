"""Sapiens2 human-vision models: backbone + task heads, pipelines, rendering and exports.

Public names are imported lazily so that ``import sapiens2`` stays cheap (the app imports it
before ``spaces`` decides where CUDA lives).
"""

from __future__ import annotations

import importlib
from typing import Any

from .errors import (
    CheckpointError,
    InputImageError,
    InputVideoError,
    OptionError,
    Sapiens2Error,
    WeightsUnavailableError,
)
from .models.zoo import TASKS, get_task

__version__ = "0.1.0"

# public name -> module that defines it; every task's pipeline class (``sapiens2.PosePipeline``
# ...) is found through the task registry instead (:func:`_pipeline_classes`)
_LAZY = {
    "load_model": ".models.loading",
    "describe_checkpoint": ".models.loading",
    "export_onnx": ".models.onnx_export",
    "load_image": ".inputs.intake",
    "PersonDetector": ".models.detector",
    "detect_people": ".models.detector",
    "pipeline": ".tasks",
    "build_index": ".search",
    "find_similar": ".search",
}
# short module aliases, e.g. ``sapiens2.pose.decode_heatmaps``
_MODULES = {"pose": ".tasks.pose"}

__all__ = [
    "TASKS",
    "CheckpointError",
    "InputImageError",
    "InputVideoError",
    "OptionError",
    "Sapiens2Error",
    "WeightsUnavailableError",
    "get_task",
    *_LAZY,
    *_MODULES,
]


def _pipeline_classes() -> dict[str, type]:
    """Class name -> pipeline class of every declared task (imports the task modules)."""
    from .tasks import registry

    return {task.pipeline.__name__: task.pipeline for task in registry.declared().values()}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(_MODULES[name], __name__)
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    if name.endswith("Pipeline") and name in (classes := _pipeline_classes()):
        return classes[name]
    raise AttributeError(f"module 'sapiens2' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_pipeline_classes()})
