"""INDEX: the people of a collection in LanceDB tables, one row per person (appearance: per photo).

``INDEX/vectors/`` is a LanceDB database (a folder, or a bucket prefix: LanceDB reads and writes
object stores itself) holding, per kind (``appearance``, ``pose``), a table of ``source``,
``person``, ``box`` (x1 y1 x2 y2 in photo pixels), ``keypoints`` and ``scores`` (pose), and the
unit ``vector``; and ``sources``: one row per source and kind that was indexed (its ``error``,
how many people it gave). The sources table is what a rerun skips, and it is written after the
vectors: a run killed between the two leaves vectors without their source row, which the next run
deletes before it adds the source again. Why LanceDB and not FAISS: docs/SEARCH.md.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from ..batch.sources import resolve
from ..data.metadata import NUM_KEYPOINTS
from ..errors import OptionError

KINDS = ("appearance", "pose")
SOURCES = "sources"
SETTINGS = "settings.json"
#: Rows from which a table gets an approximate (IVF-Flat) index; below it exact search is fast enough.
ANN_MIN_ROWS = 100_000

_SOURCE_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("error", pa.string()),
        pa.field("people", pa.int32()),
    ]
)


def vector_schema(dim: int) -> pa.Schema:
    return pa.schema(
        [
            pa.field("source", pa.string(), nullable=False),
            pa.field("person", pa.int32(), nullable=False),
            # plain lists: LanceDB takes every fixed-size float list for a vector column
            pa.field("box", pa.list_(pa.float32())),
            pa.field("keypoints", pa.list_(pa.float32())),  # 308 x (x, y), flat
            pa.field("scores", pa.list_(pa.float32())),
            pa.field("vector", pa.list_(pa.float32(), dim), nullable=False),
        ]
    )


def _lancedb() -> Any:
    try:
        import lancedb
    except ImportError:
        raise OptionError(
            "Searching a collection needs LanceDB: pip install 'sapiens2[search]' (or lancedb)."
        ) from None
    return lancedb


def _fixed(values: np.ndarray | None, width: int, rows: int, fixed: bool = False) -> pa.Array:
    """A list<float32> column of ``rows`` rows of ``width`` values (None: all null); ``fixed``: a
    fixed_size_list (the vector column)."""
    if values is None:
        return pa.nulls(rows, pa.list_(pa.float32()))
    flat = pa.array(np.ascontiguousarray(values, np.float32).reshape(-1))
    if fixed:
        return pa.FixedSizeListArray.from_arrays(flat, width)
    return pa.ListArray.from_arrays(pa.array(np.arange(rows + 1, dtype=np.int32) * width), flat)


@dataclass
class People:
    """Rows to add to one kind's table (numpy, one entry per person)."""

    sources: list[str]
    persons: list[int]
    boxes: np.ndarray  # (n, 4)
    vectors: np.ndarray  # (n, D) unit rows
    keypoints: np.ndarray | None = None  # (n, 308, 2)
    scores: np.ndarray | None = None  # (n, 308)

    def table(self) -> pa.Table:
        n, dim = self.vectors.shape
        columns = [
            pa.array(self.sources, pa.string()),
            pa.array(self.persons, pa.int32()),
            _fixed(self.boxes, 4, n),
            _fixed(self.keypoints, NUM_KEYPOINTS * 2, n),
            _fixed(self.scores, NUM_KEYPOINTS, n),
            _fixed(self.vectors, dim, n, fixed=True),
        ]
        return pa.Table.from_arrays(columns, schema=vector_schema(dim))


class PeopleStore:
    """The vector tables of INDEX (a local folder or a URI)."""

    def __init__(self, index: str) -> None:
        self.index = str(index).rstrip("/")
        self.fs, self.root = resolve(self.index)
        self.db = _lancedb().connect(self._vectors_uri())

    def _vectors_uri(self) -> str:
        return (
            f"{self.root}/vectors" if isinstance(self.fs, pafs.LocalFileSystem) else f"{self.index}/vectors"
        )

    def _names(self) -> set[str]:
        return set(self.db.list_tables().tables)

    def table(self, name: str) -> Any | None:
        return self.db.open_table(name) if name in self._names() else None

    # -- what is there

    def done(self, kind: str) -> set[str]:
        """The sources already indexed for ``kind`` (errors included: retry them into a new INDEX)."""
        t = self.table(SOURCES)
        if t is None:
            return set()
        rows = t.search().where(f"kind = '{kind}'").select(["source"]).limit(None).to_arrow()
        return set(rows.column("source").to_pylist())

    def count(self, kind: str) -> int:
        t = self.table(kind)
        return 0 if t is None else int(t.count_rows())

    def errors(self, kind: str) -> list[tuple[str, str]]:
        t = self.table(SOURCES)
        if t is None:
            return []
        rows = t.search().where(f"kind = '{kind}' AND error IS NOT NULL").limit(None).to_arrow()
        return list(zip(rows.column("source").to_pylist(), rows.column("error").to_pylist(), strict=True))

    def drop_orphans(self, kind: str) -> int:
        """Delete vectors whose source has no row in ``sources`` (a run killed between the two)."""
        t = self.table(kind)
        if t is None:
            return 0
        there = set(t.search().select(["source"]).limit(None).to_arrow().column("source").to_pylist())
        orphans = sorted(there - self.done(kind))
        for a in range(0, len(orphans), 500):
            quoted = ", ".join("'" + s.replace("'", "''") + "'" for s in orphans[a : a + 500])
            t.delete(f"source IN ({quoted})")
        return len(orphans)

    # -- adding

    def add(self, kind: str, people: People | None, sources: Sequence[tuple[str, str | None, int]]) -> None:
        """Add one chunk: its people (vectors first), then its sources' rows (source, error, people)."""
        if people is not None and len(people.sources):
            table = people.table()
            t = self.table(kind)
            if t is None:
                self.db.create_table(kind, table)
            else:
                width = t.schema.field("vector").type.list_size
                if width != table.schema.field("vector").type.list_size:
                    raise OptionError(
                        f"The {kind} vectors in {self.index} have {width} values, these "
                        f"{table.schema.field('vector').type.list_size}: use the same model size or another INDEX."
                    )
                t.add(table)
        if sources:
            rows = pa.table(
                {
                    "source": [s for s, _, _ in sources],
                    "kind": [kind] * len(sources),
                    "error": [e for _, e, _ in sources],
                    "people": [n for _, _, n in sources],
                },
                schema=_SOURCE_SCHEMA,
            )
            t = self.table(SOURCES)
            self.db.create_table(SOURCES, rows) if t is None else t.add(rows)

    def optimise(self, kind: str) -> bool:
        """An IVF-Flat index (cosine) on a table of at least :data:`ANN_MIN_ROWS` rows (made again as it
        grows); returns whether the table has one."""
        t = self.table(kind)
        if t is None or t.count_rows() < ANN_MIN_ROWS:
            return False
        from lancedb.index import IvfFlat  # IVF-PQ builds 20x slower here for no recall (docs/SEARCH.md)

        config = IvfFlat(distance_type="cosine", num_partitions=ann_partitions(t.count_rows()))
        t.create_index("vector", config=config, replace=True)
        return True

    # -- searching

    def nearest(self, kind: str, query: np.ndarray, k: int) -> pa.Table:
        """The ``k`` rows nearest the unit ``query`` by cosine, with ``score`` (the cosine), best first."""
        t = self.table(kind)
        if t is None:
            raise OptionError(f"{self.index} has no {kind} vectors: index with --by {kind}.")
        search = t.search(np.asarray(query, np.float32), vector_column_name="vector").distance_type("cosine")
        if t.list_indices():
            search = search.nprobes(ANN_NPROBES)
        found = search.limit(int(k)).to_arrow()
        score = pa.compute.subtract(1.0, found.column("_distance"))
        return found.drop_columns(["_distance"]).append_column("score", score)

    # -- what made the vectors

    def settings(self) -> dict[str, Any]:
        path = f"{self.root}/{SETTINGS}"
        if self.fs.get_file_info(path).type != pafs.FileType.File:
            return {}
        with self.fs.open_input_stream(path) as f:
            return json.loads(f.read().decode("utf-8"))

    def save_settings(self, settings: dict[str, Any]) -> None:
        self.fs.create_dir(self.root, recursive=True)
        with self.fs.open_output_stream(f"{self.root}/{SETTINGS}") as f:
            f.write(json.dumps(settings, indent=1, sort_keys=True).encode())


#: IVF partitions a search reads (docs/SEARCH.md: recall@10 against exact search).
ANN_NPROBES = 32


def ann_partitions(rows: int) -> int:
    """IVF partitions for ``rows`` vectors: about sqrt(rows), at least 1."""
    return max(1, int(round(rows**0.5)))
