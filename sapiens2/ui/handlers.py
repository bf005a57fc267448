"""Endpoint functions generated from the task declarations, and how their outcomes are shown.

Each task gets one function whose parameters are the photo, the size and the task's options in
declaration order (Gradio reads the signature for the API and the docstring's ``Args:`` for the
API docs and MCP tool descriptions); Gradio also passes it a progress tracker and the request
(neither is an API input). Package errors become ``gr.Error`` with a title chosen by type and
the visitor's wording (``errors.for_visitor``; the operator's details go to the log); notices
become ``gr.Warning``; any other exception is logged and reported briefly, and the server
carries on. Every error an endpoint raises is also kept for its page session
(:class:`ErrorBoard`), so the tab can show it until the next run.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import gradio as gr

from .. import serving
from ..errors import (
    CheckpointError,
    DeviceError,
    DiskFullError,
    InputImageError,
    InputVideoError,
    OptionError,
    OutOfMemoryError,
    ResidencyError,
    ResultNotFoundError,
    Sapiens2Error,
    VideoEncodeError,
    WeightsUnavailableError,
    for_visitor,
)
from ..serving import ModelManager, Presented, RequestFolders, RequestRunner, is_out_of_memory
from ..serving.present import PREVIEW_SIDE, Stages, run_info
from ..tasks.options import Option
from ..tasks.registry import OnDemand, Task
from .arrival import waited
from .gpu import gpu_device
from .inputs import refuse
from .mcp_files import photo_doc

log = logging.getLogger("sapiens2.app")

ERROR_TITLES: list[tuple[type[Exception], str]] = [  # the first match wins: subclasses first
    (DiskFullError, "Disk full"),
    (ResidencyError, "Server error"),
    (WeightsUnavailableError, "Weights unavailable"),
    (CheckpointError, "Unusable checkpoint"),
    (InputVideoError, "Video problem"),
    (VideoEncodeError, "Video encoder missing"),
    (InputImageError, "Image problem"),
    (OptionError, "Invalid option"),
    (ResultNotFoundError, "Result not found"),
    (OutOfMemoryError, "Out of GPU memory"),
    (DeviceError, "GPU problem"),
]


def user_error(err: BaseException) -> gr.Error:
    """The visitor's error for a package error: its title by type, its plain wording where it has
    one (the full message, with paths and settings, is logged and kept as ``details`` for a
    local page's operator fold)."""
    title = next((t for cls, t in ERROR_TITLES if isinstance(err, cls)), "Error")
    shown = gr.Error(for_visitor(err), title=title, print_exception=False)
    shown.details = str(err) if for_visitor(err) != str(err) else ""  # type: ignore[attr-defined]
    if shown.details:  # type: ignore[attr-defined]
        log.warning("%s: %s", title, err)
    return shown


@contextmanager
def reported(manager: ModelManager) -> Iterator[None]:
    """Package errors -> gr.Error with their message; anything else -> a short gr.Error (logged).
    Every request ends here, so this is also where its freed memory goes back to the system and
    its thread's idle OpenMP workers are let go (the next request may run on another thread)."""
    try:
        yield
    except gr.Error:
        raise
    except Sapiens2Error as err:
        raise user_error(err) from None
    except Exception as err:
        if is_out_of_memory(err):
            manager.trim()
            raise gr.Error(
                "Out of memory. Try a smaller model size or a smaller photo.", title="Out of GPU memory"
            ) from None
        log.exception("unexpected error")
        raise gr.Error(
            f"Unexpected error ({type(err).__name__}). The server is still running: try again or another photo.",
            print_exception=False,
        ) from None
    finally:
        serving.release_memory()  # looked up at call time (tests count the calls)
        serving.release_cpu_threads()


_TOLD: set[str] = set()  # notices already shown as a pop-up by this server
_TOLD_LOCK = threading.Lock()


def warn(notices: list[str], prefix: str = "") -> None:
    """A pop-up per notice, once per server for the same words: a standing condition (e.g. the
    person detector's weights are missing) would otherwise cover the page on every run. Every
    notice is also in the result's run info, every time."""
    for notice in notices:
        with _TOLD_LOCK:
            new = notice not in _TOLD
            _TOLD.add(notice)
        if new:
            gr.Warning(f"{prefix}{notice}")


@dataclass(frozen=True)
class Shown:
    """An error as the page keeps it: the text for the tab, and the operator's details (or "")."""

    text: str
    details: str = ""


class ErrorBoard:
    """The last error of each page session and event, until the page asks for it.

    An endpoint records what it raises (:meth:`catching`); the page's ``.failure`` step takes it
    (:meth:`take`) and puts it in the tab. API callers never take theirs: the oldest entries go
    once ``size`` are held."""

    def __init__(self, size: int = 512) -> None:
        self.size = size
        self._items: OrderedDict[tuple[str, str], Shown] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _session(request: Any) -> str | None:
        return getattr(request, "session_hash", None) if request is not None else None

    @contextmanager
    def catching(self, request: Any, event: str, what: str) -> Iterator[None]:
        """Record a gr.Error raised inside (``what`` names the run: "Pose"), then let it go on."""
        try:
            yield
        except gr.Error as err:
            session = self._session(request)
            if session is not None:
                title = f"{err.title}: " if err.title and err.title != "Error" else ""
                shown = Shown(f"{what} did not run. {title}{err.message}", getattr(err, "details", ""))
                with self._lock:
                    self._items[(session, event)] = shown
                    self._items.move_to_end((session, event))
                    while len(self._items) > self.size:
                        self._items.popitem(last=False)
            raise

    def take(self, request: Any, event: str) -> Shown | None:
        with self._lock:
            return self._items.pop((self._session(request), event), None)


def timed_text(presented: Presented, queued: float | None, started: float) -> str:
    """The run info of a result: its stages, with the time it waited before the function started
    (``queue``) first when known, and the total from its arrival to now."""
    stages = Stages()
    if queued is not None:
        stages.add("queue", queued)
    for name, seconds in presented.stages.seconds.items():
        stages.add(name, seconds)
    total = (queued or 0.0) + time.perf_counter() - started
    return run_info(presented.what or presented.head, stages, presented.notices, presented.head, total)


def stage_progress(progress: Any) -> Stages:
    """A stage record that moves the page's progress bar as each stage starts."""
    order = ["read", "load", "prepare", "device", "finish", "render", "downloads", "previews", "views"]

    def started(name: str) -> None:
        if progress is not None and name in order:
            progress((order.index(name), len(order)), desc=name)

    return Stages(started)


class Runner:
    """Runs requests for the app: the package's RequestRunner through the GPU entry, with the
    outcome shown the Gradio way (errors, warnings)."""

    def __init__(self, manager: ModelManager, folders: RequestFolders | None = None) -> None:
        self.manager = manager
        self.requests = RequestRunner(
            manager,
            folders,
            gpu_device(manager),
            announce=gr.Info,
            preview_side=PREVIEW_SIDE,
            later=True,  # the full-resolution mesh and cloud only when asked (Task.on_demand)
        )
        # Downloads and previews are served from the request folders as they are: Gradio would
        # otherwise hash and copy every output into its cache after each run (hundreds of MB for
        # a 12 MP pointmap). The folders' names are unguessable (RequestFolders.new).
        root = self.requests.folders.root
        root.mkdir(parents=True, exist_ok=True)
        gr.set_static_paths([root])

    def __call__(
        self, task: Task, photo: Any, size: str | None, progress: Any = None, **options: Any
    ) -> Presented:
        with reported(self.manager):
            shown = self.requests.run(task, photo, size, stages=stage_progress(progress), **options)
        warn(shown.notices)
        return shown

    def make(self, task: Task, entry: OnDemand, ref: Any) -> tuple[list[str], str]:
        """An earlier result's on-demand files (e.g. the full-resolution mesh) and their run info."""
        stages = Stages()
        with reported(self.manager):
            files, head = self.requests.make(task, entry, ref, stages)
        found, made = stages.seconds.get("find", 0.0), stages.seconds.get("make", 0.0)
        said = f"{head}: made in {found + made:.2f} s ({found:.2f} s to find the earlier result, {made:.2f} s to make the files)."
        return [str(p) for p in files], said

    def compare(self, task: Task, photo_a: Any, photo_b: Any, size: str | None) -> tuple[float, str]:
        with reported(self.manager):
            score, line, notices = self.requests.compare(task, photo_a, photo_b, size)
        warn(notices)
        return score, line

    def run_all(
        self,
        photo: Any,
        jobs: list[tuple[Task, str | None, dict[str, Any]]],
        progress: Any = None,
        queued: float | None = None,
    ) -> tuple[dict[str, Presented | Sapiens2Error], str]:
        """Every task on one photo: task name -> result shown (or the error object), and the
        status line ("5 of 6 tasks (skipped: Matting): done in ... s", then each task's seconds,
        after ``queued`` seconds of waiting when known)."""
        t0 = time.perf_counter()
        title = {task.name: task.tab for task, _, _ in jobs}
        with reported(self.manager):
            shown = self.requests.run_all(
                photo,
                {task: (size, opts) for task, size, opts in jobs},
                listener=all_progress(progress, title),
            )
        failed = {t: v for t, v in shown.items() if isinstance(v, Sapiens2Error)}
        if any(isinstance(v, OutOfMemoryError) for v in failed.values()):
            self.manager.trim()  # later tasks loaded models again after the failure's trim
        if failed and len(failed) == len(jobs):
            said: dict[str, list[str]] = {}  # one sentence, the tasks it stopped
            for t, v in failed.items():
                user_error(v)  # logs the operator's details
                said.setdefault(for_visitor(v), []).append(title[t])
            lines = [
                text if "Not run:" in text else f"{', '.join(tabs)}: {text}" for text, tabs in said.items()
            ]
            raise gr.Error("No task could run: " + " | ".join(lines))
        told: set[int] = set()  # tasks refused together share one error: say it once
        for task, value in shown.items():
            if isinstance(value, Sapiens2Error):
                if id(value) not in told:
                    told.add(id(value))
                    user_error(value)  # logs the operator's details
                    text = for_visitor(value)
                    gr.Warning(
                        text if "Not run:" in str(value) else f"{title[task]}: {text}", title="Task skipped"
                    )
            else:
                warn(value.notices, f"{title[task]}: ")
        status = f"{len(jobs) - len(failed)} of {len(jobs)} tasks"
        if failed:
            status += " (skipped: " + ", ".join(title[t] for t in failed) + ")"
        done = [v for v in shown.values() if isinstance(v, Presented)]
        stages = Stages()  # the photo was read once for every task: counted once
        if queued is not None:
            stages.add("queue", queued)
        read = min((v.stages.seconds.get("read", 0.0) for v in done), default=0.0)
        stages.add("read", read)
        for value in done:
            stages.add(title[value.task], value.stages.total() - read)
        stages.add("other", max(0.0, time.perf_counter() - t0 - stages.total() + (queued or 0.0)))
        return shown, run_info(status, stages)


def all_progress(progress: Any, title: Mapping[str, str]) -> Callable[[str, str], None] | None:
    """The progress of "Run all tasks" from each task's stages: which task runs, how many are done
    ("2 of 6 done · Normals: device"). A task is done once its last stage ("views") starts."""
    if progress is None:
        return None
    done: set[str] = set()
    lock = threading.Lock()

    def started(task: str, stage: str) -> None:
        with lock:
            if stage == "views":
                done.add(task)
            count = len(done)
        progress((count, len(title)), desc=f"{count} of {len(title)} done · {title.get(task, task)}: {stage}")

    return started


# ----------------------------------------------------------------------------- generated endpoints


def outputs_of(presented: Presented, info: str) -> list[Any]:
    """A result's values in its endpoint's output order: slider pair (the small previews when
    made), views, downloads (every file), run info."""
    files = [str(p) for p in presented.files]
    pair = presented.previews or (presented.before, presented.after)
    return [tuple(str(p) if not hasattr(p, "shape") else p for p in pair), *presented.views, files, info]


def _signature(names: list[str], required: int) -> inspect.Signature:
    """The first ``required`` names are required; the others default to None (the server's default).
    Then the two arguments Gradio fills in itself (not API inputs): a progress tracker (a
    parameter defaulting to gr.Progress) and the request (a parameter typed gr.Request)."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter(n, kind, default=inspect.Parameter.empty if i < required else None)
              for i, n in enumerate(names)]  # fmt: skip
    params.append(inspect.Parameter("progress", kind, default=gr.Progress(track_tqdm=True)))
    params.append(inspect.Parameter("request", kind, default=None, annotation=gr.Request))
    return inspect.Signature(params)


def _docstring(summary: str, args: list[tuple[str, str]]) -> str:
    lines = [summary, "", "Args:"] + [f"    {name}: {text}" for name, text in args]
    return "\n".join(lines)


def _size_doc(manager: ModelManager, task: Task) -> str:
    """The size parameter's API doc: the sizes this server runs (one, for a task it runs from its
    own checkpoint: every other choice would run the same file)."""
    if task.name in manager.checkpoints:
        return f"model size: {manager.default_size(task)} (this server runs its own {task.name} checkpoint)."
    return f"model size: {', '.join(manager.sizes(task))}."


def _endpoint(
    fn: Callable[..., Any], name: str, names: list[str], doc: str, required: int = 1
) -> Callable[..., Any]:
    fn.__name__ = fn.__qualname__ = name
    fn.__signature__ = _signature(names, required)  # type: ignore[attr-defined]
    fn.__annotations__ = {"request": gr.Request}  # how Gradio finds the request parameter
    fn.__doc__ = doc
    return fn


def _split(args: tuple[Any, ...], count: int) -> tuple[list[Any], Any, Any]:
    """(the ``count`` API values, the progress tracker or None, the request or None) of a call:
    Gradio passes all of them, a direct call (the examples' cache) the values only."""
    values = list(args[:count]) + [None] * max(0, count - len(args))
    extra = list(args[count:]) + [None, None]
    return values, extra[0], extra[1]


#: Errors of every endpoint, per page session (see ErrorBoard); the page shows them in the tab.
BOARD = ErrorBoard()


def task_endpoint(run: Runner, task: Task, gpu: bool) -> Callable[..., Any]:
    """``f(photo, size, *options)`` -> the task's outputs (see :func:`outputs_of`)."""
    names = [o.name for o in task.options]

    def endpoint(*args: Any) -> list[Any]:
        started = time.perf_counter()
        values, progress, request = _split(args, 2 + len(names))
        queued = waited(request)
        with BOARD.catching(request, task.api_name, task.tab):
            refuse(*values)
            photo, size, *opts = values
            shown = run(task, photo, size, progress, **dict(zip(names, opts, strict=True)))
        return outputs_of(shown, timed_text(shown, queued, started))

    doc = _docstring(
        task.summary,
        [("photo", photo_doc()), ("size", _size_doc(run.manager, task))]
        + [(o.name, o.describe(gpu)) for o in task.options],
    )
    return _endpoint(endpoint, task.api_name, ["photo", "size", *names], doc)


def on_demand_endpoint(run: Runner, task: Task, entry: OnDemand) -> Callable[..., Any]:
    """``f(result)`` -> (the files made, run info)."""

    def endpoint(*args: Any) -> tuple[list[str], str]:
        [ref], _, request = _split(args, 1)
        with BOARD.catching(request, entry.api_name, entry.label):
            return run.make(task, entry, ref)

    doc = _docstring(
        entry.summary,
        [("result", "the result: its id (req-...), or the path or URL of any of its files.")],
    )
    return _endpoint(endpoint, entry.api_name, ["result"], doc)


def compare_endpoint(run: Runner, task: Task) -> Callable[..., Any]:
    """``f(photo, other_photo, size)`` -> (score, run info)."""
    assert task.compare is not None
    api_name = task.compare.api_name

    def endpoint(*args: Any) -> tuple[float, str]:
        values, _, request = _split(args, 3)
        with BOARD.catching(request, api_name, "The comparison"):
            refuse(*values)
            return run.compare(task, *values)

    doc = _docstring(
        task.compare.help,
        [
            ("photo", photo_doc("the first photo")),
            ("other_photo", photo_doc("the second photo, to compare with the first")),
            ("size", _size_doc(run.manager, task)),
        ],
    )
    return _endpoint(endpoint, api_name, ["photo", "other_photo", "size"], doc, required=2)


def all_parameters(tasks: Mapping[str, Task]) -> list[tuple[Task, str, Option | None]]:
    """(task, API parameter name, option or None for the size) for "All tasks", in order.
    Option names shared by two tasks are prefixed with the task's API name."""
    counts: dict[str, int] = {}
    for task in tasks.values():
        for opt in task.options:
            counts[opt.name] = counts.get(opt.name, 0) + 1
    out: list[tuple[Task, str, Option | None]] = []
    for task in tasks.values():
        out.append((task, f"{task.api_name}_size", None))
        for opt in task.options:
            out.append((task, opt.name if counts[opt.name] == 1 else f"{task.api_name}_{opt.name}", opt))
    return out


def all_endpoint(run: Runner, tasks: Mapping[str, Task], gpu: bool) -> Callable[..., Any]:
    """``f(photo, <task>_size, <options>...)`` -> every tab's outputs, then a status line. Each
    tab's run info has its own task's seconds; the status line has the whole request's."""
    params = all_parameters(tasks)

    def endpoint(*args: Any) -> list[Any]:
        given, progress, request = _split(args, 1 + len(params))
        photo, values = given[0], dict(zip((p for _, p, _ in params), given[1:], strict=True))
        jobs = []
        for task in tasks.values():
            options = {o.name: values[p] for t, p, o in params if t is task and o is not None}
            jobs.append((task, values[f"{task.api_name}_size"], options))
        with BOARD.catching(request, "all", "Run all tasks"):
            refuse(*given)
            shown, status = run.run_all(photo, jobs, progress, waited(request))
        out: list[Any] = []
        for task in tasks.values():
            value = shown.get(task.name)
            if isinstance(value, Presented):
                out.extend(outputs_of(value, value.line))  # the task's own seconds
            else:  # skipped: the tab says why
                why = f"{task.tab} did not run. {for_visitor(value)}" if value is not None else None
                out.extend([None] * (2 + len(task.views)) + [why])
        return [*out, status]

    docs = [("photo", photo_doc())]
    for task, name, opt in params:
        docs.append(
            (name, f"{task.tab}: {_size_doc(run.manager, task) if opt is None else opt.describe(gpu)}")
        )
    summary = (
        "All tasks on one photo; options as in each task's endpoint (None: the default). A task that "
        "cannot run (e.g. its weights are missing) is skipped and named in the status."
    )
    return _endpoint(endpoint, "all_tasks", ["photo", *(p for _, p, _ in params)], _docstring(summary, docs))


def shown_error(event: str, operator: bool) -> Callable[..., Any]:
    """The page's ``.failure`` step of ``event``: the error it raised, for the tab's run info,
    then (where ``operator``: a local launch) the operator's fold (visible or not) and its text."""

    def show(request: gr.Request) -> Any:
        shown = BOARD.take(request, event)
        text = shown.text if shown else "The run stopped with an error (see the message that popped up)."
        if not operator:
            return text  # one output: its value
        details = shown.details if shown else ""
        return [text, gr.Accordion(visible=bool(details)), details]

    return show
