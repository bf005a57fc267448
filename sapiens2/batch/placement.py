"""Where a Ray run's steps go: the options (:class:`RayOptions`), the actor pools checked against
the cluster's resources (:func:`actor_resources`: a GPU default only where the job is for GPUs,
every refusal naming where its value came from, a flag only when the user gave it), and the
run's :class:`Layout` (pools, CPUs and memory per step). No Ray import: plain figures."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import OptionError
from ..tasks.registry import Task
from . import footprint
from .job import BatchJob
from .stages import stages_for


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
    connect_timeout: float | None = None  # seconds to wait for ``address`` (None: cluster.connect_timeout)
    #: why the job is for GPUs or CPUs when --gpus-per-actor was not given (said in a refusal)
    gpu_reason: str = ""


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
    why = opts.gpu_reason or ("the job is for a GPU forward" if gpu else "the job is for a CPU forward")
    for flag, want, given, role in (
        ("--gpus-per-actor", per_gpu, opts.gpus_per_actor is not None, "forward"),
        ("--detector-gpus", finder_gpu, opts.detector_gpus is not None, "detector"),
    ):
        said = f"{flag} {want:g}" if given else f"The {role} actors' default of {want:g} GPU each ({why})"
        if want < 0 or want > gpus:
            raise OptionError(
                f"{said} but this Ray cluster has {gpus:g} GPU(s); "
                f"give {flag} 0 for CPU forwards or join a cluster with GPUs (--address)."
            )
        if want > 0 and not gpu:
            raise OptionError(
                f"The job's options were resolved for a CPU forward, but {said}; "
                "make the job and the actors' GPUs agree."
            )
    if gpu and per_gpu == 0:
        raise OptionError(
            f"The job's options were resolved for a GPU forward ({why}), but the actors get 0 GPU; "
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


@dataclass(frozen=True)
class Layout:
    """How the run's steps sit on the cluster: the actor pools, which tasks find their people in
    a step of their own (``finding``) or in the read step (``in_read``), the CPUs of each CPU step
    and the memory each step declares (bytes, by step name)."""

    pools: Actors
    finding: tuple[Task, ...]
    in_read: tuple[str, ...]
    step_cpus: float
    memory: dict[str, int]


def plan_layout(job: BatchJob, opts: RayOptions, cluster: dict[str, float], nodes: list[dict]) -> Layout:
    """The run's :class:`Layout` on a cluster of these resources and nodes."""
    stages = stages_for(job.plans)
    finding = [t for t, st in stages.items() if st.finds_people]
    pools = actor_resources(opts, len(job.plans), cluster, job.gpu, len(finding))
    spare = cluster.get("CPU", 0) - pools.cpus * opts.actors * len(job.plans)
    steps = step_cpus(spare - pools.finder_cpus * pools.finders * len(finding))
    in_read = () if pools.finders else tuple(t.name for t in finding)  # the read step finds them
    cpu_step = footprint.capped(footprint.cpu_step_bytes(job), nodes)
    memory = {"read": cpu_step, "write": cpu_step, "detect": cpu_step}
    for plan in job.plans:
        hw = plan.network_hw or tuple(stages[plan.task].cpu_pipeline().network_hw)
        need = footprint.forward_actor_bytes(plan, hw, job, pools.gpus > 0)
        memory[f"forward {plan.task.name}"] = footprint.capped(need, nodes)
    # every actor plus one read and one write step must fit the cluster's memory, or the pipeline
    # could wait for ever: shrink the requests together where they would not
    total = sum(v * opts.actors for k, v in memory.items() if k.startswith("forward")) + 2 * cpu_step
    room = cluster.get("memory", 0)
    if room and total > room:
        memory = {k: int(v * room / total) for k, v in memory.items()}
    return Layout(pools, tuple(finding) if pools.finders else (), in_read, steps, memory)
