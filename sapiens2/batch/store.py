"""OUT: one Parquet dataset per task at ``OUT/<task>/``, written in committed parts.

* A part is a Parquet file written under a hidden temporary name (``.tmp-<run>-<id>.parquet``, which
  ``pyarrow.dataset`` skips, as it skips every name starting with ``.`` or ``_``) and then
  committed: renamed to ``part-<id>.parquet`` on a local disk (one atomic rename, after an fsync),
  or, on an object store, copied there by the store itself (the object appears whole or not at all).
  Workers may write the temporary files; only the run's driver commits them, so a killed run
  leaves nothing half-visible, and nothing its orphaned workers write later is ever committed.
  Each run names its temporary parts with its own run id and cleans only its own, or stale ones
  (on a local disk under the lock: all; on an object store: older than :data:`STALE_SECONDS`), so
  two runs into one bucket never delete each other's parts.
* The done set of a task is the ``source`` column of its committed parts: a rerun into the same
  OUT skips those sources, so after a crash or a kill nothing is lost and nothing runs twice. A row
  with an error is done too (its error is recorded); retry such sources with a new OUT.
* ``OUT/<task>/_sapiens2.json`` records what made the rows (size, checkpoint, inference options,
  network size), written with the task's first committed part (a run that did no work records
  nothing); a rerun with other settings is refused rather than mixing two kinds of rows.
* On a local disk the driver holds ``OUT/.lock`` for the run: a second run into the same OUT
  stops at once instead of writing the same sources twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
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
from .records import png_columns

TEMP_PREFIX, PART_PREFIX, SUFFIX = ".tmp-", "part-", ".parquet"
JOB_FILE = "_sapiens2.json"
LOCK_FILE = ".lock"
#: A temporary part older than this on an object store is a dead run's (a live run commits each
#: part seconds after writing it), and any run may delete it.
STALE_SECONDS = 6 * 3600
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

    def __init__(
        self, out: str, filesystem: pafs.FileSystem | None = None, run_id: str | None = None
    ) -> None:
        self.out = str(out)
        self.filesystem = filesystem
        self.run_id = run_id or uuid.uuid4().hex[:12]  # names this run's temporary parts
        self._recorded: set[str] = set()
        self.commits = 0  # parts this Store committed
        self.fs, self.root = sources.resolve(self.out, filesystem)
        self.root = self.root.rstrip("/") or "/"
        self.local = isinstance(self.fs, pafs.LocalFileSystem)

    def __reduce__(self) -> tuple[Any, ...]:  # workers get the location, and resolve it themselves
        return (Store, (self.out, self.filesystem, self.run_id))

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

    def _job_path(self, task: Task) -> str:
        return f"{self.folder(task)}/{JOB_FILE}"

    def check_job(self, task: Task, made_by: Mapping[str, Any]) -> None:
        """Refuse when ``task``'s rows in OUT were made otherwise than ``made_by`` (reads only:
        :meth:`record_job` writes it with the first part)."""
        path = self._job_path(task)
        wanted = json.loads(json.dumps(made_by, sort_keys=True, default=str))
        if self.fs.get_file_info(path).type != pafs.FileType.File:
            return
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
        self._recorded.add(task.name)

    def record_job(self, task: Task, made_by: Mapping[str, Any]) -> None:
        """Write ``made_by`` beside ``task``'s rows, once (before its first committed part)."""
        if task.name in self._recorded:
            return
        path = self._job_path(task)
        if self.fs.get_file_info(path).type != pafs.FileType.File:  # a run beside this one may have
            self.fs.create_dir(self.folder(task), recursive=True)
            with self.fs.open_output_stream(path) as f:
                f.write(json.dumps(made_by, indent=1, sort_keys=True, default=str).encode())
        self._recorded.add(task.name)

    # -- parts

    def clean(self, task: Task, everything: bool | None = None) -> int:
        """Remove temporary parts never committed: this run's, and stale ones (``everything``:
        all of them, true by default on a local disk, where the lock keeps other runs out);
        returns how many."""
        everything = self.local if everything is None else everything
        infos = self.fs.get_file_info(pafs.FileSelector(self.folder(task), allow_not_found=True))
        mine, now = f"{TEMP_PREFIX}{self.run_id}-", time.time()
        stale = [
            i.path
            for i in infos
            if i.base_name.startswith(TEMP_PREFIX)
            and (everything or i.base_name.startswith(mine) or _age(i, now) > STALE_SECONDS)
        ]
        for path in stale:
            try:
                self.fs.delete_file(path)
            except FileNotFoundError:  # another run cleaned it first
                pass
        return len(stale)

    def write(self, task: Task, table: pa.Table) -> Written:
        """``table`` as a Parquet file under a temporary name in ``OUT/<task>/``."""
        folder = self.folder(task)
        self.fs.create_dir(folder, recursive=True)
        temp = f"{folder}/{TEMP_PREFIX}{self.run_id}-{uuid.uuid4().hex}{SUFFIX}"
        rows_per_group = max(1, int(len(table) * ROW_GROUP_BYTES / max(1, table.nbytes)))
        compression = {name: "zstd" for name in table.column_names}
        compression.update({name: "none" for name in png_columns(task)})  # PNG: compressed
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
        self.commits += 1
        return final

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold ``OUT/.lock`` for a run (local disks; an object store has no lock to take). A run
        that made OUT and committed nothing takes OUT away again (its empty folders, the lock)."""
        try:
            import fcntl
        except ImportError:  # Windows: no advisory locks here
            fcntl = None
        if not self.local or fcntl is None:
            yield
            return
        made = not os.path.isdir(self.root)
        os.makedirs(self.root, exist_ok=True)
        lock = f"{self.root}/{LOCK_FILE}"
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise OptionError(
                    f"Another sapiens2 batch run is writing into {self.out}; wait for it to end."
                ) from None
            try:
                yield
            finally:
                if made and not self.commits:
                    _unmake(self.root, lock)
        finally:
            os.close(fd)


def _unmake(root: str, lock: str) -> None:
    """Remove a run's lock and the empty folders it made under ``root`` (while the lock is held)."""
    with contextlib.suppress(OSError):
        os.unlink(lock)
    for folder, _dirs, _files in sorted(os.walk(root), key=lambda w: -len(w[0])):
        with contextlib.suppress(OSError):
            os.rmdir(folder)  # only empty ones go


def _age(info: pafs.FileInfo, now: float) -> float:
    """Seconds since ``info`` was modified (0 where the filesystem does not say)."""
    mtime = info.mtime
    return 0.0 if mtime is None else now - mtime.timestamp()


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
