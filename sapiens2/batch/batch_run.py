"""A batch run from start to summary, whatever the engine: list INPUT, skip what OUT has done,
hand the rest to the engine, commit its parts (:mod:`.parts`), count."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from ..errors import OptionError
from ..tasks.registry import Task
from .job import BatchJob
from .parts import Parts, Summary
from .sources import list_sources
from .store import Store

#: Env var: seconds between progress lines when stdout is not a terminal (0: none).
PROGRESS_ENV = "SAPIENS2_PROGRESS_SECONDS"
PROGRESS_SECONDS = 30.0


def plan_todo(
    job: BatchJob, store: Store, input_location: str
) -> tuple[list[tuple[str, tuple[Task, ...]]], int]:
    """(source, the tasks it still needs) for every source INPUT names that some task lacks, and
    how many sources every task has already."""
    listed = list_sources(input_location, job.filesystem)
    done = {t: store.done(t) for t in job.tasks}
    todo, skipped = [], 0
    for source in listed:
        tasks = tuple(t for t in job.tasks if source not in done[t])
        if tasks:
            todo.append((source, tasks))
        else:
            skipped += 1
    return todo, skipped


def run(
    job: BatchJob,
    input_location: str,
    *,
    engine: str = "local",
    engine_options: Any = None,
    progress: bool = True,
) -> Summary:
    """Run ``job`` over ``input_location`` (see :mod:`.sources`) into ``job.out``: the sources
    OUT already has are skipped; returns the summary. OptionError for an unusable INPUT, OUT or
    setting (before anything runs). The Ray engine joins its cluster before OUT is touched, so a
    cluster that is not there leaves OUT as it was."""
    if engine not in ("local", "ray"):
        raise OptionError(f"Unknown engine {engine!r}; choose local or ray.")
    started = time.perf_counter()
    summary = Summary(engine=engine)
    ready: Any = contextlib.nullcontext()
    if engine == "ray":
        from .cluster import connected
        from .placement import RayOptions

        ready = connected(engine_options or RayOptions())
    with ready:
        store = Store(job.out, job.out_filesystem)
        with store.locked():
            for plan in job.plans:
                store.check_job(plan.task, plan.made_by(job.dtype))
                store.clean(plan.task)
            todo, summary.skipped = plan_todo(job, store, input_location)
            parts = Parts(job, store, summary, started)
            try:
                if todo:
                    with progress_lines(parts, len(todo), progress):
                        _run_engine(engine, job, todo, store, parts, engine_options, progress)
            finally:
                for plan in job.plans:  # what this run wrote and did not commit (a failure midway)
                    store.clean(plan.task)
        summary.photos = len(todo)
    summary.seconds = time.perf_counter() - started
    return summary


def _run_engine(
    engine: str, job: BatchJob, todo: list, store: Store, parts: Parts, options: Any, progress: bool
) -> None:
    if engine == "local":
        from .local import run_local

        run_local(job, todo, parts, progress=progress)
    else:
        from .ray_engine import run_ray

        run_ray(job, todo, store, parts, options, progress=progress)


@contextlib.contextmanager
def progress_lines(parts: Parts, total: int, enabled: bool = True) -> Iterator[None]:
    """Where stdout is not a terminal (a batch job's log), a :meth:`Parts.progress_line` every
    ``$SAPIENS2_PROGRESS_SECONDS`` (default :data:`PROGRESS_SECONDS`) from a thread."""
    every = progress_seconds()
    if not enabled or every is None or _is_terminal(sys.stdout):
        yield
        return
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(every):
            print(parts.progress_line(total), flush=True)

    thread = threading.Thread(target=tick, name="sapiens2-batch-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def progress_seconds() -> float | None:
    """Seconds between progress lines: ``$SAPIENS2_PROGRESS_SECONDS`` (0: none), else the default."""
    raw = os.environ.get(PROGRESS_ENV, "").strip()
    try:
        value = float(raw) if raw else PROGRESS_SECONDS
    except ValueError:
        raise OptionError(f"${PROGRESS_ENV} takes seconds (a number); got {raw!r}.") from None
    return value if value > 0 else None


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
