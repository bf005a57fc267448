"""From a task result to what a front end shows: the rendering, the files, the declared views,
small previews for the page, and the time each stage of the request took (the run info)."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from ..outputs.export import safe_path
from ..outputs.writers import WRITE_WORKERS, Writer
from ..tasks.registry import Task
from . import on_demand

#: Long side of the pictures a page shows: a screen needs no more; downloads keep full size.
PREVIEW_SIDE = 2048
PREVIEW_JPEG_QUALITY = 90


class Stages:
    """Wall seconds per stage of one request, in the order the stages first ran."""

    def __init__(self, listener: Callable[[str], None] | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self.listener = listener  # told each stage's name as it starts (a page's progress bar)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + float(seconds)

    def starting(self, name: str) -> None:
        """Tell the listener that ``name`` starts (a stage timed elsewhere, e.g. a shared device call)."""
        if self.listener is not None:
            self.listener(name)

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        self.starting(name)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def total(self) -> float:
        return sum(self.seconds.values())

    def breakdown(self) -> str:
        """``read 0.31 · prepare 0.02 · ...`` (seconds)."""
        return " · ".join(f"{name} {s:.2f}" for name, s in self.seconds.items())


@dataclass
class Presented:
    """One result ready to show (CPU data only; files already written)."""

    task: str
    before: np.ndarray  # the upright input photo
    after: np.ndarray  # the rendering (the same picture as the saved PNG)
    files: list[Path]
    head: str  # how it was made: model, size, device, dtype, model seconds
    notices: list[str] = field(default_factory=list)
    views: list[Any] = field(default_factory=list)  # values of the task's declared views, in order
    stages: Stages = field(default_factory=Stages)
    #: JPEG previews of ``before`` / ``after`` (long side <= PREVIEW_SIDE), when asked for
    previews: tuple[Path, Path] | None = None
    what: str = ""  # what ran, for people: "Pose (0.4b model on the CPU)"

    @property
    def line(self) -> str:
        """The run info (see :func:`run_info`)."""
        return run_info(self.what or self.head, self.stages, self.notices, self.head)


def what_ran(tab: str, info: Any) -> str:
    """``Pose (0.4b model on the CPU)``: a task's tab label and its result's ``RunInfo``."""
    mark = getattr(info, "mark", "")  # a Sapiens v1 model: "· Sapiens v1 · 1b · CC-BY-NC-4.0"
    return running(tab, info.size or "custom", info.device) + (f" · {mark}" if mark else "")


def running(tab: str, size: str, device: Any, models: str = "model") -> str:
    """``Pose (0.4b model on the CPU)``: what runs, in the words of every run info's first line."""
    where = "CPU" if str(device).startswith("cpu") else "GPU"
    return f"{tab} ({size} {models} on the {where})"


def run_info(
    what: str,
    stages: Stages,
    notices: Sequence[str] = (),
    details: str = "",
    total: float | None = None,
) -> str:
    """The run info. First one line for people: what ran, how long it took, and any notices
    (``Pose (0.4b model on the CPU): done in 1.23 s. Note: ...``); then ``Seconds:`` and every
    stage's seconds; then ``details`` (model, device, dtype, model seconds) when given.
    ``total`` defaults to the sum of the stages."""
    total = stages.total() if total is None else total
    first = " ".join([f"{what}: done in {total:.2f} s.", *(f"Note: {n}" for n in notices)])
    return "\n".join([first, f"Seconds: {stages.breakdown()}", *([details] if details else [])])


def queued_stages(seconds: Mapping[str, float], queued: float | None) -> Stages:
    """A request's stages after the time it waited before its function started (``queue``), when known."""
    stages = Stages()
    if queued is not None:
        stages.add("queue", queued)
    for name, spent in seconds.items():
        stages.add(name, spent)
    return stages


def all_tasks_stages(done: Sequence[tuple[str, Stages]], queued: float | None, elapsed: float) -> Stages:
    """The stages of every task on one photo: ``queue``, the photo's ``read`` (once: it was read
    once for every task), each task's own seconds under its label, and ``other``: what the
    request's ``elapsed`` seconds since its function started leave."""
    stages = queued_stages({}, queued)
    read = min((s.seconds.get("read", 0.0) for _, s in done), default=0.0)
    stages.add("read", read)
    for label, spent in done:
        stages.add(label, spent.total() - read)
    stages.add("other", max(0.0, elapsed - stages.total() + (queued or 0.0)))
    return stages


def clip_info(
    what: str,
    timing: Mapping[str, float],
    notices: Sequence[str],
    parts: Mapping[str, str],
    rest: str = "the rest",
) -> str:
    """A clip's run info in the photo tabs' words (:func:`run_info`): what ran and how long, with
    every notice; then the seconds of its ``parts`` (``timing`` key -> the words for it), and
    what they leave of ``total_s`` as ``rest``."""
    total = float(timing.get("total_s", 0.0))
    stages = Stages()
    for key, words in parts.items():
        stages.add(words, float(timing.get(key, 0.0)))
    stages.add(rest, max(0.0, total - stages.total()))
    return run_info(what, stages, notices, total=total)


#: A clip run's parts in its run info (the rest: people, finishing, drawing and encoding).
CLIP_PARTS = {"decode_s": "reading frames", "infer_s": "models"}


def accepted(fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The subset of ``kwargs`` that ``fn`` takes by name (all of them if it takes ``**kwargs``)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(kwargs)
    return {k: v for k, v in kwargs.items() if k in params}


def preview(image: np.ndarray, max_side: int = PREVIEW_SIDE) -> np.ndarray:
    """``image`` shrunk (INTER_AREA) so its long side is at most ``max_side``; the same array
    when it already fits (no copy)."""
    h, w = image.shape[:2]
    scale = max_side / max(h, w)
    if scale >= 1.0:
        return image
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return cv2.resize(image, size, interpolation=cv2.INTER_AREA)


def write_preview(path: Path, image: np.ndarray, max_side: int = PREVIEW_SIDE) -> Path:
    """A JPEG of ``image`` (RGB uint8) no larger than ``max_side``: small to send and to show."""
    small = np.ascontiguousarray(preview(image, max_side)[..., ::-1])  # cv2 encodes BGR
    ok, buf = cv2.imencode(".jpg", small, [cv2.IMWRITE_JPEG_QUALITY, PREVIEW_JPEG_QUALITY])
    if not ok:  # pragma: no cover - any uint8 RGB array encodes
        raise ValueError(f"could not encode a preview of shape {image.shape}")
    path.write_bytes(buf.tobytes())
    return path


def present(
    task: Task,
    result: Any,
    out_dir: str | Path,
    *,
    stages: Stages | None = None,
    preview_side: int | None = None,
    later: bool = False,
    **render_opts: Any,
) -> Presented:
    """Render ``task``'s ``result`` with the (validated) rendering options and write its exports
    into ``out_dir``; the saved picture is the one shown, so downloads match the screen.

    ``stages``: where to add this step's timings (render, downloads, previews, views).
    ``preview_side``: also write JPEG previews of the photo and the rendering, that long at most
    (into ``out_dir/preview``, apart from the downloads).
    ``later``: leave the task's on-demand files (``Task.on_demand``) to be made when asked, and
    keep what makes them (:func:`sapiens2.serving.on_demand.keep`).

    The files are written side by side on ``WRITE_WORKERS`` threads (a pooled
    :class:`~sapiens2.outputs.writers.Writer`): the downloads, then the two previews. Each stage is
    the wall time until its own files are all written, so the stages still add up to the request's
    time; the files, their order and the errors are those of writing one file after another."""
    stages = stages or Stages()
    args = task.render_args(render_opts)
    # the on-demand files are the save's business only (render never sees the flag)
    save_args = {**args, "later": True} if later and task.on_demand else args
    # The render runs alone: its cv2 calls use cv2's own threads, which a concurrent cv2 call
    # from another thread would take (cv2 then runs one of them single-threaded).
    with stages.timed("render"):
        after = result.render(**accepted(result.render, args))
    shown: list[Future[Path]] = []  # the previews' jobs: the photo's, then the rendering's
    with ThreadPoolExecutor(WRITE_WORKERS, thread_name_prefix="sapiens2-write") as pool:
        writer = Writer(pool)
        with stages.timed("downloads"), writer:  # leaving waits for every file
            save = accepted(result.save, {**save_args, "writer": writer})
            files = [Path(p) for p in result.save(Path(out_dir), rendered=after, **save)]
            for entry in task.on_demand if later else ():
                on_demand.keep(entry, result, Path(out_dir), writer)
            if preview_side is not None:  # after the downloads' jobs: they are waited for first
                folder = Path(out_dir) / "preview"
                folder.mkdir(parents=True, exist_ok=True)
                # named after the photo: the page's own download button saves them under these names
                shown += [
                    pool.submit(
                        write_preview,
                        safe_path(folder, result.name, "_preview.jpg"),
                        result.image,
                        preview_side,
                    ),
                    pool.submit(
                        write_preview,
                        safe_path(folder, result.name, f"_{task.api_name}_preview.jpg"),
                        after,
                        preview_side,
                    ),
                ]
        previews = None
        if preview_side is not None:
            with stages.timed("previews"):  # what is left of them once the downloads are written
                before_jpg, after_jpg = (job.result() for job in shown)
                previews = (before_jpg, after_jpg)
    with stages.timed("views"):
        views = [view.value(result, files) for view in task.views]
    return Presented(
        task=task.name,
        before=result.image,
        after=after,
        files=files,
        head=result.info.head(),
        notices=list(result.notices),
        views=views,
        stages=stages,
        previews=previews,
        what=what_ran(task.tab, result.info),
    )
