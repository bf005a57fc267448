"""The network input as the package made it before it followed the release (float bilinear on
the device, then normalised): kept here only so the fidelity benches can show "before" next to
"after". No pipeline uses it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sapiens2.inputs.network import PadInfo, normalize, pad_info, to_device  # noqa: E402
from sapiens2.models.zoo import INPUT_SIZE  # noqa: E402


def _resize_float(x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    if tuple(x.shape[-2:]) == tuple(hw):
        return x
    return F.interpolate(x, size=hw, mode="bilinear", align_corners=False)


def stretch_to(img: np.ndarray, hw: tuple[int, int] = INPUT_SIZE) -> torch.Tensor:
    """Before: float bilinear (no antialias) straight to ``hw``, normalised (1, 3, *hw)."""
    x = to_device(img).float()
    return normalize(_resize_float(x, hw).clamp(0, 255))


def letterbox(img: np.ndarray, hw: tuple[int, int] = INPUT_SIZE) -> tuple[torch.Tensor, PadInfo]:
    """Before: float bilinear into the letterbox, zero padding, normalised (1, 3, *hw)."""
    x = to_device(img).float()
    pad = pad_info(tuple(x.shape[-2:]), hw)
    inner = _resize_float(x, pad.inner_hw).clamp(0, 255)
    canvas = x.new_zeros((x.shape[0], 3, *hw))
    canvas[:, :, pad.top : pad.top + pad.inner_hw[0], pad.left : pad.left + pad.inner_hw[1]] = inner
    return normalize(canvas), pad
