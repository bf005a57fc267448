"""The app's request runner: the package's RequestRunner through the GPU entry, with the outcome
shown the Gradio way (errors, warnings, the progress bar, the run info)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import gradio as gr

from ..errors import OutOfMemoryError, Sapiens2Error, for_visitor
from ..serving import ModelManager, Presented, RequestFolders, RequestRunner, trim_after_out_of_memory
from ..serving.present import PREVIEW_SIDE, Stages, all_tasks_stages, queued_stages, run_info
from ..tasks.registry import OnDemand, Task
from .error_board import reported, user_error, warn
from .gpu import gpu_device


def timed_text(presented: Presented, queued: float | None, started: float) -> str:
    """The run info of a result: its stages, with the time it waited before the function started
    (``queue``) first when known, and the total from its arrival to now."""
    stages = queued_stages(presented.stages.seconds, queued)
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
        oom = next((v for v in failed.values() if isinstance(v, OutOfMemoryError)), None)
        if oom is not None:  # later tasks loaded models again after the failure's trim
            trim_after_out_of_memory(self.manager, oom)
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
        spent = [(title[v.task], v.stages) for v in done]
        return shown, run_info(status, all_tasks_stages(spent, queued, time.perf_counter() - t0))


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
