"""Endpoint functions generated from the task declarations, and how their outcomes are shown.

Each task gets one function whose parameters are the photo, the size and the task's options in
declaration order (Gradio reads the signature for the API and the docstring's ``Args:`` for the
API docs and MCP tool descriptions). Package errors become ``gr.Error`` with a title chosen by
type; notices become ``gr.Warning``; any other exception is logged and reported briefly, and the
server carries on.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
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
)
from ..serving import ModelManager, Presented, RequestFolders, RequestRunner, is_out_of_memory
from ..serving.present import PREVIEW_SIDE, Stages, run_info
from ..tasks.options import Option
from ..tasks.registry import OnDemand, Task
from .gpu import device_call, device_many
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
    title = next((t for cls, t in ERROR_TITLES if isinstance(err, cls)), "Error")
    return gr.Error(str(err), title=title, print_exception=False)


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


class RunInfo(str):
    """The run info text, carrying its stages so the page's timing wrapper (see
    :func:`time_requests`) can add Gradio's own stages and the end-to-end total."""

    head: str
    stages: Stages
    notices: list[str]

    def __new__(cls, head: str, stages: Stages, notices: list[str] | None = None) -> RunInfo:
        obj = super().__new__(cls, with_notices(run_info(head, stages), notices or []))
        obj.head, obj.stages, obj.notices = head, stages, list(notices or [])
        return obj

    def final(self, extra: dict[str, float], total: float) -> str:
        stages = Stages()
        stages.seconds = {**self.stages.seconds, **extra}
        return with_notices(run_info(self.head, stages, total), self.notices)


def with_notices(text: str, notices: list[str]) -> str:
    return text + "".join(f"\nNote: {n}" for n in notices)


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
            device_call(manager),
            announce=gr.Info,
            device_many=device_many(manager),
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
        self, task: str, photo: Any, size: str | None, progress: Any = None, **options: Any
    ) -> Presented:
        with reported(self.manager):
            shown = self.requests.run(task, photo, size, stages=stage_progress(progress), **options)
        warn(shown.notices)
        return shown

    def make(self, api_name: str, ref: Any) -> tuple[list[str], RunInfo]:
        """An earlier result's on-demand files (e.g. the full-resolution mesh) and their run info."""
        stages = Stages()
        with reported(self.manager):
            files, head = self.requests.make(api_name, ref, stages)
        return [str(p) for p in files], RunInfo(head, stages)

    def compare(self, task: str, photo_a: Any, photo_b: Any, size: str | None) -> tuple[float, str]:
        with reported(self.manager):
            score, line, notices = self.requests.compare(task, photo_a, photo_b, size)
        warn(notices)
        return score, line

    def run_all(
        self, photo: Any, jobs: list[tuple[str, str | None, dict[str, Any]]]
    ) -> tuple[dict[str, Presented | Sapiens2Error], RunInfo]:
        """Every task on one photo: task -> result shown (or the error object), and a status line
        (with each task's seconds)."""
        from ..tasks import registry

        t0 = time.perf_counter()
        with reported(self.manager):
            shown = self.requests.run_all(photo, {task: (size, opts) for task, size, opts in jobs})
        failed = {t: v for t, v in shown.items() if isinstance(v, Sapiens2Error)}
        if any(isinstance(v, OutOfMemoryError) for v in failed.values()):
            self.manager.trim()  # later tasks loaded models again after the failure's trim
        title = {t: registry.get(t).tab for t in shown}
        if failed and len(failed) == len(jobs):
            lines = dict.fromkeys(
                str(v) if "Not run:" in str(v) else f"{title[t]}: {v}" for t, v in failed.items()
            )
            raise gr.Error("No task could run: " + " | ".join(lines))
        said: set[int] = set()  # tasks refused together share one error: say it once
        for task, value in shown.items():
            if isinstance(value, Sapiens2Error):
                if id(value) not in said:
                    said.add(id(value))
                    gr.Warning(
                        str(value) if "Not run:" in str(value) else f"{title[task]}: {value}",
                        title="Task skipped",
                    )
            else:
                warn(value.notices, f"{title[task]}: ")
        status = f"{len(jobs) - len(failed)} of {len(jobs)} tasks done"
        if failed:
            status += " · Skipped: " + ", ".join(title[t] for t in failed)
        done = [v for v in shown.values() if isinstance(v, Presented)]
        stages = Stages()  # the photo was read once for every task: counted once
        read = min((v.stages.seconds.get("read", 0.0) for v in done), default=0.0)
        stages.add("read", read)
        for value in done:
            stages.add(title[value.task], value.stages.total() - read)
        stages.add("other", max(0.0, time.perf_counter() - t0 - stages.total()))
        return shown, RunInfo(status, stages)


# ----------------------------------------------------------------------------- generated endpoints


def outputs_of(presented: Presented) -> list[Any]:
    """A result's values in its tab's output order: slider pair (the small previews when made),
    views, downloads, run info."""
    files = [str(p) for p in presented.files]
    pair = presented.previews or (presented.before, presented.after)
    return [tuple(str(p) if not hasattr(p, "shape") else p for p in pair), *presented.views, files,
            RunInfo(presented.head, presented.stages, presented.notices)]  # fmt: skip


def _signature(names: list[str], required: int) -> inspect.Signature:
    """The first ``required`` names are required; the others default to None (the server's default)."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter(n, kind, default=inspect.Parameter.empty if i < required else None)
              for i, n in enumerate(names)]  # fmt: skip
    # Gradio passes a progress tracker for a parameter defaulting to gr.Progress (not an API input)
    progress = gr.Progress(track_tqdm=True)
    params.append(inspect.Parameter("progress", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=progress))
    return inspect.Signature(params)


def _docstring(summary: str, args: list[tuple[str, str]]) -> str:
    lines = [summary, "", "Args:"] + [f"    {name}: {text}" for name, text in args]
    return "\n".join(lines)


def _size_doc(task: Task) -> str:
    return f"model size: {', '.join(task.spec.sizes)}."


def _endpoint(
    fn: Callable[..., Any], name: str, names: list[str], doc: str, required: int = 1
) -> Callable[..., Any]:
    fn.__name__ = fn.__qualname__ = name
    fn.__signature__ = _signature(names, required)  # type: ignore[attr-defined]
    fn.__doc__ = doc
    return fn


def task_endpoint(run: Runner, task: Task, gpu: bool) -> Callable[..., Any]:
    """``f(photo, size, *options)`` -> the task's outputs (see :func:`outputs_of`)."""
    names = [o.name for o in task.options]

    def endpoint(*args: Any) -> list[Any]:
        photo, size, *values = args[: 2 + len(names)]
        progress = args[2 + len(names)] if len(args) > 2 + len(names) else None
        return outputs_of(run(task.name, photo, size, progress, **dict(zip(names, values, strict=True))))

    doc = _docstring(
        task.summary,
        [("photo", photo_doc()), ("size", _size_doc(task))]
        + [(o.name, o.describe(gpu)) for o in task.options],
    )
    return _endpoint(endpoint, task.api_name, ["photo", "size", *names], doc)


def on_demand_endpoint(run: Runner, entry: OnDemand) -> Callable[..., Any]:
    """``f(result)`` -> (the files made, run info)."""

    def endpoint(*args: Any) -> tuple[list[str], RunInfo]:
        return run.make(entry.api_name, args[0])

    doc = _docstring(
        entry.summary,
        [("result", "the result: its id (req-...), or the path or URL of any of its files.")],
    )
    return _endpoint(endpoint, entry.api_name, ["result"], doc)


def compare_endpoint(run: Runner, task: Task) -> Callable[..., Any]:
    """``f(photo, other_photo, size)`` -> (score, run info)."""
    assert task.compare is not None

    def endpoint(*args: Any) -> tuple[float, str]:
        photo, other, size = args[:3]
        return run.compare(task.name, photo, other, size)

    doc = _docstring(
        task.compare.help,
        [
            ("photo", photo_doc("the first photo")),
            ("other_photo", photo_doc("the second photo, to compare with the first")),
            ("size", _size_doc(task)),
        ],
    )
    return _endpoint(endpoint, task.compare.api_name, ["photo", "other_photo", "size"], doc, required=2)


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
    """``f(photo, <task>_size, <options>...)`` -> every tab's outputs, then a status line."""
    params = all_parameters(tasks)

    def endpoint(*args: Any) -> list[Any]:
        photo, values = args[0], dict(zip((p for _, p, _ in params), args[1 : 1 + len(params)], strict=True))
        jobs = []
        for task in tasks.values():
            options = {o.name: values[p] for t, p, o in params if t is task and o is not None}
            jobs.append((task.name, values[f"{task.api_name}_size"], options))
        shown, status = run.run_all(photo, jobs)
        out: list[Any] = []
        for task in tasks.values():
            value = shown.get(task.name)
            out.extend(outputs_of(value) if isinstance(value, Presented) else [None] * (3 + len(task.views)))
        return [*out, status]

    docs = [("photo", photo_doc())]
    for task, name, opt in params:
        docs.append((name, f"{task.tab}: {_size_doc(task) if opt is None else opt.describe(gpu)}"))
    summary = (
        "All tasks on one photo; options as in each task's endpoint (None: the default). A task that "
        "cannot run (e.g. its weights are missing) is skipped and named in the status."
    )
    return _endpoint(endpoint, "all_tasks", ["photo", *(p for _, p, _ in params)], _docstring(summary, docs))


# ----------------------------------------------------------------------------- end-to-end timing

#: (monotonic time the request joined the queue or None, perf_counter at processing start, seconds
#: of Gradio's input processing): set per request by :func:`time_requests`' wrappers
_REQUEST: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "sapiens2_request", default=None
)


def time_requests(blocks: gr.Blocks | None) -> None:
    """Wrap ``blocks``' ``process_api``, ``preprocess_data`` and ``postprocess_data`` so that a
    :class:`RunInfo` output ends up with the whole request: the time it waited in the queue,
    Gradio's input processing, our stages, and Gradio's output processing (writing the pictures
    and copying the downloads into its cache, which happens after our function returned)."""
    if blocks is None or getattr(blocks.process_api, "times_requests", False):
        return
    process_api, preprocess_data, postprocess_data = (
        blocks.process_api,
        blocks.preprocess_data,
        blocks.postprocess_data,
    )

    @functools.wraps(process_api)
    async def timed_process_api(*args: Any, **kwargs: Any) -> Any:
        queue = getattr(blocks, "_queue", None)
        event = getattr(queue, "event_ids_to_events", {}).get(kwargs.get("event_id"))
        token = _REQUEST.set(
            {"queue": time.monotonic() - event.enqueue_time if event is not None else 0.0, "gradio in": 0.0,
             "started": time.perf_counter()}
        )  # fmt: skip
        try:
            return await process_api(*args, **kwargs)
        finally:
            _REQUEST.reset(token)

    @functools.wraps(preprocess_data)
    async def timed_preprocess(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await preprocess_data(*args, **kwargs)
        finally:
            if (req := _REQUEST.get()) is not None:
                req["gradio in"] += time.perf_counter() - t0

    @functools.wraps(postprocess_data)
    async def timed_postprocess(block_fn: Any, predictions: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = await postprocess_data(block_fn, predictions, *args, **kwargs)
        req = _REQUEST.get()
        values = predictions if isinstance(predictions, (list, tuple)) else [predictions]
        if req is None or not isinstance(out, list) or len(out) != len(values):
            return out
        done = time.perf_counter()
        extra = {"queue": req["queue"], "gradio in": req["gradio in"], "gradio out": done - t0}
        total = req["queue"] + done - req["started"]
        return [
            v.final(extra, total) if isinstance(v, RunInfo) else o for v, o in zip(values, out, strict=True)
        ]

    timed_process_api.times_requests = True  # type: ignore[attr-defined]
    blocks.process_api = timed_process_api  # type: ignore[method-assign]
    blocks.preprocess_data = timed_preprocess  # type: ignore[method-assign]
    blocks.postprocess_data = timed_postprocess  # type: ignore[method-assign]
