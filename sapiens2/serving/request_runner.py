"""One request, the same way for every task: read, check, load, prepare, infer, finish, present.
The prepare -> one infer -> finish step is ``sapiens2.tasks.base.run_batch``, shared with the
library call (``Pipeline.run_stages``, the CLI) and each batch of a clip (``sapiens2.video``).

Only the device step touches the accelerator: one unit of device work per call
(:mod:`sapiens2.serving.device`), run by the server's ``device`` (on ZeroGPU its GPU entry).
Everything else runs in the server process: reading the photo, checking options, loading models
(the residency decision), preparing network inputs, mapping results back to the photo,
rendering and writing files. The task arrives as a :class:`~sapiens2.tasks.registry.Task`, looked
up by the caller. Errors are ``sapiens2.errors`` objects from end to end (isinstance checks only).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import GpuUnavailableError, InputImageError, OutOfMemoryError, Sapiens2Error
from ..inputs.intake import Intake
from ..models import cost
from ..tasks.base import finish_batch, prepare_batch
from ..tasks.registry import OnDemand, Task
from ..zerogpu.quota import cost_notice
from . import on_demand
from .cache import ModelManager
from .device import AllTasks, Batch, Device, OneTask, local_device
from .folders import RequestFolders
from .memory_errors import trim_after_out_of_memory
from .present import Presented, Stages, present, run_info, what_ran

log = logging.getLogger(__name__)


NO_PHOTO = "No photo given: upload one, take one with the webcam or paste one."
NO_SECOND_PHOTO = (
    'No second photo to compare with: add one under "Second photo (to compare)" (upload, webcam '
    "or paste; API: other_photo)."
)


def read_photo(source: Any, missing: str = NO_PHOTO) -> Intake:
    """Read the request's photo once (EXIF-upright, size-checked) for every task that uses it.

    Raises InputImageError with the reason (empty, not an image, too large ...); ``missing`` is
    the message when no photo was given."""
    from ..inputs.intake import load_image

    if source is None or (isinstance(source, str) and not source.strip()):
        raise InputImageError(missing)
    return load_image(source)


@dataclass
class Job:
    """A checked request: the task, its size, the photos read, and the validated options."""

    task: Task
    size: str
    intakes: list[Intake]
    infer_opts: dict[str, Any]
    render_opts: dict[str, Any]
    stages: Stages = field(default_factory=Stages)  # each step's seconds (the run info)

    @property
    def batch_sizes(self) -> list[str]:
        """The published size of each model the job uses: its own and the ones it borrows."""
        return model_sizes(self.task, self.size, self.infer_opts)


def model_sizes(task: Task, size: str, infer_opts: Mapping[str, Any]) -> list[str]:
    """The published size of each model ``task`` at ``size`` uses: its own and the ones it
    borrows with ``infer_opts`` (those at their GPU default where ``size`` is not one of theirs)."""
    return [
        size if size in t.spec.sizes else t.spec.default_size(True) for t in (task, *task.needs(infer_opts))
    ]


def call_seconds(jobs: Sequence[Job], resident_bytes: int) -> int:
    """The GPU seconds one call running ``jobs`` reserves: a fresh worker's start with everything
    resident (at least the jobs' own models), plus each photo's work (``sapiens2.models.cost``)."""
    resident = cost.resident_for(resident_bytes, *(j.batch_sizes for j in jobs))
    return cost.photos_reservation(
        ((j.size, j.task.work(j.infer_opts), len(j.intakes)) for j in jobs), resident
    )


class RequestRunner:
    """Runs requests for a server: ``run`` (one photo), ``compare`` (two photos), ``run_all``."""

    def __init__(
        self,
        manager: ModelManager,
        folders: RequestFolders | None = None,
        device: Device | None = None,
        announce: Callable[[str], None] | None = None,
        preview_side: int | None = None,
        later: bool = False,
    ) -> None:
        self.manager = manager
        self.folders = folders or RequestFolders()
        self.device = device or local_device(manager)  # runs each unit of device work (one call)
        self.announce = announce  # tells the visitor what a large run costs (ZeroGPU) before it starts
        self.preview_side = preview_side  # a page's previews (present.PREVIEW_SIDE); None: none
        #: leave the tasks' on-demand files (the full-resolution mesh) to :meth:`make`
        self.later = later

    def job(
        self,
        task: Task,
        photos: Sequence[Any],
        size: str | None,
        options: Mapping[str, Any],
        stages: Stages | None = None,
        *,
        missing: Sequence[str] = (),
    ) -> Job:
        """Read and check a request (CPU, no model): InputImageError / OptionError when bad.
        ``stages``: where each step's seconds go (a fresh record if not given); ``missing``: per
        photo, the message when it is not given (default :data:`NO_PHOTO`)."""
        stages = stages or Stages()
        with stages.timed("read"):
            intakes = [
                read_photo(p, m) for p, m in zip(photos, missing or [NO_PHOTO] * len(photos), strict=True)
            ]
        size = self.manager.resolve_size(task, size)
        infer_opts, render_opts = task.split(options, gpu=self.manager.cuda)
        return Job(task, size, intakes, infer_opts, render_opts, stages)

    def seconds(self, *jobs: Job) -> int:
        """The GPU seconds to reserve for one device call running ``jobs``."""
        return call_seconds(jobs, self.manager.resident_bytes())

    def tell_cost(self, seconds: float, what: str) -> None:
        notice = cost_notice(seconds, what)
        if notice and self.announce is not None:
            self.announce(notice)

    def results(self, job: Job, announce: bool = True) -> list[Any]:
        """Load (here), prepare (here), infer (device call), finish (here): one result per photo.
        ``announce``: tell the visitor first when the run is costly (see :meth:`tell_cost`)."""
        t0 = time.perf_counter()
        stages = job.stages
        task, size, opts = job.task, job.size, job.infer_opts
        with stages.timed("load"):
            held = self.manager.prepare(task, size, **opts)
        with self.manager.holding(held):
            pipe = self.manager.get(task, size)
            with stages.timed("prepare"):  # the batch step's halves (tasks.base.run_batch)
                preps = prepare_batch(pipe, job.intakes, opts)
            seconds = self.seconds(job)
            if announce:
                self.tell_cost(seconds, f"This {task.tab.lower()} {size} run")
            unit = OneTask(Batch(task, size, tuple(preps), opts), seconds)
            try:
                with stages.timed("device"):
                    [raws] = list(self.device(unit))
            except OutOfMemoryError as err:
                trim_after_out_of_memory(
                    self.manager, err
                )  # a GPU worker trimmed its own copy; so does this one
                raise
        with stages.timed("finish"):
            out = finish_batch(pipe, raws, job.intakes, opts)
        for result in out:
            result.info.total_s = time.perf_counter() - t0
        return out

    def run(
        self, task: Task, photo: Any, size: str | None = None, *, stages: Stages | None = None, **options: Any
    ) -> Presented:
        """One task on one photo, rendered and exported into a fresh request folder.
        ``stages``: where each step's seconds go (a fresh record if not given)."""
        job = self.job(task, [photo], size, options, stages)
        [result] = self.results(job)
        return self.present(result, job)

    def present(self, result: Any, job: Job) -> Presented:
        return present(
            job.task,
            result,
            self.folders.new(),
            stages=job.stages,
            preview_side=self.preview_side,
            later=self.later,
            **job.render_opts,
        )

    def make(
        self, task: Task, entry: OnDemand, ref: Any, stages: Stages | None = None
    ) -> tuple[list[Path], str]:
        """The on-demand files ``entry`` (one of ``task.on_demand``) of the earlier result ``ref``
        names (:meth:`RequestFolders.find`), made in its folder: (files, how they were made). CPU
        only, no model; ``stages``: where each step's seconds go."""
        stages = stages if stages is not None else Stages()
        with stages.timed("find"):
            folder = self.folders.find(ref)
        with stages.timed("make"):
            files = on_demand.make(entry, folder)
        size = sum(p.stat().st_size for p in files)
        return files, f"{task.api_name}: {entry.label}, {size / 1e6:,.1f} MB"

    def compare(
        self, task: Task, photo_a: Any, photo_b: Any, size: str | None = None
    ) -> tuple[float, str, list[str]]:
        """Score two photos with the task's ``compare`` (one device call for both)."""
        if task.compare is None:
            raise InputImageError(f"The {task.name} task does not compare photos.")
        job = self.job(task, [photo_a, photo_b], size, {}, missing=(NO_PHOTO, NO_SECOND_PHOTO))
        a, b = self.results(job)
        # one forward made both results: one line for both
        line = run_info(f"{what_ran(task.tab, a.info)}, both photos", job.stages, details=a.info.head())
        return task.compare.score(a, b), line, [*a.notices, *b.notices]

    def run_all(
        self,
        photo: Any,
        requests: Mapping[Task, tuple[str | None, Mapping[str, Any]]],
        listener: Callable[[str, str], None] | None = None,
    ) -> dict[str, Presented | Sapiens2Error]:
        """Every requested task (task -> (size, options)) on one photo, in ONE GPU admission that
        yields each task's raws as it finishes; by task name. A task that fails gives its error
        object. When ZeroGPU refuses the admission for quota, the tasks that fit in the seconds
        left run (one more admission) and the others get one error saying which, why and what
        helps; when the GPU fails partway, every task already done is kept. ``listener(name,
        stage)`` is told each task's stages as they start, by task name (a page's progress)."""
        read = Stages()
        with read.timed("read"):
            intake = read_photo(photo)
        out: dict[str, Presented | Sapiens2Error] = {}
        jobs: dict[str, Job] = {}
        for task, (size, options) in requests.items():
            try:
                stages = Stages(functools.partial(listener, task.name) if listener else None)
                stages.seconds.update(read.seconds)  # every task used the one read
                jobs[task.name] = self.job(task, [intake], size, options, stages)
            except Sapiens2Error as err:
                out[task.name] = err
        with ExitStack() as held:
            ready = self._prepared(jobs, out, held)
            self.tell_cost(self.seconds(*[j for j, _, _ in ready.values()]), "Running all tasks")
            self._run_many(ready, out)
        return {task.name: out[task.name] for task in requests}

    def _prepared(
        self, jobs: dict[str, Job], out: dict[str, Presented | Sapiens2Error], held: ExitStack
    ) -> dict[str, tuple[Job, Any, list[Any]]]:
        """Load (held until the request ends) and prepare every job: task -> (job, pipe, preps)."""
        ready: dict[str, tuple[Job, Any, list[Any]]] = {}
        for task, job in jobs.items():
            size, opts = job.size, job.infer_opts
            try:
                with job.stages.timed("load"):
                    held.enter_context(self.manager.holding(self.manager.prepare(job.task, size, **opts)))
                pipe = self.manager.get(job.task, size)
                with job.stages.timed("prepare"):
                    ready[task] = (job, pipe, prepare_batch(pipe, job.intakes, opts))
            except Sapiens2Error as err:
                out[task] = err
        return ready

    def _run_many(
        self,
        ready: dict[str, tuple[Job, Any, list[Any]]],
        out: dict[str, Presented | Sapiens2Error],
        retry: bool = True,
    ) -> None:
        """One admission for ``ready``; each task presented as its raws arrive (see run_all)."""
        if not ready:
            return
        names = list(ready)
        t0 = time.perf_counter()
        batches = tuple(Batch(j.task, j.size, tuple(preps), j.infer_opts) for j, _, preps in ready.values())
        unit = AllTasks(batches, self.seconds(*[j for j, _, _ in ready.values()]))
        try:
            arrived = t0
            ready[names[0]][0].stages.starting("device")  # the tasks' forwards run in this order
            for i, raws in self.device(unit):
                ready[names[i]][0].stages.add("device", time.perf_counter() - arrived)  # since the last
                out[names[i]] = self._present(ready[names[i]], raws)
                if i + 1 < len(names):
                    ready[names[i + 1]][0].stages.starting("device")
                arrived = time.perf_counter()
        except OutOfMemoryError as err:
            trim_after_out_of_memory(self.manager, err)
            raise
        except GpuUnavailableError as err:
            todo = {t: v for t, v in ready.items() if t not in out}
            fits = self._fitting(todo, err) if retry and len(todo) == len(ready) else {}
            if fits:
                self._run_many(fits, out, retry=False)
            rest = [t for t in todo if t not in out]
            if rest:
                tabs = ", ".join(ready[t][0].task.tab for t in rest)
                skipped = GpuUnavailableError(f"Not run: {tabs}. {err}", requested_s=err.requested_s,
                                              left_s=err.left_s, wait=err.wait, quota=err.quota)  # fmt: skip
                out.update({t: skipped for t in rest})

    def _fitting(
        self, todo: dict[str, tuple[Job, Any, list[Any]]], err: GpuUnavailableError
    ) -> dict[str, tuple[Job, Any, list[Any]]]:
        """The first tasks (in order) whose one admission fits the quota left that spaces reported."""
        if not err.quota or err.left_s is None:
            return {}
        fits: dict[str, tuple[Job, Any, list[Any]]] = {}
        for task, value in todo.items():
            trial = [v[0] for v in fits.values()] + [value[0]]
            if not cost.within_quota(self.seconds(*trial), err.left_s):
                break
            fits[task] = value
        return fits

    def _present(self, ready: tuple[Job, Any, list[Any]], raws: Any) -> Presented | Sapiens2Error:
        if isinstance(raws, Sapiens2Error):
            return raws
        job, pipe, _ = ready
        try:
            with job.stages.timed("finish"):
                [result] = finish_batch(pipe, raws, job.intakes, job.infer_opts)
            # this task's own seconds, as its run info counts them: not the time since the shared
            # call began, which holds the tasks presented before it too
            result.info.total_s = job.stages.total()
            return self.present(result, job)
        except Sapiens2Error as err:
            return err


__all__ = ["Job", "RequestRunner", "call_seconds", "model_sizes", "read_photo"]
