"""The CPUs this process may use, and pools of one thread per CPU for work that splits into
independent pieces (PNG blocks, seg's label rows). No torch here: the file writers use it too.

A process that shares its machine under a scheduler (a Ray task or actor given 1 of 16 CPUs) sets
a CPU budget: :func:`set_cpu_budget`, or ``$SAPIENS2_CPUS`` for a process started with it. The
budget caps :func:`available_cpus`, so the pools here and torch's thread count
(``runtime.threads.configure_cpu_threads``) stay within what the scheduler gave; without it, every
such process would start a thread per host CPU."""

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


#: Env var holding this process's CPU budget (a number; fractions round up), read when no budget
#: was set in the process itself.
CPU_BUDGET_ENV = "SAPIENS2_CPUS"

_budget: int | None = None


def _cpus(value: float | str) -> int:
    """A budget as whole CPUs: fractions round up (a 0.5-CPU share still runs one thread), >= 1."""
    n = float(value)
    if not math.isfinite(n) or n <= 0:
        raise ValueError(f"a CPU budget must be a positive number; got {value!r}")
    return max(1, math.ceil(n))


def cpu_budget() -> int | None:
    """The CPU budget of this process: set by :func:`set_cpu_budget`, else ``$SAPIENS2_CPUS``
    (ignored when it is not a positive number), else None (no budget)."""
    if _budget is not None:
        return _budget
    raw = os.environ.get(CPU_BUDGET_ENV, "").strip()
    try:
        return _cpus(raw) if raw else None
    except ValueError:
        return None


def set_cpu_budget(cpus: float | None) -> int | None:
    """Cap this process at ``cpus`` CPUs (None: no cap but the machine's); returns the budget in
    whole CPUs. Pools made under another size are let go (their queued work still runs), so the
    next :func:`cpu_pool` call makes one of the new size."""
    global _budget
    budget = None if cpus is None else _cpus(cpus)
    with _pools_lock:
        _budget = budget
        old = list(_POOLS.values())
        _POOLS.clear()
    for pool in old:
        pool.shutdown(wait=False)
    return budget


def available_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup CPU quota and by the
    CPU budget (:func:`cpu_budget`); at least 1."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS / Windows have no affinity call
        n = os.cpu_count() or 1
    limit = _cgroup_cpu_limit()
    if limit is not None:
        n = min(n, math.ceil(limit))  # a 1.5-CPU quota still runs two threads usefully
    budget = cpu_budget()
    if budget is not None:
        n = min(n, budget)
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
