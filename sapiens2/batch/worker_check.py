"""A Ray run's first small task, one per node: can a worker there read INPUT, write OUT and find the
weights? Each answer in seconds, with what is missing and where, instead of a worker failing
minutes later deep in a Ray traceback (a worker's environment is its ``ray start``'s plus what
:mod:`.cluster` ships, not the driver's).

OUT is checked from both ends: each worker writes a small probe file and the driver must see it
(a local folder of one node is not the driver's folder: the driver could never commit its parts).
The probes are deleted at once.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.fs as pafs

from ..errors import OptionError
from .job import BatchJob, ModelPlan
from .store import Store

#: Seconds for every node's check, worker start included.
CHECK_SECONDS = 180.0


def _models(job: BatchJob) -> list[ModelPlan]:
    return [m for p in job.plans for m in (p.model, *p.borrowed)]


def weights_problem(model: ModelPlan) -> str | None:
    """What keeps this process from the model's weights, or None (a model the Hub may still
    serve when the Hub is reachable counts as found: its actor downloads it)."""
    name = f"{model.task.name} weights"
    if model.checkpoint is not None:
        path = Path(model.checkpoint)
        if not path.exists():
            return f"{name}: {path} does not exist"
        if not os.access(path, os.R_OK):
            return f"{name}: {path} is not readable"
        return None
    spec, size = model.task.spec, model.size or ""
    from ..models.weights import local_root

    root = local_root()
    if root is not None and (root / spec.local_path(size)).is_file():
        return None
    from huggingface_hub import constants, try_to_load_from_cache

    for filename in (spec.filename(size), "model.safetensors"):
        if isinstance(try_to_load_from_cache(spec.repo_id(size), filename), str):
            return None
    if constants.HF_HUB_OFFLINE:
        return (
            f"{name} ({spec.repo_id(size)}): not in the Hugging Face cache {constants.HF_HUB_CACHE} and "
            "HF_HUB_OFFLINE is set (share HF_HOME, or give --checkpoint)"
        )
    return None


def _detector_problem(job: BatchJob) -> str | None:
    for plan in job.plans:
        given = plan.pipeline_kwargs.get("detector")
        if isinstance(given, str) and not Path(given).exists():
            return f"--detector-checkpoint {given} does not exist"
    return None


def _input_problem(job: BatchJob, source: str) -> str | None:
    from .sources import read_source

    try:
        read_source(source, job.filesystem)
    except Exception as err:
        return f"INPUT: cannot read {source}: {' '.join(str(err).split())}"
    return None


def _out_problem(store: Store, probe: str) -> str | None:
    try:
        store.fs.create_dir(store.root, recursive=True)
        with store.fs.open_output_stream(f"{store.root}/{probe}") as f:
            f.write(b"sapiens2 batch: a worker's check, deleted at once\n")
    except Exception as err:
        return f"OUT: cannot write into {store.out}: {' '.join(str(err).split())}"
    return None


def worker_problems(job: BatchJob, source: str, store: Store, probe: str) -> tuple[str, list[str]]:
    """Run in a Ray task on one node: (the node's address, what this worker cannot do). One that
    hangs (an endpoint that does not answer) is the driver's timeout, named by node."""
    import ray

    found = [
        _input_problem(job, source),
        _out_problem(store, probe),
        next(filter(None, map(weights_problem, _models(job))), None) or _detector_problem(job),
    ]
    return ray.util.get_node_ip_address(), [p for p in found if p]


def check_workers(job: BatchJob, source: str, store: Store, seconds: float = CHECK_SECONDS) -> int:
    """One :func:`worker_problems` task per live node (its weights and paths as that node sees
    them); OptionError naming each problem and its node. Returns how many nodes were checked."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from .cluster import alive_nodes

    nodes = alive_nodes()
    check = ray.remote(num_cpus=0, max_retries=0)(worker_problems)
    probes = [f".probe-{store.run_id}-{i}" for i in range(len(nodes))]
    refs = [
        check.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
            job, source, store, probe
        )
        for n, probe in zip(nodes, probes, strict=True)
    ]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=seconds)
    problems = []
    for node, ref, probe in zip(nodes, refs, probes, strict=True):
        where = f"node {node['NodeManagerAddress']}"
        if ref not in ready:
            ray.cancel(ref, force=True)
            problems.append(
                f"{where}: reading INPUT, writing OUT or finding the weights did not end in {seconds:g} s "
                "(an endpoint that does not answer?)"
            )
            continue
        _, found = ray.get(ref)
        problems += [f"{where}: {p}" for p in found]
        if not any(p.startswith("OUT") for p in found):
            problems += [f"{where}: {p}" for p in _probe_seen(store, probe)]
    if problems:
        raise OptionError("A Ray worker cannot run this job: " + "; ".join(problems) + ".")
    return len(nodes)


def _probe_seen(store: Store, probe: str) -> list[str]:
    """The driver must see what a worker wrote into OUT; the probe is deleted either way."""
    path = f"{store.root}/{probe}"
    if store.fs.get_file_info(path).type != pafs.FileType.File:
        return [
            f"OUT: {store.out} there is not the folder the driver sees here (a part written there never "
            "reaches this one); use a shared filesystem or a bucket"
        ]
    store.fs.delete_file(path)
    return []
