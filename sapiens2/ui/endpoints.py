"""Endpoint functions generated from the task declarations.

Each task gets one function whose parameters are the photo, the size and the task's options in
declaration order (Gradio reads the signature for the API and the docstring's ``Args:`` for the
API docs and MCP tool descriptions); Gradio also passes it a progress tracker and the request
(neither is an API input). Every error an endpoint raises is kept for its page session
(:data:`~sapiens2.ui.error_board.BOARD`).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping
from typing import Any

import gradio as gr

from ..errors import for_visitor
from ..serving import ModelManager, Presented
from ..tasks.options import Option
from ..tasks.registry import OnDemand, Task
from .arrival import waited
from .error_board import BOARD
from .inputs import refuse
from .mcp_files import photo_doc
from .page_runner import Runner, timed_text


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


def api_docstring(summary: str, args: list[tuple[str, str]]) -> str:
    lines = [summary, "", "Args:"] + [f"    {name}: {text}" for name, text in args]
    return "\n".join(lines)


def _size_doc(manager: ModelManager, task: Task) -> str:
    """The size parameter's API doc: the sizes this server runs (one, for a task it runs from its
    own checkpoint: every other choice would run the same file)."""
    if task.name in manager.checkpoints:
        return f"model size: {manager.default_size(task)} (this server runs its own {task.name} checkpoint)."
    return f"model size: {', '.join(manager.sizes(task))}."


def as_endpoint(
    fn: Callable[..., Any], name: str, names: list[str], doc: str, required: int = 1
) -> Callable[..., Any]:
    fn.__name__ = fn.__qualname__ = name
    fn.__signature__ = _signature(names, required)  # type: ignore[attr-defined]
    fn.__annotations__ = {"request": gr.Request}  # how Gradio finds the request parameter
    fn.__doc__ = doc
    return fn


def split_call(args: tuple[Any, ...], count: int) -> tuple[list[Any], Any, Any]:
    """(the ``count`` API values, the progress tracker or None, the request or None) of a call:
    Gradio passes all of them, a direct call (the examples' cache) the values only."""
    values = list(args[:count]) + [None] * max(0, count - len(args))
    extra = list(args[count:]) + [None, None]
    return values, extra[0], extra[1]


def task_endpoint(run: Runner, task: Task, gpu: bool) -> Callable[..., Any]:
    """``f(photo, size, *options)`` -> the task's outputs (see :func:`outputs_of`)."""
    names = [o.name for o in task.options]

    def endpoint(*args: Any) -> list[Any]:
        started = time.perf_counter()
        values, progress, request = split_call(args, 2 + len(names))
        queued = waited(request)
        with BOARD.catching(request, task.api_name, task.tab):
            refuse(*values)
            photo, size, *opts = values
            shown = run(task, photo, size, progress, **dict(zip(names, opts, strict=True)))
        return outputs_of(shown, timed_text(shown, queued, started))

    doc = api_docstring(
        task.summary,
        [("photo", photo_doc()), ("size", _size_doc(run.manager, task))]
        + [(o.name, o.describe(gpu)) for o in task.options],
    )
    return as_endpoint(endpoint, task.api_name, ["photo", "size", *names], doc)


def on_demand_endpoint(run: Runner, task: Task, entry: OnDemand) -> Callable[..., Any]:
    """``f(result)`` -> (the files made, run info)."""

    def endpoint(*args: Any) -> tuple[list[str], str]:
        [ref], _, request = split_call(args, 1)
        with BOARD.catching(request, entry.api_name, entry.label):
            return run.make(task, entry, ref)

    doc = api_docstring(
        entry.summary,
        [("result", "the result: its id (req-...), or the path or URL of any of its files.")],
    )
    return as_endpoint(endpoint, entry.api_name, ["result"], doc)


def compare_endpoint(run: Runner, task: Task) -> Callable[..., Any]:
    """``f(photo, other_photo, size)`` -> (score, run info)."""
    assert task.compare is not None
    api_name = task.compare.api_name

    def endpoint(*args: Any) -> tuple[float, str]:
        values, _, request = split_call(args, 3)
        with BOARD.catching(request, api_name, "The comparison"):
            refuse(*values)
            return run.compare(task, *values)

    doc = api_docstring(
        task.compare.help,
        [
            ("photo", photo_doc("the first photo")),
            ("other_photo", photo_doc("the second photo, to compare with the first")),
            ("size", _size_doc(run.manager, task)),
        ],
    )
    return as_endpoint(endpoint, api_name, ["photo", "other_photo", "size"], doc, required=2)


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
        given, progress, request = split_call(args, 1 + len(params))
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
    return as_endpoint(
        endpoint, "all_tasks", ["photo", *(p for _, p, _ in params)], api_docstring(summary, docs)
    )
