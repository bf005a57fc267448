"""``sapiens2 index``: a collection's people into INDEX, through ``sapiens2 batch``.

The photos go through the batch machinery unchanged (every INPUT it takes, the local and Ray
engines, resume, one error row per unreadable photo) into ``INDEX/batch/`` (``features`` for
appearance, ``pose`` for pose); then the rows no table has yet become vectors
(:mod:`.vectors`) in the LanceDB tables (:mod:`.people_store`). INPUT may also be the OUT of an
earlier ``sapiens2 batch features|pose`` run: its rows are indexed as they are, nothing is
computed again. Either way a rerun adds only the sources the index lacks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow.dataset as pads
import pyarrow.fs as pafs

from ..batch import run as run_batch
from ..batch.job import BatchJob
from ..batch.records import column_arrays
from ..batch.store import JOB_FILE, Store
from ..errors import OptionError
from .people_store import KINDS, People, PeopleStore
from .vectors import appearance_people, pose_vector

#: The batch task each kind of vector is made from.
TASK_OF = {"appearance": "features", "pose": "pose"}
#: Rows turned into vectors and added per step (bounded memory on any collection).
CHUNK_ROWS = 4096
#: A features row's people (``per_person``), read when its batch output has them.
PERSON_COLUMNS = ("person_boxes", "person_embeddings")


def parse_kinds(text: str | Sequence[str]) -> tuple[str, ...]:
    """``"appearance,pose"`` (or a list) -> the kinds, checked, each once."""
    names = text.split(",") if isinstance(text, str) else list(text)
    kinds = tuple(dict.fromkeys(n.strip() for n in names if n.strip()))
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise OptionError(f"--by takes {' and/or '.join(KINDS)} (comma-separated); got {text!r}.")
    return kinds


def batch_folder(index: str) -> str:
    """Where ``sapiens2 index`` keeps the batch rows its vectors are made from."""
    return f"{str(index).rstrip('/')}/batch"


def batch_output(location: str, kinds: Sequence[str]) -> bool:
    """Whether ``location`` is the OUT of a ``sapiens2 batch`` run holding the rows of ``kinds``."""
    try:
        store = Store(str(location))
    except OptionError:
        return False
    files = [f"{store.folder(TASK_OF[k])}/{JOB_FILE}" for k in kinds]
    return all(store.fs.get_file_info(p).type == pafs.FileType.File for p in files)


@dataclass
class IndexSummary:
    """What a ``sapiens2 index`` run did, per kind."""

    added: dict[str, int] = field(default_factory=dict)  # sources newly indexed
    people: dict[str, int] = field(default_factory=dict)  # vectors newly added
    errors: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # new error rows
    total: dict[str, int] = field(default_factory=dict)  # vectors in the table after the run
    computed: bool = True  # False: an earlier batch run's rows were indexed as they are
    batch: Any = None  # the batch run's summary when photos were run

    def line(self) -> str:
        parts = [
            f"{k}: +{self.added[k]} sources, +{self.people[k]} vectors ({self.total[k]} in all), "
            f"{len(self.errors[k])} errors"
            for k in self.added
        ]
        return "; ".join(parts) + ("" if self.computed else " (from an existing batch output)")


def build_index(
    input_location: str,
    index: str,
    *,
    by: str | Sequence[str] = ("appearance",),
    job: BatchJob | None = None,
    engine: str = "local",
    engine_options: Any = None,
    progress: bool = True,
) -> IndexSummary:
    """Index ``input_location`` (photos, or a batch OUT) into ``index``. ``job``: the batch job
    that runs the photos (its ``out`` must be :func:`batch_folder` of ``index``); not needed
    for a batch OUT."""
    kinds = parse_kinds(by)
    summary = IndexSummary()
    if batch_output(input_location, kinds):
        rows_from, summary.computed = str(input_location), False
    else:
        if job is None:
            raise OptionError(f"{input_location!r} is no batch output: give a BatchJob to run the photos.")
        if job.out.rstrip("/") != batch_folder(index):
            raise OptionError(f"The job's OUT must be {batch_folder(index)!r}, not {job.out!r}.")
        missing = [k for k in kinds if TASK_OF[k] not in {t.name for t in job.tasks}]
        if missing:
            raise OptionError(f"The job does not run the task of {', '.join(missing)}.")
        summary.batch = run_batch(job, input_location, engine=engine, engine_options=engine_options,
                                  progress=progress)  # fmt: skip
        rows_from = job.out
    people = PeopleStore(index)
    settings = people.settings()
    for kind in kinds:
        settings[kind] = _made_by(rows_from, kind, settings.get(kind))
        people.save_settings(settings)
        ingest(rows_from, people, kind, summary)
        people.optimise(kind)
        summary.total[kind] = people.count(kind)
    return summary


def _made_by(rows_from: str, kind: str, before: dict[str, Any] | None) -> dict[str, Any]:
    """What made the rows of ``kind`` (the batch run's record), refused when it differs from what
    made the vectors already in the index."""
    store = Store(rows_from)
    with store.fs.open_input_stream(f"{store.folder(TASK_OF[kind])}/{JOB_FILE}") as f:
        import json

        made = {"batch": rows_from, "made_by": json.loads(f.read().decode("utf-8"))}
    if before is not None and before["made_by"] != made["made_by"]:
        raise OptionError(
            f"The index's {kind} vectors were made with other settings ({before['made_by']}); "
            "use the same settings or another INDEX."
        )
    return made


def ingest(rows_from: str, people: PeopleStore, kind: str, summary: IndexSummary) -> None:
    """The rows of ``rows_from`` (a batch OUT) the index lacks, as ``kind`` vectors."""
    store = Store(rows_from)
    task = TASK_OF[kind]
    parts = store.committed(task)  # type: ignore[arg-type]  # a task's folder is named by its name
    people.drop_orphans(kind)
    done = people.done(kind)
    summary.added[kind], summary.people[kind], summary.errors[kind] = 0, 0, []
    if not parts:
        return
    data = pads.dataset(parts, filesystem=store.fs, format="parquet")
    columns = ["source", "error", "width", "height"]
    if kind == "appearance":  # an output made before per_person existed has no person columns
        columns += ["embedding", *(c for c in PERSON_COLUMNS if c in data.schema.names)]
    else:
        columns += ["keypoints", "scores", "boxes"]
    for batch in data.to_batches(columns=columns, batch_size=CHUNK_ROWS):
        sources = batch.column("source").to_pylist()
        keep = [i for i, s in enumerate(sources) if s not in done]
        if not keep:
            continue
        batch = batch.take(keep)
        found, rows = (_appearance if kind == "appearance" else _pose)(batch)
        people.add(kind, found, rows)
        done.update(s for s, _, _ in rows)
        summary.added[kind] += len(rows)
        summary.people[kind] += 0 if found is None else len(found.sources)
        summary.errors[kind] += [(s, e) for s, e, _ in rows if e is not None]


def _appearance(batch: Any) -> tuple[People | None, list[tuple[str, str | None, int]]]:
    """One vector per person found (:func:`~.vectors.appearance_people`); a photo with nobody
    found, or rows made without ``per_person``: one, its CLS, with the whole photo as the box."""
    sources, errors = batch.column("source").to_pylist(), batch.column("error").to_pylist()
    widths, heights = batch.column("width").to_pylist(), batch.column("height").to_pylist()
    embeddings = column_arrays(batch.column("embedding"))
    names = batch.schema.names
    boxes, flat = (
        column_arrays(batch.column(c)) if c in names else [None] * len(sources) for c in PERSON_COLUMNS
    )
    rows, keep = [], []  # keep: (source, person, box, vector)
    for i, source in enumerate(sources):
        error, found = errors[i], []
        if error is None:
            try:
                found = appearance_people(embeddings[i], boxes[i], flat[i], widths[i], heights[i])
            except OptionError as err:
                error = str(err)
        keep += [(source, p, box, v) for p, box, v in found]
        rows.append((source, error, len(found)))
    if not keep:
        return None, rows
    cols = list(zip(*keep, strict=True))
    return People(list(cols[0]), list(cols[1]), np.stack(cols[2]), np.stack(cols[3])), rows


def _pose(batch: Any) -> tuple[People | None, list[tuple[str, str | None, int]]]:
    """One vector per person with enough confident keypoints."""
    sources, errors = batch.column("source").to_pylist(), batch.column("error").to_pylist()
    kps, scores = column_arrays(batch.column("keypoints")), column_arrays(batch.column("scores"))
    boxes = column_arrays(batch.column("boxes"))
    rows, keep = [], []  # keep: (source, person, box, keypoints, scores, vector)
    for i, source in enumerate(sources):
        count = 0
        if errors[i] is None:
            for p in range(len(kps[i])):
                v = pose_vector(kps[i][p], scores[i][p])
                if v is not None:
                    keep.append((source, p, boxes[i][p], kps[i][p], scores[i][p], v))
                    count += 1
        rows.append((source, errors[i], count))
    if not keep:
        return None, rows
    cols = list(zip(*keep, strict=True))
    return People(list(cols[0]), list(cols[1]), np.stack(cols[2]), np.stack(cols[5]), np.stack(cols[3]),
                  np.stack(cols[4])), rows  # fmt: skip
