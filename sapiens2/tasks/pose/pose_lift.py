"""2D keypoints + a pointmap of the same picture -> 3D keypoints in metres, camera frame (x right,
y down, z forward), as the pointmap gives them.

Each keypoint is read from a small window of the pointmap around it, on its own person only:
the window's pixels count when they lie on the foreground mask (the body-part segmentation's
people), inside that person's box (padded), and hold a finite point in front of the camera. Of
those samples, the ones whose depth is within a robust band of their median (3 scaled MADs, at
least :data:`MIN_BAND_M`) are averaged with Gaussian weights by their distance to the keypoint.
A weighted mean of points of one surface stays on that surface when it is planar, and the median
gate keeps a stray sample (a mask edge, another person's arm in front) from pulling the depth.
A keypoint with fewer than ``min_samples`` such samples gets no point (NaN): nothing is invented.

Limits: a person's mask is the foreground inside their box, so where two people overlap in the
picture a window can see the other one; the median gate keeps the majority's depth.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from ...errors import OptionError

#: Window side in pixels of the picture the pointmap is sampled at (odd).
WINDOW = 7
#: Least samples on the person for a keypoint to get a point.
MIN_SAMPLES = 4
#: A person's region: the box widened by this fraction of its size on every side (keypoints of
#: hands and feet often lie a little outside the detector's box).
BOX_PAD = 0.1
#: The depth band around the window's median is at least this wide (metres) each way, so a
#: window on a flat patch (MAD ~ 0) still accepts its own samples.
MIN_BAND_M = 0.02


@dataclass
class Lifted:
    """3D keypoints of every person of one picture."""

    points: np.ndarray  # (P, K, 3) float32 metres, camera frame; NaN where no depth was found
    samples: np.ndarray  # (P, K) int32 samples that made each point (0: none)

    @property
    def valid(self) -> np.ndarray:
        """(P, K) bool: the keypoint has a point."""
        return np.isfinite(self.points).all(axis=-1)


def _window_offsets(window: int) -> np.ndarray:
    if isinstance(window, bool) or not isinstance(window, int) or window < 1 or window % 2 == 0:
        raise OptionError(f"The sampling window must be an odd whole number of pixels, got {window!r}.")
    r = window // 2
    dy, dx = np.mgrid[-r : r + 1, -r : r + 1]
    return np.stack([dx.ravel(), dy.ravel()], axis=1)  # (W*W, 2) x, y


def lift_keypoints(
    keypoints: np.ndarray,
    pointmap: np.ndarray,
    mask: np.ndarray | None,
    boxes: np.ndarray | None = None,
    *,
    window: int = WINDOW,
    min_samples: int = MIN_SAMPLES,
    box_pad: float = BOX_PAD,
) -> Lifted:
    """3D points of ``keypoints`` (P, K, 2) pixel x, y from ``pointmap`` (H, W, 3) metres.

    ``mask`` (H, W) bool: the people (None: every valid point counts, as with a pointmap run
    without segmentation). ``boxes`` (P, 4) x1, y1, x2, y2: each person's region (None: the whole
    picture). See the module docstring for the rule."""
    kp = np.asarray(keypoints, np.float64)
    if kp.ndim != 3 or kp.shape[-1] != 2:
        raise OptionError(f"keypoints must be (people, K, 2); got {kp.shape}.")
    pm = np.asarray(pointmap, np.float32)
    if pm.ndim != 3 or pm.shape[-1] != 3:
        raise OptionError(f"pointmap must be (H, W, 3); got {pm.shape}.")
    h, w = pm.shape[:2]
    if mask is not None and np.shape(mask) != (h, w):
        raise OptionError(f"mask must be {(h, w)} like the pointmap; got {np.shape(mask)}.")
    p, k = kp.shape[:2]
    offsets = _window_offsets(window)
    if p == 0 or k == 0:
        return Lifted(np.full((p, k, 3), np.nan, np.float32), np.zeros((p, k), np.int32))
    centre = np.floor(kp + 0.5)  # the pixel each keypoint lies in (pixel centres at integers)
    centre = np.where(np.isfinite(centre), centre, -(10**6))  # a NaN keypoint samples nothing
    xy = centre[:, :, None, :] + offsets[None, None]  # (P, K, S, 2)
    x, y = xy[..., 0], xy[..., 1]
    ok = (x >= 0) & (x < w) & (y >= 0) & (y < h)
    if boxes is not None:
        ok &= _in_boxes(x, y, np.asarray(boxes, np.float64).reshape(-1, 4), p, box_pad)
    xi, yi = np.where(ok, x, 0).astype(np.intp), np.where(ok, y, 0).astype(np.intp)
    pts = pm[yi, xi]  # (P, K, S, 3)
    with np.errstate(invalid="ignore"):
        ok &= np.isfinite(pts).all(axis=-1) & (pts[..., 2] > 0)
    if mask is not None:
        ok &= np.asarray(mask, bool)[yi, xi]
    dist2 = ((xy - kp[:, :, None, :]) ** 2).sum(-1)
    return _robust_mean(pts, ok, dist2, window, min_samples)


def _in_boxes(x: np.ndarray, y: np.ndarray, boxes: np.ndarray, people: int, pad: float) -> np.ndarray:
    if len(boxes) != people:
        raise OptionError(f"{people} people but {len(boxes)} boxes.")
    size = boxes[:, 2:] - boxes[:, :2]
    lo = boxes[:, :2] - pad * size
    hi = boxes[:, 2:] + pad * size
    lo, hi = lo[:, None, None, :], hi[:, None, None, :]
    return (x >= lo[..., 0]) & (x <= hi[..., 0]) & (y >= lo[..., 1]) & (y <= hi[..., 1])


def _robust_mean(pts: np.ndarray, ok: np.ndarray, dist2: np.ndarray, window: int, min_samples: int) -> Lifted:
    """Per keypoint: the median-gated, distance-weighted mean of its valid samples."""
    z = np.where(ok, pts[..., 2], np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN windows: no point, below
        med = np.nanmedian(z, axis=-1, keepdims=True)
        mad = np.nanmedian(np.abs(z - med), axis=-1, keepdims=True)
    band = np.maximum(3.0 * 1.4826 * np.nan_to_num(mad), MIN_BAND_M)
    with np.errstate(invalid="ignore"):
        keep = ok & (np.abs(z - med) <= band)
    sigma = max(window / 4.0, 0.5)
    weight = np.where(keep, np.exp(-dist2 / (2 * sigma**2)), 0.0)
    total = weight.sum(-1)
    count = keep.sum(-1).astype(np.int32)
    mean = (np.where(keep[..., None], pts, 0.0) * weight[..., None]).sum(-2) / np.maximum(total, 1e-12)[
        ..., None
    ]
    good = count >= max(1, int(min_samples))
    points = np.where(good[..., None], mean, np.nan).astype(np.float32)
    return Lifted(points, np.where(good, count, 0).astype(np.int32))


__all__ = ["BOX_PAD", "MIN_BAND_M", "MIN_SAMPLES", "WINDOW", "Lifted", "lift_keypoints"]
