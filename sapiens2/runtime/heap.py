"""glibc's heap set up for a server whose requests allocate and free arrays of hundreds of MB.

By default glibc gives every block over 32 MB its own ``mmap`` and a worker thread's arena holds
none over 64 MB, so every 48-144 MB temporary of a 12 MP request would start on fresh pages the
kernel must fault in (the figures: docs/PERFORMANCE.md, "Threads and pages").

:func:`configure` makes the process keep one heap that all threads share and that is never
unmapped block by block, so a request's temporaries reuse pages it has already touched. The
memory goes back to the system once the free heap has grown by more than :data:`KEEP_FREE_BYTES`
since the last trim (:func:`release_memory` runs ``malloc_trim``); up to that much stays mapped
for the next request. Outside glibc (macOS, musl) this does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading
from collections.abc import Callable

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8
#: free memory kept at the top of the heap before glibc gives it back by itself; the explicit
#: trim after each request gives back the rest
TRIM_THRESHOLD = 1 << 30

_done = False


def configure() -> bool:
    """Apply the settings once per process; True when glibc took them. Call it first thing, before
    any thread allocates: the one-arena setting only holds for arenas not created yet."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # one arena: a worker thread's own arena would mmap every block over 64 MB anyway; no mmap
    # per block: freed blocks stay in the heap for the next temporary; and no self-trimming
    # inside a request
    _done = all(
        mallopt(param, value) == 1
        for param, value in ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    )
    return _done


#: Free heap a server keeps mapped between requests, so a request's temporaries reuse pages the
#: process holds instead of faulting in fresh ones (docs/PERFORMANCE.md, "The last round").
KEEP_FREE_BYTES = 1 << 30


def release_memory(keep_bytes: int = KEEP_FREE_BYTES) -> None:
    """Give the heap memory freed by finished requests back to the operating system, once the free
    heap has grown by more than ``keep_bytes`` since the last time (0: always); nothing outside glibc.

    glibc keeps freed pages, so without a trim a server's memory climbs with every burst
    (docs/RELIABILITY.md). The growth decides, not the total: freed blocks stay counted as free
    after a trim took their pages.
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


__all__ = ["KEEP_FREE_BYTES", "configure", "heap_free_bytes", "release_memory"]
