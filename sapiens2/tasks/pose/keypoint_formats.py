"""Keypoint formats made from the 308 points: COCO-WholeBody-133, OpenPose's 70 face points, and a
long CSV (one row per person and keypoint).

Every target point is a weighted sum of named 308 points (:class:`PointMap`), scored with the
lowest score of its sources. COCO-WholeBody's 133:

* the 53 body, feet and finger points that ``keypoints308.json`` pairs by name
  (``coco_wholebody_to_sapiens308``);
* each hand's root: the 308 wrist; each finger's base (``<finger>1``): the 308
  ``<finger>_third_joint``, which the 308 skeleton links between the wrist and ``<finger>2``
  (the release gives these the COCO-WholeBody sigmas of ``<finger>1``);
* the 68 face points of :mod:`sapiens2.data.face68` (iBUG-300W order, some derived).

The COCO-WholeBody file is in the layout of its results (what its evaluation loads with
``COCO.loadRes``, see the dataset's ``data_format.md``): a list with one entry per person,
``keypoints`` (17 body) and ``foot_kpts``, ``face_kpts``, ``lefthand_kpts``, ``righthand_kpts``,
each ``[x, y, score] * n``, plus ``image_id``, ``category_id`` 1 and ``score``.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...data.face68 import FACE68, FACE70
from ...data.metadata import (
    COCO_WHOLEBODY_NAMES,
    COCO_WHOLEBODY_PARTS,
    COCO_WHOLEBODY_TO_308,
    KEYPOINT_NAMES,
    NUM_KEYPOINTS,
    keypoint_index,
)
from ...outputs.writers import NOW, Writer
from ...outputs.writers import prepare as _prepare

Sources = Sequence[tuple[str, float]]


class PointMap:
    """K output points, each a weighted sum of 308 points, scored with its sources' lowest score."""

    def __init__(self, sources: Sequence[Sources]) -> None:
        width = max(len(s) for s in sources)
        self.index = np.zeros((len(sources), width), np.int64)
        self.weight = np.zeros((len(sources), width), np.float64)
        for k, src in enumerate(sources):
            for j in range(width):  # padding: the first source again, weight 0 (min unchanged)
                name, w = src[j] if j < len(src) else (src[0][0], 0.0)
                self.index[k, j], self.weight[k, j] = keypoint_index(name), w
        self.derived = np.array([len(s) > 1 for s in sources])
        for arr in (self.index, self.weight, self.derived):
            arr.setflags(write=False)

    def __len__(self) -> int:
        return len(self.index)

    def __call__(self, keypoints: Any, scores: Any) -> tuple[np.ndarray, np.ndarray]:
        """(P, K, 2) points and (P, K) scores from (P, 308, 2) points and (P, 308) scores."""
        kp = np.asarray(keypoints, dtype=np.float64).reshape(-1, NUM_KEYPOINTS, 2)
        sc = np.asarray(scores, dtype=np.float64).reshape(kp.shape[0], NUM_KEYPOINTS)
        with np.errstate(invalid="ignore", over="ignore"):
            xy = np.einsum("pkjd,kj->pkd", kp[:, self.index], self.weight)
        return xy, sc[:, self.index].min(-1)


def _wholebody_sources() -> list[tuple[tuple[str, float], ...]]:
    out: list[tuple[tuple[str, float], ...]] = []
    face = {23 + p.index: p.sources for p in FACE68}
    for k, name in enumerate(COCO_WHOLEBODY_NAMES):
        if k in COCO_WHOLEBODY_TO_308:  # by name, from keypoints308.json
            out.append(((KEYPOINT_NAMES[COCO_WHOLEBODY_TO_308[k]], 1.0),))
        elif k in face:
            out.append(face[k])
        elif name.endswith("_hand_root"):
            out.append(((name.replace("_hand_root", "_wrist"), 1.0),))
        elif name.endswith("1"):  # a finger's base joint
            out.append(((name[:-1] + "_third_joint", 1.0),))
        else:  # pragma: no cover - every index is one of the above (checked at import)
            raise AssertionError(f"COCO-WholeBody {k} {name} has no source")
    return out


#: COCO-WholeBody's 133 points from the 308
WHOLEBODY = PointMap(_wholebody_sources())
#: OpenPose's 70 face points (iBUG 68 + right, left pupil) from the 308
FACE = PointMap([p.sources for p in FACE70])


def _r(v: float, nd: int) -> float:
    return round(float(v), nd)


def _triples(xy: np.ndarray, s: np.ndarray) -> list[float]:
    """[x, y, score] per point; a point that is not finite is 0, 0, 0 (the evaluation needs
    numbers); a score below 0 (not found) is written 0."""
    out: list[float] = []
    for (x, y), c in zip(xy, s, strict=True):
        ok = math.isfinite(x) and math.isfinite(y) and math.isfinite(c)
        out += [_r(x, 2), _r(y, 2), _r(max(c, 0.0), 4)] if ok else [0, 0, 0]
    return out


def coco_wholebody_json(
    keypoints: Any,
    scores: Any,
    *,
    box_scores: Sequence[float] | None = None,
    threshold: float = 0.3,
    image_id: int = 0,
    extra: Sequence[dict[str, Any]] | None = None,
    points133: tuple[Any, Any] | None = None,
) -> list[dict[str, Any]]:
    """COCO-WholeBody results: one entry per person (see the module docstring).

    Every point is written with its score (results carry no visibility; the evaluation ranks
    people by ``score``), ``score`` being the mean score of the points at or above ``threshold``
    (0 if none), times the box score when given. ``face_kpts_derived``: 1 for a face point that
    is not one named 308 point (:mod:`sapiens2.data.face68`). ``extra``: fields added per person
    (e.g. a clip's ``track_id``). ``points133``: a 133-keypoint model's own (P, 133, 2) points and
    (P, 133) scores, written as they are (none derived) instead of those made from the 308."""
    if points133 is None:
        xy, s = WHOLEBODY(keypoints, scores)
        flags = [int(d) for d in WHOLEBODY.derived[slice(*COCO_WHOLEBODY_PARTS["face_kpts"])]]
    else:
        xy = np.asarray(points133[0], np.float64).reshape(-1, len(COCO_WHOLEBODY_NAMES), 2)
        s = np.asarray(points133[1], np.float64).reshape(xy.shape[0], len(COCO_WHOLEBODY_NAMES))
        flags = [0] * (COCO_WHOLEBODY_PARTS["face_kpts"][1] - COCO_WHOLEBODY_PARTS["face_kpts"][0])
    out = []
    for p in range(xy.shape[0]):
        with np.errstate(invalid="ignore"):
            good = s[p][np.isfinite(s[p]) & (s[p] >= threshold)]
        score = float(good.mean()) if good.size else 0.0
        if box_scores is not None and math.isfinite(float(box_scores[p])):
            score *= float(box_scores[p])
        person: dict[str, Any] = {"image_id": int(image_id), "category_id": 1}
        for part, (a, b) in COCO_WHOLEBODY_PARTS.items():
            person[part] = _triples(xy[p, a:b], s[p, a:b])
        person.update(score=_r(score, 4), face_kpts_derived=flags)
        if extra is not None:
            person.update(extra[p])
        out.append(person)
    return out


def face70_arrays(keypoints: Any, scores: Any) -> tuple[np.ndarray, np.ndarray]:
    """(P, 70, 2) points and (P, 70) scores in OpenPose's face order."""
    return FACE(keypoints, scores)


# ---------------------------------------------------------------- the long CSV

PHOTO_COLUMNS = ("image", "person", "keypoint_id", "name", "x", "y", "score")
CLIP_COLUMNS = ("image", "frame", "time_s", "person", "keypoint_id", "name", "x", "y", "score")


def _num(v: float, nd: int) -> str:
    return f"{v:.{nd}f}" if math.isfinite(v) else ""


def csv_rows(
    image: str,
    keypoints: Any,
    scores: Any,
    people: Sequence[int] | None = None,
    lead: Sequence[Any] = (),
    names: Sequence[str] = KEYPOINT_NAMES,
) -> Iterable[list[Any]]:
    """One row per person and keypoint of ``names`` (the 308, or a v1 model's own set):
    ``image, *lead, person, id, name, x, y, score`` (coordinates 2 decimals, scores 4; not
    finite: empty)."""
    kp = np.asarray(keypoints, dtype=np.float64).reshape(-1, len(names), 2)
    sc = np.asarray(scores, dtype=np.float64).reshape(kp.shape[0], len(names))
    ids = range(kp.shape[0]) if people is None else people
    for p, pid in enumerate(ids):
        for k, name in enumerate(names):
            x, y = kp[p, k]
            yield [image, *lead, pid, k, name, _num(x, 2), _num(y, 2), _num(sc[p, k], 4)]


def write_csv(
    path: str | Path, columns: Sequence[str], rows: Iterable[list[Any]], *, writer: Writer = NOW
) -> Path:
    """A UTF-8 CSV with a header row (the rows are made when it is written)."""

    def write(p: Path) -> None:
        with open(p, "w", encoding="utf-8", newline="") as f:
            out = csv.writer(f)
            out.writerow(columns)
            out.writerows(rows)

    return writer.write(_prepare(path), write)


def write_keypoints_csv(
    path: str | Path,
    image: str,
    keypoints: Any,
    scores: Any,
    *,
    writer: Writer = NOW,
    names: Sequence[str] = KEYPOINT_NAMES,
) -> Path:
    """``<photo>_keypoints.csv``: image, person, keypoint_id, name, x, y, score (per keypoint of
    ``names``: the 308, or a v1 model's own set)."""
    kp = np.array(keypoints, dtype=np.float64)  # a copy: a pooled write must not see later edits
    sc = np.array(scores, dtype=np.float64)
    return write_csv(path, PHOTO_COLUMNS, csv_rows(image, kp, sc, names=names), writer=writer)


__all__ = [
    "CLIP_COLUMNS",
    "FACE",
    "PHOTO_COLUMNS",
    "WHOLEBODY",
    "PointMap",
    "coco_wholebody_json",
    "csv_rows",
    "face70_arrays",
    "write_csv",
    "write_keypoints_csv",
]
