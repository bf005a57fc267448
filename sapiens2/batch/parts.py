"""What a run's parts come to: each committed part's :class:`Tally`, the run's :class:`Summary`,
and :class:`Parts`, which gathers rows per task and commits them (the engines hand it their rows
or their written parts)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..tasks.registry import Task
from .job import BatchJob
from .records import rows_table
from .store import Store, Written

#: Errors quoted in the summary at most (every error is in its row).
QUOTED_ERRORS = 20


@dataclass(frozen=True)
class Tally:
    """A part's counts: rows, errors, and the first errors (source, error)."""

    rows: int
    errors: int
    quoted: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, table: Any) -> Tally:
        errors = table.column("error")
        failed = table.filter(errors.is_valid()).slice(0, QUOTED_ERRORS).select(["source", "error"])
        quoted = tuple((r["source"], r["error"]) for r in failed.to_pylist())
        return cls(len(table), len(errors) - errors.null_count, quoted)


@dataclass
class Summary:
    """What a run did."""

    photos: int = 0  # sources that went through this run
    skipped: int = 0  # sources every task had done already
    rows: dict[str, int] = field(default_factory=dict)  # by task name
    errors: dict[str, int] = field(default_factory=dict)
    quoted: list[tuple[str, str, str]] = field(default_factory=list)  # (task name, source, error)
    seconds: float = 0.0
    parts: int = 0
    #: seconds from the start to each committed part, and its photos (throughput once started)
    commits: list[tuple[float, int]] = field(default_factory=list)
    engine: str = "local"
    notes: list[str] = field(default_factory=list)
    #: average bytes per photo passed from prepare to the forward, and from the forward to finish
    bytes_between: dict[str, float] = field(default_factory=dict)

    def count(self, task: Task, tally: Tally, started: float, photos: int) -> None:
        """A committed part of ``task`` (``photos``: photos through the run so far)."""
        self.rows[task.name] = self.rows.get(task.name, 0) + tally.rows
        self.errors[task.name] = self.errors.get(task.name, 0) + tally.errors
        self.parts += 1
        self.commits.append((time.perf_counter() - started, photos))
        room = QUOTED_ERRORS - len(self.quoted)
        self.quoted += [(task.name, source, error) for source, error in tally.quoted[: max(0, room)]]

    @property
    def photos_per_s(self) -> float:
        return self.photos / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        """``pose: 198 rows (2 errors) · seg: ... · 200 photos in 41.2 s (4.85 photos/s)``."""
        per_task = " · ".join(f"{t}: {n} rows ({self.errors.get(t, 0)} errors)" for t, n in self.rows.items())
        skipped = f", {self.skipped} already done" if self.skipped else ""
        return (
            f"{per_task or 'nothing to do'} · {self.photos} photos in {self.seconds:.1f} s "
            f"({self.photos_per_s:.2f} photos/s, {self.engine}){skipped}"
        )


class Parts:
    """Rows of a run gathered per task and committed as parts of ``job.part_rows()`` rows."""

    def __init__(self, job: BatchJob, store: Store, summary: Summary, started: float) -> None:
        self.job, self.store, self.summary, self.started = job, store, summary, started
        self.pending: dict[Task, list[dict[str, Any]]] = {t: [] for t in job.tasks}
        self.photos = 0

    def add(self, rows: dict[Task, list[dict[str, Any]]], photos: int) -> None:
        self.photos += photos
        for task, new in rows.items():
            self.pending[task].extend(new)
            while len(self.pending[task]) >= self.job.part_rows():
                self._commit(task, self.job.part_rows())

    def flush(self) -> None:
        for task, rows in self.pending.items():
            if rows:
                self._commit(task, len(rows))

    def _commit(self, task: Task, n: int) -> None:
        rows, self.pending[task] = self.pending[task][:n], self.pending[task][n:]
        table = rows_table(task, rows)
        self._record(task)
        self.store.commit(self.store.write(task, table))
        self.summary.count(task, Tally.of(table), self.started, self.photos)

    def committed(self, written: Written, tally: Tally, photos: int) -> None:
        """A part an engine's worker wrote: commit it here, in the driver."""
        self.photos += photos
        self._record(written.task)
        self.store.commit(written)
        self.summary.count(written.task, tally, self.started, self.photos)

    def _record(self, task: Task) -> None:
        """The task's settings beside its rows, with its first part (never for a run that did nothing)."""
        plan = next(p for p in self.job.plans if p.task is task)
        self.store.record_job(task, plan.made_by(self.job.dtype))

    def progress_line(self, total: int) -> str:
        """``progress: 120/1000 photos · 4.1 rows/s · 2 errors`` (photos whose parts are committed,
        or, locally, that went through every step)."""
        rows, errors = sum(self.summary.rows.values()), sum(self.summary.errors.values())
        seconds = max(1e-9, time.perf_counter() - self.started)
        return f"progress: {self.photos}/{total} photos · {rows / seconds:.2f} rows/s · {errors} errors"


__all__ = ["QUOTED_ERRORS", "Parts", "Summary", "Tally"]
