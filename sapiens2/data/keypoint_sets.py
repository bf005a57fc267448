"""The keypoint sets a pose model may give: COCO-17, COCO-WholeBody-133 (Sapiens v1 only) and
the 308 Goliath set (Sapiens2, and v1's 308 models: identical names, order, colours and links,
SAPIENS_V1_SPEC.md 5).

Everything past decoding works on the 308 layout, so a 17 or 133 result is also *lifted* into it:
each of its points that the 308 set names goes to that slot, every other 308 slot scores 0 (not
found). The set's own points are kept besides, for the exports that are exactly that set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import OptionError
from .face68 import FACE68
from .metadata import (
    COCO17_NAMES,
    COCO_WHOLEBODY_NAMES,
    COCO_WHOLEBODY_TO_308,
    FLIP_INDEX,
    KEYPOINT_NAMES,
    NUM_KEYPOINTS,
    keypoint_index,
)

# iBUG-300W's mirror (jaw, brows, nose base, eyes, lips reversed; the nose bridge on the axis)
_FACE_MIRROR = (
    [*range(16, -1, -1), *range(26, 16, -1), 27, 28, 29, 30, *range(35, 30, -1)]
    + [45, 44, 43, 42, 47, 46, 39, 38, 37, 36, 41, 40]
    + [*range(54, 47, -1), *range(59, 54, -1), *range(64, 59, -1), *range(67, 64, -1)]
)


@dataclass(frozen=True)
class KeypointSet:
    """A keypoint set: its names in the model's channel order, the flip test's left/right swap,
    and the 308 slot of each point (-1: the 308 set has no such point)."""

    name: str
    label: str
    names: tuple[str, ...]
    flip_index: np.ndarray
    to308: np.ndarray
    #: what a result of this set cannot give (said beside it); empty for the 308 set
    lacks: str = ""

    @property
    def count(self) -> int:
        return len(self.names)

    def lift(self, keypoints: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(P, K, 2) points and (P, K) scores of this set -> the (P, 308, 2) / (P, 308) layout
        (absent points at (0, 0), score 0)."""
        if self.count == NUM_KEYPOINTS:
            return keypoints, scores
        kp = np.zeros((len(keypoints), NUM_KEYPOINTS, 2), np.float32)
        sc = np.zeros((len(keypoints), NUM_KEYPOINTS), np.float32)
        for k in np.flatnonzero(self.to308 >= 0)[::-1]:  # body last: its wrists win over hand roots
            kp[:, self.to308[k]], sc[:, self.to308[k]] = keypoints[:, k], scores[:, k]
        return kp, sc


def _mirror(name: str) -> str:
    for a, b in (("left_", "right_"), ("right_", "left_")):
        if name.startswith(a):
            return b + name[len(a) :]
    return name


def _flip(names: tuple[str, ...]) -> np.ndarray:
    where = {n: i for i, n in enumerate(names)}
    out = [where[_mirror(n)] for n in names]
    for i, j in enumerate(_FACE_MIRROR):
        if f"face-{i}" in where:
            out[where[f"face-{i}"]] = where[f"face-{j}"]
    return np.array(out, np.int64)


def _wholebody_to308() -> np.ndarray:
    face = {23 + p.index: keypoint_index(p.sources[0][0]) for p in FACE68 if not p.derived}
    out = np.full(len(COCO_WHOLEBODY_NAMES), -1, np.int64)
    for k, name in enumerate(COCO_WHOLEBODY_NAMES):
        if k in COCO_WHOLEBODY_TO_308:
            out[k] = COCO_WHOLEBODY_TO_308[k]
        elif k in face:
            out[k] = face[k]
        elif name.endswith("_hand_root"):
            out[k] = keypoint_index(name.replace("_hand_root", "_wrist"))
        elif name.endswith("1") and not name.startswith("face-"):  # a finger base: the 308 third joint
            out[k] = keypoint_index(name[:-1] + "_third_joint")
    return out


_WB = _wholebody_to308()
COCO17 = KeypointSet(
    "coco17", "COCO-17", COCO17_NAMES, _flip(COCO17_NAMES), _WB[:17],
    "a 17-keypoint (COCO) model gives the body only: feet (BODY_25's toes and heels), face and "
    "hands need a 133- or 308-keypoint model; those points are written with score 0",
)  # fmt: skip
WHOLEBODY133 = KeypointSet(
    "coco_wholebody133", "COCO-WholeBody-133", COCO_WHOLEBODY_NAMES, _flip(COCO_WHOLEBODY_NAMES), _WB,
    "a 133-keypoint (COCO-WholeBody) model has no 308-only points (e.g. the pupils, elbow and "
    "shoulder landmarks, most face points): those score 0 in the 308 layout",
)  # fmt: skip
GOLIATH308 = KeypointSet("goliath308", "308 (Goliath)", KEYPOINT_NAMES, FLIP_INDEX, np.arange(NUM_KEYPOINTS))
SETS = {s.count: s for s in (COCO17, WHOLEBODY133, GOLIATH308)}
BY_NAME = {s.name: s for s in SETS.values()}
for _s in SETS.values():
    for _arr in (_s.flip_index, _s.to308):
        _arr.setflags(write=False)


def keypoint_set(count: int) -> KeypointSet:
    """The set of a model with ``count`` heatmaps; OptionError for any other count."""
    if count not in SETS:
        raise OptionError(
            f"The pose model returned {count} heatmaps; the keypoint sets are "
            f"{', '.join(f'{s.count} ({s.label})' for s in SETS.values())}."
        )
    return SETS[count]


__all__ = ["BY_NAME", "COCO17", "GOLIATH308", "SETS", "WHOLEBODY133", "KeypointSet", "keypoint_set"]
