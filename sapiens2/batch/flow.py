"""The steps both engines run on a batch of photos, and what passes between them.

``read_prepare`` (CPU): each source read and decoded ONCE, then prepared for every task it still
needs; only the preps (the network inputs) and the photo's :class:`~.stages.Geometry` go on, the
decoded photo is dropped. ``forward`` (the device, one task): one ``infer`` for the batch.
``finish`` (CPU): each raw finished into the task's row. A failure anywhere is caught per photo
and per task and becomes that row's ``error``; the run goes on.

A task that finds people first (pose with its DETR) takes two more steps between them:
``find_people`` (the device: the detector on its small inputs) and ``prepare_found`` (CPU: the
person crops from the photo). Until then the item keeps the photo's file bytes, which a step in
another process decodes again (the same pixels), and, in this process only, the decoded photo
itself (never pickled): the pixels never travel to a device step.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs as pafs

from ..inputs.intake import Intake
from ..tasks.registry import Task
from .sources import decode_source, read_source
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
    people_inputs: dict[Task, Any] = field(default_factory=dict)  # the detector's inputs, to find people
    people: dict[Task, Any] = field(default_factory=dict)  # the people found, to prepare the crops from
    photo: bytes | None = None  # the file's bytes while a task awaits its people
    rows: dict[Task, dict[str, Any]] = field(default_factory=dict)  # finished, right after each forward
    intake: Intake | None = None  # the decoded photo meanwhile, in this process only (not pickled)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "intake": None}

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
    """``todo``: (source, the tasks it needs). Each source decoded once, prepared per task (or,
    for a task that finds people first, its detector's input made)."""
    items = []
    for source, tasks in todo:
        item = Item(source, tuple(tasks))
        items.append(item)
        try:
            data, name = read_source(source, filesystem)
            intake = decode_source(data, name, max_side=max_side)
        except Exception as err:  # a bad photo is its rows' error, never the run's
            item.errors = dict.fromkeys(item.tasks, describe_error(err))
            continue
        item.geometry = Geometry.of(intake)
        for task in item.tasks:
            try:
                found = stages[task].people_input(intake)
                if found is None:
                    item.preps[task] = stages[task].prepare(intake)
                else:
                    item.people_inputs[task] = found
            except Exception as err:
                item.errors[task] = describe_error(err)
        if item.people_inputs:
            item.photo, item.intake = data, intake
    return items


def _in_batch_then_alone(todo: list[Item], task: Task, run: Callable[[list[Item]], None]) -> None:
    """``run`` on all of ``todo`` at once; if that fails, on each item alone, so one bad photo
    costs only its own row (its error recorded, what it held for ``task`` dropped)."""
    try:
        run(todo)
        return
    except Exception as err:
        if len(todo) == 1:
            _failed(todo[0], task, err)
            return
    for it in todo:
        try:
            run([it])
        except Exception as err:
            _failed(it, task, err)


def find_people(items: Sequence[Item], stage: TaskStages) -> None:
    """The device step of a task that finds people first: its detector on every item's input."""
    _device_step(items, stage.task, "people_inputs", "people", stage.find_people)


def find_and_prepare(
    items: Sequence[Item], finders: Sequence[TaskStages], stages: Mapping[Task, TaskStages], *, max_side: int
) -> None:
    """Both people steps in this process (the local engine; a Ray read step on CPUs): each
    finder's detector, then the crops from the photo still in memory."""
    for stage in finders:
        find_people(items, stage)
    if finders:
        prepare_found(items, stages, max_side=max_side)


def prepare_found(items: Sequence[Item], stages: Mapping[Task, TaskStages], *, max_side: int) -> None:
    """CPU, after :func:`find_people`: each task's network input from the photo and its people
    (the photo decoded again from its bytes when this is another process), then the photo dropped."""
    for it in items:
        if it.people:
            _prepare_people(it, stages, max_side)
        if not it.people_inputs:
            it.photo = it.intake = None


def _prepare_people(item: Item, stages: Mapping[Task, TaskStages], max_side: int) -> None:
    error = ""
    try:
        intake = item.intake
        if intake is None:  # another process: the same photo from its file's bytes
            intake = decode_source(item.photo or b"", item.geometry.name, max_side=max_side)
    except Exception as err:
        intake, error = None, describe_error(err)
    for task, people in item.people.items():
        try:
            if intake is None:  # the photo's bytes would not decode: each waiting task's error
                item.errors[task] = error
            else:
                item.preps[task] = stages[task].prepare(intake, people)
        except Exception as err:
            item.errors[task] = describe_error(err)
    item.people.clear()


def forward(items: Sequence[Item], stage: TaskStages) -> None:
    """ONE forward of ``stage``'s task for every item that has its prep; a batch that fails is
    run again photo by photo, so one bad photo costs only its own row."""
    _device_step(items, stage.task, "preps", "raws", stage.forward)


def _device_step(items: Sequence[Item], task: Task, takes: str, gives: str, run_step: Callable) -> None:
    """``run_step`` on the ``takes`` entries of ``task`` (one call for the batch, else photo by
    photo), each result stored in ``gives`` and what it took dropped (not carried any further)."""
    todo = [it for it in items if task in getattr(it, takes)]

    def run(some: list[Item]) -> None:
        out = run_step([getattr(it, takes)[task] for it in some])
        if len(out) != len(some):
            raise RuntimeError(f"The {task.name} device step gave {len(out)} results for {len(some)} photos.")
        for it, value in zip(some, out, strict=True):
            getattr(it, gives)[task] = value
            del getattr(it, takes)[task]

    if todo:
        _in_batch_then_alone(todo, task, run)


def _failed(item: Item, task: Task, err: BaseException) -> None:
    item.errors[task] = describe_error(err)
    for held in (item.preps, item.people_inputs, item.people):
        held.pop(task, None)


def finish_task(items: Sequence[Item], stage: TaskStages) -> None:
    """Each item's row of ``stage``'s task, finished from its raw as soon as the forward gave it
    (the raw dropped: only the small finished row goes on), or its error row."""
    task = stage.task
    for it in items:
        if task not in it.tasks or task in it.rows:
            continue
        error = it.errors.get(task)
        if error is None and task not in it.raws:
            error = "RuntimeError: no forward result (the forward step did not run for this task)"
        if error is None:
            try:
                it.rows[task] = stage.finish(it.raws.pop(task), it.geometry, it.source)
                continue
            except Exception as err:
                error = describe_error(err)
        it.rows[task] = _error_row(it, error)


def take_rows(items: Sequence[Item], tasks: Sequence[Task]) -> dict[Task, list[dict[str, Any]]]:
    """Per task, the finished rows of ``items`` in order (taken out of the items)."""
    rows: dict[Task, list[dict[str, Any]]] = {t: [] for t in tasks}
    for it in items:
        for task in it.tasks:
            row = it.rows.pop(task, None)
            if row is None:
                row = _error_row(it, it.errors.get(task) or "RuntimeError: no finished row for this task")
            rows[task].append(row)
    return rows


def finish(items: Sequence[Item], stages: Mapping[Task, TaskStages]) -> dict[Task, list[dict[str, Any]]]:
    """Per task, the rows of ``items`` (in order): finished results, or errors."""
    for stage in stages.values():
        finish_task(items, stage)
    return take_rows(items, list(stages))


def _error_row(item: Item, error: str) -> dict[str, Any]:
    row: dict[str, Any] = {"source": item.source, "error": error}
    if item.geometry is not None:
        row.update(width=item.geometry.size_hw[1], height=item.geometry.size_hw[0])
    return row
