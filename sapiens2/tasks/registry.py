"""The task registry: one :class:`Task` declaration per task, in tab order.

A declaration says everything the layers above the pipelines need to know about a task: its zoo
row (sizes, checkpoints), its pipeline class, its options (name, type, default, range, label,
stage), the extra views its result fills besides the before/after picture, its downloads, the
other models it borrows, and its GPU-time estimate. The server, the app's tabs and endpoints,
"All tasks", the CLI flags and the API docs are all generated from these declarations; adding a
task is one new module that ends with a ``TASK = Task(...)`` and one entry in :data:`BUILTIN`
(or a :func:`register` call).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .. import options as opts
from ..errors import OptionError
from ..zoo import ARCHS, TaskSpec
from ..zoo import TASKS as ZOO

#: The built-in task modules (sapiens2.tasks.<module>), in tab order; each defines ``TASK``.
BUILTIN = ("pose", "seg", "normal", "pointmap", "matting", "features")


@dataclass(frozen=True)
class View:
    """An output shown next to the before/after picture: a JSON panel, an image or a 3D model.

    ``value(result, files)`` gives its content from the task's result and the files written."""

    kind: Literal["json", "image", "model3d"]
    label: str
    value: Callable[[Any, list[Path]], Any]


@dataclass(frozen=True)
class Switch:
    """A command-line switch that changes how the task's pipeline is built (not a request option)."""

    flag: str
    help: str
    kwargs: Mapping[str, Any]


@dataclass(frozen=True)
class Compare:
    """A task whose results of two photos can be compared (features: cosine similarity)."""

    api_name: str
    label: str  # the score's label
    help: str
    score: Callable[[Any, Any], float]


def no_borrowed(infer_opts: Mapping[str, Any]) -> tuple[str, ...]:
    return ()


def same_options(render_opts: Mapping[str, Any]) -> dict[str, Any]:
    return dict(render_opts)


@dataclass(frozen=True)
class Task:
    """One task, declared once (see the module docstring)."""

    spec: TaskSpec  # the zoo row: sizes, checkpoints, default sizes
    #: the pipeline class: ``pipeline(size, checkpoint=, device=, dtype=, **borrowed)``
    pipeline: Callable[..., Any]
    api_name: str  # endpoint, CLI and tab id ("features" for the pretrain checkpoints)
    tab: str  # tab label
    button: str  # run button label
    summary: str  # one sentence: the API description and the CLI help
    result_label: str  # label of the before/after view
    downloads: str  # label of the download list
    #: seconds of GPU work for one image (size, photo pixels, inference options); the caller adds
    #: worker start-up and the ZeroGPU duration factor
    gpu_seconds: Callable[[str, int, Mapping[str, Any]], float]
    options: tuple[opts.Option, ...] = ()  # in API order
    views: tuple[View, ...] = ()
    #: other tasks whose pipelines this one's constructor takes as zero-argument factories
    #: (keyword = task name), and which of them a request with these inference options uses
    borrows: tuple[str, ...] = ()
    needs: Callable[[Mapping[str, Any]], tuple[str, ...]] = no_borrowed
    #: loads what the task needs besides models (pose: the person detector) on a device; returns
    #: True when it loaded something now
    warm: Callable[[str], bool] | None = None
    #: rendering options -> keyword arguments of the result's render() and save()
    render_args: Callable[[Mapping[str, Any]], dict[str, Any]] = same_options
    compare: Compare | None = None
    #: extra command-line spellings of options (option name -> flags), and pipeline switches
    cli_aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    cli_switches: tuple[Switch, ...] = ()

    @property
    def name(self) -> str:
        return self.spec.name

    def option(self, name: str) -> opts.Option:
        for opt in self.options:
            if opt.name == name:
                return opt
        raise KeyError(name)

    def split(
        self, values: Mapping[str, Any], gpu: bool = False, where: Callable[[opts.Option], str] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Validated (inference options, rendering options), defaults filled in (see options.split)."""
        return opts.split(self.name, self.options, values, gpu, where)

    def defaults(self, gpu: bool = False) -> dict[str, Any]:
        return {o.name: o.default_for(gpu) for o in self.options}


def forward_seconds(size: str, images: int = 1) -> float:
    """Generous seconds of GPU work for ``images`` forwards of a backbone size at 1024x768.

    From the published FLOPs (zoo.ARCHS) at ``serving.gpu_time.SUSTAINED_TFLOPS`` (an estimate),
    plus 0.5 s of fixed per-call work; not measured on a GPU (none was lent to this project yet)."""
    from ..serving.gpu_time import SUSTAINED_TFLOPS  # the one place of the estimate

    arch = ARCHS.get(size)
    tflops = arch.tflops_1024x768 if arch and arch.tflops_1024x768 else 16 * 4.715  # 1b-4k: 16x the tokens
    return 0.5 + images * tflops / SUSTAINED_TFLOPS


_lock = threading.Lock()
_tasks: dict[str, Task] = {}
_loaded = False


def _load_builtin() -> None:
    global _loaded
    with _lock:
        if _loaded:
            return
        for module in BUILTIN:
            task = importlib.import_module(f"{__package__}.{module}").TASK
            _tasks.setdefault(task.name, task)
        _loaded = True


def all_tasks() -> dict[str, Task]:
    """Every declared task by zoo name, in tab order (built-ins first, then registered ones)."""
    _load_builtin()
    with _lock:
        return dict(_tasks)


def get(name: str) -> Task:
    """A task by zoo name or API name ("pretrain" or "features"); OptionError lists the names."""
    tasks = all_tasks()
    if isinstance(name, str):
        if name in tasks:
            return tasks[name]
        for task in tasks.values():
            if task.api_name == name:
                return task
    names = ", ".join(t.api_name for t in tasks.values())
    raise OptionError(f"Unknown task {name!r}; choose one of: {names}.")


def register(task: Task) -> Task:
    """Add a task (after the built-ins); its zoo row joins ``sapiens2.zoo.TASKS`` when new."""
    _load_builtin()
    with _lock:
        taken = {t.api_name for t in _tasks.values()} | set(_tasks)
        if task.name in taken or task.api_name in taken:
            raise OptionError(f"A task named {task.name!r} / {task.api_name!r} is already registered.")
        ZOO.setdefault(task.name, task.spec)
        _tasks[task.name] = task
    return task


def unregister(name: str) -> None:
    """Remove a registered task and its zoo row (tests; built-ins stay)."""
    with _lock:
        task = _tasks.get(name)
        if task is None or name in {importlib.import_module(f"{__package__}.{m}").TASK.name for m in BUILTIN}:
            return
        del _tasks[name]
        if ZOO.get(name) is task.spec:
            del ZOO[name]


__all__ = [
    "BUILTIN",
    "Compare",
    "Switch",
    "Task",
    "View",
    "all_tasks",
    "forward_seconds",
    "get",
    "register",
    "unregister",
]
