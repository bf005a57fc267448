"""After a request: heap pages back to the OS, idle CPU threads let go, accelerator caches,
out-of-memory errors."""

from __future__ import annotations

import ctypes
import functools
import gc
import sys
import threading
from collections.abc import Callable

from ..errors import OutOfMemoryError
from ..models.zoo import TaskSpec, is_v1

#: Free heap a server keeps mapped between requests. A request's temporaries then find pages the
#: process already holds instead of the kernel faulting in (zeroing, and for numpy's huge pages
#: compacting) fresh ones: on the 2-CPU test machine that was 0.3-0.5 s of a served 12 MP pointmap
#: request, whose temporaries leave ~0.6 GB free at its end (docs/PERFORMANCE.md, "The last
#: round"). More than this (a 48 MP photo frees ~2.3 GB) all goes back to the system at once.
KEEP_FREE_BYTES = 1 << 30


def release_memory(keep_bytes: int = KEEP_FREE_BYTES) -> None:
    """Give the heap memory freed by finished requests back to the operating system, once the free
    heap has grown by more than ``keep_bytes`` since the last time (0: always).

    Request buffers (photos, model outputs, renders) are freed, but glibc keeps their pages, and a
    server runs requests on many threads: without a trim its resident memory climbs with every
    burst (docs/RELIABILITY.md). ``malloc_trim`` returns every
    free page in milliseconds, so the trim waits until that much more is free: up to
    ``keep_bytes`` stays warm for the next request (see :data:`KEEP_FREE_BYTES`). The growth, not
    the total, decides: after a trim the free blocks stay counted as free (their pages are gone),
    so after one very large request the total alone would call for a trim every time.
    Outside glibc this does nothing.
    """
    global _free_after_trim
    trim = _malloc_trim()
    if trim is None:
        return
    with _TRIM_LOCK:
        free = heap_free_bytes()
        if keep_bytes > 0 and free is not None and free <= _free_after_trim + keep_bytes:
            return
        trim(0)
        _free_after_trim = heap_free_bytes() or 0


_TRIM_LOCK = threading.Lock()
#: free heap bytes right after the last trim: none of it resident then
_free_after_trim = 0


class _MallInfo2(ctypes.Structure):  # glibc's struct mallinfo2 (2.33+): every field a size_t
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                     "fordblks", "keepcost")
    ]  # fmt: skip


def heap_free_bytes() -> int | None:
    """Bytes free in glibc's heap (every arena: ``mallinfo2().fordblks``), None where unknown."""
    info = _mallinfo2()
    return None if info is None else int(info().fordblks)


@functools.cache
def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):  # not glibc, or older than 2.33
        return None
    fn.argtypes, fn.restype = [], _MallInfo2
    return fn


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc; musl and others have no such function
    except (OSError, AttributeError):
        return None


def release_cpu_threads() -> None:
    """Let the calling thread's OpenMP worker threads go (torch's CPU ops start them on first use).

    Every thread that runs torch ops keeps its own team of OpenMP workers, and a server runs
    requests on many threads. Once the workers alive outnumber the CPUs, GNU OpenMP stops letting
    idle workers spin and puts them to sleep after each op, so every op pays a wake-up
    (docs/PERFORMANCE.md, "Threads and pages"). Freeing the team when a thread's work ends keeps one
    team alive; the next op builds a new one in microseconds. Where no OpenMP runtime offers
    ``omp_pause_resource_all`` this does nothing.
    """
    from ..runtime.threads import openmp_function

    pause = openmp_function("omp_pause_resource_all")
    if pause is not None:
        pause(1)  # omp_pause_soft: the calling thread's thread pool only (none in a parallel region)


def free_accelerator_memory() -> None:
    gc.collect()
    import torch

    # Only when CUDA really runs in this process (under ZeroGPU the main process only emulates it).
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def is_out_of_memory(err: BaseException) -> bool:
    """True for a CUDA/accelerator out-of-memory error (torch's type, or its message)."""
    if isinstance(err, MemoryError):  # ours (OutOfMemoryError) is one too
        return True
    import torch

    if isinstance(err, torch.cuda.OutOfMemoryError):
        return True
    # other backends and older builds raise a RuntimeError that only says so in its message
    text = f"{type(err).__name__} {err}".lower()
    return "out of memory" in text or "outofmemoryerror" in text


def out_of_memory(spec: TaskSpec, size: str) -> OutOfMemoryError:
    """The error for an out-of-memory run of a task (its zoo row), advising a smaller size when one
    exists."""
    sizes = spec.sizes
    # the sizes listed before it, of its own generation (Sapiens2's, or Sapiens v1's ``v1-*``)
    smaller = [s for s in sizes[: sizes.index(size)] if is_v1(s) == is_v1(size)] if size in sizes else []
    advice = f"choose a smaller size ({', '.join(smaller)})" if smaller else "use a smaller photo"
    return OutOfMemoryError(
        f"Out of GPU memory running {spec.name} {size}. The model cache was trimmed; try again, or {advice}."
    )
