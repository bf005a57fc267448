"""Keypoint and segmentation metadata: names, colours, links, groups and format mappings.

Everything here is read once from ``data/keypoints308.json`` and ``data/seg29.json`` (the single
source of truth) at import time; the module exposes plain numpy arrays and tuples.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import OptionError

_DATA = Path(__file__).parent


@cache
def _load(name: str) -> dict[str, Any]:
    with open(_DATA / name, encoding="utf-8") as f:
        return json.load(f)


_KP = _load("keypoints308.json")
_SEG = _load("seg29.json")

NUM_KEYPOINTS: int = int(_KP["num_keypoints"])
KEYPOINT_NAMES: tuple[str, ...] = tuple(k["name"] for k in _KP["keypoints"])
KEYPOINT_COLORS: np.ndarray = np.array([k["color_rgb"] for k in _KP["keypoints"]], dtype=np.uint8)
# (from, to, rgb) per link, drawn in this order
SKELETON: tuple[tuple[int, int, tuple[int, int, int]], ...] = tuple(
    (int(s["from"]), int(s["to"]), tuple(int(c) for c in s["color_rgb"])) for s in _KP["skeleton"]
)
FLIP_INDEX: np.ndarray = np.array(_KP["flip_index"], dtype=np.int64)
KEYPOINT_GROUPS: dict[str, np.ndarray] = {
    name: np.array(ids, dtype=np.int64) for name, ids in _KP["groups"].items()
}
_NAME_TO_INDEX = {n: i for i, n in enumerate(KEYPOINT_NAMES)}

NUM_SEG_CLASSES: int = int(_SEG["num_classes"])
SEG_CLASS_NAMES: tuple[str, ...] = tuple(c["name"] for c in _SEG["classes"])
SEG_PALETTE: np.ndarray = np.array([c["color_rgb"] for c in _SEG["classes"]], dtype=np.uint8)
#: the classes' names for people ("Right upper leg", "Face and neck"), in id order; the
#: identifiers above stay the names of the API, the files and the options
SEG_CLASS_LABELS: tuple[str, ...] = tuple(
    {"Face_Neck": "Face and neck", "Eyeglass": "Eyeglasses"}.get(n, n.replace("_", " ").capitalize())
    for n in SEG_CLASS_NAMES
)

for _arr in (KEYPOINT_COLORS, FLIP_INDEX, SEG_PALETTE, *KEYPOINT_GROUPS.values()):
    _arr.setflags(write=False)  # shared module constants: nobody may edit them in place

# COCO-WholeBody index -> 308 index, for the points both formats name alike
COCO_WHOLEBODY_TO_308: dict[int, int] = {
    int(k): int(v) for k, v in _KP["coco_wholebody_to_sapiens308"]["mapping"].items()
}
COCO17_NAMES: tuple[str, ...] = (
    "nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder", "right_shoulder",
    "left_elbow", "right_elbow", "left_wrist", "right_wrist", "left_hip", "right_hip",
    "left_knee", "right_knee", "left_ankle", "right_ankle",
)  # fmt: skip
# COCO-17 = the first 17 COCO-WholeBody points; entry k = the 308 index of COCO point k
COCO17_INDEX: np.ndarray = np.array([COCO_WHOLEBODY_TO_308[k] for k in range(17)], dtype=np.int64)
COCO17_INDEX.setflags(write=False)

# COCO-WholeBody's 133 names in its order: 17 body (COCO), 6 feet, 68 face (``face-0`` ... in the
# iBUG-300W order), 21 left hand, 21 right hand (root = wrist, then each finger 1 = base .. 4 = tip),
# as its annotation files and mmpose name them
_WB_FINGERS = ("thumb", "forefinger", "middle_finger", "ring_finger", "pinky_finger")
COCO_WHOLEBODY_NAMES: tuple[str, ...] = (
    *COCO17_NAMES,
    "left_big_toe", "left_small_toe", "left_heel", "right_big_toe", "right_small_toe", "right_heel",
    *(f"face-{i}" for i in range(68)),
    *(
        name
        for side in ("left", "right")
        for name in (f"{side}_hand_root", *(f"{side}_{f}{j}" for f in _WB_FINGERS for j in range(1, 5)))
    ),
)  # fmt: skip
#: part -> (start, stop) in the 133, in the order of the results' fields (body is ``keypoints``)
COCO_WHOLEBODY_PARTS: dict[str, tuple[int, int]] = {
    "keypoints": (0, 17), "foot_kpts": (17, 23), "face_kpts": (23, 91), "lefthand_kpts": (91, 112),
    "righthand_kpts": (112, 133),
}  # fmt: skip

# OpenPose BODY_25 order; each entry is one 308 name, or two names whose midpoint is used
# (OpenPose's neck and mid-hip are midpoints of the shoulders / hips; score = the lower one).
BODY25_NAMES: tuple[str, ...] = (
    "Nose", "Neck", "RShoulder", "RElbow", "RWrist", "LShoulder", "LElbow", "LWrist", "MidHip",
    "RHip", "RKnee", "RAnkle", "LHip", "LKnee", "LAnkle", "REye", "LEye", "REar", "LEar",
    "LBigToe", "LSmallToe", "LHeel", "RBigToe", "RSmallToe", "RHeel",
)  # fmt: skip
_BODY25_SOURCES: tuple[tuple[str, ...], ...] = (
    ("nose",), ("left_shoulder", "right_shoulder"), ("right_shoulder",), ("right_elbow",),
    ("right_wrist",), ("left_shoulder",), ("left_elbow",), ("left_wrist",),
    ("left_hip", "right_hip"), ("right_hip",), ("right_knee",), ("right_ankle",), ("left_hip",),
    ("left_knee",), ("left_ankle",), ("right_eye",), ("left_eye",), ("right_ear",), ("left_ear",),
    ("left_big_toe",), ("left_small_toe",), ("left_heel",), ("right_big_toe",),
    ("right_small_toe",), ("right_heel",),
)  # fmt: skip
# (25, 2) pairs of 308 indices; single points repeat their index so midpoint == the point
BODY25_PAIRS: np.ndarray = np.array(
    [[_NAME_TO_INDEX[s[0]], _NAME_TO_INDEX[s[-1]]] for s in _BODY25_SOURCES], dtype=np.int64
)
BODY25_PAIRS.setflags(write=False)


def keypoint_index(name: str) -> int:
    """Index of a 308-keypoint name, e.g. ``keypoint_index("left_wrist") == 62``."""
    try:
        return _NAME_TO_INDEX[name]
    except KeyError:
        raise OptionError(
            f"Unknown keypoint name {name!r}; names are listed in sapiens2/data/keypoints308.json "
            f"(e.g. {', '.join(KEYPOINT_NAMES[:5])}, ...)."
        ) from None


def _norm_class(name: str) -> str:
    # case-insensitive; spaces, hyphens and underscores are the same separator
    return re.sub(r"[\s_\-]+", "_", str(name).strip().lower())


_SEG_LOOKUP = {_norm_class(n): i for i, n in enumerate(SEG_CLASS_NAMES)}


def seg_class_ids(names: Iterable[str | int]) -> list[int]:
    """Class ids for body-part class names (``"left hand"``, ``"Left_Hand"`` ...) or ids.

    Returns sorted ids without duplicates. Raises OptionError naming every valid class when
    one is unknown.
    """
    if isinstance(names, str):
        names = [names]
    ids: set[int] = set()
    unknown: list[str] = []
    for name in names:
        if isinstance(name, (int, np.integer)) and not isinstance(name, bool):
            if 0 <= int(name) < NUM_SEG_CLASSES:
                ids.add(int(name))
            else:
                unknown.append(str(name))
            continue
        key = _norm_class(name)
        if key in _SEG_LOOKUP:
            ids.add(_SEG_LOOKUP[key])
        else:
            unknown.append(repr(name))
    if unknown:
        raise OptionError(
            f"Unknown body-part class {', '.join(unknown)}. Valid classes (names or ids "
            f"0-{NUM_SEG_CLASSES - 1}): {', '.join(SEG_CLASS_NAMES)}."
        )
    return sorted(ids)
