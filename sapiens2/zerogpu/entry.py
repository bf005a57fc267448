"""ZeroGPU mechanics, kept out of the app and the model cache.

- **Durations.** What to pass to ``@spaces.GPU(duration=...)``, what a visitor's daily quota is
  charged for it once the node's duration factor is applied (:func:`gpu_request`), and what to tell
  a visitor before a large run (:func:`cost_notice`). "All tasks" makes one call per task.
- **Residency.** :class:`GpuEntry` is the app's one GPU entry. A ZeroGPU worker is a fork of the
  server process, reused while idle, so it holds only the models the server had when it was
  forked. After the server loads or drops a model, :func:`resident_changed` makes the next call
  fork a fresh worker and ends the idle workers of older generations; inside a worker,
  :func:`sapiens2.zerogpu.loadguard.check_loading_allowed` turns a load into a clear error instead of a
  load billed to the visitor.
- **Memory.** The GPU memory of a slice and the budget left for the model cache.

Facts come from ``spaces`` 0.51.3 (read from its source) and the Hub's ZeroGPU docs; see
docs/ZEROGPU.md. Nothing here imports ``spaces`` or ``torch`` when the module is imported.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import math
import os
import pickle
import re
import signal
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from ..errors import GpuUnavailableError, Sapiens2Error

log = logging.getLogger(__name__)

R = TypeVar("R")
GpuSize = Literal["large", "xlarge"]

#: torch versions ZeroGPU lists as supported (Hub docs "Supported Versions", with 2.12.1 and 2.13.0
#: added by huggingface/hub-docs PR #2763); the Space pins one of them exactly.
SUPPORTED_TORCH: tuple[str, ...] = ("2.8.0", "2.9.1", "2.10.0", "2.11.0", "2.12.1", "2.13.0")
#: Python versions ZeroGPU lists as supported (Hub docs "Supported Versions").
SUPPORTED_PYTHON: tuple[str, ...] = ("3.10.13", "3.12.12")
#: Included daily GPU quota per visitor type, in seconds (Hub docs, "Usage Tiers").
DAILY_QUOTA_S: dict[str, int] = {
    "anonymous": 120,
    "free": 300,
    "pro": 2400,
    "team": 2400,
    "enterprise": 3600,
}
#: GPU memory of one call per ``spaces.GPU(size=...)``, bytes (Hub docs: half / full RTX Pro 6000).
SLICE_BYTES: dict[str, int] = {"large": 48 * 10**9, "xlarge": 96 * 10**9}
#: Device memory a CUDA context takes before any tensor (spaces' zero/torch/static.py).
CUDA_CONTEXT_BYTES = 309_002_240
#: GPU memory kept free for one request's activations beside the resident weights: pointmap 5b
#: needs 2.7 GB and pose 8 crops per forward about 2.1 GB (computed, docs/ZEROGPU.md).
ACTIVATION_HEADROOM_BYTES = 5 * 10**9
#: ``duration_factor`` of the slowest node in spaces 0.51.3's configs.json, used if it cannot be read.
FALLBACK_DURATION_FACTOR = 1.5


# ----------------------------------------------------------------------------- durations


@functools.cache
def _node_configs() -> tuple[dict[str, Any], ...]:
    """The ZeroGPU node table shipped in spaces (zero/configs.json), read without importing spaces
    (its import patches torch when SPACES_ZERO_GPU is set); empty when spaces is not installed."""
    spec = importlib.util.find_spec("spaces")
    if spec is None or not spec.submodule_search_locations:
        return ()
    path = Path(next(iter(spec.submodule_search_locations))) / "zero" / "configs.json"
    try:
        return tuple(json.loads(path.read_text()))
    except (OSError, ValueError):
        return ()


def duration_factor() -> float:
    """The largest ``duration_factor`` among ZeroGPU's nodes (the worst node a call may land on).

    spaces multiplies a ``large`` call's requested seconds by its node's factor before it asks the
    scheduler, and the scheduler checks that product against the visitor's remaining quota.
    """
    factors = [float(c["duration_factor"]) for c in _node_configs() if "duration_factor" in c]
    return max(factors, default=FALLBACK_DURATION_FACTOR)


@dataclass(frozen=True)
class GpuRequest:
    """One GPU call as the scheduler sees it."""

    duration_s: int  # what to give @spaces.GPU (it keeps whole seconds only, so this is rounded up)
    charged_s: int  # what is checked against the visitor's remaining quota on the worst node
    gpu_size: GpuSize = "large"

    def fits(self, visitor: str = "anonymous") -> bool:
        """Whether a visitor with a full daily quota may start this call."""
        return self.charged_s <= DAILY_QUOTA_S[visitor]

    @property
    def fits_anonymous(self) -> bool:
        return self.fits("anonymous")

    @property
    def fits_free(self) -> bool:
        return self.fits("free")


def gpu_request(estimate_s: float, *, gpu_size: GpuSize = "large", factor: float | None = None) -> GpuRequest:
    """The duration to request for ``estimate_s`` seconds of GPU work, and what it is charged.

    ``large`` calls are charged ``round(duration * factor)`` (spaces' client.py); ``xlarge`` calls
    skip the factor but cost twice the quota (Hub docs). The factor also lengthens the allowance on
    slow nodes, so requesting the estimate itself is enough everywhere.
    """
    if not isinstance(estimate_s, (int, float)) or not math.isfinite(estimate_s) or estimate_s < 0:
        raise ValueError(f"A GPU time estimate must be a finite number of seconds >= 0; got {estimate_s!r}.")
    if gpu_size not in SLICE_BYTES:
        raise ValueError(f"gpu_size must be 'large' or 'xlarge'; got {gpu_size!r}.")
    duration = max(1, math.ceil(estimate_s))
    if gpu_size == "xlarge":
        return GpuRequest(duration, 2 * duration, gpu_size)
    factor = duration_factor() if factor is None else float(factor)
    return GpuRequest(duration, round(duration * factor), gpu_size)


#: A call charged at least this many seconds (a quarter of a visitor's daily quota without an
#: account) is announced to the visitor before it starts: every 5b run on the Space is.
ANNOUNCE_CHARGED_S = 30


def cost_notice(estimate_s: float, what: str) -> str | None:
    """On ZeroGPU, a sentence saying what ``what`` costs of a visitor's daily quota when that is
    large (at least :data:`ANNOUNCE_CHARGED_S`); None elsewhere and for small runs."""
    if not zero_gpu_enabled():
        return None
    charged = gpu_request(estimate_s).charged_s
    if charged < ANNOUNCE_CHARGED_S:
        return None
    q = DAILY_QUOTA_S
    return (
        f"{what} reserves up to {charged} s of ZeroGPU time (daily quota: {q['anonymous']} s without an "
        f"account, {q['free']} s with a free account, {q['pro']} s with PRO). Smaller sizes cost less."
    )


# ----------------------------------------------------------------------------- memory


def model_bytes(module: Any) -> int:
    """Bytes of a model's parameters and buffers as they sit on the device (works on ZeroGPU's
    emulated CUDA tensors, whose shapes and dtypes are real)."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def cache_budget_bytes(pinned_bytes: int, headroom_bytes: int, gpu_size: GpuSize = "large") -> int:
    """GPU bytes the model cache may fill besides the pinned (packed at start-up) models.

    Every fresh worker moves *all* resident weights onto its slice, so the resident set, the CUDA
    context and the activations of the largest request (``headroom_bytes``) must fit one slice.
    """
    return max(0, SLICE_BYTES[gpu_size] - CUDA_CONTEXT_BYTES - int(pinned_bytes) - int(headroom_bytes))


# ----------------------------------------------------------------------------- residency

_in_worker = False  # set in a GPU worker process by the first call it runs
_entries: weakref.WeakSet[GpuEntry[Any]] = weakref.WeakSet()


def in_gpu_worker() -> bool:
    """True inside a ZeroGPU worker process (a fork of the server that runs GPU calls)."""
    return _in_worker


@contextmanager
def cuda_emulation() -> Iterator[None]:
    """Make ZeroGPU's CUDA emulation active in this thread for the block; a no-op elsewhere.

    spaces enters its torch modes only in the thread that imported it. Gradio runs handlers in
    worker threads, where ``.to("cuda")`` would reach real CUDA (an error on ZeroGPU) and an emulated
    CUDA parameter would report ``cpu``. Wrap every load to "cuda" (model, weights, pipeline set-up).
    """
    patching = sys.modules.get("spaces.zero.torch.patching")  # imported by spaces only on ZeroGPU
    if patching is None or _in_worker or patching.function_mode in _function_modes():
        yield
        return
    patching.enter_mode()  # spaces' own helper for its threads (see its generator wrapper)
    try:
        yield
    finally:
        patching.dispatch_mode.__exit__(None, None, None)
        patching.function_mode.__exit__(None, None, None)


def _function_modes() -> list[Any]:
    from torch.overrides import _get_current_function_mode_stack

    return _get_current_function_mode_stack()


def resident_changed() -> None:
    """Tell every :class:`GpuEntry` that the server's resident models changed (a load or an
    eviction): call it right after the cache inserts or drops a model, under the cache's lock."""
    for entry in list(_entries):
        entry.resident_changed()


def zero_gpu_enabled() -> bool:
    """Whether ``spaces`` runs GPU functions in ZeroGPU workers here (``SPACES_ZERO_GPU``)."""
    try:
        from spaces.config import Config
    except ImportError:
        return False
    return bool(Config.zero_gpu)


@dataclass(frozen=True)
class _Outcome:
    """What a worker sends back: its pid and the value or the (picklable) exception."""

    pid: int
    value: Any = None
    error: BaseException | None = None


@dataclass
class _Generation:
    """The spaces.GPU function used while the server's resident models stay the same."""

    number: int
    call: Callable[..., _Outcome]  # the decorated function
    task: Callable[..., _Outcome]  # what was decorated (spaces caches by it)
    inflight: int = 0
    pids: set[int] = field(default_factory=set)


class GpuEntry(Generic[R]):
    """The app's one GPU entry: ``entry(*args)`` runs ``fn(*args)`` in a ZeroGPU worker that
    holds the server's current models, or as a plain call off ZeroGPU.

    ``duration``: seconds of GPU work, or a function of the same arguments as ``fn`` returning
    them; it is rounded up with :func:`gpu_request` (spaces applies the node's factor itself).
    Exceptions raised by ``fn`` reach the caller as the same objects (``Sapiens2Error`` types
    included), not as spaces' generic "ZeroGPU worker error".
    """

    def __init__(
        self,
        fn: Callable[..., R],
        duration: float | Callable[..., float],
        *,
        gpu_size: GpuSize | None = None,
        zero_gpu: bool | None = None,
        generator: bool = False,
    ) -> None:
        self.fn = fn
        self.duration = duration
        self.gpu_size = gpu_size
        self.generator = generator  # fn yields: one admission streams every value it yields
        self.zero_gpu = zero_gpu_enabled() if zero_gpu is None else bool(zero_gpu)
        self._lock = threading.Lock()
        self._current = 0
        self._generations: dict[int, _Generation] = {}
        if self.zero_gpu:
            # decorated before launch: spaces reports its GPU functions to ZeroGPU at start-up
            self._generations[0] = self._decorate(0)
            _entries.add(self)

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        if not self.zero_gpu:
            return self.fn(*args, **kwargs)
        if self.generator:
            return self._stream(args, kwargs)  # type: ignore[return-value]
        gen = self._enter()
        outcome: _Outcome | None = None
        try:
            outcome = _spaces_call(gen.call, *args, **kwargs)
        finally:
            self._leave(gen, outcome.pid if isinstance(outcome, _Outcome) else None)
        if outcome.error is not None:
            raise outcome.error
        return outcome.value

    def _stream(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[Any]:
        """One admission for everything ``fn`` yields; values arrive as the worker yields them."""
        gen = self._enter()
        pid: int | None = None
        try:
            stream = _spaces_call(gen.call, *args, **kwargs)
            while True:
                outcome = _spaces_call(next, stream, None)
                if outcome is None:
                    return
                pid = outcome.pid
                if outcome.error is not None:
                    raise outcome.error
                yield outcome.value
        finally:
            self._leave(gen, pid)

    @property
    def generation(self) -> int:
        return self._current

    def worker_pids(self) -> dict[int, set[int]]:
        """Generation -> pids of the workers that ran its calls and are not ended yet."""
        with self._lock:
            return {n: set(g.pids) for n, g in self._generations.items()}

    def resident_changed(self) -> None:
        """The server's models changed: the next call gets a fresh worker; idle workers of older
        generations are ended (SIGTERM, which spaces' worker loop handles) once none of their calls
        is running. Off ZeroGPU this does nothing."""
        if not self.zero_gpu:
            return
        with self._lock:
            self._current += 1
            stale = self._take_stale_locked()
        _end_workers(stale)

    # -- internals -----------------------------------------------------------------------

    def _duration_s(self, *args: Any, **kwargs: Any) -> int:
        seconds = self.duration(*args, **kwargs) if callable(self.duration) else self.duration
        return gpu_request(seconds, gpu_size=self.gpu_size or "large").duration_s

    def _decorate(self, number: int) -> _Generation:
        import spaces

        fn = self.fn

        def run_in_worker(*args: Any, **kwargs: Any) -> _Outcome:
            return _run_in_worker(fn, args, kwargs)

        if self.generator:

            def run_in_worker(*args: Any, **kwargs: Any) -> Iterator[_Outcome]:  # type: ignore[misc]
                yield from _stream_in_worker(fn, args, kwargs)

        run_in_worker.__name__ = getattr(fn, "__name__", "gpu_call")
        run_in_worker.__qualname__ = getattr(fn, "__qualname__", run_in_worker.__name__)
        call = spaces.GPU(run_in_worker, duration=self._duration_s, size=self.gpu_size)
        return _Generation(number, call, run_in_worker)

    def _enter(self) -> _Generation:
        with self._lock:
            gen = self._generations.get(self._current)
            if gen is None:
                gen = self._generations[self._current] = self._decorate(self._current)
            gen.inflight += 1
            return gen

    def _leave(self, gen: _Generation, pid: int | None) -> None:
        with self._lock:
            gen.inflight -= 1
            if pid is not None:
                gen.pids.add(pid)
            stale = self._take_stale_locked()
        _end_workers(stale)

    def _take_stale_locked(self) -> list[int]:
        stale = [g for n, g in self._generations.items() if n < self._current and g.inflight == 0]
        for gen in stale:
            del self._generations[gen.number]
            _forget(gen)
        return [pid for gen in stale for pid in gen.pids]


def _run_in_worker(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Outcome:
    """Runs in the worker: mark the process, call ``fn``, return the value or the error object."""
    global _in_worker
    _in_worker = True
    try:
        return _Outcome(os.getpid(), value=fn(*args, **kwargs))
    except Exception as err:
        if not isinstance(err, Sapiens2Error):
            log.exception("GPU call failed")
        return _Outcome(os.getpid(), error=_portable(err))


def _stream_in_worker(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Iterator[_Outcome]:
    """Runs in the worker: every value ``fn`` yields, then its error object if it fails."""
    global _in_worker
    _in_worker = True
    try:
        for value in fn(*args, **kwargs):
            yield _Outcome(os.getpid(), value=value)
    except Exception as err:
        if not isinstance(err, Sapiens2Error):
            log.exception("GPU call failed")
        yield _Outcome(os.getpid(), error=_portable(err))


_ASKED_LEFT = re.compile(r"\((\d+)s requested vs\. (\d+)s left\)")
_WAIT = re.compile(r"Try again in ([0-9:]+)")


def _spaces_call(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, with spaces' own errors (a refused schedule, an aborted worker: ``gr.Error``
    raised before or around the worker) turned into :class:`GpuUnavailableError`."""
    try:
        return fn(*args)
    except Sapiens2Error:
        raise
    except Exception as err:
        if type(err).__name__ not in ("Error", "HTMLError") or not hasattr(err, "title"):
            raise
        raise gpu_unavailable(
            str(getattr(err, "title", "") or ""), str(getattr(err, "message", err))
        ) from None


def gpu_unavailable(title: str, message: str) -> GpuUnavailableError:
    """A package error for spaces' refusal ``title``/``message``: what happened, with the seconds
    requested and left when spaces gives them, and what helps."""
    asked_left = _ASKED_LEFT.search(message)
    wait = _WAIT.search(message)
    q = DAILY_QUOTA_S
    helps = (
        f"Log in for a larger daily quota ({q['free']} s with a free account, {q['pro']} s with PRO), "
        f"wait for your quota to refill{f' (in {wait.group(1)})' if wait else ''}, or choose a smaller "
        "size, fewer tasks or fewer frames."
    )
    if asked_left:
        asked, left = int(asked_left.group(1)), int(asked_left.group(2))
        why = f"ZeroGPU quota: {asked} s requested vs. {left} s left."
        return GpuUnavailableError(f"{why} {helps}", requested_s=asked, left_s=left,
                                   wait=wait.group(1) if wait else None, quota=True)  # fmt: skip
    quota = "quota" in title.lower() or "limit" in message.lower()
    why = f"ZeroGPU: {message.strip() or title}".rstrip(". ") + "."
    return GpuUnavailableError(f"{why} {helps if quota else 'Try again in a moment.'}", quota=quota)


def _portable(err: Exception) -> Exception:
    """``err`` if it survives pickling (the way back to the server), else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(err))
    except Exception:
        return RuntimeError(f"{type(err).__name__}: {err}")
    return err


def _forget(gen: _Generation) -> None:
    """Drop spaces' own reference to a stale generation, so that its worker handles are freed."""
    try:
        from spaces.zero.decorator import decorated_cache
    except ImportError:
        return
    decorated_cache.pop(gen.task, None)
    decorated_cache.pop(gen.call, None)


def _parent_pid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # after "pid (name)": state, ppid, ...
    return int(fields[1]) if len(fields) > 1 else None


def _end_workers(pids: list[int]) -> None:
    """SIGTERM each pid that is still a child of this process (a worker spaces forked)."""
    for pid in pids:
        if _parent_pid(pid) != os.getpid():
            continue  # already gone (or not ours): nothing to end
        try:
            os.kill(pid, signal.SIGTERM)
            log.info("ended stale GPU worker %d", pid)
        except ProcessLookupError:
            pass
