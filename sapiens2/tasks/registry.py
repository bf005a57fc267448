"""The task registry: one :class:`Task` declaration per task, in tab order.

A declaration says everything the layers above the pipelines need to know about a task: its zoo
row (sizes, checkpoints), its pipeline class, its options (name, type, default, range, label,
stage), the extra views its result fills besides the before/after picture, its downloads, the
other models it borrows, and its GPU-time estimate. The server, the app's tabs and endpoints,
"All tasks", the CLI flags and the API docs are all generated from these declarations; adding a
task is one new module in this package that ends with a ``TASK = Task(...)`` (found by
:func:`builtin_modules`; tab order is the zoo's row order), or a :func:`register` call.

A task whose weights are not on the Hub (``TaskSpec.on_hub=False``, e.g. albedo) is declared but
shown (page, API, CLI, video) only where a checkpoint for it is found: :func:`all_tasks` leaves it
out otherwise; :func:`get` still finds it by name.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..errors import OptionError
from ..models.zoo import ARCHS, TaskSpec
from ..models.zoo import TASKS as ZOO
from . import options as opts

#: Modules of this package known to hold machinery, not a task (not even imported by the scan; any
#: other module without a ``TASK`` is skipped too).
_NOT_TASKS = frozenset({"base", "dense", "options", "registry", "pose_codec", "pose_crops", "seg_borrow"})


@dataclass(frozen=True)
class View:
    """An output shown next to the before/after picture: a JSON panel, an image, a 3D model or
    HTML text (read by screen readers and a browser's search, e.g. seg's legend).

    ``value(result, files)`` gives its content from the task's result and the files written."""

    kind: Literal["json", "image", "model3d", "html"]
    label: str
    value: Callable[[Any, list[Path]], Any]


@dataclass(frozen=True)
class OnDemand:
    """Files a finished result makes only when asked (the pointmap's full-resolution mesh): too
    large to write on every run for the few who download them. The run leaves in its request
    folder what ``make`` needs (``save(..., later=True)``); ``make(folder)`` writes the files
    there and returns their paths, the same files ``save()`` writes without ``later``."""

    api_name: str  # endpoint: ``/<api_name>`` (its one parameter names the result)
    button: str  # the tab's button
    label: str  # label of the files it makes
    summary: str  # one sentence: the API description
    make: Callable[[Path], list[Path]]


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


def one_forward(infer_opts: Mapping[str, Any]) -> int:
    return 1


@dataclass(frozen=True)
class Video:
    """A task that runs on clips (``sapiens2.video``): how its frames are handled. Video code reads
    only this; no name of a task appears there.

    ``handler``: the frame handler kind in ``sapiens2.video.handlers`` ("frames": each frame
    rendered as its photo result; "depth": a clip-wide hook, every frame rendered at the end with
    the clip's depth bounds, from the result's ``depth`` and ``mask``; "tracks": people found by
    ``detect``, tracked and smoothed, drawn as keypoints, with the track exports).
    ``raw_fields``: result attribute -> dtype it is kept in for the clip's per-frame NPZ (None: as
    it is); a task with none writes no NPZ. ``render_overrides``: video render options that differ
    from, or add to, the defaults of the task's render options (pose: no boxes but track ids, since
    tracks are labelled instead). ``detect``: the detection hook, ``(pipeline, inference options)
    -> (rgb -> detections with .boxes)``, for tasks whose frames need person boxes (the detector
    every K frames, tracking between); None: frames are inferred whole. ``forwards``: forwards of
    the task's own model per frame and person (pose with flip test: 2), for the cost estimates."""

    handler: Literal["frames", "depth", "tracks"] = "frames"
    raw_fields: Mapping[str, Any] = field(default_factory=dict)
    render_overrides: Mapping[str, Any] = field(default_factory=dict)
    detect: Callable[[Any, Mapping[str, Any]], Callable[[Any], Any]] | None = None
    forwards: Callable[[Mapping[str, Any]], int] = one_forward


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
    #: files made after the run, on request (see :class:`OnDemand`)
    on_demand: tuple[OnDemand, ...] = ()
    video: Video | None = None  # None: photos only
    #: extra command-line spellings of options (option name -> flags), and pipeline switches
    cli_aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    cli_switches: tuple[Switch, ...] = ()

    def __post_init__(self) -> None:
        switches = {o.name for o in self.options if o.kind == "bool"}
        for opt in self.options:
            if opt.enabled_by is not None and opt.enabled_by not in switches:
                raise OptionError(
                    f"{self.name} option {opt.name!r} is enabled by {opt.enabled_by!r}, which is not "
                    f"one of its on/off options ({', '.join(sorted(switches)) or 'none'})."
                )

    @property
    def name(self) -> str:
        return self.spec.name

    def available(self) -> bool:
        """Shown in the page, API, CLI and video: its weights are on the Hub, or a checkpoint for
        it is found (``$SAPIENS2_TASK_CHECKPOINTS`` / ``--checkpoint TASK=PATH``, or the release's
        layout under ``$SAPIENS2_CHECKPOINTS``)."""
        return self.spec.on_hub or local_checkpoint_found(self.spec)

    def split(
        self, values: Mapping[str, Any], gpu: bool = False, where: Callable[[opts.Option], str] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Validated (inference options, rendering options), defaults filled in (see options.split)."""
        return opts.split(self.name, self.options, values, gpu, where)

    def defaults(self, gpu: bool = False) -> dict[str, Any]:
        return {o.name: o.default_for(gpu) for o in self.options}

    def video_render_defaults(self) -> dict[str, Any]:
        """Render options of a clip: the render options' defaults, then the video overrides."""
        overrides = self.video.render_overrides if self.video else {}
        return {o.name: o.default for o in self.options if o.stage == "render"} | dict(overrides)


def on_demand(api_name: str) -> tuple[Task, OnDemand]:
    """The shown task declaring the on-demand files ``api_name``, and that entry."""
    for task in all_tasks().values():
        for entry in task.on_demand:
            if entry.api_name == api_name:
                return task, entry
    raise OptionError(f"No task makes {api_name!r} on request.")


def forward_seconds(size: str, images: int = 1) -> float:
    """Generous seconds of GPU work for ``images`` forwards of a backbone size at 1024x768.

    From the published FLOPs (zoo.ARCHS) at ``serving.gpu_time.SUSTAINED_TFLOPS`` (an estimate),
    plus 0.5 s of fixed per-call work; not measured on a GPU (none was lent to this project yet)."""
    from ..serving.gpu_time import SUSTAINED_TFLOPS  # the one place of the estimate

    arch = ARCHS.get(size)
    tflops = arch.tflops_1024x768 if arch and arch.tflops_1024x768 else 16 * 4.715  # 1b-4k: 16x the tokens
    return 0.5 + images * tflops / SUSTAINED_TFLOPS


#: Env var naming per-task checkpoints (``pose=/a.safetensors,albedo=/b``); the app's and the
#: server's ``--checkpoint TASK=PATH`` flags add to it (sapiens2.serving.checkpoints reads it).
TASK_CHECKPOINTS_ENV = "SAPIENS2_TASK_CHECKPOINTS"


def local_checkpoint_found(spec: TaskSpec) -> bool:
    """A checkpoint for ``spec`` is named in ``$SAPIENS2_TASK_CHECKPOINTS`` and exists, or one of
    its sizes sits in the release's layout under ``$SAPIENS2_CHECKPOINTS``."""
    from ..models.weights import local_root

    for item in os.environ.get(TASK_CHECKPOINTS_ENV, "").split(","):
        task, sep, path = item.partition("=")
        if sep and task.strip() == spec.name and Path(path.strip()).expanduser().exists():
            return True
    root = local_root()
    return root is not None and any((root / spec.local_path(size)).is_file() for size in spec.sizes)


def video_tasks() -> dict[str, Task]:
    """The shown tasks that run on clips (``Task.video`` set), by zoo name, in tab order."""
    return {name: task for name, task in all_tasks().items() if task.video is not None}


def builtin_modules() -> list[str]:
    """The task modules of this package (every module but the machinery ones), by name."""
    package = importlib.import_module(__package__)
    return [m.name for m in pkgutil.iter_modules(package.__path__) if m.name not in _NOT_TASKS]


_lock = threading.Lock()
_tasks: dict[str, Task] = {}
_builtin: frozenset[str] = frozenset()
_loaded = False


def _load_builtin() -> None:
    global _loaded, _builtin
    with _lock:
        if _loaded:
            return
        modules = [importlib.import_module(f"{__package__}.{m}") for m in builtin_modules()]
        found = [m.TASK for m in modules if isinstance(getattr(m, "TASK", None), Task)]
        order = list(ZOO)  # tab order = the zoo's row order; rows a module adds itself go last
        found.sort(key=lambda t: order.index(t.name) if t.name in order else len(order))
        for task in found:
            _tasks.setdefault(task.name, task)
        _builtin = frozenset(t.name for t in found)
        _loaded = True


def declared() -> dict[str, Task]:
    """Every declared task by zoo name, in tab order, shown or not (see :meth:`Task.available`)."""
    _load_builtin()
    with _lock:
        return dict(_tasks)


def all_tasks() -> dict[str, Task]:
    """The tasks to show, by zoo name, in tab order (built-ins first, then registered ones):
    every declared task whose weights can be had here (:meth:`Task.available`)."""
    return {name: task for name, task in declared().items() if task.available()}


def get(name: str) -> Task:
    """A task by zoo name or API name ("pretrain" or "features"), shown or not; OptionError lists
    the names."""
    tasks = declared()
    if isinstance(name, str):
        if name in tasks:
            return tasks[name]
        for task in tasks.values():
            if task.api_name == name:
                return task
    names = ", ".join(t.api_name for t in all_tasks().values())
    raise OptionError(f"Unknown task {name!r}; choose one of: {names}.")


def register(task: Task) -> Task:
    """Add a task (after the built-ins); its zoo row joins ``sapiens2.models.zoo.TASKS`` when new."""
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
        if task is None or name in _builtin:
            return
        del _tasks[name]
        if ZOO.get(name) is task.spec:
            del ZOO[name]


__all__ = [
    "TASK_CHECKPOINTS_ENV",
    "Compare",
    "OnDemand",
    "Switch",
    "Task",
    "Video",
    "View",
    "all_tasks",
    "builtin_modules",
    "declared",
    "forward_seconds",
    "get",
    "local_checkpoint_found",
    "on_demand",
    "register",
    "unregister",
    "video_tasks",
]
