"""The process-level settings a server needs: OpenMP teams let go after a request
(``serving.release_cpu_threads``) and glibc's heap kept across a request's temporaries
(``sapiens2.runtime.heap``). Both are measured on the live process, not assumed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from sapiens2 import serving
from sapiens2.runtime.threads import openmp_function

ROOT = Path(__file__).resolve().parents[1]
LINUX = sys.platform.startswith("linux")


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not LINUX, reason="counts threads in /proc")
@pytest.mark.skipif(
    openmp_function("omp_pause_resource_all") is None, reason="no OpenMP runtime with omp_pause_resource_all"
)
def test_release_cpu_threads_lets_the_calling_threads_openmp_team_go() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the tests run torch on one thread (conftest): a team needs two
    try:
        _check_team_released()
    finally:
        torch.set_num_threads(threads)


def _check_team_released() -> None:
    x = torch.ones(1 << 22)
    seen: list[int] = []

    def settled(base: int) -> int:  # OpenMP workers leave asynchronously
        deadline = time.monotonic() + 30  # returns as soon as they are gone; wide for a busy machine
        while _threads() > base and time.monotonic() < deadline:
            time.sleep(0.01)
        return _threads() - base

    def request() -> None:  # like a request on a server's pool thread, which never exits
        base = _threads()
        x.mul_(1.0)  # big enough for a parallel region: this thread's team starts
        time.sleep(0.05)
        seen.append(_threads() - base)  # the team outlives the work
        serving.release_cpu_threads()
        seen.append(settled(base))
        x.mul_(2.0)  # torch still works: a new team
        seen.append(_threads() - base)
        serving.release_cpu_threads()
        seen.append(settled(base))

    worker = threading.Thread(target=request)
    worker.start()
    worker.join()
    assert seen[0] >= 1 and seen[2] >= 1
    assert seen[1] == 0 and seen[3] == 0
    assert float(x.sum()) == 2.0 * (1 << 22)


_HEAP_PROBE = textwrap.dedent(
    """
    import resource, sys, threading
    import numpy as np
    sys.path.insert(0, {root!r})
    from sapiens2.runtime import heap
    configured = heap.configure() if sys.argv[1] == "on" else False
    faults = []

    def request():
        for _ in range(3):  # a 12 MP float32 plane, allocated, touched and freed, three times
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            a = np.empty(12_000_000, np.float32)
            a.fill(1.0)
            del a
            faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)

    t = threading.Thread(target=request)
    t.start()
    t.join()
    print(configured, *faults)
    """
)


@pytest.mark.subprocess
@pytest.mark.skipif(not LINUX, reason="glibc's mallopt")
def test_heap_configure_lets_a_threads_big_temporaries_reuse_touched_pages() -> None:
    def probe(mode: str) -> tuple[str, list[int]]:
        code = _HEAP_PROBE.format(root=str(ROOT))
        out = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, check=True)
        flag, *faults = out.stdout.split()
        return flag, [int(f) for f in faults]

    flag, on = probe("on")
    if flag != "True":
        pytest.skip("not glibc: heap.configure does nothing")
    _, off = probe("off")
    assert on[0] > 10 and off[0] > 10  # the first use faults the pages in (4 kB or 2 MB ones)
    # default glibc: a 48 MB block is mmapped and unmapped each time, so every use faults anew
    assert min(off[1:]) > off[0] / 2
    # configured: later uses find the pages in the heap
    assert max(on[1:]) < on[0] / 10
