"""A worker process's CPUs: the package's pools, torch's threads and OpenCV's threads all kept to
the CPUs the scheduler gave the process (a Ray task or actor), never one thread per host CPU."""

from __future__ import annotations

import math

from ..runtime import cpus


def use_cpus(n: float) -> int:
    """Run this process's CPU work on ``n`` CPUs (fractions round up); returns the whole count.
    Cheap when the budget is already ``n``."""
    want = max(1, math.ceil(float(n)))
    if cpus.cpu_budget() != want:
        cpus.set_cpu_budget(want)
    import cv2
    import torch

    if torch.get_num_threads() != want:
        torch.set_num_threads(want)
    if cv2.getNumThreads() != want:
        cv2.setNumThreads(want)
    return want


def use_ray_allotment(default: float = 1.0) -> int:
    """:func:`use_cpus` with the CPUs Ray assigned to the calling task or actor (``default`` when
    it was given none, e.g. ``num_cpus=0``)."""
    import ray

    assigned = ray.get_runtime_context().get_assigned_resources().get("CPU") or default
    return use_cpus(assigned)
