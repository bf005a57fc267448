"""Shared fixtures: tiny random checkpoints built once per test session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

_TESTS = Path(__file__).resolve().parent
for _p in (_TESTS, _TESTS.parent):  # `import tiny_checkpoints` and `import sapiens2` without installing
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from tiny_checkpoints import all_task_names, make_tiny_checkpoint, make_tiny_detr  # noqa: E402

# Tiny models are dominated by small element-wise ops; on a shared or small CPU extra threads
# mostly wait on each other (measured here: one 200k-element multiply 80x slower with 2 threads
# on a loaded 2-core machine). One thread keeps the suite fast and its timings steady.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """task -> folder holding a tiny checkpoint (model.safetensors; + config.json where transformers
    wrote it), for every zoo task."""
    root = tmp_path_factory.mktemp("tiny_checkpoints")
    return {task: make_tiny_checkpoint(task, root / task, seed=i) for i, task in enumerate(all_task_names())}


@pytest.fixture(scope="session")
def tiny_detr(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding a tiny random DETR person detector (model.safetensors + config.json)."""
    folder = tmp_path_factory.mktemp("tiny_detr")
    make_tiny_detr(folder)
    return folder


@pytest.fixture(scope="session")
def space_checkpoints(tiny_checkpoints: dict[str, Path]) -> dict[str, Path]:
    """The tiny checkpoints of the tasks the Space shows (those on the Hub): a server given a
    checkpoint for a task off the Hub (albedo) shows that task too."""
    from sapiens2.models.zoo import TASKS

    return {task: path for task, path in tiny_checkpoints.items() if TASKS[task].on_hub}


_SLOW_KINDS = ("browser", "subprocess", "ray")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A browser, subprocess or Ray test is slow too, so `-m "not slow"` leaves it out."""
    for item in items:
        if any(item.get_closest_marker(kind) for kind in _SLOW_KINDS) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker per usable CPU, at most 4 (each holds torch, Gradio and a tiny model
    set; beyond 4 the browser and Ray tests' own processes compete for the same cores)."""
    import os

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(4, cpus))
