"""Explicit checkpoints per task (fine-tuned or custom weights; the tests' tiny ones): one immutable
:class:`Checkpoints` mapping, built where the program starts from ``--checkpoint TASK=PATH`` and
``$SAPIENS2_TASK_CHECKPOINTS`` and passed down to whatever needs it (which tasks are shown, the
model cache). Each file decides its task's model and a chosen size only checks it
(``sapiens2.models.loading.checkpoint_size_conflict``)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from ..errors import OptionError
from .zoo import TASKS

#: Env var naming per-task checkpoints, e.g. ``pose=/ckpt/pose.safetensors,seg=/ckpt/seg``.
CHECKPOINTS_ENV = "SAPIENS2_TASK_CHECKPOINTS"


def _known(name: str) -> str:
    if name not in TASKS:
        raise OptionError(f"Unknown task {name!r}; choose one of: {', '.join(TASKS)}.")
    return name


class Checkpoints(Mapping[str, Path]):
    """Task name -> checkpoint file or folder; immutable. Names are the zoo's (a registered task
    adds its row), checked when the mapping is made."""

    def __init__(self, paths: Mapping[str, str | os.PathLike] | None = None) -> None:
        self._paths = {_known(str(t)): Path(p).expanduser() for t, p in (paths or {}).items()}

    @classmethod
    def parse(cls, specs: Iterable[str] | str | None) -> Checkpoints:
        """``["pose=/p1", "seg=/p2"]`` or ``"pose=/p1,seg=/p2"``; OptionError for a malformed
        spec or an unknown task."""
        if specs is None:
            return cls()
        if isinstance(specs, str):
            specs = [s for s in specs.split(",") if s.strip()]
        out: dict[str, str] = {}
        for spec in specs:
            task, sep, path = spec.partition("=")
            if not sep or not task.strip() or not path.strip():
                raise OptionError(
                    f"Checkpoint spec {spec!r} must look like TASK=PATH with TASK one of: {', '.join(TASKS)}."
                )
            out[task.strip()] = path.strip()
        return cls(out)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Checkpoints:
        """The checkpoints ``$SAPIENS2_TASK_CHECKPOINTS`` names (empty when unset)."""
        return cls.parse((os.environ if environ is None else environ).get(CHECKPOINTS_ENV, ""))

    def __or__(self, other: Mapping[str, str | os.PathLike]) -> Checkpoints:
        """These checkpoints with ``other``'s added (``other`` wins for a task in both)."""
        return Checkpoints({**self._paths, **dict(other)})

    def found(self, task: str) -> bool:
        """A checkpoint is named for ``task`` and exists."""
        return task in self._paths and self._paths[task].exists()

    def __getitem__(self, task: str) -> Path:
        return self._paths[task]

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)

    def __repr__(self) -> str:
        return f"Checkpoints({self._paths!r})"


__all__ = ["CHECKPOINTS_ENV", "Checkpoints"]
