"""Per-pixel maps at photo size: unit normals, and the release's blur-then-resize of a pointmap.

Both run in a request's ``finish`` on the server's CPU, on arrays of up to 12 megapixels, so they
work on blocks of rows in place (cv2) rather than on whole-size temporaries (torch).
"""

from __future__ import annotations

import cv2
import numpy as np
import torch
import torch.nn.functional as F

EPS = 1e-8
_ROWS = 128  # rows per block of unit_normalise: its temporaries stay in cache (6 MB at 4000 px)
_SUM3 = np.ones((1, 3), np.float32)
#: The release's demo smooths the pointmap before enlarging it: 4 passes of a 3x3 Gaussian.
BLUR_SIGMA, BLUR_PASSES = 0.8, 4


def unit_normalise(x: np.ndarray) -> np.ndarray:
    """``x`` (H, W, 3) float32 divided IN PLACE by max(|x|, 1e-8) per pixel: unit vectors, zero
    vectors stay zero; returns ``x``. cv2 passes over blocks of rows (torch's ``x / x.norm(dim=1)``
    runs one thread over a strided reduction with full-size temporaries)."""
    for top in range(0, x.shape[0], _ROWS):
        block = x[top : top + _ROWS]
        norm = cv2.transform(cv2.multiply(block, block), _SUM3)  # (rows, W): sum of squares
        cv2.sqrt(norm, dst=norm)
        np.maximum(norm, EPS, out=norm)
        cv2.divide(block, cv2.merge([norm, norm, norm]), dst=block)
    return x


def blur_release(pm: torch.Tensor) -> torch.Tensor:
    """(C, h, w) float32 -> ``BLUR_PASSES`` passes of a 3x3 Gaussian (sigma ``BLUR_SIGMA``,
    kernel as ``cv2.getGaussianKernel``), reflect padding (the edge pixel is not repeated:
    torch's "reflect", cv2's default border); a 1-pixel side repeats its edge instead."""
    g = torch.exp(-torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64) / (2 * BLUR_SIGMA**2))
    g = (g / g.sum()).float()
    c = pm.shape[0]
    kernel = (g[:, None] * g[None, :]).expand(c, 1, 3, 3).contiguous()
    mode = "reflect" if min(pm.shape[-2:]) >= 2 else "replicate"
    x = pm[None]
    for _ in range(BLUR_PASSES):
        x = F.conv2d(F.pad(x, (1, 1, 1, 1), mode=mode), kernel, groups=c)
    return x[0]


def to_photo(pm: torch.Tensor, out_hw: tuple[int, int]) -> np.ndarray:
    """(3, h, w) -> (H, W, 3) float32 numpy, the release's way back: when the photo is larger than
    the (cropped) output, blur first (:func:`blur_release`), then bilinear (half-pixel centres, no
    antialias) with ``cv2.INTER_LINEAR`` as the release does. cv2 writes the (H, W, 3) layout the
    result keeps directly, faster than torch's bilinear and without its float32 drift of the
    source coordinates far from the origin."""
    if out_hw[0] > pm.shape[-2] or out_hw[1] > pm.shape[-1]:
        pm = blur_release(pm)
    hwc = np.ascontiguousarray(pm.permute(1, 2, 0).numpy(), dtype=np.float32)
    if hwc.shape[:2] == tuple(out_hw):
        return hwc
    return cv2.resize(hwc, (out_hw[1], out_hw[0]), interpolation=cv2.INTER_LINEAR)


__all__ = ["blur_release", "to_photo", "unit_normalise"]
