"""The vectors people are found by, and exact search over a few of them (numpy only).

* appearance: one vector per person the detector found, the backbone's patch features pooled
  over their box (``features`` with ``per_person``: one forward, no crops), L2-normalised, so a
  dot product is a cosine; a photo where nobody was found (or made without ``per_person``) has
  one vector, its CLS embedding, with person :data:`WHOLE_PHOTO` and the photo as its box;
* pose: one vector per person from the 308 keypoints: the confident points (score >= the
  threshold) centred on their mean and divided by their RMS distance from it (position and scale
  gone), the others zeroed, then L2-normalised. Two people in the same pose score 1 whatever
  they wear and wherever they stand; :func:`mirrored` is the same pose seen in a mirrored photo
  (left and right swapped through the keypoints' flip pairs), so a search may match either.

:func:`top_k` and :func:`kmeans` serve small sets (a visitor's photos, a query's few candidates):
exact, in memory, no database.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..data.metadata import FLIP_INDEX, NUM_KEYPOINTS
from ..errors import OptionError

#: Keypoints scored below this are left out of a pose vector (pose's own default threshold of a
#: drawn point is the same).
POSE_SCORE_MIN = 0.3
#: A person with fewer confident keypoints has no pose vector (no shape to compare).
POSE_POINTS_MIN = 5
POSE_DIM = NUM_KEYPOINTS * 2
#: The person index of an appearance vector that is the whole photo's (nobody was found in it).
WHOLE_PHOTO = -1


def normalised(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (float32); OptionError for a zero or non-finite row."""
    v = np.asarray(vectors, np.float32)
    v = v.reshape(1, -1) if v.ndim == 1 else v
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    if not np.isfinite(v).all() or (norms == 0).any():
        raise OptionError("An embedding is all zeros or not finite; it cannot be searched by.")
    return v / norms


def appearance_people(
    embedding: np.ndarray,
    person_boxes: np.ndarray | None,
    person_embeddings: np.ndarray | None,
    width: int,
    height: int,
) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """A photo's appearance vectors as (person, box, unit vector): each person's pooled vector
    (``person_embeddings``: (P, D), or the P * D values flat, as a batch row keeps them), or, with
    no person, the unit CLS ``embedding`` as :data:`WHOLE_PHOTO` with the photo for its box. A
    person whose vector is all zeros is left out. OptionError when the widths disagree or the CLS
    cannot be normalised."""
    cls = np.asarray(embedding, np.float32).reshape(-1)
    found = []
    if person_boxes is not None and len(person_boxes) and person_embeddings is not None:
        boxes = np.asarray(person_boxes, np.float32).reshape(-1, 4)
        flat = np.asarray(person_embeddings, np.float32).reshape(-1)
        if flat.size != len(boxes) * cls.size:
            raise OptionError(
                f"{len(boxes)} person boxes but {flat.size} person values for vectors of {cls.size}."
            )
        for p, (box, v) in enumerate(zip(boxes, flat.reshape(len(boxes), cls.size), strict=True)):
            norm = float(np.linalg.norm(v))
            if np.isfinite(v).all() and norm > 0:
                found.append((p, box, v / norm))
    if not found:
        found.append((WHOLE_PHOTO, np.array([0, 0, width, height], np.float32), normalised(cls)[0]))
    return found


def pose_vector(
    keypoints: np.ndarray, scores: np.ndarray, score_min: float = POSE_SCORE_MIN
) -> np.ndarray | None:
    """One person's pose vector (see the module docstring), or None with fewer than
    :data:`POSE_POINTS_MIN` confident keypoints."""
    kp = np.asarray(keypoints, np.float64).reshape(NUM_KEYPOINTS, 2)
    valid = (np.asarray(scores, np.float64).reshape(NUM_KEYPOINTS) >= score_min) & np.isfinite(kp).all(1)
    if valid.sum() < POSE_POINTS_MIN:
        return None
    centred = kp - kp[valid].mean(0)
    spread = float(np.sqrt((centred[valid] ** 2).sum(1).mean()))
    if spread <= 1e-9:
        return None
    centred[~valid] = 0.0
    v = (centred / spread).reshape(-1)
    return (v / np.linalg.norm(v)).astype(np.float32)


def mirrored(vectors: np.ndarray) -> np.ndarray:
    """Pose vectors of the same poses seen in a mirrored photo: x negated, left and right swapped."""
    v = np.asarray(vectors, np.float32).reshape(-1, NUM_KEYPOINTS, 2)[:, FLIP_INDEX].copy()
    v[..., 0] *= -1
    return v.reshape(-1, POSE_DIM)


#: Search kind -> its vectors' mirror image (a pose is searched as seen and mirrored; appearance is not).
MIRRORS: dict[str, Callable[[np.ndarray], np.ndarray]] = {"pose": mirrored}


def top_k(query: np.ndarray, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices, cosine scores) of the ``k`` rows of unit ``vectors`` nearest the unit ``query``,
    best first (exact)."""
    if len(vectors) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    scores = np.asarray(vectors, np.float32) @ np.asarray(query, np.float32).reshape(-1)
    k = min(int(k), len(scores))
    part = np.argpartition(-scores, k - 1)[:k]
    order = part[np.lexsort((part, -scores[part]))]  # ties: the earlier row first
    return order, scores[order]


def kmeans(vectors: np.ndarray, groups: int, *, iterations: int = 30, seed: int = 0) -> np.ndarray:
    """A group label per row of unit ``vectors`` (spherical k-means: cosine, k-means++ start,
    deterministic for a seed). ``groups`` is capped at the number of rows."""
    x = np.asarray(vectors, np.float32)
    n = len(x)
    if n == 0:
        return np.zeros(0, np.int64)
    k = max(1, min(int(groups), n))
    rng = np.random.default_rng(seed)
    centres = [x[rng.integers(n)]]
    for _ in range(1, k):  # k-means++: far rows are likelier next centres
        d = np.clip(1.0 - np.max(x @ np.stack(centres).T, axis=1), 0.0, None)
        total = float(d.sum())
        centres.append(x[rng.choice(n, p=d / total)] if total > 0 else x[rng.integers(n)])
    c = np.stack(centres)
    labels = np.full(n, -1)
    for _ in range(iterations):
        new = np.argmax(x @ c.T, axis=1)
        if np.array_equal(new, labels):
            break
        labels = new
        for g in range(k):
            members = x[labels == g]
            if len(members):
                mean = members.sum(0)
                c[g] = mean / max(float(np.linalg.norm(mean)), 1e-12)
    return labels
