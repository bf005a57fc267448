"""Typed outputs of the task models: what ``model(pixel_values)`` returns, per task.

A zoo row names its output class (``TaskSpec.output``); the model turns the head's raw result
into it with ``from_head``, so ``Sapiens2TaskModel.forward`` has no per-task branch. A task whose
head gives one plain (B, C, H, W) map needs no class of its own: :class:`DenseOutput` is the
default. Shapes are for a (B, 3, H, W) input; tensors stay on the model's device and dtype.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch


class TaskOutput:
    """Base of every typed model output (``isinstance(out, TaskOutput)`` for any task)."""

    @classmethod
    def from_head(cls, out: Any) -> TaskOutput:
        """The head's raw result (a tensor, or a tuple for multi-part heads) as this type."""
        return cls(out)


@dataclass
class DenseOutput(TaskOutput):
    values: torch.Tensor  # (B, C, H, W): the head's map as it is (tasks with no typed output)


@dataclass
class PoseOutput(TaskOutput):
    heatmaps: torch.Tensor  # (B, 308, H/4, W/4)


@dataclass
class SegOutput(TaskOutput):
    logits: torch.Tensor  # (B, 29, H, W)


@dataclass
class NormalOutput(TaskOutput):
    normals: torch.Tensor  # (B, 3, H, W), raw (not unit length)


@dataclass
class PointmapOutput(TaskOutput):
    pointmap: torch.Tensor  # (B, 3, H, W), canonical (divide by scale for metric)
    scale: torch.Tensor  # (B, 1): canonical focal / actual focal

    @classmethod
    def from_head(cls, out: Any) -> PointmapOutput:
        pointmap, scale = out
        return cls(pointmap=pointmap, scale=scale)


@dataclass
class DepthOutput(TaskOutput):
    depth: torch.Tensor  # (B, 1, H, W): Sapiens v1's relative depth (not metric)


@dataclass
class MattingOutput(TaskOutput):
    foreground: torch.Tensor  # (B, 3, H, W), premultiplied RGB in [0, 1]
    alpha: torch.Tensor  # (B, 1, H, W) in [0, 1]

    @classmethod
    def from_head(cls, out: Any) -> MattingOutput:
        out = out.sigmoid()  # channels 0-2: premultiplied foreground, 3: alpha
        return cls(foreground=out[:, :3], alpha=out[:, 3:4])


@dataclass
class FeaturesOutput(TaskOutput):
    cls_embedding: torch.Tensor  # (B, D), CLS token after the final norm
    patch_features: torch.Tensor  # (B, D, H/16, W/16)


def output_type(name: str) -> type[TaskOutput]:
    """The output class a zoo row names (``TaskSpec.output``)."""
    cls = getattr(sys.modules[__name__], name, None)
    if not (isinstance(cls, type) and issubclass(cls, TaskOutput)):
        raise ValueError(f"sapiens2.models.nn.outputs has no output type {name!r}")
    return cls
