"""Normals' picture: unit normals as RGB over a background."""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np

from ...errors import InputImageError, OptionError
from ...outputs.render import as_rgb_uint8, check_hw, finite_pixels, to_uint8


def _background(background: Any, hw: tuple[int, int]) -> np.ndarray:
    if isinstance(background, str) and background in ("black", "white"):
        return np.full((*hw, 3), 0 if background == "black" else 255, np.uint8)
    if isinstance(background, str):
        raise OptionError(f"Background must be 'black', 'white' or an image, got {background!r}.")
    bg = as_rgb_uint8(background)
    check_hw(bg, hw, "The background image")
    return bg


def normals_to_rgb(normals: Any, mask: Any = None, background: Any = "black") -> np.ndarray:
    """(H, W, 3) unit normals -> RGB = (n + 1) / 2 * 255 with x->R, y->G, z->B.

    mask: (H, W) bool, True on the person; elsewhere (and where the normal is not finite) the
    background shows: "black", "white" or an (H, W, 3) image such as the photo.
    """
    n = np.ascontiguousarray(normals, dtype=np.float32)
    if n.ndim != 3 or n.shape[2] != 3:
        raise InputImageError(f"Normals must be an (H, W, 3) array, got shape {n.shape}.")
    valid = finite_pixels(n)
    if mask is not None:
        m = np.asarray(mask, dtype=bool)
        check_hw(m, n.shape, "The normal mask")
        valid &= m
    out = _background(background, n.shape[:2]).copy()
    cv2.copyTo(to_uint8(n, 127.5, 127.5), valid.view(np.uint8), out)  # non-finite pixels stay background
    return out
