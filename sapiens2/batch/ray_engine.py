"""The Ray engine: the local engine's steps (:mod:`.flow`) as a Ray Data pipeline: read + prepare
on CPUs, the detector's actor pool where people are found first on a GPU job, forward + finish in
per-task actor pools (only finished rows reach the object store), and a write step whose parts
the driver commits as they stream back (:mod:`.store`). Before the first photo a check per node
(:mod:`.worker_check`); each step declares its memory (:mod:`.footprint`) and keeps to its CPUs
(:mod:`.workers`). docs/SCALE.md gives the steps, what travels between them and why. Ray is
imported only here, and only when this engine runs.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from .. import errors
from ..errors import Sapiens2Error
from ..tasks.registry import Task
from . import flow
from .job import BatchJob
from .parts import Parts, Tally
from .placement import DETECTOR_GPU_SHARE, Actors, Layout, RayOptions, actor_resources, plan_layout
from .records import rows_table
from .stages import TaskStages, stages_for
from .store import Store, Written
from .workers import use_ray_allotment

__all__ = ["DETECTOR_GPU_SHARE", "Actors", "RayOptions", "actor_resources", "run_ray", "step_names"]


# ----------------------------------------------------------------------------- worker side

_CACHE: dict[str, dict[Task, TaskStages]] = {}


def _cpu_stages(job: BatchJob) -> dict[Task, TaskStages]:
    """The job's weight-free stages, made once per worker process and job."""
    key = repr([p.made_by(job.dtype) for p in job.plans])
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = stages_for(job.plans)
    return _CACHE[key]


_ITEM = pa.large_binary()


def _passed(items: list[flow.Item], label: str, batch: pa.Table | None = None) -> pa.Table:
    """``batch`` (the step's input) with its items replaced by ``items`` and a column ``label``
    holding each pickled item's bytes (what this step passes to the next; summed at the end)."""
    blobs = [it.dumps() for it in items]
    sizes = pa.array([len(b) for b in blobs], pa.int64())
    if batch is None:
        return pa.table({"item": pa.array(blobs, _ITEM), label: sizes})
    batch = batch.set_column(batch.schema.get_field_index("item"), "item", pa.array(blobs, _ITEM))
    return batch.append_column(label, sizes)


def _items(batch: pa.Table) -> list[flow.Item]:
    return [flow.Item.loads(b) for b in batch.column("item").to_pylist()]


def read_prepare_step(batch: pa.Table, job: BatchJob, label: str, find: tuple[str, ...] = ()) -> pa.Table:
    """CPU step: sources -> items holding every task's network input (or detector input).
    ``find``: the tasks whose people this step finds itself (a CPU job), as the local engine does."""
    use_ray_allotment()
    named = zip(batch.column("source").to_pylist(), batch.column("tasks").to_pylist(), strict=True)
    todo = [(source, tuple(job.task_named(n) for n in names)) for source, names in named]
    stages = _cpu_stages(job)
    items = flow.read_prepare(todo, stages, filesystem=job.filesystem, max_side=job.max_side)
    finders = [stages[job.task_named(name)] for name in find]
    for stage in finders:
        stage.load_finder("cpu")
    flow.find_and_prepare(items, finders, stages, max_side=job.max_side)
    return _passed(items, label)


def prepare_found_step(batch: pa.Table, job: BatchJob, label: str) -> pa.Table:
    """CPU step after the people steps: the person crops from the photo's bytes, then no photo."""
    use_ray_allotment()
    items = _items(batch)
    flow.prepare_found(items, _cpu_stages(job), max_side=job.max_side)
    return _passed(items, label, batch)


class DeviceStep:
    """Actor: one task's device step, its weights loaded once; each call runs it on its batch.
    ``people``: the task's people finder (its detector alone) instead of its model."""

    def __init__(self, job: BatchJob, task: Task, device: str, label: str, people: bool = False) -> None:
        use_ray_allotment()
        self.label, self.people = label, people
        self.stage = TaskStages(next(p for p in job.plans if p.task is task))
        if people:
            self.stage.load_finder(device)
        else:
            self.stage.load(device, job.dtype)

    def __call__(self, batch: pa.Table) -> pa.Table:
        items = _items(batch)
        if self.people:
            flow.find_people(items, self.stage)
        else:
            flow.forward(items, self.stage)
            flow.finish_task(items, self.stage)  # rows on, never the raw maps
        return _passed(items, self.label, batch)


_WRITTEN = pa.schema(
    [
        ("task", pa.string()),
        ("temp", pa.string()),
        ("rows", pa.int64()),
        ("errors", pa.int64()),
        ("quoted", pa.string()),
        ("photos", pa.int64()),
        ("sent", pa.string()),  # JSON: bytes passed from step to step, by "a -> b"
    ]
)


def write_step(batch: pa.Table, job: BatchJob, store: Store) -> pa.Table:
    """CPU step: the items' finished rows -> one part per task, written under a temporary name."""
    use_ray_allotment()
    items = _items(batch)
    sent = {name: sum(batch.column(name).to_pylist()) for name in batch.column_names if name != "item"}
    out: list[dict[str, Any]] = []
    for task, rows in flow.take_rows(items, job.tasks).items():
        if not rows:
            continue
        table = rows_table(task, rows)
        written = store.write(task, table)
        tally = Tally.of(table)
        first = not out  # the batch's photos and bytes are counted once, with its first part
        out.append(
            {
                "task": task.name,
                "temp": written.temp,
                "rows": written.rows,
                "errors": tally.errors,
                "quoted": json.dumps(tally.quoted),
                "photos": len(items) if first else 0,
                "sent": json.dumps(sent if first else {}),
            }
        )
    return pa.Table.from_pylist(out, schema=_WRITTEN)


# ----------------------------------------------------------------------------- driver side


def run_ray(
    job: BatchJob,
    todo: Sequence[tuple[str, tuple[Task, ...]]],
    store: Store,
    parts: Parts,
    opts: RayOptions | None = None,
    *,
    progress: bool = True,
) -> None:
    """Every source of ``todo`` through ``job``'s tasks on the Ray this process has joined
    (:func:`.cluster.connected`); parts committed through ``parts``."""
    import ray
    import ray.data

    from .cluster import alive_nodes
    from .worker_check import check_workers

    opts = opts or RayOptions()
    try:
        ray.data.DataContext.get_current().enable_progress_bars = progress
        nodes = alive_nodes()
        layout = plan_layout(job, opts, ray.cluster_resources(), nodes)
        checked = check_workers(job, todo[0][0], store)
        gib = ", ".join(f"{k} {v / 2**30:.1f}" for k, v in layout.memory.items())
        print(f"ray: {checked} node(s) can read INPUT, write OUT and find the weights; memory per "
              f"step (GiB): {gib}", file=sys.stderr)  # fmt: skip
        rows = [{"source": s, "tasks": [t.name for t in tasks]} for s, tasks in todo]
        ds = ray.data.from_items(
            rows, override_num_blocks=min(len(rows), math.ceil(len(rows) / job.batch_size))
        )
        _commit_stream(_pipeline(ds, job, store, opts, layout), parts, job)
    except Exception as err:  # a worker's package error (weights missing ...) as itself, not Ray's wrapper
        cause = _package_cause(err)
        if cause is None:
            raise
        raise cause from None


def step_names(job: BatchJob, finding: Sequence[Task], in_read: Sequence[str] = ()) -> list[str]:
    """The run's steps in order: prepare (and the people it finds itself), each people finder
    and the crops, each forward (which finishes its rows), write."""
    people = [f"detect {t.name}" for t in finding] + (["crops"] if finding else [])
    first = " + ".join(["prepare", *(f"detect {name}" for name in in_read)])
    return [first, *people, *(f"forward {t.name}" for t in job.tasks), "write"]


def _pipeline(ds: Any, job: BatchJob, store: Store, opts: RayOptions, layout: Layout) -> Any:
    """The Ray Data steps of the run (:func:`step_names`), each labelling the bytes it passes on
    and declaring its memory."""
    import ray.data

    names = step_names(job, layout.finding, layout.in_read)
    labels = iter(f"{a} -> {b}" for a, b in zip(names, names[1:], strict=False))
    batch = {"batch_size": job.batch_size, "batch_format": "pyarrow"}
    mem, pools = layout.memory, layout.pools
    ds = ds.map_batches(
        read_prepare_step,
        fn_kwargs={"job": job, "label": next(labels), "find": layout.in_read},
        num_cpus=layout.step_cpus, memory=mem["read"], **batch,
    )  # fmt: skip

    def device_step(ds: Any, task: Task, people: bool, gpus: float, cpus: float, actors: int) -> Any:
        device = "cuda" if gpus > 0 else "cpu"  # Ray shows each actor only its own GPUs
        return ds.map_batches(
            DeviceStep, fn_constructor_kwargs={"job": job, "task": task, "device": device,
                                               "label": next(labels), "people": people},
            compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=cpus, num_gpus=gpus or None,
            memory=mem["detect"] if people else mem[f"forward {task.name}"], **batch,
        )  # fmt: skip

    for task in layout.finding:
        ds = device_step(ds, task, True, pools.finder_gpus, pools.finder_cpus, pools.finders)
    if layout.finding:
        ds = ds.map_batches(
            prepare_found_step, fn_kwargs={"job": job, "label": next(labels)},
            num_cpus=layout.step_cpus, memory=mem["read"], **batch,
        )  # fmt: skip
    for plan in job.plans:
        ds = device_step(ds, plan.task, False, pools.gpus, pools.cpus, opts.actors)
    return ds.map_batches(
        write_step, fn_kwargs={"job": job, "store": store}, batch_size=job.part_rows(),
        batch_format="pyarrow", num_cpus=layout.step_cpus, memory=mem["write"],
    )  # fmt: skip


_QUOTED_ERROR = re.compile(r"sapiens2\.errors\.(\w+): ([^\n]+)")


def _package_cause(err: BaseException) -> Sapiens2Error | None:
    """The package error inside a Ray error: its ``cause`` or the exception chain, else the last
    one quoted in its message (an actor's failed start reaches the driver as text only)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [err]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, Sapiens2Error):
            return e
        todo += [getattr(e, "cause", None), e.__cause__, e.__context__]
    quoted = _QUOTED_ERROR.findall(str(err))
    if quoted:
        kind = getattr(errors, quoted[-1][0], None)
        if isinstance(kind, type) and issubclass(kind, Sapiens2Error):
            return kind(quoted[-1][1])
    return None


def _commit_stream(ds: Any, parts: Parts, job: BatchJob) -> None:
    """Commit each written part as it streams back; the bytes per photo between the steps."""
    sent: dict[str, int] = {}
    photos = 0
    for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
        for r in batch.to_pylist():
            quoted = tuple((s, e) for s, e in json.loads(r["quoted"]))
            parts.committed(
                Written(job.task_named(r["task"]), r["temp"], r["rows"]),
                Tally(r["rows"], r["errors"], quoted),
                r["photos"],
            )
            photos += r["photos"]
            for hop, n in json.loads(r["sent"]).items():
                sent[hop] = sent.get(hop, 0) + n
    if photos:
        parts.summary.bytes_between = {k: v / photos for k, v in sent.items()}
