"""What a batch run does, decided once in the driver before any photo is read: per task the
model size, the checkpoint, the inference options with their defaults filled in for the device
the forward runs on, the borrowed models, and the run's settings. Workers get this plan as it is
and resolve nothing themselves (the CPU side and the GPU side never disagree on a default)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from ..errors import CheckpointError, OptionError
from ..inputs.intake import DEFAULT_MAX_SIDE
from ..inputs.network import check_input_hw
from ..tasks.registry import Task
from . import records

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class ModelPlan:
    """One model: its task, size (None: a checkpoint of no published size) and checkpoint."""

    task: Task
    size: str | None
    checkpoint: str | None = None

    def described(self) -> dict[str, Any]:
        return {"task": self.task.name, "size": self.size, "checkpoint": self.checkpoint}


@dataclass(frozen=True)
class TaskPlan:
    """One task of a run, resolved."""

    model: ModelPlan
    options: Mapping[str, Any]  # inference options, checked, every default filled in
    pipeline_kwargs: Mapping[str, Any] = field(default_factory=dict)  # switches (pose: detector=None)
    borrowed: tuple[ModelPlan, ...] = ()  # models the pipeline borrows (seg for a foreground)
    #: network input (H, W) instead of the checkpoint's: models trained at another size, quick tests
    network_hw: tuple[int, int] | None = None

    @property
    def task(self) -> Task:
        return self.model.task

    def made_by(self, dtype: str) -> dict[str, Any]:
        """What decides the rows' values (kept beside them in OUT/<task>/_sapiens2.json)."""
        return {
            "task": self.task.name,
            "size": self.model.size,
            "checkpoint": self.model.checkpoint,
            "options": dict(self.options),
            "pipeline": {k: repr(v) for k, v in self.pipeline_kwargs.items()},
            "borrowed": [b.described() for b in self.borrowed],
            "network_hw": list(self.network_hw) if self.network_hw else None,
            "dtype": dtype,
        }


@dataclass(frozen=True)
class BatchJob:
    """A whole run: the tasks (in order), INPUT and OUT, and how the photos go through.

    ``gpu``: the forward runs on a GPU (it decides option defaults such as flip test and the
    dtype). ``filesystem`` / ``out_filesystem``: pyarrow filesystems INPUT / OUT are paths in
    (Python API; default: from the path or URI)."""

    plans: tuple[TaskPlan, ...]
    out: str
    gpu: bool = False
    dtype: str = "float32"
    device: str | None = None  # the local engine's device (None: cuda when gpu, else cpu)
    batch_size: int = 8  # photos per forward
    rows_per_part: int | None = None  # None: the smallest of the tasks' records
    max_side: int = DEFAULT_MAX_SIDE
    filesystem: pafs.FileSystem | None = None
    out_filesystem: pafs.FileSystem | None = None

    @property
    def tasks(self) -> tuple[Task, ...]:
        return tuple(p.task for p in self.plans)

    def task_named(self, name: str) -> Task:
        """One of the job's tasks by its name (the Ray steps pass names through Arrow columns)."""
        return next(t for t in self.tasks if t.name == name)

    def part_rows(self) -> int:
        if self.rows_per_part is not None:
            return self.rows_per_part
        return min(records.rows_per_part(t) for t in self.tasks)

    def forward_device(self) -> str:
        return self.device or ("cuda" if self.gpu else "cpu")


def model_plan(task: Task, size: str | None, checkpoint: str | Path | None, gpu: bool) -> ModelPlan:
    """The model a run uses: a checkpoint decides its own size (a given size only checks it, as
    everywhere in the package); else the given size or the task's default for the device. Reads
    only the checkpoint's header."""
    spec = task.spec
    if checkpoint is None:
        if size is not None:
            spec.check_size(size)
        size = size or spec.default_size(gpu)
        if not spec.on_hub:  # only a local file can serve it: say so now, not in a worker
            from ..models.loading import resolve_checkpoint

            resolve_checkpoint(spec.name, size)
        return ModelPlan(task, size, None)
    from ..models.loading import checkpoint_size_conflict, describe_checkpoint

    path = Path(checkpoint).expanduser()
    info = describe_checkpoint(path)
    if info["task"] not in (None, spec.name):  # None: a v1 graph, whose task only its output says
        raise CheckpointError(f"{path} is a {info['task']} checkpoint, not a {spec.name} one.")
    conflict = checkpoint_size_conflict(info["size"], size)
    if conflict is not None:
        raise CheckpointError(f"{path} is size {info['size']}, not {size}. {conflict}")
    return ModelPlan(task, info["size"], str(path.absolute()))


def task_plan(
    task: Task,
    *,
    values: Mapping[str, Any] | None = None,
    size: str | None = None,
    checkpoints: Mapping[str, str | Path] | None = None,
    pipeline_kwargs: Mapping[str, Any] | None = None,
    gpu: bool = False,
    network_hw: Sequence[int] | None = None,
    where: Any = None,
) -> TaskPlan:
    """One task's plan: ``values`` (its inference options by name; None = the default for the
    device) checked as any request is; ``checkpoints`` by task name
    (:class:`~sapiens2.models.checkpoints.Checkpoints`) for the task and what it borrows.
    OptionError / CheckpointError on anything unusable."""
    if task.record is None:
        raise OptionError(f"{task.name} has no batch record; batch runs: {', '.join(records.batch_tasks())}.")
    infer = task.resolve(values or {}, gpu=gpu, where=where)
    ckpts = dict(checkpoints or {})
    model = model_plan(task, size, ckpts.get(task.name), gpu)
    borrowed = []
    for other in task.needs(infer):
        own = model.size if model.size in other.spec.sizes else None  # as the pipelines' LazySeg picks
        given = ckpts.get(other.name)
        borrowed.append(model_plan(other, None if given is not None else own, given, gpu))
    hw = None if network_hw is None else check_input_hw(tuple(network_hw))
    return TaskPlan(model, dict(infer), dict(pipeline_kwargs or {}), tuple(borrowed), hw)


def parse_network_size(text: str) -> tuple[int, int]:
    """``"256x192"`` -> (256, 192): height x width."""
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise OptionError(f"--network-size takes HEIGHTxWIDTH, e.g. 512x384; got {text!r}.") from None
    return check_input_hw((h, w))


def resolve_dtype(dtype: str | None, gpu: bool) -> str:
    """The weights' dtype: the given one, else bfloat16 on a GPU and float32 on a CPU."""
    if dtype is None:
        return "bfloat16" if gpu else "float32"
    if dtype not in DTYPES:
        raise OptionError(f"Unknown dtype {dtype!r}; choose one of: {', '.join(DTYPES)}.")
    return dtype
