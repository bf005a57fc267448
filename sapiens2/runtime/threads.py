"""torch's CPU threads: :func:`configure_cpu_threads` caps them at the CPUs this process may use
(a container with a 2-CPU quota on a 64-core host would otherwise run 64 threads on 2 CPUs), and
:func:`openmp_function` reaches the OpenMP runtime for what torch does not expose (a thread's own
thread count, letting idle workers go)."""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Callable

import torch

from .cpus import available_cpus

_THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
_threads_lock = threading.Lock()
_threads_done = False


@functools.cache
def openmp_function(name: str) -> Callable[[int], int] | None:
    """``name`` (one int argument, an int result: ``omp_set_num_threads``,
    ``omp_pause_resource_all``) from the OpenMP runtime torch was built with, None where the
    process has no such function (another runtime, or none)."""
    try:
        fn = getattr(ctypes.CDLL(None), name)  # torch, imported above, loaded the runtime
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    return fn


def configure_cpu_threads() -> int:
    """Once per process: lower torch's intra-op thread count to :func:`available_cpus` when it is
    higher. Never raises the count (a caller's ``torch.set_num_threads`` wins) and leaves it alone
    when ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` is set. Returns the count in effect."""
    global _threads_done
    with _threads_lock:
        if not _threads_done:
            _threads_done = True
            if not any(os.environ.get(name) for name in _THREAD_ENV):
                cpus = available_cpus()
                if torch.get_num_threads() > cpus:
                    torch.set_num_threads(cpus)
        return torch.get_num_threads()


def release_cpu_threads() -> None:
    """Let the calling thread's OpenMP worker threads go (torch's CPU ops start them on first use);
    nothing where no OpenMP runtime offers ``omp_pause_resource_all``.

    Teams left alive on a server's many request threads outnumber the CPUs, and GNU OpenMP then
    puts idle workers to sleep after every op (docs/PERFORMANCE.md, "Threads and pages").
    """
    pause = openmp_function("omp_pause_resource_all")
    if pause is not None:
        pause(1)  # omp_pause_soft: the calling thread's thread pool only (none in a parallel region)


__all__ = ["configure_cpu_threads", "openmp_function", "release_cpu_threads"]
