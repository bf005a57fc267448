"""Features' picture: the first three principal components of the patch features as RGB."""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np

from ...errors import InputImageError


def _top3_components(x: np.ndarray) -> np.ndarray:
    """(D, 3) leading principal directions of centred rows x (N, D), via a small randomised SVD."""
    n, d = x.shape
    k = min(3, n, d)
    x = x / max(float(np.abs(x).max()), 1e-30)  # scale-free directions; huge values cannot overflow
    if d <= 64 or n <= 64:
        _, _, vt = np.linalg.svd(x, full_matrices=False)
        comps = vt[:k].T
    else:  # range finder + 2 power iterations: O(N*D*k), fast enough for 2048-wide features
        rng = np.random.default_rng(0)  # fixed seed: the same picture for the same input
        q = np.linalg.qr(x @ rng.standard_normal((d, k + 8)))[0]
        for _ in range(2):
            q = np.linalg.qr(x @ (x.T @ q))[0]
        _, _, vt = np.linalg.svd(q.T @ x, full_matrices=False)
        comps = vt[:k].T
    # fix each component's sign (SVD signs are arbitrary) so colours are stable between runs
    proj = x @ comps
    proj = proj / (np.abs(proj).max(axis=0) + 1e-30)
    signs = np.sign(np.sum(proj**3, axis=0))
    comps = comps * np.where(signs == 0, 1.0, signs)
    return np.pad(comps, ((0, 0), (0, 3 - k))).astype(np.float32)


def pca_rgb(features: Any, out_hw: tuple[int, int] | None = None, mask: Any = None) -> np.ndarray:
    """Patch features (D, h, w) -> uint8 RGB of their first 3 principal components.

    Fitted on the patches inside mask ((h, w) or any size, resized nearest; None = all) with
    finite values; each component is stretched to 0-255 between its 1st and 99th percentile;
    patches outside the mask are black. out_hw=(H, W) resizes the picture (bilinear).
    """
    f = np.asarray(features, dtype=np.float32)
    if f.ndim != 3:
        raise InputImageError(f"Features must be a (D, h, w) array, got shape {f.shape}.")
    d, h, w = f.shape
    valid = np.isfinite(f).all(axis=0).ravel()
    if mask is not None:
        m = np.asarray(mask, dtype=np.uint8)
        if m.shape != (h, w):
            m = cv2.resize(m, (w, h), interpolation=cv2.INTER_NEAREST)
        valid &= m.ravel().astype(bool)
    rgb = np.zeros((h * w, 3), np.float32)
    if valid.sum() >= 2:
        x = np.ascontiguousarray(f.reshape(d, h * w).T)  # (N, D) patch vectors, float32 throughout
        x[~valid] = 0.0
        x -= x[valid].mean(axis=0, dtype=np.float64).astype(np.float32)
        proj = x @ _top3_components(x if valid.all() else x[valid])
        lo, hi = np.percentile(proj[valid], [1.0, 99.0], axis=0)
        rgb = np.clip((proj - lo) / np.maximum(hi - lo, 1e-12), 0.0, 1.0).astype(np.float32) * 255.0
        rgb[~valid] = 0.0
    img = np.clip(rgb.reshape(h, w, 3) + 0.5, 0, 255).astype(np.uint8)
    if out_hw is not None:  # resized as uint8: at photo size a float copy is 12 bytes per pixel
        img = cv2.resize(img, (int(out_hw[1]), int(out_hw[0])), interpolation=cv2.INTER_LINEAR)
    return img
