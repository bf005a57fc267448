"""The model cache of a server: one pipeline per (task, size), loaded once, bounded, thread-safe.

It is also where residency is decided: :meth:`ModelManager.prepare` loads, in the server process,
everything a request will use (the task's model, the models it borrows, the person detector)
before any GPU function runs; a GPU function then only reads the cache (``load=False``), and
every change of what is loaded is reported through ``on_change`` (ZeroGPU's worker must be
refreshed to see it; see ``sapiens2.zerogpu.entry``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ..errors import OptionError, ResidencyError, Sapiens2Error
from ..models.checkpoints import Checkpoints
from ..models.onnx_cache import check_runtime
from ..models.zoo import is_v1
from ..runtime.devices import default_device, free_accelerator_memory
from ..tasks import registry
from ..tasks.registry import Task
from ..zerogpu.entry import cuda_emulation
from ..zerogpu.loadguard import check_loading_allowed
from ..zerogpu.quota import model_bytes

log = logging.getLogger(__name__)

#: The key size used for a task whose checkpoint is given explicitly (the file decides its model).
CUSTOM = "custom"
#: Pipelines kept besides pinned ones when no byte budget is given: "All tasks" at one size fits.
DEFAULT_MAX_MODELS = 6

Key = tuple[str, str]  # (task name, size or CUSTOM)
Factory = Callable[..., Any]


def pipeline_bytes(pipe: Any) -> int:
    """Bytes of a pipeline's weights (0 for stand-ins without a model)."""
    model = getattr(pipe, "model", None)
    return model_bytes(model) if hasattr(model, "parameters") else 0


class ModelManager:
    """Thread-safe bounded cache of task pipelines keyed by (task name, size).

    ``checkpoints`` (:class:`~sapiens2.models.checkpoints.Checkpoints`, or a mapping made into one)
    names an explicit checkpoint file or folder per task (fine-tuned or custom weights; the tests'
    tiny checkpoints): the file decides that task's model, and a chosen size only checks it
    (``loading.checkpoint_size_conflict``): a file of a published size offers that size alone, a
    file of no published size takes any size; they also decide which tasks the server shows.
    ``size`` overrides the default size of every task that offers it. ``factory`` builds a
    pipeline (``factory(task name, size, checkpoint=..., device=..., dtype=..., **borrowed)``);
    the default is the task's pipeline class. Unpinned pipelines are evicted least recently used first
    beyond ``max_models`` of them or ``max_bytes`` of weights (when given). ``on_change`` is called
    after a model was loaded or dropped (and after the person detector loaded), under the cache's
    lock, so that no request reaches its device call with the old set (ZeroGPU: see
    ``sapiens2.zerogpu.entry.resident_changed``).
    """

    def __init__(
        self,
        device: str | None = None,
        dtype: Any = None,
        checkpoints: Checkpoints | Mapping[str, str | os.PathLike] | None = None,
        max_models: int = DEFAULT_MAX_MODELS,
        *,
        size: str | None = None,
        factory: Factory | None = None,
        compile: bool = False,
        max_bytes: int | None = None,
        on_change: Callable[[], None] | None = None,
        runtime: str | None = None,
    ) -> None:
        if max_models < 1:
            raise OptionError(f"max_models must be at least 1; got {max_models}.")
        self.device = str(device) if device else str(default_device())
        self.dtype = dtype
        self.checkpoints = checkpoints if isinstance(checkpoints, Checkpoints) else Checkpoints(checkpoints)
        self.max_models = int(max_models)
        self.max_bytes = max_bytes
        self.size = size
        self.on_change = on_change
        #: "torch" (None), "onnxruntime" or "onnxruntime-int8": each model exported once, run by ORT
        self.runtime = None if runtime in (None, "torch") else check_runtime(runtime)
        self._factory = factory
        self.compile = compile  # torch.compile each model at load (local CUDA only; models.compile)
        self.compile_reports: dict[Key, Any] = {}  # what compilation did or why it was skipped
        self._guard = threading.Lock()  # protects the dicts below, never held while loading
        self._cache: OrderedDict[Key, Any] = OrderedDict()  # least recently used first
        self._pinned: set[Key] = set()
        self._held: dict[Key, int] = {}  # keys in use by requests in flight -> how many
        self._locks: dict[Key, threading.Lock] = {}
        self._file_sizes: dict[str, str | None] = {}  # task -> its checkpoint's published size
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

    def tasks(self) -> dict[str, Task]:
        """The tasks this server shows (its checkpoints decide those not on the Hub), in tab order."""
        return registry.all_tasks(self.checkpoints)

    def video_tasks(self) -> dict[str, Task]:
        """The shown tasks that run on clips, in tab order."""
        return registry.video_tasks(self.checkpoints)

    def checkpoint_size(self, task: Task) -> str | None:
        """The published size of the task's explicit checkpoint, read from its header once; None
        without a checkpoint, for a file of no published size, or for an unreadable file (whose
        load then reports what is wrong)."""
        name = task.name
        if name not in self.checkpoints:
            return None
        if name not in self._file_sizes:
            from ..models.loading import describe_checkpoint

            try:
                size = describe_checkpoint(self.checkpoints[name]).get("size")
            except (Sapiens2Error, OSError):
                size = None
            self._file_sizes[name] = str(size) if size else None
        return self._file_sizes[name]

    def sizes(self, task: Task) -> tuple[str, ...]:
        """The sizes a menu offers: the zoo's, or the one the task's checkpoint runs (its published
        size, or :data:`CUSTOM` for a file of none: every size would run the same file)."""
        return (self.default_size(task),) if task.name in self.checkpoints else task.spec.sizes

    def default_size(self, task: Task) -> str:
        if task.name in self.checkpoints:
            return self.checkpoint_size(task) or CUSTOM
        spec = task.spec
        return str(self.size) if self.size in spec.sizes else spec.default_size(self.cuda)

    def resolve_size(self, task: Task, size: str | None) -> str:
        """The size that will run: ``size`` checked against the zoo (None -> the default);
        OptionError names the sizes. With a checkpoint a size only checks the file (the same
        rule as ``load_model``) and the answer is what runs: its size, or :data:`CUSTOM`."""
        if task.name in self.checkpoints:
            self._check_checkpoint_size(task, size)
            return self.default_size(task)
        if size in (None, ""):
            return self.default_size(task)
        task.spec.check_size(str(size))
        return str(size)

    def key(self, task: Task, size: str | None) -> Key:
        if task.name in self.checkpoints:
            self._check_checkpoint_size(task, size)
            return (task.name, CUSTOM)
        return (task.name, self.resolve_size(task, size))

    def _check_checkpoint_size(self, task: Task, size: str | None) -> None:
        """The same rule as ``load_model(size, checkpoint=...)``: a size only checks the file
        (:data:`CUSTOM`, what the menus offer, names the file itself)."""
        if size in (None, "", CUSTOM):
            return
        task.spec.check_size(str(size))  # a size that exists nowhere is refused too
        from ..models.loading import checkpoint_size_conflict

        conflict = checkpoint_size_conflict(self.checkpoint_size(task), str(size))
        if conflict is not None:
            raise OptionError(
                f"This server's {task.name} model is the checkpoint {self.checkpoints[task.name].name}, "
                f"size {self.checkpoint_size(task)}; size {size} is not offered. {conflict}"
            )

    def borrowed_size(self, borrowed: Task, size: str | None) -> str | None:
        """Size of a borrowed model: the borrower's when offered (same cost class), else the default."""
        return size if size in borrowed.spec.sizes else None

    # -- cache -------------------------------------------------------------------------

    def loaded(self) -> list[Key]:
        """Cached keys, least recently used first."""
        with self._guard:
            return list(self._cache)

    def resident_bytes(self) -> int:
        with self._guard:
            return sum(pipeline_bytes(p) for p in self._cache.values())

    def _hit(self, key: Key, pin: bool) -> Any:
        """The cached pipeline (marked most recently used), or None; call with ``_guard`` held."""
        pipe = self._cache.get(key)
        if pipe is not None:
            self._cache.move_to_end(key)
            if pin:
                self._pinned.add(key)
        return pipe

    def get(self, task: Task, size: str | None = None, *, pin: bool = False, load: bool = True) -> Any:
        """The pipeline for (task, size), loading it once on first use. ``load=False`` (a GPU
        function) raises ResidencyError instead of loading."""
        key = self.key(task, size)
        with self._guard:
            if (pipe := self._hit(key, pin)) is not None:
                return pipe
            lock = self._locks.setdefault(key, threading.Lock())
        if not load:
            raise ResidencyError(f"The {key[0]} {key[1]} model is not resident in this process.")
        check_loading_allowed(f"The {key[0]} {key[1]} model")
        with lock:  # one loader per key; others wait here and then find it cached
            with self._guard:
                if (pipe := self._hit(key, pin)) is not None:
                    return pipe
            try:
                pipe = self._build(task, key[1])
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
                # under the lock: no request may reach its device call with the old model set
                self._changed()
        if evicted:
            log.info("model cache: evicted %s", evicted)
            del evicted
            free_accelerator_memory()
        return pipe

    def prepare(self, task: Task, size: str | None = None, **infer_opts: Any) -> list[Key]:
        """Load everything a request with these options will use (the task's model, the models
        it borrows, the person detector) here, before any GPU function runs; returns the keys of
        the models (hold them with :meth:`holding` until the device call returns). A borrowed model
        that cannot be loaded is only logged: the pipeline falls back with a notice."""
        self.get(task, size)
        keys = [self.key(task, size)]
        for borrowed in task.needs(infer_opts):
            bsize = self.borrowed_size(borrowed, size)
            try:
                self.get(borrowed, bsize)
                keys.append(self.key(borrowed, bsize))
            except Sapiens2Error as err:
                log.warning("%s model for %s unavailable: %s", borrowed.name, task.name, err)
        if task.warm is not None:
            self._warm(task)
        return keys

    @contextmanager
    def holding(self, keys: Iterable[Key]) -> Iterator[None]:
        """Keep these models from eviction while a request uses them (until its device call
        returns), so a concurrent load cannot drop a model between preparation and use."""
        keys = list(keys)
        with self._guard:
            for key in keys:
                self._held[key] = self._held.get(key, 0) + 1
        try:
            yield
        finally:
            with self._guard:
                for key in keys:
                    self._held[key] -= 1
                    if not self._held[key]:
                        del self._held[key]

    def preload(self, tasks: Iterable[Task] | None = None, *, pin: bool = True) -> dict[str, str]:
        """Load the default size of each task (by default every task this server shows, but for
        those whose default is a Sapiens v1 size and whose file the operator did not give: as on the
        Space card's preload, depth loads on first use, so its weights do not lengthen every GPU
        call's start) and what it always
        needs; returns task name -> error text for those that failed (nothing raises: a Space
        must start without weights)."""
        if tasks is None:
            tasks = [
                t
                for t in self.tasks().values()
                if t.name in self.checkpoints or not is_v1(t.spec.default_size(self.cuda))
            ]
        failed: dict[str, str] = {}
        for task in tasks:
            try:
                self.get(task, None, pin=pin)
                if task.warm is not None:
                    self._warm(task)
            except Exception as err:  # report, keep starting
                failed[task.name] = f"{type(err).__name__}: {err}"
                log.warning("preload %s failed: %s", task.name, failed[task.name])
        return failed

    def trim(self, keep: int = 1) -> list[Key]:
        """Drop all but the ``keep`` most recently used unpinned pipelines and free accelerator
        memory; used after an out-of-memory error. Pinned (preloaded) models stay: on ZeroGPU
        they are packed at launch and dropping them here frees no GPU memory. Returns the
        dropped keys."""
        with self._guard:
            unpinned = [k for k in self._cache if k not in self._pinned]
            oldest = unpinned[: max(0, len(unpinned) - max(0, keep))]
            dropped = [k for k in oldest if k not in self._held]  # in use by a request: kept
            for key in dropped:
                del self._cache[key]
            if dropped:
                self._changed()
        free_accelerator_memory()
        return dropped

    def clear(self) -> None:
        """Drop every pipeline, pinned ones too, and free accelerator memory."""
        with self._guard:
            self._cache.clear()
            self._pinned.clear()
            self._changed()
        free_accelerator_memory()

    def _evict_locked(self) -> list[Key]:
        unpinned = [k for k in self._cache if k not in self._pinned and k not in self._held]
        evicted = unpinned[: max(0, len(unpinned) - self.max_models)]
        if self.max_bytes is not None:
            total = sum(pipeline_bytes(p) for p in self._cache.values())
            total -= sum(pipeline_bytes(self._cache[k]) for k in evicted)
            for key in unpinned[len(evicted) : -1]:  # never the model just loaded (the last)
                if total <= self.max_bytes:
                    break
                total -= pipeline_bytes(self._cache[key])
                evicted.append(key)
        for key in evicted:
            del self._cache[key]
        return evicted

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _warm(self, task: Task) -> None:
        """Load what the task needs besides models (the person detector) in this process."""
        assert task.warm is not None
        check_loading_allowed(f"what {task.name} needs besides its model")
        with cuda_emulation():
            loaded = task.warm(self.device)
        if loaded:
            with self._guard:
                self._changed()

    def _build(self, task: Task, size: str) -> Any:
        real_size = None if size == CUSTOM else size
        kwargs: dict[str, Any] = {"checkpoint": self.checkpoints.get(task.name), "device": self.device}
        if self.dtype is not None:
            kwargs["dtype"] = self.dtype
        if self.runtime is not None:
            kwargs["runtime"] = self.runtime
        for borrowed in task.borrows:  # shared with that task's own tab, never a private copy
            bsize = self.borrowed_size(borrowed, real_size)
            kwargs[borrowed.name] = lambda b=borrowed, s=bsize: self.get(b, s)
        t0 = time.perf_counter()
        with cuda_emulation():  # ZeroGPU: a request thread must place weights on emulated CUDA too
            if self._factory is not None:
                pipe = self._factory(task.name, real_size, **kwargs)
            else:
                pipe = task.pipeline(real_size, **kwargs)
        log.info("loaded %s %s on %s in %.1f s", task.name, size, self.device, time.perf_counter() - t0)
        if self.compile:  # skipped with a reason off CUDA and on ZeroGPU; never raises
            from ..models.compile import compile_model

            report = compile_model(pipe.model)
            self.compile_reports[(task.name, size)] = report
            log.info("compile %s %s: %s", task.name, size, report)
        return pipe


__all__ = ["CUSTOM", "DEFAULT_MAX_MODELS", "ModelManager", "pipeline_bytes"]
