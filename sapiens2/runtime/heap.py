"""glibc's heap set up for a server whose requests allocate and free arrays of hundreds of MB.

By default glibc gives every block over 32 MB its own ``mmap`` and unmaps it on ``free``, and a
worker thread's arena cannot hold a block over 64 MB at all. A 12 MP photo's arrays are 48-144 MB,
so every temporary of a request (a resize, a mask, an edge test of the mesh) starts on fresh pages
that the kernel must fault in and zero -- or, where numpy asks for huge pages, compact memory for.
On the 2-CPU test machine that was 1.5 s of a 4 s pointmap request spent in the kernel
(docs/PERFORMANCE.md, "Threads and pages").

:func:`configure` makes the process keep one heap that all threads share and that is never
unmapped block by block, so a request's temporaries reuse pages it has already touched. The
memory goes back to the system once the free heap has grown by more than
``serving.memory.KEEP_FREE_BYTES`` since the last trim (``serving.release_memory`` runs
``malloc_trim``); up to that much stays mapped for the next request. Outside glibc (macOS, musl) this does nothing.
"""

from __future__ import annotations

import ctypes
import sys

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


__all__ = ["configure"]
