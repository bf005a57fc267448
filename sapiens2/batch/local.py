"""The local engine (the default): everything in this process, no Ray. Batches of photos go through
read+prepare, the people steps of the tasks that find people first (detector, then crops), one
forward per task and finish; the next batch is read and prepared on a thread while this one's
device steps run (decoding and torch both release the GIL)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..tasks.registry import Task
from . import flow
from .job import BatchJob
from .parts import Parts
from .stages import stages_for


def _bar(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm comes with huggingface_hub
        return None
    return tqdm(total=total, unit="photo", file=sys.stderr, dynamic_ncols=True, disable=None)


def run_local(
    job: BatchJob, todo: Sequence[tuple[str, tuple[Task, ...]]], parts: Parts, *, progress: bool = True
) -> None:
    """Every source of ``todo`` through ``job``'s tasks; rows committed through ``parts``."""
    stages = stages_for(job.plans)
    for stage in stages.values():  # the weights, once; a missing checkpoint stops here, before any photo
        stage.load(job.forward_device(), job.dtype)
    finders = [s for s in stages.values() if s.finds_people]
    for stage in finders:
        stage.load_finder(job.forward_device())
    chunks = [todo[a : a + job.batch_size] for a in range(0, len(todo), job.batch_size)]

    def read(chunk: Sequence[tuple[str, tuple[Task, ...]]]) -> list[flow.Item]:
        return flow.read_prepare(chunk, stages, filesystem=job.filesystem, max_side=job.max_side)

    bar = _bar(len(todo), progress)
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="sapiens2-batch-read") as reader:
            ahead = reader.submit(read, chunks[0])
            for i, chunk in enumerate(chunks):
                items = ahead.result()
                if i + 1 < len(chunks):
                    ahead = reader.submit(read, chunks[i + 1])
                flow.find_and_prepare(items, finders, stages, max_side=job.max_side)
                for task in job.tasks:  # each raw finished at once: one task's raws alive at a time
                    flow.forward(items, stages[task])
                    flow.finish_task(items, stages[task])
                parts.add(flow.take_rows(items, job.tasks), len(chunk))
                if bar is not None:
                    bar.update(len(chunk))
            parts.flush()
    finally:
        if bar is not None:
            bar.close()
