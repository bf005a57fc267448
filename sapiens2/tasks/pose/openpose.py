"""OpenPose COCO-18 from the 308 keypoints: the JSON and the ControlNet conditioning picture.

Body, 18 points in OpenPose's COCO order (:data:`COCO18_NAMES`): each is one 308 point, except
the neck, which OpenPose predicts and the 308 set's COCO-style body lacks: it is the mid-point of
the shoulders, scored with the lower shoulder score, so it passes the threshold only when both
shoulders do.

Hands, 21 points each in OpenPose's hand order (wrist, then thumb, index, middle, ring, pinky,
each from the base joint to the tip). All 21 map one to one: the wrist is the 308 wrist (the root
of the 308 hand chains); finger points 2-4 (the two middle joints and the tip) are the 308
``<finger>2``, ``<finger>3``, ``<finger>4`` points, as the COCO-WholeBody table of
``keypoints308.json`` pairs them; the base joint of each finger (OpenPose 1, 5, 9, 13, 17: the
thumb's CMC and the other fingers' knuckles) is the 308 ``<finger>_third_joint``, which the 308
skeleton links wrist -> third_joint -> finger2, the same place in the chain.

Face, 70 points in OpenPose's face order (iBUG-300W's 68, then the right and the left pupil), from
the 308 named face points (:mod:`sapiens2.data.face68`: some are named points, the others are
interpolated between named neighbours or, for the jaw, constructed; each scored with the lowest
score of its sources).

The picture (:func:`draw_openpose`) follows the OpenPose/ControlNet annotator's look: black
canvas at the photo's size, limbs as filled ellipses in OpenPose's 17 limb colours at 60%, joints
as full-colour discs, hands as lines coloured along the rainbow (each finger its own band of hues)
with blue joints, face points as white dots; widths are the annotator's (4 px sticks, 3 px face
dots at a 512 px short side) scaled with the photo's short side.
"""

from __future__ import annotations

import colorsys
import math
from typing import Any

import cv2
import numpy as np

from ...data.metadata import NUM_KEYPOINTS, keypoint_index
from .keypoint_formats import face70_arrays

COCO18_NAMES: tuple[str, ...] = (
    "Nose", "Neck", "RShoulder", "RElbow", "RWrist", "LShoulder", "LElbow", "LWrist", "RHip",
    "RKnee", "RAnkle", "LHip", "LKnee", "LAnkle", "REye", "LEye", "REar", "LEar",
)  # fmt: skip
_COCO18_SOURCES: tuple[tuple[str, ...], ...] = (
    ("nose",), ("left_shoulder", "right_shoulder"), ("right_shoulder",), ("right_elbow",),
    ("right_wrist",), ("left_shoulder",), ("left_elbow",), ("left_wrist",), ("right_hip",),
    ("right_knee",), ("right_ankle",), ("left_hip",), ("left_knee",), ("left_ankle",),
    ("right_eye",), ("left_eye",), ("right_ear",), ("left_ear",),
)  # fmt: skip
#: (18, 2) 308 indices per COCO-18 point; a single point repeats its index (midpoint = itself)
COCO18_PAIRS: np.ndarray = np.array(
    [[keypoint_index(s[0]), keypoint_index(s[-1])] for s in _COCO18_SOURCES], dtype=np.int64
)

_FINGERS = ("thumb", "forefinger", "middle_finger", "ring_finger", "pinky_finger")


def hand_index(side: str) -> np.ndarray:
    """(21,) 308 indices of one hand ("left" or "right") in OpenPose's hand order."""
    names = [f"{side}_wrist"]
    for finger in _FINGERS:
        names += [
            f"{side}_{finger}_third_joint",
            f"{side}_{finger}2",
            f"{side}_{finger}3",
            f"{side}_{finger}4",
        ]
    return np.array([keypoint_index(n) for n in names], dtype=np.int64)


HAND_LEFT, HAND_RIGHT = hand_index("left"), hand_index("right")
for _arr in (COCO18_PAIRS, HAND_LEFT, HAND_RIGHT):
    _arr.setflags(write=False)

#: OpenPose's COCO-18 limbs (point pairs) in drawing order, with the annotator's colours (RGB)
LIMBS: tuple[tuple[int, int], ...] = (
    (1, 2), (1, 5), (2, 3), (3, 4), (5, 6), (6, 7), (1, 8), (8, 9), (9, 10), (1, 11), (11, 12),
    (12, 13), (1, 0), (0, 14), (14, 16), (0, 15), (15, 17),
)  # fmt: skip
COLORS: tuple[tuple[int, int, int], ...] = (
    (255, 0, 0), (255, 85, 0), (255, 170, 0), (255, 255, 0), (170, 255, 0), (85, 255, 0), (0, 255, 0),
    (0, 255, 85), (0, 255, 170), (0, 255, 255), (0, 170, 255), (0, 85, 255), (0, 0, 255), (85, 0, 255),
    (170, 0, 255), (255, 0, 255), (255, 0, 170), (255, 0, 85),
)  # fmt: skip
LIMB_ALPHA = 0.6  # limbs are drawn at 60% of their colour, joints at full colour
HAND_EDGES: tuple[tuple[int, int], ...] = tuple(
    (0 if j == 0 else 4 * f + j, 4 * f + j + 1) for f in range(5) for j in range(4)
)
HAND_EDGE_COLORS: tuple[tuple[int, int, int], ...] = tuple(
    tuple(round(c * 255) for c in colorsys.hsv_to_rgb(i / len(HAND_EDGES), 1.0, 1.0))  # type: ignore[misc]
    for i in range(len(HAND_EDGES))
)
HAND_JOINT_COLOR = (0, 0, 255)
FACE_COLOR = (255, 255, 255)
REFERENCE_SIDE = 512  # the annotator's widths are for a 512 px short side


def _inputs(keypoints: Any, scores: Any) -> tuple[np.ndarray, np.ndarray]:
    kp = np.asarray(keypoints, dtype=np.float64).reshape(-1, NUM_KEYPOINTS, 2)
    sc = np.asarray(scores, dtype=np.float64).reshape(kp.shape[0], NUM_KEYPOINTS)
    return kp, sc


def coco18_arrays(keypoints: Any, scores: Any) -> tuple[np.ndarray, np.ndarray]:
    """(P, 18, 2) points and (P, 18) scores in OpenPose COCO-18 order (neck: shoulder mid-point,
    scored with the lower shoulder score)."""
    kp, sc = _inputs(keypoints, scores)
    a, b = COCO18_PAIRS[:, 0], COCO18_PAIRS[:, 1]
    return (kp[:, a] + kp[:, b]) / 2.0, np.minimum(sc[:, a], sc[:, b])


def hand_arrays(keypoints: Any, scores: Any, side: str) -> tuple[np.ndarray, np.ndarray]:
    """(P, 21, 2) points and (P, 21) scores of one hand in OpenPose's hand order."""
    kp, sc = _inputs(keypoints, scores)
    idx = HAND_LEFT if side == "left" else HAND_RIGHT
    return kp[:, idx], sc[:, idx]


def _visible(xy: np.ndarray, s: np.ndarray, threshold: float) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.isfinite(xy).all(-1) & np.isfinite(s) & (s >= threshold)


def _flat(xy: np.ndarray, s: np.ndarray, threshold: float) -> list[float]:
    """[x, y, c] per point; points below the threshold or not finite are 0, 0, 0 (not detected)."""
    vis = _visible(xy, s, threshold)
    out: list[float] = []
    for k in range(len(xy)):
        out += (
            [round(float(xy[k, 0]), 2), round(float(xy[k, 1]), 2), round(float(s[k]), 4)]
            if vis[k]
            else [0, 0, 0]
        )
    return out


def openpose_people(
    body: np.ndarray,
    body_s: np.ndarray,
    keypoints: Any,
    scores: Any,
    *,
    threshold: float = 0.3,
    hands: bool = True,
    face: bool = True,
) -> list[dict[str, Any]]:
    """OpenPose's ``people`` entries: each body (P, N, 2) with its scores (P, N) as
    ``pose_keypoints_2d``, and, from the 308 points, ``hand_left/right_keypoints_2d`` (21 each)
    and ``face_keypoints_2d`` (70); the 3D arrays empty, as OpenPose writes them without --3d."""
    left, left_s = hand_arrays(keypoints, scores, "left")
    right, right_s = hand_arrays(keypoints, scores, "right")
    fxy, fs = face70_arrays(keypoints, scores)
    people = []
    for p in range(body.shape[0]):
        people.append(
            {
                "person_id": [-1],
                "pose_keypoints_2d": _flat(body[p], body_s[p], threshold),
                "face_keypoints_2d": _flat(fxy[p], fs[p], threshold) if face else [],
                "hand_left_keypoints_2d": _flat(left[p], left_s[p], threshold) if hands else [],
                "hand_right_keypoints_2d": _flat(right[p], right_s[p], threshold) if hands else [],
                "pose_keypoints_3d": [],
                "face_keypoints_3d": [],
                "hand_left_keypoints_3d": [],
                "hand_right_keypoints_3d": [],
            }
        )
    return people


def openpose_coco18_json(
    keypoints: Any,
    scores: Any,
    *,
    image_size: tuple[int, int],
    threshold: float = 0.3,
    hands: bool = True,
    face: bool = True,
) -> dict[str, Any]:
    """OpenPose JSON (version 1.3) with COCO-18 bodies: per person ``pose_keypoints_2d`` =
    [x, y, c] * 18, with ``hands`` ``hand_left/right_keypoints_2d`` = [x, y, c] * 21, with
    ``face`` ``face_keypoints_2d`` = [x, y, c] * 70.

    ``image_size`` (width, height) is also written as ``canvas_width``/``canvas_height``, the keys
    ComfyUI's pose nodes read next to ``people``.
    """
    body, body_s = coco18_arrays(keypoints, scores)
    people = openpose_people(body, body_s, keypoints, scores, threshold=threshold, hands=hands, face=face)
    w, h = image_size
    return {"version": 1.3, "canvas_width": int(w), "canvas_height": int(h), "people": people}


def _widths(size_hw: tuple[int, int]) -> tuple[int, int, int, int]:
    """(limb half-width, joint radius, hand line thickness, face dot radius) for a canvas, scaled
    from the annotator's 4, 4, 2 and 3 px at 512 px."""
    s = min(size_hw) / REFERENCE_SIDE
    return max(1, round(4 * s)), max(1, round(4 * s)), max(1, round(2 * s)), max(1, round(3 * s))


_FAR = 1 << 20  # points are clipped to +-1M px: cv2 draws in int32 and a wild value must not overflow


def _pt(xy: Any) -> tuple[int, int]:
    x, y = (min(max(float(v), -_FAR), _FAR) for v in xy)
    return int(round(x)), int(round(y))


def _draw_body(canvas: np.ndarray, xy: np.ndarray, vis: np.ndarray, stick: int, radius: int) -> None:
    for (i, j), color in zip(LIMBS, COLORS, strict=False):
        if not (vis[i] and vis[j]):
            continue
        (x1, y1), (x2, y2) = xy[i], xy[j]
        length = min(math.hypot(x2 - x1, y2 - y1), 2 * _FAR)
        angle = math.degrees(math.atan2(y2 - y1, x2 - x1))
        centre = _pt(((x1 + x2) / 2, (y1 + y2) / 2))
        poly = cv2.ellipse2Poly(centre, (int(length / 2), stick), int(round(angle)), 0, 360, 1)
        cv2.fillConvexPoly(canvas, poly, tuple(int(c * LIMB_ALPHA) for c in color))
    for k in range(len(xy)):
        if vis[k]:
            cv2.circle(canvas, _pt(xy[k]), radius, COLORS[k], thickness=-1)


def _draw_hand(canvas: np.ndarray, xy: np.ndarray, vis: np.ndarray, thickness: int, radius: int) -> None:
    for (i, j), color in zip(HAND_EDGES, HAND_EDGE_COLORS, strict=True):
        if vis[i] and vis[j]:
            cv2.line(canvas, _pt(xy[i]), _pt(xy[j]), color, thickness=thickness)
    for k in range(len(xy)):
        if vis[k]:
            cv2.circle(canvas, _pt(xy[k]), radius, HAND_JOINT_COLOR, thickness=-1)


def _draw_face(canvas: np.ndarray, xy: np.ndarray, vis: np.ndarray, radius: int) -> None:
    for k in range(len(xy)):
        if vis[k]:
            cv2.circle(canvas, _pt(xy[k]), radius, FACE_COLOR, thickness=-1)


def draw_openpose(
    keypoints: Any,
    scores: Any,
    size_hw: tuple[int, int],
    *,
    threshold: float = 0.3,
    hands: bool = True,
    face: bool = True,
) -> np.ndarray:
    """The ControlNet OpenPose conditioning picture: (H, W, 3) uint8 RGB, on black: bodies, then
    hands, then the 70 face points (the annotator's order)."""
    h, w = int(size_hw[0]), int(size_hw[1])
    canvas = np.zeros((h, w, 3), np.uint8)
    stick, radius, line, dot = _widths((h, w))
    body, body_s = coco18_arrays(keypoints, scores)
    for p in range(body.shape[0]):
        _draw_body(canvas, body[p], _visible(body[p], body_s[p], threshold), stick, radius)
    if hands:
        for side in ("left", "right"):
            xy, s = hand_arrays(keypoints, scores, side)
            for p in range(xy.shape[0]):
                _draw_hand(canvas, xy[p], _visible(xy[p], s[p], threshold), line, radius)
    if face:
        fxy, fs = face70_arrays(keypoints, scores)
        for p in range(fxy.shape[0]):
            _draw_face(canvas, fxy[p], _visible(fxy[p], fs[p], threshold), dot)
    return canvas


__all__ = [
    "COCO18_NAMES",
    "COCO18_PAIRS",
    "COLORS",
    "FACE_COLOR",
    "HAND_LEFT",
    "HAND_RIGHT",
    "LIMBS",
    "coco18_arrays",
    "draw_openpose",
    "hand_arrays",
    "hand_index",
    "openpose_coco18_json",
    "openpose_people",
]
