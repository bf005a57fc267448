"""The values pose's stages hand each other: :class:`PosePrep` (prepare -> the device step) and
:class:`PoseRaw` (the device step -> finish), and how the device step builds them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ...data.keypoint_sets import KeypointSet
from ..base import RunInfo

if TYPE_CHECKING:
    from ...models.detector import Detections


@dataclass
class PosePrep:
    """One photo's input to the device step (small and picklable: uint8 pixels, no model data).

    Without ``found``: the working copy, and the device step runs the detector. With the people
    ``found`` before the device step (the caller's boxes, the whole photo's when the pipeline has
    no detector, or a detector step's): the release's uint8 person crops made here when they are
    smaller than the working copy (a large photo), else the working copy.
    """

    image: np.ndarray | None  # (h, w, 3) uint8 working copy
    crops: np.ndarray | None = None  # (P, H, W, 3) uint8 at the network input size
    notices: list[str] = field(default_factory=list)
    pointmap: Any = None  # the borrowed pointmap's prep (keypoints_3d)
    found: Detections | None = None  # people known before the device step (working-copy pixels)

    @property
    def boxes(self) -> np.ndarray | None:
        """(P, 4) working-copy boxes of the people known before the device step (else None)."""
        return None if self.found is None else self.found.boxes


@dataclass
class PoseRaw:
    """One photo's device result: per person a box and 308 keypoints in working-copy pixels."""

    keypoints: np.ndarray  # (P, 308, 2) float32
    scores: np.ndarray  # (P, 308) float32
    boxes: np.ndarray  # (P, 4) float32
    box_scores: np.ndarray  # (P,) float32
    source: str
    num_found: int
    flip_test: bool
    info: RunInfo
    notices: list[str] = field(default_factory=list)
    pointmap: Any = None  # the borrowed pointmap's raw (keypoints_3d)
    keypoint_set: str = "goliath308"  # the model's set (``sapiens2.data.keypoint_sets``)
    #: a 17 / 133 model's own (P, K, 2) points and (P, K) scores (``keypoints`` is the 308 lift)
    native: tuple[np.ndarray, np.ndarray] | None = None


def with_set(raw: PoseRaw, kset: KeypointSet, keypoints: np.ndarray, scores: np.ndarray) -> PoseRaw:
    """``raw`` labelled with the model's keypoint set; a set other than 308 keeps its own points
    and says what it cannot give."""
    raw.keypoint_set = kset.name
    if kset.lacks:
        raw.native = (keypoints, scores)
        raw.notices = notices_once(raw.notices, [f"Keypoint set {kset.label}: {kset.lacks}."])
    return raw


def people_spans(counts: list[int], lo: int, hi: int) -> list[tuple[int, slice]]:
    """The people ``lo``..``hi`` of the batch (counted across preps of ``counts`` people each) as
    (prep index, its people) pieces."""
    spans, start = [], 0
    for i, n in enumerate(counts):
        a, b = max(lo, start), min(hi, start + n)
        if a < b:
            spans.append((i, slice(a - start, b - start)))
        start += n
    return spans


def pose_raw(
    prep: PosePrep, det: Detections, keypoints: np.ndarray, scores: np.ndarray, bad: int, flip_test: bool,
    info: RunInfo, pointmap: Any,
) -> PoseRaw:  # fmt: skip
    """One photo's device result: keypoints and boxes in working-copy pixels, its notices, and the
    borrowed pointmap's raw (``keypoints_3d``; else None)."""
    notices = notices_once(prep.notices, det.notices)
    if bad:
        notices.append(
            f"The pose model returned NaN/inf in {bad} heatmap(s); those values were treated as 0."
        )
    boxes, box_scores = np.asarray(det.boxes, np.float32), np.asarray(det.scores, np.float32)
    return PoseRaw(keypoints, scores, boxes, box_scores, det.source, int(det.num_found), flip_test, info,
                   notices, pointmap)  # fmt: skip


def notices_once(*lists: list[str]) -> list[str]:
    """Notices in order, each once."""
    return list(dict.fromkeys(n for notices in lists for n in notices))


__all__ = ["PosePrep", "PoseRaw", "notices_once", "people_spans", "pose_raw", "with_set"]
