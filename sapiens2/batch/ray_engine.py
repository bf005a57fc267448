"""The Ray engine: the same steps as the local engine (:mod:`.flow`) as a Ray Data pipeline.

* read + prepare: a CPU map step (each photo decoded once, prepared for every task);
* forward: per task, an actor pool (``actors`` actors, each loading the model once; ``num_gpus``
  may be a fraction, so several small models share a GPU);
* finish + write: a CPU map step that finishes each raw into its row and writes each task's
  rows of its batch as one Parquet part under a temporary name; the driver commits the parts as
  they stream back (:mod:`.store`), so a killed driver leaves nothing half-done.

Each step's process keeps to the CPUs Ray gave it (:mod:`.workers`): torch's threads, OpenCV's and
the package's pools. Between steps only one pickled :class:`~.flow.Item` per photo travels (the
network inputs, then the network-resolution outputs, and the photo's geometry).

No ``address``: a local Ray is started (bound to 127.0.0.1, no dashboard) and stopped at the end;
with one, the run joins that cluster. A Ray already initialised in this process is used as it is.
Ray is imported only here, and only when this engine runs.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from .. import errors
from ..errors import OptionError, Sapiens2Error
from ..runtime.cpus import available_cpus
from ..tasks.registry import Task
from . import flow
from .job import BatchJob
from .parts import Parts, Tally
from .records import rows_table
from .stages import TaskStages, stages_for
from .store import Store, Written
from .workers import use_ray_allotment


@dataclass(frozen=True)
class RayOptions:
    """How the run uses Ray."""

    address: str | None = None  # a cluster to join (``ray://host:10001``, ``auto``); None: start one here
    actors: int = 1  # forward actors per task
    gpus_per_actor: float | None = None  # None: 1 when the job is for a GPU (BatchJob.gpu), else 0
    cpus_per_actor: float | None = None  # None: 1 beside a GPU; on CPUs, a share that leaves 1 CPU free
    cpus: int | None = None  # a local Ray's CPUs (default: this process's)
    object_store_bytes: int | None = None  # a local Ray's object store (default: Ray's)


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


def read_prepare_step(batch: pa.Table, job: BatchJob) -> pa.Table:
    """CPU step: sources -> items holding every task's network input."""
    use_ray_allotment()
    named = zip(batch.column("source").to_pylist(), batch.column("tasks").to_pylist(), strict=True)
    todo = [(source, tuple(job.task_named(n) for n in names)) for source, names in named]
    items = flow.read_prepare(todo, _cpu_stages(job), filesystem=job.filesystem, max_side=job.max_side)
    blobs = [it.dumps() for it in items]
    return pa.table({"item": pa.array(blobs, _ITEM), "prepared_bytes": [len(b) for b in blobs]})


class ForwardStep:
    """Actor: one task's model, loaded once; each call runs one forward for its batch."""

    def __init__(self, job: BatchJob, task: Task, device: str) -> None:
        use_ray_allotment()
        self.stage = TaskStages(next(p for p in job.plans if p.task is task))
        self.stage.load(device, job.dtype)

    def __call__(self, batch: pa.Table) -> pa.Table:
        items = [flow.Item.loads(b) for b in batch.column("item").to_pylist()]
        flow.forward(items, self.stage)
        blobs = pa.array([it.dumps() for it in items], _ITEM)
        return batch.set_column(batch.schema.get_field_index("item"), "item", blobs)


_WRITTEN = pa.schema(
    [
        ("task", pa.string()),
        ("temp", pa.string()),
        ("rows", pa.int64()),
        ("errors", pa.int64()),
        ("quoted", pa.string()),
        ("photos", pa.int64()),
        ("prepared_bytes", pa.int64()),
        ("finished_bytes", pa.int64()),
    ]
)


def finish_write_step(batch: pa.Table, job: BatchJob, store: Store) -> pa.Table:
    """CPU step: items -> rows -> one part per task, written under a temporary name."""
    use_ray_allotment()
    blobs = batch.column("item").to_pylist()
    items = [flow.Item.loads(b) for b in blobs]
    out: list[dict[str, Any]] = []
    for task, rows in flow.finish(items, _cpu_stages(job)).items():
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
                "prepared_bytes": sum(batch.column("prepared_bytes").to_pylist()) if first else 0,
                "finished_bytes": sum(len(b) for b in blobs) if first else 0,
            }
        )
    return pa.Table.from_pylist(out, schema=_WRITTEN)


# ----------------------------------------------------------------------------- driver side


def _package_path() -> str:
    """The folder holding the ``sapiens2`` package, for local workers to import it from."""
    return str(Path(__file__).resolve().parents[2])


def start_ray(opts: RayOptions) -> bool:
    """Initialise Ray for the run; True when this call started it (and the run stops it)."""
    import ray

    if ray.is_initialized():
        return False
    if opts.address:
        ray.init(address=opts.address, log_to_driver=True)
        return True
    path = os.pathsep.join(p for p in (_package_path(), os.environ.get("PYTHONPATH", "")) if p)
    ray.init(
        num_cpus=opts.cpus or available_cpus(),
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        object_store_memory=opts.object_store_bytes,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    return True


def step_cpus(spare: float) -> float:
    """CPUs each read or finish task asks for, given the CPUs the actors leave: half a CPU on a
    small machine, so a read and a finish run side by side on the one CPU left (neither waits for
    all of the other's batches to be done), a whole CPU where there are several to spare."""
    return 1.0 if spare >= 4 else 0.5


def actor_resources(
    opts: RayOptions, tasks: int, cluster: dict[str, float], gpu: bool = False
) -> tuple[float, float]:
    """(GPUs, CPUs) of one forward actor, checked against the cluster and the job (``gpu``: its
    options were resolved for a GPU forward). The actors must leave at least one CPU for the read
    and finish steps, or the pipeline would wait forever."""
    cpus, gpus = float(cluster.get("CPU", 0)), float(cluster.get("GPU", 0))
    if opts.actors < 1:
        raise OptionError(f"--actors must be at least 1; got {opts.actors}.")
    per_gpu = opts.gpus_per_actor if opts.gpus_per_actor is not None else (1.0 if gpu else 0.0)
    if per_gpu < 0 or per_gpu > gpus:
        raise OptionError(
            f"--gpus-per-actor {per_gpu:g} but this Ray cluster has {gpus:g} GPU(s); "
            "use 0 for CPU forwards or join a cluster with GPUs (--address)."
        )
    if (per_gpu > 0) != gpu:
        where = "a GPU" if gpu else "a CPU"
        raise OptionError(
            f"The job's options were resolved for {where} forward, but the actors get {per_gpu:g} GPU; "
            "make the job and --gpus-per-actor agree."
        )
    actors = opts.actors * tasks
    per_cpu = opts.cpus_per_actor
    if per_cpu is None:
        per_cpu = 1.0 if per_gpu > 0 else max(0.1, math.floor((cpus - 1) / actors * 10) / 10)
    if cpus - actors * per_cpu < 1:
        raise OptionError(
            f"{actors} forward actor(s) x {per_cpu:g} CPU leave no CPU of this Ray cluster's {cpus:g} "
            "for reading and finishing the photos; lower --actors or --cpus-per-actor."
        )
    return per_gpu, per_cpu


def run_ray(
    job: BatchJob,
    todo: Sequence[tuple[str, tuple[Task, ...]]],
    store: Store,
    parts: Parts,
    opts: RayOptions | None = None,
    *,
    progress: bool = True,
) -> None:
    """Every source of ``todo`` through ``job``'s tasks on Ray; parts committed through ``parts``."""
    import ray
    import ray.data

    opts = opts or RayOptions()
    started = start_ray(opts)
    try:
        ray.data.DataContext.get_current().enable_progress_bars = progress
        cluster = ray.cluster_resources()
        gpus, cpus = actor_resources(opts, len(job.plans), cluster, job.gpu)
        steps = step_cpus(cluster.get("CPU", 0) - cpus * opts.actors * len(job.plans))
        device = "cuda" if gpus > 0 else "cpu"  # Ray shows each actor only its own GPUs
        rows = [{"source": s, "tasks": [t.name for t in tasks]} for s, tasks in todo]
        ds = ray.data.from_items(
            rows, override_num_blocks=min(len(rows), math.ceil(len(rows) / job.batch_size))
        )
        ds = ds.map_batches(
            read_prepare_step,
            fn_kwargs={"job": job},
            batch_size=job.batch_size,
            batch_format="pyarrow",
            num_cpus=steps,
        )
        for plan in job.plans:
            ds = ds.map_batches(
                ForwardStep,
                fn_constructor_kwargs={"job": job, "task": plan.task, "device": device},
                batch_size=job.batch_size,
                batch_format="pyarrow",
                compute=ray.data.ActorPoolStrategy(size=opts.actors),
                num_cpus=cpus,
                num_gpus=gpus or None,
            )
        ds = ds.map_batches(
            finish_write_step,
            fn_kwargs={"job": job, "store": store},
            batch_size=job.part_rows(),
            batch_format="pyarrow",
            num_cpus=steps,
        )
        try:
            _commit_stream(ds, parts, job)
        except (
            Exception
        ) as err:  # a worker's package error (weights missing ...) as itself, not Ray's wrapper
            cause = _package_cause(err)
            if cause is None:
                raise
            raise cause from None
    finally:
        if started:
            ray.shutdown()


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
    sent = {"prepare -> forward": 0, "forward -> finish": 0}
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
            sent["prepare -> forward"] += r["prepared_bytes"]
            sent["forward -> finish"] += r["finished_bytes"]
    if photos:
        parts.summary.bytes_between = {k: v / photos for k, v in sent.items()}
