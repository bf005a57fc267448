"""Pose's JSON files: Sapiens-308, COCO-17 and OpenPose BODY_25 (dicts a writer writes)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...data.metadata import BODY25_PAIRS, COCO17_INDEX, COCO17_NAMES, KEYPOINT_NAMES, NUM_KEYPOINTS
from .openpose import openpose_people

# COCO person skeleton (1-based keypoint ids), as in the COCO keypoint annotations
COCO17_SKELETON = [
    [16, 14], [14, 12], [17, 15], [15, 13], [12, 13], [6, 12], [7, 13], [6, 7], [6, 8], [7, 9],
    [8, 10], [9, 11], [2, 3], [1, 2], [1, 3], [2, 4], [3, 5], [4, 6], [5, 7],
]  # fmt: skip


# ---------------------------------------------------------------- pose JSON


def _pose_inputs(keypoints: Any, scores: Any, boxes: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    kp = np.asarray(keypoints, dtype=np.float64).reshape(-1, NUM_KEYPOINTS, 2)
    sc = np.asarray(scores, dtype=np.float64).reshape(kp.shape[0], NUM_KEYPOINTS)
    bx = None if boxes is None else np.asarray(boxes, dtype=np.float64).reshape(kp.shape[0], 4)
    return kp, sc, bx


def _r(v: float, nd: int) -> float | None:
    return round(float(v), nd) if math.isfinite(v) else None


def pose_json(
    keypoints: Any,
    scores: Any,
    boxes: Any,
    *,
    image_size: tuple[int, int],
    box_scores: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Sapiens-308 JSON: per person its box [x1, y1, x2, y2] and 308 {name, x, y, score}.

    image_size is (width, height). Coordinates in image px (2 decimals), non-finite -> null.
    """
    kp, sc, bx = _pose_inputs(keypoints, scores, boxes)
    people = []
    for p in range(kp.shape[0]):
        points = [
            {
                "name": KEYPOINT_NAMES[k],
                "x": _r(kp[p, k, 0], 2),
                "y": _r(kp[p, k, 1], 2),
                "score": _r(sc[p, k], 4),
            }
            for k in range(NUM_KEYPOINTS)
        ]
        person: dict[str, Any] = {"id": p, "box": None if bx is None else [_r(v, 2) for v in bx[p]]}
        if box_scores is not None:
            person["box_score"] = _r(box_scores[p], 4)
        person["keypoints"] = points
        people.append(person)
    w, h = image_size
    return {
        "format": "sapiens2-308",
        "image_size": {"width": int(w), "height": int(h)},
        "num_keypoints": NUM_KEYPOINTS,
        "people": people,
    }


def coco17_json(
    keypoints: Any,
    scores: Any,
    boxes: Any,
    *,
    image_size: tuple[int, int],
    box_scores: Sequence[float] | None = None,
    threshold: float = 0.3,
    image_id: int = 0,
) -> dict[str, Any]:
    """COCO-style person keypoints: one annotation per person, ``keypoints`` = [x, y, v] * 17.

    v = 2 (labelled, visible) when the score >= threshold and the point is finite, else the
    triple is 0, 0, 0 (COCO's "not labelled"). bbox is [x, y, w, h]; ``score`` is the box score
    when given, else the mean score of the visible points; ``keypoint_scores`` keeps all 17.
    """
    kp, sc, bx = _pose_inputs(keypoints, scores, boxes)
    w, h = image_size
    anns = []
    for p in range(kp.shape[0]):
        xy, s = kp[p, COCO17_INDEX], sc[p, COCO17_INDEX]
        vis = np.isfinite(xy).all(1) & np.isfinite(s) & (s >= threshold)
        flat: list[float] = []
        for k in range(17):
            flat += [_r(xy[k, 0], 2), _r(xy[k, 1], 2), 2] if vis[k] else [0, 0, 0]
        ann: dict[str, Any] = {
            "id": p + 1,
            "image_id": image_id,
            "category_id": 1,
            "keypoints": flat,
            "num_keypoints": int(vis.sum()),
            "keypoint_scores": [_r(v, 4) for v in s],
        }
        if bx is not None:
            x1, y1, x2, y2 = bx[p]
            ann["bbox"] = [_r(x1, 2), _r(y1, 2), _r(x2 - x1, 2), _r(y2 - y1, 2)]
        score = box_scores[p] if box_scores is not None else (float(s[vis].mean()) if vis.any() else 0.0)
        ann["score"] = _r(score, 4)
        anns.append(ann)
    return {
        "images": [{"id": image_id, "width": int(w), "height": int(h)}],
        "annotations": anns,
        "categories": [
            {"id": 1, "name": "person", "keypoints": list(COCO17_NAMES), "skeleton": COCO17_SKELETON}
        ],
    }


def body25_arrays(keypoints: Any, scores: Any) -> tuple[np.ndarray, np.ndarray]:
    """(P, 25, 2) points and (P, 25) scores in OpenPose BODY_25 order.

    Neck = midpoint of the shoulders, MidHip = midpoint of the hips, each scored with the lower
    of its two scores (OpenPose's convention, not the 308 set's own ``neck`` point).
    """
    kp, sc, _ = _pose_inputs(keypoints, scores, None)
    a, b = BODY25_PAIRS[:, 0], BODY25_PAIRS[:, 1]
    return (kp[:, a] + kp[:, b]) / 2.0, np.minimum(sc[:, a], sc[:, b])


def openpose_body25_json(
    keypoints: Any,
    scores: Any,
    *,
    threshold: float = 0.3,
    hands: bool = True,
    face: bool = True,
    image_size: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """OpenPose JSON (version 1.3): per person ``pose_keypoints_2d`` = [x, y, c] * 25,
    ``hand_left_keypoints_2d`` / ``hand_right_keypoints_2d`` = [x, y, c] * 21 and
    ``face_keypoints_2d`` = [x, y, c] * 70 (:mod:`sapiens2.tasks.pose.openpose`: OpenPose's hand and
    face orders), the 3D arrays empty. ``image_size`` (width, height), when given, is written as
    ``canvas_width``/``canvas_height``, as the COCO-18 file has it.

    Points below the threshold or not finite are written 0, 0, 0 (OpenPose's "not detected").
    """
    xy, s = body25_arrays(keypoints, scores)
    people = openpose_people(xy, s, keypoints, scores, threshold=threshold, hands=hands, face=face)
    if image_size is None:
        return {"version": 1.3, "people": people}
    w, h = image_size
    return {"version": 1.3, "canvas_width": int(w), "canvas_height": int(h), "people": people}
