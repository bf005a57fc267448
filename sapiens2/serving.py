"""Serving layer for the Space (and any other server): a model cache and a request runner.

Nothing here imports Gradio. The app calls, per request::

    intake = read_photo(path)                      # CPU, clear InputImageError
    size = manager.resolve_size(task, size)        # OptionError naming the sizes offered
    infer_opts, render_opts = split_options(task, options)
    manager.prepare(task, size, **infer_opts)      # loads outside the GPU function
    result = infer(manager, task, intake, size, **infer_opts)   # the only GPU work
    shown = present(result, folders.new(), **render_opts)       # CPU: render + export files

:class:`ModelManager` is a thread-safe, bounded LRU cache of pipelines keyed by (task, size):
one lock per key so that two requests that first need the same model load it once; a failed
load is not cached, so the next request retries; ``trim()`` frees memory after a CUDA
out-of-memory error.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import logging
import math
import os
import shutil
import sys
import tempfile
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InputImageError, OptionError, Sapiens2Error
from .zoo import TASKS, get_task

log = logging.getLogger(__name__)

#: Env var naming per-task checkpoints, e.g. ``pose=/ckpt/pose.safetensors,seg=/ckpt/seg``.
CHECKPOINTS_ENV = "SAPIENS2_TASK_CHECKPOINTS"
#: Task names the app and API use, mapped to the zoo's names.
TASK_ALIASES = {"features": "pretrain"}
#: The key size used for a task whose checkpoint is given explicitly (any size choice maps to it).
CUSTOM = "custom"
#: Pipelines kept besides pinned ones: the six default-size models of "All tasks" fit.
DEFAULT_MAX_MODELS = 6

Key = tuple[str, str]
Factory = Callable[..., Any]


class OutOfMemoryError(Sapiens2Error, MemoryError):
    """The accelerator ran out of memory; the message suggests a smaller size."""


def task_name(task: str) -> str:
    """The zoo name of a task, accepting the app's aliases (``features`` -> ``pretrain``)."""
    name = TASK_ALIASES.get(task, task)
    get_task(name)  # OptionError listing the tasks when unknown
    return name


# ----------------------------------------------------------------------------- checkpoints


def parse_checkpoint_specs(specs: Iterable[str] | str | None) -> dict[str, Path]:
    """``["pose=/p1", "seg=/p2"]`` or ``"pose=/p1,seg=/p2"`` -> ``{"pose": Path, "seg": Path}``."""
    if specs is None:
        return {}
    if isinstance(specs, str):
        specs = [s for s in specs.split(",") if s.strip()]
    out: dict[str, Path] = {}
    for spec in specs:
        task, sep, path = spec.partition("=")
        if not sep or not task.strip() or not path.strip():
            raise OptionError(
                f"Checkpoint spec {spec!r} must look like TASK=PATH with TASK one of: "
                f"{', '.join([*TASKS, *TASK_ALIASES])}."
            )
        out[task_name(task.strip())] = Path(path.strip()).expanduser()
    return out


def checkpoints_from_env() -> dict[str, Path]:
    """Per-task checkpoints named by ``$SAPIENS2_TASK_CHECKPOINTS`` (empty when unset)."""
    return parse_checkpoint_specs(os.environ.get(CHECKPOINTS_ENV, ""))


# ----------------------------------------------------------------------------- model cache


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def release_memory() -> None:
    """Give the heap memory freed by a finished request back to the operating system.

    Request buffers (photos, model outputs, renders) are freed, but glibc keeps the pages in the
    malloc arena of the thread that used them, and a server runs requests on many threads: its
    resident memory climbs with every burst (measured with bench/load.py: +60% over 200 requests
    without this). ``malloc_trim`` returns them in milliseconds; elsewhere this does nothing.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc; musl and others have no such function
    except (OSError, AttributeError):
        return None


def _free_accelerator_memory() -> None:
    gc.collect()
    import torch

    # Only when CUDA really runs in this process (under ZeroGPU the main process only emulates it).
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


class ModelManager:
    """Thread-safe bounded cache of task pipelines keyed by (task, size).

    ``checkpoints`` maps a task to an explicit checkpoint file or folder used for that task
    whatever size is chosen (custom or fine-tuned weights; the tests' tiny checkpoints).
    ``size`` overrides the default size of every task that offers it. ``factory`` builds a
    pipeline (``factory(task, size, checkpoint=..., device=..., dtype=..., **extra)``); the
    default is :func:`sapiens2.tasks.pipeline`.
    """

    def __init__(
        self,
        device: str | None = None,
        dtype: Any = None,
        checkpoints: Mapping[str, str | os.PathLike] | None = None,
        max_models: int = DEFAULT_MAX_MODELS,
        *,
        size: str | None = None,
        factory: Factory | None = None,
        compile: bool = False,
    ) -> None:
        if max_models < 1:
            raise OptionError(f"max_models must be at least 1; got {max_models}.")
        self.device = str(device) if device else _default_device()
        self.dtype = dtype
        self.checkpoints = {task_name(t): Path(p) for t, p in (checkpoints or {}).items()}
        self.max_models = int(max_models)
        self.size = size
        self._factory = factory
        self.compile = compile  # torch.compile each model at load (local CUDA only; see accel)
        self.compile_reports: dict[Key, Any] = {}  # what compilation did or why it was skipped
        self._guard = threading.Lock()  # protects the dicts below, never held while loading
        self._cache: OrderedDict[Key, Any] = OrderedDict()  # least recently used first
        self._pinned: set[Key] = set()
        self._locks: dict[Key, threading.Lock] = {}
        self.loads = 0  # successful loads (a cache hit does not count)
        self.failures = 0  # failed loads
        if hasattr(os, "register_at_fork"):  # ZeroGPU runs GPU functions in a forked worker
            ref = weakref.ref(self)
            os.register_at_fork(after_in_child=lambda: (m := ref()) is not None and m._after_fork())

    def _after_fork(self) -> None:
        # A lock held by another thread at fork time would stay locked forever in the child.
        self._guard = threading.Lock()
        self._locks = {}

    # -- sizes -------------------------------------------------------------------------

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def sizes(self, task: str) -> tuple[str, ...]:
        return get_task(task_name(task)).sizes

    def default_size(self, task: str) -> str:
        spec = get_task(task_name(task))
        if self.size in spec.sizes:
            return str(self.size)
        return spec.default_size(self.cuda)

    def resolve_size(self, task: str, size: str | None) -> str:
        """``size`` checked against the zoo (None -> the default); OptionError names the sizes."""
        if size in (None, ""):
            return self.default_size(task)
        get_task(task_name(task)).check_size(str(size))
        return str(size)

    def key(self, task: str, size: str | None) -> Key:
        task = task_name(task)
        if task in self.checkpoints:
            return (task, CUSTOM)
        return (task, self.resolve_size(task, size))

    # -- cache -------------------------------------------------------------------------

    def loaded(self) -> list[Key]:
        """Cached keys, least recently used first."""
        with self._guard:
            return list(self._cache)

    def get(self, task: str, size: str | None = None, *, pin: bool = False) -> Any:
        """The pipeline for (task, size), loading it once on first use."""
        key = self.key(task, size)
        with self._guard:
            if key in self._cache:
                self._cache.move_to_end(key)
                if pin:
                    self._pinned.add(key)
                return self._cache[key]
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # one loader per key; others wait here and then find it cached
            with self._guard:
                if key in self._cache:  # another thread loaded it meanwhile
                    self._cache.move_to_end(key)
                    if pin:
                        self._pinned.add(key)
                    return self._cache[key]
            try:
                pipe = self._build(*key)
            except BaseException:
                with self._guard:
                    self.failures += 1
                raise  # nothing cached: the next request tries again
            with self._guard:
                self._cache[key] = pipe
                if pin:
                    self._pinned.add(key)
                self.loads += 1
                evicted = self._evict_locked()
        if evicted:
            log.info("model cache: evicted %s", evicted)
            del evicted
            _free_accelerator_memory()
        return pipe

    def prepare(self, task: str, size: str | None = None, **infer_opts: Any) -> None:
        """Load what a request will need (the task's model and, for normals with background
        removal or pointmaps with segmentation, the seg model) before any GPU function runs."""
        task = task_name(task)
        self.get(task, size)
        if task == "pose":
            _warm_detector(self.device)
        if _needs_seg(task, infer_opts):
            try:
                self.get("seg", self._seg_size(size))
            except Sapiens2Error as err:  # the pipeline falls back with a notice; log only
                log.warning("segmentation model for %s unavailable: %s", task, err)

    def preload(self, tasks: Iterable[str] | None = None, *, pin: bool = True) -> dict[str, str]:
        """Load the default size of each task (all by default); returns task -> error text for
        those that failed (nothing raises: a Space must start without weights)."""
        failed: dict[str, str] = {}
        for task in tasks or TASKS:
            try:
                self.get(task, None, pin=pin)
                if task_name(task) == "pose":
                    _warm_detector(self.device)
            except Exception as err:  # report, keep starting
                failed[task] = f"{type(err).__name__}: {err}"
                log.warning("preload %s failed: %s", task, failed[task])
        return failed

    def trim(self, keep: int = 1) -> list[Key]:
        """Drop all but the ``keep`` most recently used unpinned pipelines and free accelerator
        memory; used after an out-of-memory error. Pinned (preloaded) models stay: on ZeroGPU
        they are packed at launch and dropping them here frees no GPU memory. Returns the
        dropped keys."""
        with self._guard:
            unpinned = [k for k in self._cache if k not in self._pinned]
            dropped = unpinned[: max(0, len(unpinned) - max(0, keep))]
            for key in dropped:
                del self._cache[key]
        _free_accelerator_memory()
        return dropped

    def clear(self) -> None:
        """Drop every pipeline, pinned ones too, and free accelerator memory."""
        with self._guard:
            self._cache.clear()
            self._pinned.clear()
        _free_accelerator_memory()

    def _evict_locked(self) -> list[Key]:
        unpinned = [k for k in self._cache if k not in self._pinned]
        evicted = unpinned[: max(0, len(unpinned) - self.max_models)]
        for key in evicted:
            del self._cache[key]
        return evicted

    def _seg_size(self, size: str | None) -> str | None:
        # normals/pointmaps use the seg model of their own size (same cost class), else the default
        return size if size in get_task("seg").sizes else None

    def _build(self, task: str, size: str) -> Any:
        kwargs: dict[str, Any] = {"checkpoint": self.checkpoints.get(task), "device": self.device}
        if self.dtype is not None:
            kwargs["dtype"] = self.dtype
        if task in ("normal", "pointmap"):
            seg_size = self._seg_size(None if size == CUSTOM else size)
            kwargs["seg"] = lambda: self.get("seg", seg_size)  # shared with the Body parts tab
        real_size = None if size == CUSTOM else size
        t0 = time.perf_counter()
        if self._factory is not None:
            pipe = self._factory(task, real_size, **kwargs)
        else:
            from .tasks import pipeline

            pipe = pipeline(task, real_size, **kwargs)
        log.info("loaded %s %s on %s in %.1f s", task, size, self.device, time.perf_counter() - t0)
        if self.compile:  # skipped with a reason off CUDA and on ZeroGPU; never raises
            from .accel import compile_model

            report = compile_model(pipe.model)
            self.compile_reports[(task, size)] = report
            log.info("compile %s %s: %s", task, size, report)
        return pipe


def _warm_detector(device: str | None = None) -> None:
    """Load the shared person detector for ``device`` now (outside any GPU function). Without its
    weights pose falls back to the whole image with a notice, and retries the load on later requests."""
    from . import detect

    try:
        detect._auto_detector(device)
    except Sapiens2Error as err:
        log.info("person detector not loaded: %s", err)


def _needs_seg(task: str, infer_opts: Mapping[str, Any]) -> bool:
    return (task == "normal" and bool(infer_opts.get("remove_background"))) or (
        task == "pointmap" and bool(infer_opts.get("use_segmentation", True))
    )


# ----------------------------------------------------------------------------- options


@dataclass(frozen=True)
class Option:
    """One request option: its kind, default, limits and whether inference or rendering uses it."""

    kind: str  # "bool" | "float" | "int" | "choice" | "classes" | "color" | "image"
    default: Any
    stage: str  # "infer" (changes the model run) or "render" (only the picture)
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()


#: Options per task (app/API names). Keep in step with the pipelines' signatures.
OPTIONS: dict[str, dict[str, Option]] = {
    "pose": {
        "flip_test": Option("bool", False, "infer"),
        "max_people": Option("int", 20, "infer", 1, 50),
        "threshold": Option("float", 0.3, "render", 0.0, 1.0),
        "show_face": Option("bool", True, "render"),
        "body_only": Option("bool", False, "render"),
        "show_boxes": Option("bool", True, "render"),
    },
    "seg": {
        "opacity": Option("float", 0.5, "render", 0.0, 1.0),
        "classes": Option("classes", None, "render"),
    },
    "normal": {
        "remove_background": Option("bool", False, "infer"),
        "background": Option("choice", "black", "render", choices=("black", "photo")),
    },
    "pointmap": {"use_segmentation": Option("bool", True, "infer")},
    "matting": {
        "background_color": Option("color", "#00b140", "render"),
        "background_image": Option("image", None, "render"),
    },
    "pretrain": {},
}


def _check(task: str, name: str, opt: Option, value: Any) -> Any:
    where = f"{task} option {name!r}"
    if value is None or (isinstance(value, str) and value == "" and opt.kind != "choice"):
        return opt.default
    if opt.kind == "bool":
        if isinstance(value, (bool, np.bool_)) or value in (0, 1):
            return bool(value)
        raise OptionError(f"The {where} must be true or false; got {value!r}.")
    if opt.kind in ("float", "int"):
        try:
            num = float(value)
        except (TypeError, ValueError):
            num = math.nan
        if isinstance(value, bool) or not math.isfinite(num) or not (opt.low <= num <= opt.high):
            raise OptionError(
                f"The {where} must be a number from {opt.low:g} to {opt.high:g}; got {value!r}."
            )
        if opt.kind == "int":
            if num != int(num):
                raise OptionError(
                    f"The {where} must be a whole number from {opt.low:g} to {opt.high:g}; got {value!r}."
                )
            return int(num)
        return num
    if opt.kind == "choice":
        if value not in opt.choices:
            raise OptionError(f"The {where} must be one of: {', '.join(opt.choices)}; got {value!r}.")
        return value
    if opt.kind == "classes":
        from .metadata import seg_class_ids

        names = [value] if isinstance(value, (str, int)) else list(value)
        return seg_class_ids(names) if names else None  # OptionError lists every class
    if opt.kind == "color":
        return parse_color(value, where)
    if opt.kind == "image":
        return value  # a path or array, read (with its own clear errors) when rendering
    raise AssertionError(opt.kind)  # pragma: no cover - table typo


def parse_color(value: Any, where: str = "colour") -> tuple[int, int, int]:
    """A colour option -> (r, g, b) ints 0-255, with the forms :func:`sapiens2.render.parse_color`
    takes ('#rgb', '#rrggbb[aa]', 'rgb(...)'/'rgba(...)', a triple); the error names the option."""
    from .render import parse_color as _parse

    try:
        return _parse(value)
    except OptionError as err:
        raise OptionError(f"The {where}: {err}") from None


def split_options(task: str, options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Validate request options -> (inference options, rendering options), defaults filled in.

    Raises OptionError naming the allowed option names or values.
    """
    task = task_name(task)
    table = OPTIONS[task]
    unknown = sorted(set(options) - set(table))
    if unknown:
        allowed = ", ".join(table) or "none"
        raise OptionError(f"Unknown {task} option {', '.join(map(repr, unknown))}; allowed: {allowed}.")
    infer_opts: dict[str, Any] = {}
    render_opts: dict[str, Any] = {}
    for name, opt in table.items():
        value = _check(task, name, opt, options.get(name))
        (infer_opts if opt.stage == "infer" else render_opts)[name] = value
    return infer_opts, render_opts


# ----------------------------------------------------------------------------- requests


def read_photo(source: Any) -> Any:
    """Read the request's photo once (EXIF-upright, size-checked) for every task that uses it.

    Raises InputImageError with the reason (empty, not an image, too large ...)."""
    from .imaging import load_image

    if source is None or (isinstance(source, str) and not source.strip()):
        raise InputImageError("No photo given: upload one, take one with the webcam or paste one.")
    return load_image(source)


def is_out_of_memory(err: BaseException) -> bool:
    """True for a CUDA/accelerator out-of-memory error (typed or by its message)."""
    if isinstance(err, (OutOfMemoryError, MemoryError)):
        return True
    try:
        import torch

        if isinstance(err, torch.cuda.OutOfMemoryError):
            return True
    except (ImportError, AttributeError):  # pragma: no cover - old torch
        pass
    text = f"{type(err).__name__} {err}".lower()
    return "out of memory" in text or "outofmemoryerror" in text


def smaller_sizes(task: str, size: str) -> list[str]:
    sizes = get_task(task_name(task)).sizes
    return list(sizes[: sizes.index(size)]) if size in sizes else []


def out_of_memory_message(task: str, size: str) -> str:
    smaller = smaller_sizes(task, size)
    advice = f"choose a smaller size ({', '.join(smaller)})" if smaller else "use a smaller photo"
    return f"Out of GPU memory running {task} {size}. The model cache was trimmed; try again, or {advice}."


def infer(manager: ModelManager, task: str, image: Any, size: str | None = None, **infer_opts: Any) -> Any:
    """Run one task on one image: the heavy part (what the Space's GPU function does).

    ``image`` is anything ``sapiens2.imaging.load_image`` takes (an ``Intake`` is reused as is).
    Returns the task's result with CPU numpy arrays. An out-of-memory error trims the cache and
    becomes :class:`OutOfMemoryError` with advice.
    """
    task = task_name(task)
    size = manager.resolve_size(task, size)
    pipe = manager.get(task, size)
    try:
        if task == "pose":
            return pipe(
                image,
                flip_test=infer_opts.get("flip_test", False),
                max_people=infer_opts.get("max_people", 20),
            )
        if task == "normal":
            return pipe(image, remove_background=infer_opts.get("remove_background", False))
        if task == "pointmap":
            return pipe(image, use_segmentation=infer_opts.get("use_segmentation", True))
        return pipe(image)
    except Exception as err:
        if not is_out_of_memory(err) or isinstance(err, OutOfMemoryError):
            raise
        manager.trim()
        raise OutOfMemoryError(out_of_memory_message(task, size)) from err


def gpu_seconds(task: str, size: str | None, pixels: int = 0, **infer_opts: Any) -> int:
    """A generous estimate of one request's GPU time (seconds) for ZeroGPU's scheduler.

    A shorter request gets a better queue position, so it scales with the model size, flip
    test, the extra seg model and (slightly) the photo size; the per-forward numbers are small,
    most of the budget covers moving weights to the GPU when a worker starts.
    """
    base = {"0.1b": 6, "0.4b": 8, "0.8b": 10, "1b": 12, "1b-4k": 30, "5b": 35}
    task = task_name(task)
    seconds = float(base.get(size or "1b", 12))
    if task == "pose":
        seconds *= 2 if infer_opts.get("flip_test") else 1
        seconds += 4  # person detector
    if _needs_seg(task, infer_opts):
        seconds += base.get(size or "1b", 12)
    if pixels > 4096 * 4096 // 2:
        seconds += 5  # big photos: resizing outputs back to full size
    return int(min(120, max(10, seconds)))


# ----------------------------------------------------------------------------- presentation


@dataclass
class Shown:
    """What the app shows for one result (all CPU data, files already written)."""

    before: np.ndarray  # the upright input photo
    after: np.ndarray  # the rendering
    files: list[Path]
    line: str  # run info: model, device, dtype, model time, total time
    notices: list[str] = field(default_factory=list)
    data: dict[str, Any] | None = None  # pose: per person, 308 named points; others: summary
    extra: np.ndarray | None = None  # seg: legend image
    model3d: Path | None = None  # pointmap: GLB point cloud


def present(result: Any, out_dir: str | Path, **render_opts: Any) -> Shown:
    """Render ``result`` with the (validated) options and write its exports into ``out_dir``
    (the saved rendering is the one shown, so downloads match the screen)."""
    task = result.info.task
    out_dir = Path(out_dir)
    data: dict[str, Any] | None = None
    extra = None
    model3d = None
    if task == "pose":
        after = result.render(
            threshold=render_opts.get("threshold", 0.3),
            show_face=render_opts.get("show_face", True),
            body_only=render_opts.get("body_only", False),
            show_boxes=render_opts.get("show_boxes", True),
        )
        files = result.save(out_dir, threshold=render_opts.get("threshold", 0.3), rendered=after)
        data = result.to_dict()
    elif task == "seg":
        after = result.render(opacity=render_opts.get("opacity", 0.5), classes=render_opts.get("classes"))
        extra = result.legend()
        files = result.save(out_dir, rendered=after)
    elif task == "normal":
        after = result.render(background=render_opts.get("background", "black"))
        files = result.save(out_dir, rendered=after)
    elif task == "matting":
        background: Any = render_opts.get("background_image")
        if background is None:
            background = render_opts.get("background_color", (0, 177, 64))
        else:
            try:
                background = read_photo(background).rgb
            except InputImageError as err:  # say which of the two images is the problem
                raise InputImageError(f"Background image: {err}") from None
        after = result.render(background=background)
        files = result.save(out_dir, background=background, rendered=after)
    else:  # pointmap, pretrain
        after = result.render()
        files = result.save(out_dir, rendered=after)
        if task == "pointmap":
            model3d = next((p for p in files if p.suffix == ".glb"), None)
    if data is None:
        data = result.summary()
    return Shown(
        before=result.image,
        after=after,
        files=list(files),
        line=result.info.line(),
        notices=list(result.notices),
        data=data,
        extra=extra,
        model3d=model3d,
    )


class RequestFolders:
    """One fresh output folder per request under ``root``; folders older than ``max_age_s``
    are deleted when new ones are made (the server copies outputs to its own cache at once)."""

    def __init__(self, root: str | Path | None = None, max_age_s: float = 900.0) -> None:
        self.root = Path(root) if root else Path(tempfile.gettempdir()) / "sapiens2-requests"
        self.max_age_s = float(max_age_s)
        self._last_prune = 0.0
        self._lock = threading.Lock()

    def new(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        self.prune()
        return Path(tempfile.mkdtemp(prefix="req-", dir=self.root))

    def prune(self, force: bool = False) -> int:
        """Delete request folders older than ``max_age_s``; returns how many were removed."""
        now = time.time()
        with self._lock:
            if not force and now - self._last_prune < min(60.0, self.max_age_s / 2):
                return 0
            self._last_prune = now
        removed = 0
        for folder in self.root.glob("req-*"):
            try:
                if now - folder.stat().st_mtime > self.max_age_s:
                    shutil.rmtree(folder, ignore_errors=True)
                    removed += 1
            except OSError:
                continue
        return removed
