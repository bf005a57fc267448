"""Pose's picture: skeletons and person boxes drawn on the photo (numpy in, uint8 RGB out)."""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np

from ...data.metadata import KEYPOINT_COLORS, KEYPOINT_GROUPS, NUM_KEYPOINTS, SKELETON
from ...errors import InputImageError
from ...outputs.render import as_rgb_uint8, check_unit, finite

BOX_COLOR: tuple[int, int, int] = (0, 255, 0)
_SHIFT = 4  # cv2 fixed-point bits: draw at 1/16 px so antialiased lines sit at sub-pixel spots
_COORD_LIMIT = 1e5  # far-off coordinates are clipped here so the int32 fixed point never overflows


def pose_style(height: int, width: int) -> tuple[int, int]:
    """(line thickness, point radius) in px for an image: both grow with the long side.

    thickness = max(1, round(long / 500)), radius = max(2, round(long / 320)): 2 and 3 px at
    1024 px, 4 and 6 px at 1920 px. Face points (238 of them, densely packed) use radius // 2.
    """
    long_side = max(int(height), int(width))
    return max(1, round(long_side / 500)), max(2, round(long_side / 320))


def _drawable_mask(show_face: bool, body_only: bool) -> np.ndarray:
    allowed = np.ones(NUM_KEYPOINTS, dtype=bool)
    if body_only:
        allowed[:] = False
        allowed[KEYPOINT_GROUPS["body"]] = True
        allowed[KEYPOINT_GROUPS["foot"]] = True
    if not show_face:
        allowed[KEYPOINT_GROUPS["face"]] = False
    return allowed


def _pose_arrays(keypoints: Any, scores: Any) -> tuple[np.ndarray, np.ndarray]:
    kp = np.asarray(keypoints, dtype=np.float64)
    if kp.ndim == 2:
        kp = kp[None]
    if kp.ndim != 3 or kp.shape[1:] != (NUM_KEYPOINTS, 2):
        raise InputImageError(f"keypoints must have shape (P, {NUM_KEYPOINTS}, 2), got {kp.shape}.")
    sc = np.asarray(scores, dtype=np.float64)
    if sc.size != kp.shape[0] * NUM_KEYPOINTS:
        raise InputImageError(f"scores must have shape ({kp.shape[0]}, {NUM_KEYPOINTS}), got {sc.shape}.")
    return kp, sc.reshape(kp.shape[:2])


def _fixed_point(xy: np.ndarray) -> np.ndarray:
    return np.round(np.clip(finite(xy), -_COORD_LIMIT, _COORD_LIMIT) * (1 << _SHIFT)).astype(np.int32)


def draw_pose(
    image: Any,
    keypoints: Any,
    scores: Any,
    *,
    threshold: float = 0.3,
    show_face: bool = True,
    body_only: bool = False,
    boxes: Any = None,
) -> np.ndarray:
    """Skeletons drawn on a copy of the image: links first (antialiased), then filled points.

    keypoints (P, 308, 2) in image px (x, y), scores (P, 308). A point is drawn when its score
    is >= threshold and it is finite; a link when both its ends are drawn. body_only keeps the
    body and foot groups; show_face=False hides the face group. Sizes: see ``pose_style``.
    """
    threshold = check_unit(threshold, "Keypoint threshold")
    canvas = as_rgb_uint8(image).copy()
    kp, sc = _pose_arrays(keypoints, scores)
    h, w = canvas.shape[:2]
    thickness, radius = pose_style(h, w)
    visible = np.isfinite(kp).all(-1) & np.isfinite(sc) & (sc >= threshold)
    visible &= _drawable_mask(show_face, body_only)[None]
    radii = np.full(NUM_KEYPOINTS, radius << _SHIFT, dtype=np.int64)
    radii[KEYPOINT_GROUPS["face"]] = max(1, radius // 2) << _SHIFT
    if boxes is not None:
        _draw_boxes(canvas, boxes, max(1, thickness // 2))
    # plain Python values for cv2's calls (per-element numpy access costs more than the drawing)
    pts, seen, radii_px = _fixed_point(kp).tolist(), visible.tolist(), radii.tolist()
    for p in range(kp.shape[0]):
        at, on = pts[p], seen[p]
        for i, j, color in SKELETON:
            if on[i] and on[j]:
                cv2.line(canvas, at[i], at[j], color, thickness, cv2.LINE_AA, _SHIFT)
        for k in np.flatnonzero(visible[p]).tolist():
            cv2.circle(canvas, at[k], radii_px[k], _POINT_COLORS[k], -1, cv2.LINE_AA, _SHIFT)
    return canvas


_POINT_COLORS = [tuple(int(c) for c in rgb) for rgb in KEYPOINT_COLORS]  # cv2 colours, made once


def _draw_boxes(canvas: np.ndarray, boxes: Any, thickness: int) -> None:
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    for x1, y1, x2, y2 in _fixed_point(b[np.isfinite(b).all(1)]).reshape(-1, 4):
        cv2.rectangle(canvas, (x1, y1), (x2, y2), BOX_COLOR, thickness, cv2.LINE_AA, _SHIFT)
