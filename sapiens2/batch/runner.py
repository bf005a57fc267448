"""A batch run from start to summary, whatever the engine: list INPUT, skip what OUT has done,
hand the rest to the engine, commit its parts (:mod:`.parts`), count."""

from __future__ import annotations

import time
from typing import Any

from ..errors import OptionError
from ..tasks.registry import Task
from .job import BatchJob
from .parts import Parts, Summary
from .sources import list_sources
from .store import Store


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
    setting (before anything runs)."""
    if engine not in ("local", "ray"):
        raise OptionError(f"Unknown engine {engine!r}; choose local or ray.")
    started = time.perf_counter()
    store = Store(job.out, job.out_filesystem)
    summary = Summary(engine=engine)
    with store.locked():
        for plan in job.plans:
            store.check_job(plan.task, plan.made_by(job.dtype))
            store.clean(plan.task)
        todo, summary.skipped = plan_todo(job, store, input_location)
        parts = Parts(job, store, summary, started)
        if todo:
            if engine == "local":
                from .local import run_local

                run_local(job, todo, parts, progress=progress)
            else:
                from .ray_engine import run_ray

                run_ray(job, todo, store, parts, engine_options, progress=progress)
        summary.photos = len(todo)
    summary.seconds = time.perf_counter() - started
    return summary
