"""OUT: one Parquet dataset per task at ``OUT/<task>/``, written in committed parts.

* A part is a Parquet file written under a hidden temporary name (``.tmp-<id>.parquet``, which
  ``pyarrow.dataset`` skips, as it skips every name starting with ``.`` or ``_``) and then
  committed: renamed to ``part-<id>.parquet`` on a local disk (one atomic rename, after an fsync),
  or, on an object store, copied there by the store itself (the object appears whole or not at all).
  Workers may write the temporary files; only the run's driver commits them, so a killed run
  leaves nothing half-visible, and nothing its orphaned workers write later is ever committed.
* The done set of a task is the ``source`` column of its committed parts: a rerun into the same
  OUT skips those sources, so after a crash or a kill nothing is lost and nothing runs twice. A row
  with an error is done too (its error is recorded); retry such sources with a new OUT.
* ``OUT/<task>/_sapiens2.json`` records what made the rows (size, checkpoint, inference options,
  network size); a rerun with other settings is refused rather than mixing two kinds of rows.
* On a local disk the driver holds ``OUT/.lock`` for the run: a second run into the same OUT
  stops at once instead of writing the same sources twice.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ..errors import OptionError
from ..tasks.registry import Task
from . import sources
from .records import record_for

TEMP_PREFIX, PART_PREFIX, SUFFIX = ".tmp-", "part-", ".parquet"
JOB_FILE = "_sapiens2.json"
LOCK_FILE = ".lock"
#: Bytes of one row group at most (a reader holds about one row group of a column at a time).
ROW_GROUP_BYTES = 64 << 20


@dataclass(frozen=True)
class Written:
    """A part written under its temporary name, not yet committed."""

    task: Task
    temp: str  # path in the store's filesystem
    rows: int


class Store:
    """The OUT folder (a local path or a URI) of a batch run."""

    def __init__(self, out: str, filesystem: pafs.FileSystem | None = None) -> None:
        self.out = str(out)
        self.filesystem = filesystem
        self.fs, self.root = sources.resolve(self.out, filesystem)
        self.root = self.root.rstrip("/") or "/"
        self.local = isinstance(self.fs, pafs.LocalFileSystem)

    def __reduce__(self) -> tuple[Any, ...]:  # workers get the location, and resolve it themselves
        return (Store, (self.out, self.filesystem))

    def folder(self, task: Task | str) -> str:
        """``OUT/<task>``, named by the task's name (``features`` for the backbone)."""
        return f"{self.root}/{getattr(task, 'name', task)}"

    # -- the done set

    def committed(self, task: Task) -> list[str]:
        """Paths of the committed parts of ``task``."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.folder(task), allow_not_found=True))
        names = (i for i in infos if i.type == pafs.FileType.File)
        return sorted(
            i.path for i in names if i.base_name.startswith(PART_PREFIX) and i.base_name.endswith(SUFFIX)
        )

    def done(self, task: Task) -> set[str]:
        """The sources in the committed parts of ``task``."""
        parts = self.committed(task)
        if not parts:
            return set()
        data = pads.dataset(parts, filesystem=self.fs, format="parquet")
        return set(data.to_table(columns=["source"]).column("source").to_pylist())

    # -- what made the rows

    def check_job(self, task: Task, made_by: Mapping[str, Any]) -> None:
        """Record ``made_by`` for ``task``, or refuse when rows made otherwise are there."""
        path = f"{self.folder(task)}/{JOB_FILE}"
        wanted = json.loads(json.dumps(made_by, sort_keys=True, default=str))
        if self.fs.get_file_info(path).type == pafs.FileType.File:
            with self.fs.open_input_stream(path) as f:
                found = json.loads(f.read().decode("utf-8"))
            if found != wanted:
                diff = sorted(k for k in set(found) | set(wanted) if found.get(k) != wanted.get(k))
                raise OptionError(
                    f"{self.folder(task)} holds {task.name} rows made with other settings "
                    f"({', '.join(f'{k}: {found.get(k)!r} there, {wanted.get(k)!r} now' for k in diff)}). "
                    "Use another --out, or the same settings (give defaults that differ between CPU and "
                    "GPU explicitly, e.g. --flip-test or --no-flip-test)."
                )
            return
        self.fs.create_dir(self.folder(task), recursive=True)
        with self.fs.open_output_stream(path) as f:
            f.write(json.dumps(wanted, indent=1, sort_keys=True).encode())

    # -- parts

    def clean(self, task: Task) -> int:
        """Remove the temporary files of earlier runs (never committed); returns how many."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.folder(task), allow_not_found=True))
        stale = [i.path for i in infos if i.base_name.startswith(TEMP_PREFIX)]
        for path in stale:
            self.fs.delete_file(path)
        return len(stale)

    def write(self, task: Task, table: pa.Table) -> Written:
        """``table`` as a Parquet file under a temporary name in ``OUT/<task>/``."""
        folder = self.folder(task)
        self.fs.create_dir(folder, recursive=True)
        temp = f"{folder}/{TEMP_PREFIX}{uuid.uuid4().hex}{SUFFIX}"
        rows_per_group = max(1, int(len(table) * ROW_GROUP_BYTES / max(1, table.nbytes)))
        compression = {name: "zstd" for name in table.column_names}
        compression.update({name: "none" for name in record_for(task).png_columns})  # PNG: compressed
        pq.write_table(
            table, temp, filesystem=self.fs, compression=compression, row_group_size=rows_per_group
        )
        if self.local:
            _fsync(temp)
        return Written(task, temp, len(table))

    def commit(self, written: Written) -> str:
        """Make a written part visible (atomically); returns its path."""
        name = written.temp.rsplit("/", 1)[1][len(TEMP_PREFIX) :]
        final = f"{self.folder(written.task)}/{PART_PREFIX}{name}"
        if self.local:
            os.replace(written.temp, final)
            _fsync(self.folder(written.task))
        else:  # an object store: a server-side copy publishes the whole object at once
            self.fs.copy_file(written.temp, final)
            self.fs.delete_file(written.temp)
        return final

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold ``OUT/.lock`` for a run (local disks; an object store has no lock to take)."""
        try:
            import fcntl
        except ImportError:  # Windows: no advisory locks here
            fcntl = None
        if not self.local or fcntl is None:
            yield
            return
        os.makedirs(self.root, exist_ok=True)
        fd = os.open(f"{self.root}/{LOCK_FILE}", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise OptionError(
                    f"Another sapiens2 batch run is writing into {self.out}; wait for it to end."
                ) from None
            yield
        finally:
            os.close(fd)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_task(out: str, task: Task | str, filesystem: pafs.FileSystem | None = None) -> pa.Table:
    """Every committed row of ``task`` (a task or its name: the folder ``OUT/<task>``) under
    ``out``, as ``pyarrow.dataset.dataset("OUT/<task>")`` reads them."""
    store = Store(str(out), filesystem)
    return pads.dataset(store.folder(task), filesystem=store.fs, format="parquet").to_table()
