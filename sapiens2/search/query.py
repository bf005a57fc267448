"""``sapiens2 search``: the people of INDEX most like the person in a photo.

The query photo goes through the same batch step as the collection did, with the settings the
index records (model, checkpoint, options, network size), so its vector is comparable; then the
index's table is searched by cosine (exact below ``ANN_MIN_ROWS`` rows, IVF-Flat probing
``ANN_NPROBES`` partitions above). The query is the photo's largest person (or ``person``): by
appearance their pooled patch features (the whole photo's CLS when nobody was found, or the index
was made without ``per_person``), by pose their keypoints, also matched mirrored (``mirror``; a
result keeps the better of the two scores).
"""

from __future__ import annotations

import ast
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..batch import read_task
from ..batch import run as run_batch
from ..batch.job import BatchJob, task_plan
from ..batch.records import column_arrays
from ..errors import InputImageError, OptionError
from ..inputs.intake import load_image
from ..tasks import registry
from .indexing import TASK_OF, parse_kinds
from .people_store import PeopleStore
from .vectors import MIRRORS, WHOLE_PHOTO, appearance_people, pose_vector


@dataclass(frozen=True)
class Hit:
    """One person found: rank (1 = best), source, person index in that photo (-1,
    :data:`~.vectors.WHOLE_PHOTO`: an appearance vector of a photo where nobody was found, its box
    the photo), cosine score, box (x1 y1 x2 y2 in its photo's pixels)."""

    rank: int
    source: str
    person: int
    score: float
    box: tuple[float, float, float, float]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _job(made_by: dict[str, Any], out: str) -> BatchJob:
    """A one-task batch job with the settings the index's rows were made with."""
    import torch

    task = registry.get(made_by["task"])
    pipeline = {k: ast.literal_eval(v) for k, v in (made_by.get("pipeline") or {}).items()}
    checkpoint = made_by.get("checkpoint")
    borrowed = {b["task"]: b["checkpoint"] for b in made_by.get("borrowed") or [] if b.get("checkpoint")}
    plan = task_plan(
        task,
        values=made_by.get("options") or {},
        size=None if checkpoint else made_by.get("size"),
        checkpoints={**borrowed, **({task.name: checkpoint} if checkpoint else {})},
        pipeline_kwargs=pipeline,
        network_hw=made_by.get("network_hw"),
    )
    return BatchJob((plan,), out, gpu=torch.cuda.is_available(), dtype=made_by.get("dtype") or "float32")


def query_rows(photo: Any, made_by: dict[str, Any]) -> Any:
    """The batch row of ``photo`` (a path or URI, or any image ``load_image`` reads) made with
    ``made_by``'s settings. InputImageError when it cannot be read."""
    with tempfile.TemporaryDirectory(prefix="sapiens2-query-") as tmp:
        if isinstance(photo, (str, Path)) and str(photo).strip():
            source = str(photo)
        else:
            if photo is None:
                raise InputImageError("No query photo given.")
            source = f"{tmp}/query.png"
            from PIL import Image

            Image.fromarray(load_image(photo).rgb).save(source)
        job = _job(made_by, f"{tmp}/out")
        run_batch(job, source, progress=False)
        table = read_task(job.out, made_by["task"])
    if table.num_rows != 1:
        raise InputImageError(f"{photo!r} is not one photo.")
    error = table.column("error")[0].as_py()
    if error is not None:
        raise InputImageError(f"The query photo could not be used: {error}")
    return table


def query_vectors(row: Any, kind: str, person: int | None) -> tuple[np.ndarray, int]:
    """(the query vector; the query person: ``person``, else the largest) of a batch row."""
    if kind == "appearance":
        return _appearance_query(row, person)
    kps, scores = column_arrays(row.column("keypoints"))[0], column_arrays(row.column("scores"))[0]
    boxes = column_arrays(row.column("boxes"))[0]
    if len(kps) == 0:
        raise InputImageError("No person was found in the query photo.")
    if person is None:
        person = _largest(boxes)
    if not 0 <= person < len(kps):
        raise OptionError(f"The query photo has {len(kps)} people; person must be 0 to {len(kps) - 1}.")
    v = pose_vector(kps[person], scores[person])
    if v is None:
        raise InputImageError("Too few of the query person's keypoints are confident to search by pose.")
    return v.reshape(1, -1), person


def _largest(boxes: np.ndarray) -> int:
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    return int(np.argmax((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])))


def _appearance_query(row: Any, person: int | None) -> tuple[np.ndarray, int]:
    """The appearance vector of the row's ``person`` (None: the largest; the whole photo's when
    nobody was found)."""
    names = row.schema.names
    people = appearance_people(
        column_arrays(row.column("embedding"))[0],
        *(
            column_arrays(row.column(c))[0] if c in names else None
            for c in ("person_boxes", "person_embeddings")
        ),
        row.column("width")[0].as_py(),
        row.column("height")[0].as_py(),
    )
    if person is None:
        p, _, v = people[_largest(np.stack([box for _, box, _ in people]))]
        return v.reshape(1, -1), p
    ids = [p for p, _, _ in people if p != WHOLE_PHOTO]
    if person not in ids:
        found = f"people {', '.join(map(str, ids))}" if ids else "no person found (leave person out)"
        raise OptionError(f"The query photo has {found}; person {person} is not one of them.")
    p, _, v = next(x for x in people if x[0] == person)
    return v.reshape(1, -1), p


def find_similar(
    photo: Any,
    index: str,
    *,
    by: str = "appearance",
    k: int = 10,
    person: int | None = None,
    mirror: bool = True,
) -> list[Hit]:
    """The ``k`` people of ``index`` most like ``photo`` by appearance or by pose, best first."""
    [kind] = parse_kinds(by) if "," not in by else (None,)
    if kind is None:
        raise OptionError("Search by one kind at a time: appearance or pose.")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 1000:
        raise OptionError(f"k must be a whole number from 1 to 1000; got {k!r}.")
    if person is not None and (not isinstance(person, int) or isinstance(person, bool) or person < 0):
        raise OptionError(f"person must be a whole number from 0 (or None: the largest); got {person!r}.")
    store = PeopleStore(index)
    made = store.settings().get(kind)
    if made is None:
        raise OptionError(f"{index} has no {kind} vectors: index it with --by {kind}.")
    row = query_rows(photo, made["made_by"])
    queries, _ = query_vectors(row, kind, person)
    if mirror and kind in MIRRORS:
        queries = np.concatenate([queries, MIRRORS[kind](queries)])
    best: dict[tuple[str, int], tuple[float, tuple[float, ...]]] = {}
    for q in queries:
        found = store.nearest(kind, q, k)
        for s, p, sc, box in zip(*(found.column(c).to_pylist() for c in ("source", "person", "score", "box")),
                                 strict=True):  # fmt: skip
            if (s, p) not in best or sc > best[(s, p)][0]:
                best[(s, p)] = (float(sc), tuple(box))
    ranked = sorted(best.items(), key=lambda item: (-item[1][0], item[0]))[:k]
    return [Hit(i + 1, s, p, sc, box) for i, ((s, p), (sc, box)) in enumerate(ranked)]  # type: ignore[arg-type]


__all__ = ["TASK_OF", "Hit", "find_similar", "query_rows", "query_vectors"]
