"""Typed outputs of the task models: what ``model(pixel_values)`` returns, per task.

Shapes are for a (B, 3, H, W) input; all tensors stay on the model's device and dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PoseOutput:
    heatmaps: torch.Tensor  # (B, 308, H/4, W/4)


@dataclass
class SegOutput:
    logits: torch.Tensor  # (B, 29, H, W)


@dataclass
class NormalOutput:
    normals: torch.Tensor  # (B, 3, H, W), raw (not unit length)


@dataclass
class PointmapOutput:
    pointmap: torch.Tensor  # (B, 3, H, W), canonical (divide by scale for metric)
    scale: torch.Tensor  # (B, 1): canonical focal / actual focal


@dataclass
class MattingOutput:
    foreground: torch.Tensor  # (B, 3, H, W), premultiplied RGB in [0, 1]
    alpha: torch.Tensor  # (B, 1, H, W) in [0, 1]


@dataclass
class FeaturesOutput:
    cls_embedding: torch.Tensor  # (B, D), CLS token after the final norm
    patch_features: torch.Tensor  # (B, D, H/16, W/16)


TaskOutput = PoseOutput | SegOutput | NormalOutput | PointmapOutput | MattingOutput | FeaturesOutput
