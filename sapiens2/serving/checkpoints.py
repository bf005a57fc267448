"""Explicit per-task checkpoints for a server: ``pose=/ckpt/pose.safetensors,seg=/ckpt/seg``.

Each file decides its task's model and a chosen size only checks it, as in ``load_model`` and the
CLI (``sapiens2.models.loading.checkpoint_size_conflict``; ``ModelManager`` applies it per request)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ..errors import OptionError
from ..tasks import registry

#: Env var naming per-task checkpoints, e.g. ``pose=/ckpt/pose.safetensors,seg=/ckpt/seg``.
CHECKPOINTS_ENV = "SAPIENS2_TASK_CHECKPOINTS"


def task_name(task: str) -> str:
    """The zoo name of a task from its zoo or API name (``features`` -> ``pretrain``)."""
    return registry.get(task).name


def parse_checkpoint_specs(specs: Iterable[str] | str | None) -> dict[str, Path]:
    """``["pose=/p1", "seg=/p2"]`` or ``"pose=/p1,seg=/p2"`` -> ``{"pose": Path, "seg": Path}``."""
    if specs is None:
        return {}
    if isinstance(specs, str):
        specs = [s for s in specs.split(",") if s.strip()]
    out: dict[str, Path] = {}
    for spec in specs:
        task, sep, path = spec.partition("=")
        if not sep or not task.strip() or not path.strip():
            names = ", ".join(t.api_name for t in registry.all_tasks().values())
            raise OptionError(f"Checkpoint spec {spec!r} must look like TASK=PATH with TASK one of: {names}.")
        out[task_name(task.strip())] = Path(path.strip()).expanduser()
    return out


def checkpoints_from_env() -> dict[str, Path]:
    """Per-task checkpoints named by ``$SAPIENS2_TASK_CHECKPOINTS`` (empty when unset)."""
    return parse_checkpoint_specs(os.environ.get(CHECKPOINTS_ENV, ""))
