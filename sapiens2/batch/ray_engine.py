"""The Ray engine: the same steps as the local engine (:mod:`.flow`) as a Ray Data pipeline.

* read + prepare: a CPU map step (each photo decoded once, prepared for every task);
* for a task that finds people first (pose with its DETR), on a GPU job: per task an actor pool
  running the detector alone on the small inputs prepare made (``detector_actors`` actors, a
  share of a GPU each), then a CPU map step making the person crops from the photo's bytes
  (decoded again). On a CPU job the read step runs the detector itself, as the local engine
  does (no process to start, no second decode); ``detector_actors`` asks for the pool anyway;
* forward: per task, an actor pool (``actors`` actors, each loading the model once; ``num_gpus``
  may be a fraction, so several small models share a GPU);
* finish + write: a CPU map step that finishes each raw into its row and writes each task's
  rows of its batch as one Parquet part under a temporary name; the driver commits the parts as
  they stream back (:mod:`.store`), so a killed driver leaves nothing half-done.

Each step's process keeps to the CPUs Ray gave it (:mod:`.workers`): torch's threads, OpenCV's and
the package's pools. Between steps only one pickled :class:`~.flow.Item` per photo travels (the
network inputs, then the network-resolution outputs, and the photo's geometry; while its people
are found, the detector's input and the photo's file bytes, never its decoded pixels). Each step
counts the bytes it passes on (the run's summary: per photo, by step).

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
    #: people-finder actors per task that finds people; None: ``actors`` on a GPU job, 0 on a CPU
    #: job (0: the read step finds the people itself, on its CPUs)
    detector_actors: int | None = None
    detector_gpus: float | None = None  # GPUs per finder actor (None: DETECTOR_GPU_SHARE on a GPU job)


#: A people finder's default share of a GPU beside a forward actor (which then gets the rest): a
#: DETR-R50 photo at 800 px is a small part of a pose batch's crops, and the share only schedules
#: (both processes use the whole GPU as their work comes).
DETECTOR_GPU_SHARE = 0.1


@dataclass(frozen=True)
class Actors:
    """The actor pools of a run: per forward actor and per people-finder actor, GPUs and CPUs."""

    gpus: float
    cpus: float
    finder_gpus: float = 0.0
    finder_cpus: float = 0.0
    finders: int = 0  # finder actors per task that finds people (0: the read step finds them)


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
        (flow.find_people if self.people else flow.forward)(items, self.stage)
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


def finish_write_step(batch: pa.Table, job: BatchJob, store: Store) -> pa.Table:
    """CPU step: items -> rows -> one part per task, written under a temporary name."""
    use_ray_allotment()
    items = _items(batch)
    sent = {name: sum(batch.column(name).to_pylist()) for name in batch.column_names if name != "item"}
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
                "sent": json.dumps(sent if first else {}),
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
    opts: RayOptions, tasks: int, cluster: dict[str, float], gpu: bool = False, finding: int = 0
) -> Actors:
    """The actors' resources, checked against the cluster and the job (``gpu``: its options were
    resolved for a GPU forward; ``finding``: tasks that find people before their forward). The
    actors must leave at least one CPU for the CPU steps, or the pipeline would wait forever."""
    cpus, gpus = float(cluster.get("CPU", 0)), float(cluster.get("GPU", 0))
    finders = opts.detector_actors if opts.detector_actors is not None else (opts.actors if gpu else 0)
    finders = finders if finding else 0
    if opts.actors < 1 or finders < 0:
        raise OptionError(
            f"--actors must be at least 1 and --detector-actors at least 0; got {opts.actors}, {finders}."
        )
    share = DETECTOR_GPU_SHARE if gpu and finders else 0.0
    finder_gpu = share if opts.detector_gpus is None else opts.detector_gpus
    if finder_gpu > 0 and not finders:
        raise OptionError(
            "--detector-gpus is for detector actors; with --detector-actors 0 the read step detects."
        )
    per_gpu = opts.gpus_per_actor if opts.gpus_per_actor is not None else (1.0 - share if gpu else 0.0)
    for flag, want in (("--gpus-per-actor", per_gpu), ("--detector-gpus", finder_gpu)):
        if want < 0 or want > gpus:
            raise OptionError(
                f"{flag} {want:g} but this Ray cluster has {gpus:g} GPU(s); "
                "use 0 for CPU forwards or join a cluster with GPUs (--address)."
            )
        if want > 0 and not gpu:
            raise OptionError(
                f"The job's options were resolved for a CPU forward, but {flag} is {want:g}; "
                "make the job and the actors' GPUs agree."
            )
    if gpu and per_gpu == 0:
        raise OptionError(
            "The job's options were resolved for a GPU forward, but the actors get 0 GPU; "
            "make the job and --gpus-per-actor agree."
        )
    need = opts.actors * tasks * per_gpu + finders * finding * finder_gpu
    if opts.address is None and need > gpus + 1e-9:  # a local Ray never grows (a cluster may scale up)
        raise OptionError(
            f"The actors need {need:g} GPUs ({opts.actors} per task x {tasks} task(s) x {per_gpu:g}"
            + (f", {finders} detector actor(s) x {finder_gpu:g}" if finders else "")
            + f") but this Ray has {gpus:g}; lower --actors, --gpus-per-actor or --detector-gpus."
        )
    actors = opts.actors * tasks + finders * finding
    per_cpu = opts.cpus_per_actor
    if per_cpu is None:
        per_cpu = 1.0 if per_gpu > 0 else max(0.1, math.floor((cpus - 1) / actors * 10) / 10)
    if cpus - actors * per_cpu < 1:
        raise OptionError(
            f"{actors} actor(s) x {per_cpu:g} CPU leave no CPU of this Ray cluster's {cpus:g} "
            "for reading and finishing the photos; lower --actors or --cpus-per-actor."
        )
    return Actors(per_gpu, per_cpu, finder_gpu, per_cpu if finders else 0.0, finders)


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
        stages = stages_for(job.plans)
        finding = [t for t, st in stages.items() if st.finds_people]
        pools = actor_resources(opts, len(job.plans), cluster, job.gpu, len(finding))
        spare = cluster.get("CPU", 0) - pools.cpus * opts.actors * len(job.plans)
        steps = step_cpus(spare - pools.finder_cpus * pools.finders * len(finding))
        if not pools.finders:  # the read step finds the people itself
            in_read, finding = tuple(t.name for t in finding), []
        else:
            in_read = ()
        rows = [{"source": s, "tasks": [t.name for t in tasks]} for s, tasks in todo]
        ds = ray.data.from_items(
            rows, override_num_blocks=min(len(rows), math.ceil(len(rows) / job.batch_size))
        )
        _commit_stream(_pipeline(ds, job, store, opts, pools, finding, in_read, steps), parts, job)
    except Exception as err:  # a worker's package error (weights missing ...) as itself, not Ray's wrapper
        cause = _package_cause(err)
        if cause is None:
            raise
        raise cause from None
    finally:
        if started:
            ray.shutdown()


def step_names(job: BatchJob, finding: Sequence[Task], in_read: Sequence[str] = ()) -> list[str]:
    """The run's steps in order: prepare (and the people it finds itself), each people finder
    and the crops, each forward, finish."""
    people = [f"detect {t.name}" for t in finding] + (["crops"] if finding else [])
    first = " + ".join(["prepare", *(f"detect {name}" for name in in_read)])
    return [first, *people, *(f"forward {t.name}" for t in job.tasks), "finish"]


def _pipeline(
    ds: Any,
    job: BatchJob,
    store: Store,
    opts: RayOptions,
    pools: Actors,
    finding: list[Task],
    in_read: tuple[str, ...],
    steps: float,
) -> Any:
    """The Ray Data steps of the run (:func:`step_names`), each labelling the bytes it passes on."""
    import ray.data

    names = step_names(job, finding, in_read)
    labels = iter(f"{a} -> {b}" for a, b in zip(names, names[1:], strict=False))
    batch = {"batch_size": job.batch_size, "batch_format": "pyarrow"}
    ds = ds.map_batches(
        read_prepare_step,
        fn_kwargs={"job": job, "label": next(labels), "find": in_read},
        num_cpus=steps,
        **batch,
    )

    def device_step(ds: Any, task: Task, people: bool, gpus: float, cpus: float, actors: int) -> Any:
        device = "cuda" if gpus > 0 else "cpu"  # Ray shows each actor only its own GPUs
        return ds.map_batches(
            DeviceStep, fn_constructor_kwargs={"job": job, "task": task, "device": device,
                                               "label": next(labels), "people": people},
            compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=cpus, num_gpus=gpus or None, **batch,
        )  # fmt: skip

    for task in finding:
        ds = device_step(ds, task, True, pools.finder_gpus, pools.finder_cpus, pools.finders)
    if finding:
        ds = ds.map_batches(
            prepare_found_step, fn_kwargs={"job": job, "label": next(labels)}, num_cpus=steps, **batch
        )
    for plan in job.plans:
        ds = device_step(ds, plan.task, False, pools.gpus, pools.cpus, opts.actors)
    return ds.map_batches(
        finish_write_step,
        fn_kwargs={"job": job, "store": store},
        batch_size=job.part_rows(),
        batch_format="pyarrow",
        num_cpus=steps,
    )


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
