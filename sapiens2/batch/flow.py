"""The steps both engines run on a batch of photos, and what passes between them.

``read_prepare`` (CPU): each source read and decoded ONCE, then prepared for every task it still
needs; only the preps (the network inputs) and the photo's :class:`~.stages.Geometry` go on, the
decoded photo is dropped. ``forward`` (the device, one task): one ``infer`` for the batch.
``finish`` (CPU): each raw finished into the task's row. A failure anywhere is caught per photo
and per task and becomes that row's ``error``; the run goes on.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs as pafs

from ..tasks.registry import Task
from .sources import read_intake
from .stages import Geometry, TaskStages


@dataclass
class Item:
    """One source on its way through the steps."""

    source: str
    tasks: tuple[Task, ...]  # the tasks it still needs (the others have its row already)
    geometry: Geometry | None = None
    preps: dict[Task, Any] = field(default_factory=dict)
    raws: dict[Task, Any] = field(default_factory=dict)
    errors: dict[Task, str] = field(default_factory=dict)  # per task; a read error is every task's

    def dumps(self) -> bytes:
        return pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)

    @staticmethod
    def loads(data: bytes) -> Item:
        return pickle.loads(data)


def describe_error(err: BaseException) -> str:
    """``Type: message`` on one line, as the per-task command reports a skipped file."""
    text = " ".join(str(err).split()) or "(no message)"
    return f"{type(err).__name__}: {text}"


def read_prepare(
    todo: Sequence[tuple[str, Sequence[Task]]],
    stages: Mapping[Task, TaskStages],
    *,
    filesystem: pafs.FileSystem | None = None,
    max_side: int,
) -> list[Item]:
    """``todo``: (source, the tasks it needs). Each source decoded once, prepared per task."""
    items = []
    for source, tasks in todo:
        item = Item(source, tuple(tasks))
        items.append(item)
        try:
            intake = read_intake(source, filesystem, max_side=max_side)
        except Exception as err:  # a bad photo is its rows' error, never the run's
            item.errors = dict.fromkeys(item.tasks, describe_error(err))
            continue
        item.geometry = Geometry.of(intake)
        for task in item.tasks:
            try:
                item.preps[task] = stages[task].prepare(intake)
            except Exception as err:
                item.errors[task] = describe_error(err)
    return items


def forward(items: Sequence[Item], stage: TaskStages) -> None:
    """ONE forward of ``stage``'s task for every item that has its prep; a batch that fails is
    run again photo by photo, so one bad photo costs only its own row."""
    task = stage.task
    todo = [it for it in items if task in it.preps]
    if not todo:
        return
    try:
        _forward(todo, stage)
        return
    except Exception as err:
        if len(todo) == 1:
            _failed(todo[0], task, err)
            return
    for it in todo:
        try:
            _forward([it], stage)
        except Exception as err:
            _failed(it, task, err)


def _forward(todo: list[Item], stage: TaskStages) -> None:
    raws = stage.forward([it.preps[stage.task] for it in todo])
    if len(raws) != len(todo):
        raise RuntimeError(f"The {stage.task.name} forward gave {len(raws)} results for {len(todo)} photos.")
    for it, raw in zip(todo, raws, strict=True):
        it.raws[stage.task] = raw
        del it.preps[stage.task]  # the network input is not carried any further


def _failed(item: Item, task: Task, err: BaseException) -> None:
    item.errors[task] = describe_error(err)
    item.preps.pop(task, None)


def finish(items: Sequence[Item], stages: Mapping[Task, TaskStages]) -> dict[Task, list[dict[str, Any]]]:
    """Per task, the rows of ``items`` (in order): finished results, or errors."""
    rows: dict[Task, list[dict[str, Any]]] = {t: [] for t in stages}
    for it in items:
        for task in it.tasks:
            error = it.errors.get(task)
            if error is None and task not in it.raws:
                error = "RuntimeError: no forward result (the forward step did not run for this task)"
            if error is None:
                try:
                    rows[task].append(stages[task].finish(it.raws.pop(task), it.geometry, it.source))
                    continue
                except Exception as err:
                    error = describe_error(err)
            rows[task].append(_error_row(it, error))
    return rows


def _error_row(item: Item, error: str) -> dict[str, Any]:
    row: dict[str, Any] = {"source": item.source, "error": error}
    if item.geometry is not None:
        row.update(width=item.geometry.size_hw[1], height=item.geometry.size_hw[0])
    return row
