"""``sapiens2 batch TASK [TASK...] INPUT --out OUT``: tasks over a whole dataset into one Parquet
dataset per task (``OUT/<task>/``), in this process (``--engine local``, the default) or on Ray
(``--engine ray``; ``--address`` joins a cluster). A rerun into the same OUT does only what is
missing. The run's work is :mod:`sapiens2.batch`; this module reads the command line into a job."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from typing import Any

from ..errors import Sapiens2Error
from ..tasks import registry
from .tasks import DTYPES, add_checkpoint, add_option, add_runtime, flag, task_names

NAME = "batch"
HELP = (
    "Run tasks over a whole dataset (a folder, a glob, a list of paths, a bucket) into one Parquet "
    "dataset per task, in this process or on a Ray cluster; a rerun skips what is done."
)


def _batch_tasks() -> list[registry.Task]:
    """Every declared task (each has a batch record: tests/test_batch.py checks), without importing
    the batch package here: building the parser stays as light as for the per-task commands."""
    return list(registry.declared().values())


def add(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("tasks", nargs="+", metavar="TASK", help=f"what to compute: {task_names()}")
    add_run_options(parser, "OUT: a folder or URI; OUT/<task>/ per task")


def add_run_options(parser: argparse.ArgumentParser, out_help: str) -> None:
    """INPUT, --out and how the photos run (shared with ``sapiens2 index``)."""
    parser.add_argument(
        "input",
        metavar="INPUT",
        help="a folder, a glob, a .txt or .parquet list of paths, an image, or a URI (s3://, gs://, hf://, file://)",
    )
    parser.add_argument("--out", "-o", required=True, help=out_help)
    parser.add_argument("--engine", choices=("local", "ray"), default="local", help="default: %(default)s")
    add_checkpoint(parser)
    parser.add_argument("--size", action="append", default=[], metavar="[TASK=]SIZE",
                        help="model size, for every task or one (default: the task's default for the device)")  # fmt: skip
    parser.add_argument(
        "--device", help="the local engine's device: cpu, cuda, cuda:1 ... (default: cuda when available)"
    )
    parser.add_argument(
        "--dtype", choices=sorted(DTYPES), help="weights dtype (default: bfloat16 on GPU, float32 on CPU)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=8, metavar="N", help="photos per forward (default 8)"
    )
    parser.add_argument("--rows-per-part", type=int, metavar="N",
                        help="rows per committed Parquet part (default: 256; 16 with photo-size arrays)")  # fmt: skip
    parser.add_argument("--detector-checkpoint", metavar="PATH",
                        help="the person detector's DETR checkpoint, a file or folder every worker can read "
                        "(default: facebook/detr-resnet-50 from the Hugging Face cache)")  # fmt: skip
    add_runtime(parser)
    parser.add_argument("--network-size", metavar="HxW",
                        help="network input instead of the checkpoint's (models trained at another size, quick tests)")  # fmt: skip
    ray = parser.add_argument_group("ray engine")
    ray.add_argument(
        "--address", help="a Ray cluster to join (e.g. auto, ray://head:10001); default: start one here"
    )
    ray.add_argument("--connect-timeout", type=float, metavar="S",
                     help="seconds to wait for the cluster at --address (default: $SAPIENS2_RAY_CONNECT_TIMEOUT or 30)")  # fmt: skip
    ray.add_argument("--actors", type=int, default=1, metavar="N", help="forward actors per task (default 1)")
    ray.add_argument("--gpus-per-actor", type=float, metavar="G",
                     help="GPUs per forward actor, fractions share a GPU (default: 1 where the cluster "
                     "or this machine has GPUs, else 0)")  # fmt: skip
    ray.add_argument("--cpus-per-actor", type=float, metavar="C",
                     help="CPUs per actor (default: 1 beside a GPU; on CPUs a share leaving one CPU free)")  # fmt: skip
    ray.add_argument("--detector-actors", type=int, metavar="N",
                     help="person-detector actors per task that detects people (default: --actors on a GPU "
                     "job; 0 on CPUs, where the read step detects)")  # fmt: skip
    ray.add_argument("--detector-gpus", type=float, metavar="G",
                     help="GPUs per person-detector actor (default: 0.1 on a GPU job, the forward actors "
                     "then get 0.9 unless --gpus-per-actor says otherwise)")  # fmt: skip
    _add_task_options(parser)


def _add_task_options(parser: argparse.ArgumentParser) -> None:
    """Every batch task's inference options (one flag per name: tasks sharing a name share it) and
    pipeline switches. Rendering options are not here: rows hold data, not pictures."""
    group = parser.add_argument_group("task options (each applies to the tasks named before its help)")
    having: dict[str, list[str]] = {}
    for task in _batch_tasks():
        for opt in task.options:
            if opt.stage == "infer":
                having.setdefault(opt.name, []).append(task.name)
    for task in _batch_tasks():
        for opt in task.options:
            if opt.stage == "infer" and opt.name in having:
                add_option(group, task, opt)
                group._group_actions[
                    -1
                ].help = f"{', '.join(having.pop(opt.name))}: {opt.describe(gpu=False)}"
        for switch in task.cli_switches:
            group.add_argument(switch.flag, action="store_true", help=f"{task.name}: {switch.help}")


def _sizes(specs: list[str]) -> tuple[str | None, dict[registry.Task, str]]:
    """``--size`` values: (the size for every task, {task: size})."""
    from ..errors import OptionError

    every, per_task = None, {}
    for spec in specs:
        task, sep, size = spec.partition("=")
        if sep:
            per_task[registry.get(task.strip())] = size.strip()
        elif every is not None:
            raise OptionError("--size without TASK= is given twice.")
        else:
            every = spec.strip()
    return every, per_task


def _on_gpu(args: argparse.Namespace, cluster: dict[str, float] | None = None) -> tuple[bool, str]:
    """Whether the forward runs on GPUs, and why (said where a default is refused). ``cluster``:
    the resources of the cluster at ``--address`` (joined first to choose the default)."""
    if args.engine == "ray":
        if args.gpus_per_actor is not None:
            return args.gpus_per_actor > 0, f"--gpus-per-actor {args.gpus_per_actor:g}"
        if cluster is not None:
            gpus = cluster.get("GPU", 0)
            return gpus > 0, f"the cluster at {args.address} has {gpus:g} GPU(s)"
        local = _local_gpu()
        return local, f"a local Ray, {'with' if local else 'without'} a GPU here"
    if args.device:
        return args.device.startswith("cuda"), f"--device {args.device}"
    import torch

    return torch.cuda.is_available(), "the default device"


def build_job(args: argparse.Namespace, cluster: dict[str, float] | None = None) -> tuple[Any, str, Any]:
    """(the job, INPUT, the engine's options) from the command line (``cluster``: the joined
    cluster's resources, for the GPU default); OptionError / CheckpointError for anything unusable."""
    from ..batch.job import BatchJob, parse_network_size, resolve_dtype, task_plan
    from ..errors import OptionError
    from ..models.checkpoints import Checkpoints

    names, source = args.tasks, args.input
    gpu, why = _on_gpu(args, cluster)
    tasks = list(dict.fromkeys(registry.get(n) for n in names))  # the command's names, looked up once
    checkpoints = Checkpoints.parse(args.checkpoint, [t.name for t in tasks])
    every, per_task = _sizes(args.size)
    hw = parse_network_size(args.network_size) if args.network_size else None
    plans = []
    for task in tasks:
        values = {o.name: getattr(args, o.name, None) for o in task.options if o.stage == "infer"}
        switches: dict[str, Any] = _detector(args, task)
        for switch in task.cli_switches:
            if getattr(args, switch.flag.lstrip("-").replace("-", "_"), False):
                switches.update(switch.kwargs)
        plans.append(
            task_plan(task, values=values, size=per_task.get(task, every), checkpoints=checkpoints,
                      pipeline_kwargs=switches, gpu=gpu, network_hw=hw, where=flag)
        )  # fmt: skip
    if getattr(args, "runtime", "torch") != "torch":  # every worker loads the one exported file
        plans = [_exported(plan, args.runtime, args.dtype) for plan in plans]
    if args.batch_size < 1 or (args.rows_per_part is not None and args.rows_per_part < 1):
        raise OptionError("--batch-size and --rows-per-part must be at least 1.")
    job = BatchJob(
        tuple(plans), args.out, gpu=gpu, dtype=resolve_dtype(DTYPES.get(args.dtype or ""), gpu),
        device=args.device, batch_size=args.batch_size, rows_per_part=args.rows_per_part,
    )  # fmt: skip
    engine_options = None
    if args.engine == "ray":
        from ..batch.ray_engine import RayOptions

        engine_options = RayOptions(
            args.address, args.actors, args.gpus_per_actor, args.cpus_per_actor,
            detector_actors=args.detector_actors, detector_gpus=args.detector_gpus,
            connect_timeout=args.connect_timeout, gpu_reason=why,
        )  # fmt: skip
        print(f"ray: forward on {'GPUs' if gpu else 'CPUs'} ({why})", file=sys.stderr)
    return job, source, engine_options


def _exported(plan: Any, runtime: str, dtype: str | None) -> Any:
    """``plan`` with each model's checkpoint its ONNX export (made now when not cached)."""
    from dataclasses import replace

    from ..models.onnx_cache import cached_onnx

    def onnx(model: Any) -> Any:
        path = cached_onnx(
            model.task.name,
            model.size,
            model.checkpoint,
            runtime=runtime,
            fp16=DTYPES.get(dtype or "") == "float16",
        )
        return replace(model, checkpoint=str(path))

    return replace(plan, model=onnx(plan.model), borrowed=tuple(onnx(b) for b in plan.borrowed))


def _detector(args: argparse.Namespace, task: registry.Task) -> dict[str, Any]:
    """``--detector-checkpoint``: the DETR of the tasks that detect people, as an absolute path
    (checked here, so a missing file stops the run before any photo)."""
    from pathlib import Path

    from ..errors import OptionError

    if not args.detector_checkpoint or "detector" not in task.pipeline.parts:
        return {}
    path = Path(args.detector_checkpoint).expanduser().absolute()
    if not path.exists():
        raise OptionError(f"--detector-checkpoint {args.detector_checkpoint!r}: no such file or folder.")
    return {"detector": str(path)}


def _local_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _interrupted(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _joined(args: argparse.Namespace) -> Any:
    """The cluster at ``--address``, joined before the job is built when its GPUs choose the
    default (no ``--gpus-per-actor``); else nothing yet (the run joins or starts Ray itself)."""
    if args.engine != "ray" or not args.address or args.gpus_per_actor is not None:
        return contextlib.nullcontext(None)
    from ..batch.cluster import connected
    from ..batch.placement import RayOptions

    return connected(RayOptions(args.address, connect_timeout=args.connect_timeout))


def run(args: argparse.Namespace) -> int:
    from ..batch import run as run_batch

    main = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGTERM, _interrupted) if main else None  # SIGTERM ends it as Ctrl-C
    try:
        with _joined(args) as cluster:
            job, source, engine_options = build_job(args, cluster)
            summary = run_batch(job, source, engine=args.engine, engine_options=engine_options)
    except (Sapiens2Error, KeyError) as err:  # before any photo: once, without a traceback
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as err:
        print(f"error: interrupted ({err or 'SIGINT'}); committed parts are kept, a rerun goes on from them",
              file=sys.stderr)  # fmt: skip
        return 130
    finally:
        if main:
            signal.signal(signal.SIGTERM, before)
    for task, where, error in summary.quoted:
        print(f"error ({task}) {where}: {error}", file=sys.stderr)
    failed = sum(summary.errors.values())
    if failed > len(summary.quoted):
        print(f"... {failed - len(summary.quoted)} more errors (the rows' error column)", file=sys.stderr)
    print(summary.line())
    if summary.bytes_between:
        sent = ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in summary.bytes_between.items())
        print(f"passed between steps per photo: {sent}")
    rows = sum(summary.rows.values())
    return 1 if rows and failed == rows else 0
