"""The app's one GPU entry (:class:`GpuEntry`): ``spaces.GPU`` around a function, with a worker
that holds the server's current models, and package errors carried across intact.

A ZeroGPU worker is a fork of the server process, reused while idle, so it holds only the models
the server had when it was forked. After the server loads or drops a model,
:func:`resident_changed` makes the next call fork a fresh worker and ends the idle workers of
older generations; inside a worker, :func:`sapiens2.zerogpu.loadguard.check_loading_allowed` turns
a load into a clear error instead of a load billed to the visitor. :func:`cuda_emulation` gives a
request thread ZeroGPU's CUDA emulation for a load. What of ``spaces`` this uses besides
``spaces.GPU`` is in :mod:`sapiens2.zerogpu.internals`.

Nothing here imports ``spaces`` or ``torch`` when the module is imported.
"""

from __future__ import annotations

import errno
import gc
import logging
import os
import pickle
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from .. import zerogpu
from ..errors import GpuUnavailableError, Sapiens2Error
from . import internals
from .quota import GpuSize, gpu_request, gpu_unavailable

log = logging.getLogger(__name__)

R = TypeVar("R")

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
    modes = internals.torch_modes()
    if modes is None or _in_worker or modes[0] in internals.active_function_modes():
        yield
        return
    with ExitStack() as stack:  # the order spaces enters them in (function mode, then dispatch)
        for mode in modes:
            stack.enter_context(mode)
        yield


def resident_changed() -> None:
    """Tell every :class:`GpuEntry` that the server's resident models changed (a load or an
    eviction): call it right after the cache inserts or drops a model, under the cache's lock."""
    for entry in list(_entries):
        entry.resident_changed()


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
    them; it is rounded up with :func:`~sapiens2.zerogpu.quota.gpu_request` (spaces applies the
    node's factor itself). Exceptions raised by ``fn`` reach the caller as the same objects
    (``Sapiens2Error`` types included), not as spaces' generic "ZeroGPU worker error".
    ``generator``: ``fn`` yields, and one admission streams every value it yields.
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
        self.generator = generator
        self.zero_gpu = zerogpu.zero_gpu_enabled() if zero_gpu is None else bool(zero_gpu)
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
        for attempt in (1, 2):
            gen = self._enter()
            outcome: _Outcome | None = None
            try:
                outcome = _spaces_call(gen.call, *args, **kwargs)
            except OSError as err:  # the worker did not start: fn never ran, so once more is safe
                _start_failed(err, again=attempt == 1)
                continue
            finally:
                self._leave(gen, outcome.pid if isinstance(outcome, _Outcome) else None)
            if outcome.error is not None:
                raise outcome.error
            return outcome.value
        raise AssertionError("unreachable: the second failed start raised")  # pragma: no cover

    def _stream(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[Any]:
        """One admission for everything ``fn`` yields; values arrive as the worker yields them."""
        for attempt in (1, 2):
            gen = self._enter()
            pid: int | None = None
            try:
                try:
                    stream = _spaces_call(gen.call, *args, **kwargs)
                    outcome = _spaces_call(next, stream, None)
                except OSError as err:  # the worker did not start: fn never ran, once more is safe
                    _start_failed(err, again=attempt == 1)
                    continue
                while outcome is not None:
                    pid = outcome.pid
                    if outcome.error is not None:
                        raise outcome.error
                    yield outcome.value
                    outcome = _spaces_call(next, stream, None)
                return
            finally:
                self._leave(gen, pid)

    @property
    def generation(self) -> int:
        return self._current

    def resident_changed(self) -> None:
        """The server's models changed: the next call gets a fresh worker; idle workers of older
        generations are ended once none of their calls is running. Off ZeroGPU this does nothing."""
        if not self.zero_gpu:
            return
        with self._lock:
            self._current += 1
            stale = self._take_stale_locked()
        internals.end_workers(stale)

    # -- internals -----------------------------------------------------------------------

    def _duration_s(self, *args: Any, **kwargs: Any) -> int:
        seconds = self.duration(*args, **kwargs) if callable(self.duration) else self.duration
        return gpu_request(seconds, gpu_size=self.gpu_size or "large").duration_s

    def _decorate(self, number: int) -> _Generation:
        """A new ``spaces.GPU`` function: spaces keeps workers per decorated function, so a new one
        forks a worker that holds the models resident now."""
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
        internals.end_workers(stale)

    def _take_stale_locked(self) -> list[int]:
        stale = [g for n, g in self._generations.items() if n < self._current and g.inflight == 0]
        for gen in stale:
            del self._generations[gen.number]
            internals.forget_decorated(gen.task, gen.call)  # frees its worker handles
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


def _spaces_call(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, with spaces' own errors (a refused schedule, an aborted worker) turned into
    :class:`~sapiens2.errors.GpuUnavailableError`."""
    try:
        return fn(*args)
    except Sapiens2Error:
        raise
    except Exception as err:
        if not internals.is_refusal(err):
            raise
        raise gpu_unavailable(
            str(getattr(err, "title", "") or ""), str(getattr(err, "message", err))
        ) from None


#: ``os.fork`` of a worker start failing for memory or processes (the call never reached a GPU)
_START_ERRNOS = frozenset({errno.ENOMEM, errno.EAGAIN})
#: Seconds before the one retry of a failed worker start (memory freed by the last call settles)
START_RETRY_PAUSE_S = 1.0


def _start_failed(err: OSError, *, again: bool) -> None:
    """A GPU call's worker did not start (``err`` from spaces, in this process). Returns after a
    short pause when the caller may try ``again``; else raises GpuUnavailableError: the GPU is
    unavailable for now, in one sentence. Any other OSError passes through unchanged."""
    if err.errno not in _START_ERRNOS:
        raise err
    log.warning("the GPU worker could not start (%s)%s", err, "; trying once more" if again else "")
    if again:
        gc.collect()
        time.sleep(START_RETRY_PAUSE_S)
        return
    raise GpuUnavailableError(
        "The GPU is unavailable right now (its worker could not start on this server); try again in a moment."
    ) from None


def _portable(err: Exception) -> Exception:
    """``err`` if it survives pickling (the way back to the server), else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(err))
    except Exception:
        return RuntimeError(f"{type(err).__name__}: {err}")
    return err


__all__ = ["GpuEntry", "cuda_emulation", "in_gpu_worker", "resident_changed"]
