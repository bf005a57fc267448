"""The memory each Ray step asks for (Ray's ``memory`` resource), so Ray does not pack more of them
onto a node than its memory holds; Ray requests none unless told.

* a forward actor: a worker process, the weights of its model and of those it borrows (the
  checkpoint's tensors, or the zoo's parameter count, in the job's dtype), and its forward: on a
  CPU the budget :mod:`sapiens2.models.forward_memory` plans a forward for (its per-input estimate
  from the model's widths, capped by the host's share), on a GPU the batch's outputs on the host;
* a read or write step: a worker process and one batch of decoded working copies (at most
  ``max_side`` on the long side, RGB, and one copy while preparing).

Each figure is capped at the largest node's memory, where a larger request could never run.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from ..models import forward_memory
from ..models.zoo import ARCHS
from .job import BatchJob, ModelPlan, TaskPlan

#: A worker process with torch, pyarrow, OpenCV, Ray Data and the package imported.
PROCESS_BYTES = 1 << 30


def _arch(model: ModelPlan) -> tuple[Any, int | None]:
    """(a stand-in model :func:`forward_memory.item_bytes` reads widths from, the parameter count)."""
    if model.checkpoint is not None:
        from ..models.nn.model import arch_from_shapes
        from ..models.weights import _pick_in_folder, read_header

        path = Path(model.checkpoint)
        try:
            shapes = read_header(_pick_in_folder(path, ()) if path.is_dir() else path)
        except Exception:  # not readable here (a path of the cluster's): the zoo's figures below
            shapes = None
        if shapes is not None:
            params = sum(math.prod(s) for s in shapes.values())
            return SimpleNamespace(arch=arch_from_shapes(shapes), size=model.size), params
    zoo = ARCHS.get(model.size or "")
    return SimpleNamespace(size=model.size), (int(zoo.params_b * 1e9) if zoo else None)


def forward_actor_bytes(plan: TaskPlan, network_hw: tuple[int, int], job: BatchJob, gpu: bool) -> int:
    """Host memory one forward actor of ``plan`` needs (see the module docstring)."""
    dtype = getattr(torch, job.dtype)
    total = PROCESS_BYTES
    per_input = 0
    for i, model in enumerate((plan.model, *plan.borrowed)):
        stand_in, params = _arch(model)
        total += (params or forward_memory.UNKNOWN_ITEM_BYTES) * dtype.itemsize
        if i == 0:
            per_input = forward_memory.item_bytes(stand_in, network_hw, dtype)
    if gpu:  # activations on the device; on the host, the batch's inputs and float32 outputs
        total += job.batch_size * 2 * network_hw[0] * network_hw[1] * 3 * 4
    else:
        total += min(forward_memory.host_budget(), forward_memory.MAX_ITEMS * per_input)
    return int(total)


def cpu_step_bytes(job: BatchJob) -> int:
    """Host memory of a read or write step: a process and a batch of working copies."""
    side = job.max_side
    return PROCESS_BYTES + job.batch_size * side * side * 3 * 2


def capped(wanted: int, nodes: list[dict[str, Any]]) -> int:
    """``wanted``, at most the largest node's ``memory`` resource (0 where none says)."""
    largest = max((n["Resources"].get("memory", 0) for n in nodes), default=0)
    return int(min(wanted, largest)) if largest else int(wanted)
