"""The task registry: one :class:`Task` declaration per task, in tab order.

A declaration says everything the layers above the pipelines need to know about a task: its zoo
row (sizes, checkpoints), its pipeline class, its options (name, type, default, range, label,
stage), the extra views its result fills besides the before/after picture, its downloads, the
other tasks' models it borrows, and the shape of its device work. The server, the app's tabs and
endpoints, "All tasks", the CLI flags and the API docs are all generated from these declarations;
adding a task is one new folder ``tasks/<name>/`` whose ``__init__`` exposes ``TASK = Task(...)``
(found by :func:`builtin_modules`; tab order is the zoo's row order), or a :func:`register` call.

A task is looked up by its name once, where a request comes in (:func:`get`: the page, the API,
the command line, ``sapiens2.pipeline``); below that the :class:`Task` object itself is passed.
A task whose weights are not on the Hub (``TaskSpec.on_hub=False``, e.g. albedo) is declared but
shown only where a checkpoint for it is found: :func:`all_tasks` leaves it out otherwise.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..errors import OptionError
from ..models.checkpoints import Checkpoints
from ..models.cost import Work
from ..models.weights import local_root
from ..models.zoo import TASKS as ZOO
from ..models.zoo import TaskSpec
from . import options as opts
from .result_record import Record, ResultArray


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
    large to write on every run for the few who download them. A run with ``save(..., later=True)``
    leaves them out, and the server keeps ``source(result)`` (arrays and scalars) in the request
    folder (``sapiens2.serving.on_demand``); when asked, ``make(source, folder, out, writer)``
    writes into ``out`` the files ``names(source)`` lists, from that source and the downloads in
    ``folder``: the same files ``save()`` writes without ``later``."""

    api_name: str  # endpoint: ``/<api_name>`` (its one parameter names the result)
    button: str  # the tab's button
    label: str  # label of the files it makes
    summary: str  # one sentence: the API description
    missing: str  # the error when a result kept no source for them
    source: Callable[[Any], dict[str, Any]]
    names: Callable[[Mapping[str, Any]], list[str]]
    make: Callable[..., list[Path]]


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
    #: the ONNX output whose cosine a visitor's browser computes ("Compute in my browser",
    #: docs/ONNX_BROWSER.md); None: the server only
    browser_output: str | None = None


@dataclass(frozen=True)
class FileGroup:
    """A second download list of a task's tab (a front end shows it beside the main one): the
    files whose names end with one of ``suffixes``. The API returns it as one more file list."""

    label: str
    suffixes: tuple[str, ...]


@dataclass(frozen=True)
class Video:
    """A task that runs on clips (``sapiens2.video``): how its frames are handled. Video code reads
    only this; no name of a task appears there.

    ``handler``: the task's clip handler, a ``sapiens2.tasks.clip_frames.FrameHandler`` subclass
    from its own folder (pose's tracks people; the pointmap's colours every frame at the end with
    the clip's depth bounds); None: each frame rendered as its photo result.
    ``render_overrides``: video render options that differ
    from, or add to, the defaults of the task's render options (pose: no boxes but track ids, since
    tracks are labelled instead). ``detect``: the detection hook, ``(pipeline, inference options)
    -> (rgb -> detections with .boxes)``, for tasks whose frames need person boxes (the detector
    every K frames, tracking between); None: frames are inferred whole."""

    handler: type | None = None
    render_overrides: Mapping[str, Any] = field(default_factory=dict)
    detect: Callable[[Any, Mapping[str, Any]], Callable[[Any], Any]] | None = None


def one_forward(infer_opts: Mapping[str, Any]) -> Work:
    return Work()


def no_borrowed(infer_opts: Mapping[str, Any]) -> tuple[Task, ...]:
    return ()


def same_options(render_opts: Mapping[str, Any]) -> dict[str, Any]:
    return dict(render_opts)


@dataclass(frozen=True, eq=False)
class Task:
    """One task, declared once (see the module docstring). Compared and hashed by identity (there
    is one object per task) and pickled by name (a GPU worker, a fork of the server, holds the
    same declarations)."""

    spec: TaskSpec  # the zoo row: the task's name, sizes, checkpoints, default sizes
    #: the pipeline class: ``pipeline(size, checkpoint=, device=, dtype=, **borrowed)``
    pipeline: Callable[..., Any]
    tab: str  # tab label
    button: str  # run button label
    summary: str  # one sentence: the API description and the CLI help
    result_label: str  # label of the before/after view
    downloads: str  # label of the download list
    #: the shape of one image's device work for these inference options (``models.cost.Work``);
    #: the seconds come from ``sapiens2.models.cost``
    work: Callable[[Mapping[str, Any]], Work] = one_forward
    options: tuple[opts.Option, ...] = ()  # in API order
    views: tuple[View, ...] = ()
    #: other tasks whose pipelines this one's constructor takes as zero-argument factories
    #: (keyword = task name), and which of them a request with these inference options uses
    borrows: tuple[Task, ...] = ()
    needs: Callable[[Mapping[str, Any]], tuple[Task, ...]] = no_borrowed
    #: loads what the task needs besides models (pose: the person detector) on a device; returns
    #: True when it loaded something now
    warm: Callable[[str], bool] | None = None
    #: rendering options -> keyword arguments of the result's render() and save()
    render_args: Callable[[Mapping[str, Any]], dict[str, Any]] = same_options
    compare: Compare | None = None
    #: files made after the run, on request (see :class:`OnDemand`)
    on_demand: tuple[OnDemand, ...] = ()
    video: Video | None = None  # None: photos only
    #: its row in a ``sapiens2 batch`` table (:class:`~sapiens2.tasks.result_record.Record`); None:
    #: not run in batches
    record: Record | None = None
    #: its photo-size arrays, described once: save()'s raw files, the record's array columns and a
    #: clip's per-frame NPZ are derived from them (``result_record.ResultArray``)
    arrays: tuple[ResultArray, ...] = ()
    #: download lists besides the main one, in order (a file goes to the first that takes it)
    file_groups: tuple[FileGroup, ...] = ()
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
        """The task's one name: zoo row, endpoint (``/<name>``), CLI command, checkpoint key."""
        return self.spec.name

    @property
    def api_name(self) -> str:
        """The endpoint's name: the task's name."""
        return self.spec.name

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (_declared_task, (self.name,))

    def available(self, checkpoints: Mapping[str, Path] = Checkpoints()) -> bool:
        """Shown in the page, API, CLI and video: its weights are on the Hub, or a checkpoint for
        it is found (in ``checkpoints``, or the release's layout under ``$SAPIENS2_CHECKPOINTS``)."""
        return self.spec.on_hub or local_checkpoint_found(self.spec, checkpoints)

    def split(
        self, values: Mapping[str, Any], gpu: bool = False, where: Callable[[opts.Option], str] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Validated (inference options, rendering options), defaults filled in (see options.split)."""
        return opts.split(self.name, self.options, values, gpu, where)

    def resolve(
        self, values: Mapping[str, Any], gpu: bool = False, where: Callable[[opts.Option], str] | None = None
    ) -> dict[str, Any]:
        """The inference options of ``values``, checked, defaults filled in for the device
        (:func:`sapiens2.tasks.options.resolve`)."""
        return opts.resolve(self.name, self.options, values, gpu, where)

    def defaults(self, gpu: bool = False) -> dict[str, Any]:
        return {o.name: o.default_for(gpu) for o in self.options}

    def group_files(self, files: list[Path]) -> list[list[Path]]:
        """``files`` split into the main download list and one list per file group, in order."""
        lists: list[list[Path]] = [[] for _ in range(1 + len(self.file_groups))]
        for f in files:
            name = Path(f).name
            k = next((i for i, g in enumerate(self.file_groups, 1) if name.endswith(g.suffixes)), 0)
            lists[k].append(f)
        return lists

    def video_render_defaults(self) -> dict[str, Any]:
        """Render options of a clip: the render options' defaults, then the video overrides."""
        overrides = self.video.render_overrides if self.video else {}
        return {o.name: o.default for o in self.options if o.stage == "render"} | dict(overrides)


def local_checkpoint_found(spec: TaskSpec, checkpoints: Mapping[str, Path] = Checkpoints()) -> bool:
    """A checkpoint for ``spec`` is named in ``checkpoints`` and exists, or one of its sizes sits in
    the release's layout under ``$SAPIENS2_CHECKPOINTS``."""
    path = checkpoints.get(spec.name)
    if path is not None and Path(path).exists():
        return True
    root = local_root()
    return root is not None and any((root / spec.local_path(size)).is_file() for size in spec.sizes)


def builtin_modules() -> list[str]:
    """The task packages of ``sapiens2.tasks`` (``tasks/<name>/``), by name: its subpackages. The
    modules at its root are the shared machinery; a subpackage without a ``TASK`` is skipped."""
    package = importlib.import_module(__package__)
    return [m.name for m in pkgutil.iter_modules(package.__path__) if m.ispkg]


_lock = threading.Lock()
_tasks: dict[str, Task] = {}
_loaded = False


def _load_builtin() -> None:
    global _loaded
    with _lock:
        if _loaded:
            return
        modules = [importlib.import_module(f"{__package__}.{m}") for m in builtin_modules()]
        found = [m.TASK for m in modules if isinstance(getattr(m, "TASK", None), Task)]
        order = list(ZOO)  # tab order = the zoo's row order; rows a module adds itself go last
        found.sort(key=lambda t: order.index(t.name) if t.name in order else len(order))
        for task in found:
            _tasks.setdefault(task.name, task)
        _loaded = True


def declared() -> dict[str, Task]:
    """Every declared task by name, in tab order, shown or not (see :meth:`Task.available`)."""
    _load_builtin()
    with _lock:
        return dict(_tasks)


def all_tasks(checkpoints: Mapping[str, Path] = Checkpoints()) -> dict[str, Task]:
    """The tasks to show, by name, in tab order (built-ins first, then registered ones): every
    declared task whose weights can be had here with these explicit ``checkpoints``."""
    return {name: task for name, task in declared().items() if task.available(checkpoints)}


def video_tasks(checkpoints: Mapping[str, Path] = Checkpoints()) -> dict[str, Task]:
    """The shown tasks that run on clips (``Task.video`` set), by name, in tab order."""
    return {name: task for name, task in all_tasks(checkpoints).items() if task.video is not None}


def get(name: str) -> Task:
    """A task by its name, shown or not: the one look-up, where a request names a task.
    OptionError lists the names it takes (every declared task, as the command line's help does)."""
    tasks = declared()
    if isinstance(name, str) and name in tasks:
        return tasks[name]
    names = ", ".join(tasks)
    raise OptionError(f"Unknown task {name!r}; choose one of: {names}.")


def _declared_task(name: str) -> Task:
    """A pickled task in the process that unpickles it (a GPU worker: a fork of the server)."""
    return declared()[name]


def register(task: Task) -> Task:
    """Add a task (after the built-ins); its zoo row joins ``sapiens2.models.zoo.TASKS`` when new."""
    _load_builtin()
    with _lock:
        if task.name in _tasks:
            raise OptionError(f"A task named {task.name!r} is already registered.")
        ZOO.setdefault(task.name, task.spec)
        _tasks[task.name] = task
    return task


__all__ = [
    "Compare",
    "FileGroup",
    "OnDemand",
    "Switch",
    "Task",
    "Video",
    "View",
    "all_tasks",
    "builtin_modules",
    "declared",
    "get",
    "local_checkpoint_found",
    "register",
    "video_tasks",
]
