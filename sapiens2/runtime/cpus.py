"""The CPUs this process may use, and pools of one thread per CPU for work that splits into
independent pieces (PNG blocks, seg's label rows). No torch here: the file writers use it too."""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def _cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs allowed by the container's cgroup quota (v2 ``cpu.max`` or v1 CFS files), else None."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError):
        return None


def available_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup CPU quota; at least 1."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS / Windows have no affinity call
        n = os.cpu_count() or 1
    limit = _cgroup_cpu_limit()
    if limit is not None:
        n = min(n, math.ceil(limit))  # a 1.5-CPU quota still runs two threads usefully
    return max(1, n)


_POOLS: dict[str, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def cpu_pool(
    name: str, initializer: Callable[..., object] | None = None, initargs: tuple = ()
) -> ThreadPoolExecutor:
    """The process's pool ``name``: a thread per usable CPU (``sapiens2-<name>-N``, each started
    with ``initializer(*initargs)``), made on first use. Work that splits into independent pieces
    runs on it side by side; a piece must never wait for another piece of the same pool."""
    with _pools_lock:
        pool = _POOLS.get(name)
        if pool is None:
            pool = _POOLS[name] = ThreadPoolExecutor(
                available_cpus(),
                thread_name_prefix=f"sapiens2-{name}",
                initializer=initializer,
                initargs=initargs,
            )
        return pool


def _forget_pools() -> None:
    """In a forked child: the parent's pool threads do not exist there, so it makes its own."""
    global _pools_lock
    _POOLS.clear()
    _pools_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_pools)
