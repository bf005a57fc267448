"""One request, the same way for every task: read, check, load, prepare, infer, finish, present.

Only :func:`run_on_device` touches the accelerator; a server passes it (wrapped in its GPU
entry, e.g. ZeroGPU's ``spaces.GPU``) as ``device_call``. Everything else runs in the server
process: reading the photo, checking options, loading models (the residency decision),
preparing network inputs, mapping results back to the photo, rendering and writing files.
Errors are ``sapiens2.errors`` objects from end to end (isinstance checks only).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InputImageError, OutOfMemoryError, Sapiens2Error
from ..imaging import Intake
from ..loadguard import loading_forbidden
from ..tasks import registry
from ..zerogpu import cost_notice
from .cache import ModelManager
from .folders import RequestFolders
from .gpu_time import clamp, start_seconds, weight_bytes, work_seconds
from .memory import is_out_of_memory, out_of_memory
from .present import Presented, Stages, present, run_info

log = logging.getLogger(__name__)

#: (task, size, prepared inputs, inference options, seconds to reserve) -> raws
DeviceCall = Callable[[str, str, list[Any], dict[str, Any], int], Any]


def read_photo(source: Any) -> Intake:
    """Read the request's photo once (EXIF-upright, size-checked) for every task that uses it.

    Raises InputImageError with the reason (empty, not an image, too large ...)."""
    from ..imaging import load_image

    if source is None or (isinstance(source, str) and not source.strip()):
        raise InputImageError("No photo given: upload one, take one with the webcam or paste one.")
    return load_image(source)


def run_on_device(
    manager: ModelManager, task: str, size: str, preps: list[Any], infer_opts: dict[str, Any]
) -> Any:
    """The device work of one call: ``pipeline.infer(preps)`` with models already resident.

    Never loads: a missing model is a ResidencyError. An out-of-memory error trims the cache and
    becomes OutOfMemoryError with advice. Package errors are plain exceptions here; the app's GPU
    entry (``sapiens2.zerogpu.GpuEntry``) carries them across ZeroGPU's worker boundary intact."""
    with loading_forbidden():
        pipe = manager.get(task, size, load=False)
        try:
            return pipe.infer(preps, **infer_opts)
        except Exception as err:
            if isinstance(err, Sapiens2Error) or not is_out_of_memory(err):
                raise
            manager.trim()
            raise out_of_memory(registry.get(task).name, size) from err


@dataclass
class Job:
    """A checked request: the task, its size, the photos read, and the validated options."""

    task: registry.Task
    size: str
    intakes: list[Intake]
    infer_opts: dict[str, Any]
    render_opts: dict[str, Any]

    @property
    def pixels(self) -> list[int]:
        return [int(i.rgb.shape[0] * i.rgb.shape[1]) for i in self.intakes]


class RequestRunner:
    """Runs requests for a server: ``run`` (one photo), ``compare`` (two photos), ``run_all``."""

    def __init__(
        self,
        manager: ModelManager,
        folders: RequestFolders | None = None,
        device_call: DeviceCall | None = None,
        announce: Callable[[str], None] | None = None,
        preview_side: int | None = None,
    ) -> None:
        self.manager = manager
        self.folders = folders or RequestFolders()
        self.device_call = device_call or (lambda t, s, p, o, _sec: run_on_device(manager, t, s, p, o))
        self.announce = announce  # tells the visitor what a large run costs (ZeroGPU) before it starts
        self.preview_side = preview_side  # a page's previews (present.PREVIEW_SIDE); None: none

    def job(
        self,
        task: str,
        photos: Sequence[Any],
        size: str | None,
        options: Mapping[str, Any],
        stages: Stages | None = None,
    ) -> Job:
        """Read and check a request (CPU, no model): InputImageError / OptionError when bad."""
        decl = registry.get(task)
        with (stages or Stages()).timed("read"):
            intakes = [read_photo(p) for p in photos]
        size = self.manager.resolve_size(decl.name, size)
        infer_opts, render_opts = decl.split(options, gpu=self.manager.cuda)
        return Job(decl, size, intakes, infer_opts, render_opts)

    def seconds(self, job: Job) -> int:
        """The GPU seconds to reserve for the job's device call: a fresh worker's start with
        everything resident (at least the job's own models), plus the work (ZeroGPU then scales
        the reservation by its node's factor)."""
        name, opts = job.task.name, job.infer_opts
        resident = max(self.manager.resident_bytes(), weight_bytes(name, job.size, opts))
        return clamp(start_seconds(resident) + work_seconds(name, job.size, job.pixels, opts))

    def tell_cost(self, seconds: float, what: str) -> None:
        notice = cost_notice(seconds, what)
        if notice and self.announce is not None:
            self.announce(notice)

    def results(self, job: Job, announce: bool = True, stages: Stages | None = None) -> list[Any]:
        """Load (here), prepare (here), infer (device call), finish (here): one result per photo.
        ``announce``: tell the visitor first when the run is costly (see :meth:`tell_cost`).
        ``stages``: where each step's seconds go (the run info)."""
        t0 = time.perf_counter()
        stages = stages or Stages()
        name, size, opts = job.task.name, job.size, job.infer_opts
        with stages.timed("load"):
            held = self.manager.prepare(name, size, **opts)
        with self.manager.holding(held):
            pipe = self.manager.get(name, size)
            with stages.timed("prepare"):
                preps = [pipe.prepare(intake, **opts) for intake in job.intakes]
            seconds = self.seconds(job)
            if announce:
                self.tell_cost(seconds, f"This {job.task.tab.lower()} {size} run")
            try:
                with stages.timed("device"):
                    raws = self.device_call(name, size, preps, opts, seconds)
            except OutOfMemoryError:
                self.manager.trim()  # a ZeroGPU worker trimmed its own copy; this process holds one too
                raise
        with stages.timed("finish"):
            out = [pipe.finish(raw, intake, **opts) for raw, intake in zip(raws, job.intakes, strict=True)]
        for result in out:
            result.info.total_s = time.perf_counter() - t0
        return out

    def run(
        self, task: str, photo: Any, size: str | None = None, *, stages: Stages | None = None, **options: Any
    ) -> Presented:
        """One task on one photo, rendered and exported into a fresh request folder.
        ``stages``: where each step's seconds go (a fresh record if not given)."""
        stages = stages or Stages()
        job = self.job(task, [photo], size, options, stages)
        [result] = self.results(job, stages=stages)
        return self.present(result, job, stages)

    def present(self, result: Any, job: Job, stages: Stages) -> Presented:
        return present(
            result, self.folders.new(), stages=stages, preview_side=self.preview_side, **job.render_opts
        )

    def compare(
        self, task: str, photo_a: Any, photo_b: Any, size: str | None = None
    ) -> tuple[float, str, list[str]]:
        """Score two photos with the task's ``compare`` (one device call for both)."""
        decl = registry.get(task)
        if decl.compare is None:
            raise InputImageError(f"The {decl.api_name} task does not compare photos.")
        stages = Stages()
        a, b = self.results(self.job(decl.name, [photo_a, photo_b], size, {}, stages), stages=stages)
        line = run_info(f"{a.info.head()} (both photos)", stages)  # one forward made both results
        return decl.compare.score(a, b), line, [*a.notices, *b.notices]

    def run_all(
        self, photo: Any, requests: Mapping[str, tuple[str | None, Mapping[str, Any]]]
    ) -> dict[str, Presented | Sapiens2Error]:
        """Every requested task (task -> (size, options)) on one photo, one device call per task
        (each within its own GPU budget). A task that fails gives its error object instead."""
        read = Stages()
        with read.timed("read"):
            intake = read_photo(photo)
        out: dict[str, Presented | Sapiens2Error] = {}
        jobs: dict[str, Job] = {}
        stages: dict[str, Stages] = {}
        for task, (size, options) in requests.items():
            try:
                stages[task] = Stages()
                stages[task].seconds.update(read.seconds)  # every task used the one read
                jobs[task] = self.job(task, [intake], size, options, stages[task])
            except Sapiens2Error as err:
                out[task] = err
        self.tell_cost(sum(self.seconds(job) for job in jobs.values()), "Running all tasks")
        for task, job in jobs.items():
            try:
                [result] = self.results(job, announce=False, stages=stages[task])
                out[task] = self.present(result, job, stages[task])
            except Sapiens2Error as err:
                out[task] = err
        return {task: out[task] for task in requests}


__all__ = ["DeviceCall", "Job", "RequestRunner", "read_photo", "run_on_device"]
