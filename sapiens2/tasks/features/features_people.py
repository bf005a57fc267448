"""One appearance vector per person from the photo's single forward: the patch features pooled
over the person's box, L2-normalised.

The backbone saw the whole photo once; each 16x16 patch's feature describes what is there, so the
mean over the patches a box covers describes that person (their clothes, hair, build) more than
the photo's CLS token, which mixes every person and the background. No crop is run again: a
person costs a weighted sum over the grid, not a forward. Patches are weighted by the share of
their cell the box covers, so a box narrower than a patch still gets the patch it lies in.
"""

from __future__ import annotations

import numpy as np

from ...errors import OptionError


def _cover(lo: float, hi: float, cells: int) -> np.ndarray:
    """How much of each of ``cells`` unit cells the span [lo, hi] covers (0 to 1); a span inside
    one cell, or of no length, gives that cell weight 1."""
    lo, hi = float(np.clip(lo, 0, cells)), float(np.clip(hi, 0, cells))
    edges = np.arange(cells + 1, dtype=np.float64)
    w = np.clip(np.minimum(edges[1:], hi) - np.maximum(edges[:-1], lo), 0.0, None)
    if w.sum() <= 0:
        w[min(cells - 1, int(lo))] = 1.0
    return w


def box_weights(box: np.ndarray, image_hw: tuple[int, int], grid_hw: tuple[int, int]) -> np.ndarray:
    """(h, w) weights of the patch grid for ``box`` (x1, y1, x2, y2 in the pixels of an image of
    ``image_hw`` that was stretched to the network input the grid covers)."""
    (ih, iw), (gh, gw) = image_hw, grid_hw
    x1, y1, x2, y2 = (float(v) for v in box)
    wx = _cover(min(x1, x2) * gw / iw, max(x1, x2) * gw / iw, gw)
    wy = _cover(min(y1, y2) * gh / ih, max(y1, y2) * gh / ih, gh)
    return np.outer(wy, wx)


def pooled_embeddings(patch_features: np.ndarray, boxes: np.ndarray, image_hw: tuple[int, int]) -> np.ndarray:
    """(P, D) unit float32 rows: the (D, h, w) ``patch_features`` averaged over each of the (P, 4)
    ``boxes`` (pixels of an image of ``image_hw``), then L2-normalised. A row is all zeros where
    its patches' mean is zero or not finite (nothing to search by)."""
    f = np.asarray(patch_features, np.float32)
    b = np.asarray(boxes, np.float64).reshape(-1, 4)
    if f.ndim != 3:
        raise OptionError(f"Patch features must be (D, h, w); got shape {f.shape}.")
    if not np.isfinite(b).all():
        raise OptionError("Person boxes must be finite numbers.")
    d, gh, gw = f.shape
    if len(b) == 0:
        return np.zeros((0, d), np.float32)
    weights = np.stack([box_weights(box, image_hw, (gh, gw)) for box in b]).reshape(len(b), -1)
    means = (weights @ f.reshape(d, -1).T.astype(np.float64)) / weights.sum(1, keepdims=True)
    norms = np.linalg.norm(means, axis=1, keepdims=True)
    ok = np.isfinite(means).all(1, keepdims=True) & (norms > 0)
    return np.where(ok, means / np.where(ok, norms, 1.0), 0.0).astype(np.float32)
