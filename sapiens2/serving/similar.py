""" "Find similar" over a visitor's small set: the set and the query photo through one task
(features with ``per_person`` for appearance, pose for pose) in ONE device call, then exact search
and k-means in numpy (:mod:`sapiens2.search.vectors`): a set of at most 32 photos needs no database.

What a set costs is priced as every GPU call is (``models.cost``), so the photos that fit a
visitor's call are known before anything runs (:func:`photos_that_fit`). The set's vectors are
kept in a :class:`PeopleSet` for the visitor's session (the page keeps it in a ``gr.State``
whose end deletes its folder), so "Group" after "Find similar" costs no second GPU call.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from ..errors import InputImageError
from ..inputs.intake import Intake, load_image
from ..models import cost
from ..search.vectors import MIRRORS, WHOLE_PHOTO, appearance_people, kmeans, pose_vector, top_k
from ..tasks.registry import Task
from .photo_set import MAX_SET_PHOTOS
from .request_runner import RequestRunner, model_sizes

#: Side of a gallery picture, pixels.
THUMB_SIDE = 256
#: The inference options a set runs with, per kind: appearance one vector per person.
SET_OPTIONS: dict[str, dict[str, Any]] = {"appearance": {"per_person": True}, "pose": {}}


def photos_that_fit(runner: RequestRunner, task: Task, size: str | None, options: dict[str, Any]) -> int:
    """How many set photos (besides the query) one call of ``task`` may take within the longest
    call a visitor can start (``cost.MAX_CALL_S``), at most :data:`MAX_SET_PHOTOS`."""
    size = runner.manager.resolve_size(task, size)
    infer, _ = task.split(options, gpu=runner.manager.cuda)
    budget = cost.work_budget(
        cost.resident_for(runner.manager.resident_bytes(), model_sizes(task, size, infer))
    )
    per_photo = cost.photo_seconds(size, task.work(infer))
    return max(0, min(MAX_SET_PHOTOS, int(budget // per_photo) - 1))


@dataclass
class Person:
    """One searchable person of the set: its photo, index there, box and unit vector."""

    photo: int
    person: int
    box: tuple[float, float, float, float]
    vector: np.ndarray


@dataclass
class PeopleSet:
    """A visitor's set, run through one task: its photos (small copies to draw on) and people."""

    key: tuple[Any, ...]  # what it was made from: the files, the kind, the size
    kind: str
    names: list[str]
    pictures: list[np.ndarray]  # RGB, at most THUMB_SIDE * 2 on a side
    people: list[Person]
    folder: Path | None = None  # where its gallery pictures go; deleted with the session
    query: list[np.ndarray] = field(default_factory=list)  # the query's vectors (pose: and mirrored)
    query_photo: str = ""  # what the query was (a digest of its file): a new query runs the set anew

    def close(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def _small(rgb: np.ndarray) -> tuple[np.ndarray, float]:
    h, w = rgb.shape[:2]
    scale = min(1.0, 2 * THUMB_SIDE / max(h, w))
    if scale == 1.0:
        return np.ascontiguousarray(rgb), 1.0
    return cv2.resize(rgb, (round(w * scale), round(h * scale)), interpolation=cv2.INTER_AREA), scale


def _people(kind: str, result: Any, photo: int) -> list[Person]:
    h, w = result.image.shape[:2]
    if kind == "appearance":
        found = appearance_people(result.embedding, result.person_boxes, result.person_embeddings, w, h)
        return [Person(photo, p, tuple(float(x) for x in box), v) for p, box, v in found]
    found = []
    for p in range(len(result.keypoints)):
        v = pose_vector(result.keypoints[p], result.scores[p])
        if v is not None:
            found.append(Person(photo, p, tuple(float(x) for x in result.boxes[p]), v))
    return found


def run_set(
    runner: RequestRunner,
    task: Task,
    kind: str,
    query: Any,
    photos: Sequence[tuple[str, bytes]],
    size: str | None,
    key: tuple[Any, ...],
) -> PeopleSet:
    """The set and the query through ``task`` in one device call (as a comparison is), kept as a
    PeopleSet. InputImageError names a photo that cannot be read."""
    intakes: list[Intake] = []
    for name, data in photos:
        try:
            intakes.append(load_image(data))
        except InputImageError as err:
            raise InputImageError(f"{name}: {err}") from None
    job = runner.job(task, [query, *intakes], size, SET_OPTIONS[kind])
    results = runner.results(job)
    names = [n for n, _ in photos]
    pictures, people = [], []
    for i, result in enumerate(results[1:]):
        small, scale = _small(result.image)
        pictures.append(small)
        for person in _people(kind, result, i):
            person.box = tuple(v * scale for v in person.box)  # type: ignore[assignment]
            people.append(person)
    found = _people(kind, results[0], -1)
    if not found:
        raise InputImageError(
            "No person in the query photo could be searched by (too few confident keypoints)."
        )
    biggest = max(found, key=lambda p: (p.box[2] - p.box[0]) * (p.box[3] - p.box[1]))
    query_vectors = [biggest.vector] + ([MIRRORS[kind](biggest.vector)[0]] if kind in MIRRORS else [])
    return PeopleSet(key, kind, names, pictures, people, query=query_vectors)


def _drawn(people_set: PeopleSet, person: Person) -> np.ndarray:
    """The person's photo with its box drawn, at most THUMB_SIDE on a side."""
    picture = people_set.pictures[person.photo].copy()
    x1, y1, x2, y2 = (round(v) for v in person.box)
    h, w = picture.shape[:2]
    thick = max(2, round(max(h, w) / 150))
    cv2.rectangle(picture, (max(0, x1), max(0, y1)), (min(w - 1, x2), min(h - 1, y2)), (255, 64, 32), thick)
    scale = THUMB_SIDE / max(h, w)
    return cv2.resize(
        picture, (max(1, round(w * scale)), max(1, round(h * scale))), interpolation=cv2.INTER_AREA
    )


def _save(folder: Path, name: str, picture: np.ndarray) -> str:
    path = folder / name
    cv2.imwrite(str(path), cv2.cvtColor(picture, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 88])
    return str(path)


def _label(people_set: PeopleSet, person: Person) -> str:
    who = "whole photo" if person.person == WHOLE_PHOTO else f"person {person.person + 1}"
    return f"{people_set.names[person.photo]} · {who}"


def most_similar(people_set: PeopleSet, folder: Path, k: int = 12) -> list[tuple[str, str]]:
    """(picture path, caption) of the ``k`` people of the set most like the query, best first."""
    if not people_set.people:
        raise InputImageError(f"No person of the set could be searched by {people_set.kind}.")
    vectors = np.stack([p.vector for p in people_set.people])
    best: dict[int, float] = {}
    for q in people_set.query:  # pose: the pose itself and mirrored, the better score kept
        ids, scores = top_k(q, vectors, len(vectors))
        for i, s in zip(ids.tolist(), scores.tolist(), strict=True):
            best[i] = max(best.get(i, -2.0), s)
    ranked = sorted(best.items(), key=lambda item: (-item[1], item[0]))[:k]
    out = []
    for rank, (i, score) in enumerate(ranked, 1):
        person = people_set.people[i]
        path = _save(folder, f"similar-{rank:02d}.jpg", _drawn(people_set, person))
        out.append((path, f"{rank}. {score:.3f} · {_label(people_set, person)}"))
    return out


def grouped(people_set: PeopleSet, folder: Path, groups: int) -> list[tuple[str, str]]:
    """(picture, caption) per group of the set's people (k-means on their vectors): each picture
    is one row of the group's people, side by side."""
    if not people_set.people:
        raise InputImageError(f"No person of the set could be grouped by {people_set.kind}.")
    vectors = np.stack([p.vector for p in people_set.people])
    labels = kmeans(vectors, groups)
    out = []
    order = sorted(set(labels.tolist()), key=lambda g: (-int((labels == g).sum()), g))
    for n, g in enumerate(order, 1):
        members = [people_set.people[i] for i in np.flatnonzero(labels == g)]
        tiles = [_drawn(people_set, p) for p in members]
        row = np.full((THUMB_SIDE, sum(t.shape[1] + 8 for t in tiles), 3), 255, np.uint8)
        x = 0
        for t in tiles:
            row[: t.shape[0], x : x + t.shape[1]] = t
            x += t.shape[1] + 8
        names = ", ".join(_label(people_set, p) for p in members)
        out.append((_save(folder, f"group-{n:02d}.jpg", row), f"Group {n} ({len(members)}): {names}"))
    return out


def group_count(people: int) -> int:
    """A default number of groups for a set of ``people``: about sqrt(people / 2), 2 to 8."""
    return max(1, min(8, people, max(2, round(math.sqrt(people / 2)))))
