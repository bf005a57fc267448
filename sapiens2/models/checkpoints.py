"""Explicit checkpoints per task (fine-tuned or custom weights; the tests' tiny ones): one immutable
:class:`Checkpoints` mapping, built where the program starts from ``--checkpoint TASK=PATH`` and
``$SAPIENS2_TASK_CHECKPOINTS`` and passed down to whatever needs it (which tasks are shown, the
model cache). Each file decides its task's model and a chosen size only checks it
(``sapiens2.models.loading.checkpoint_size_conflict``)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from ..errors import OptionError
from .zoo import TASKS

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")

#: Env var naming per-task checkpoints, e.g. ``pose=/ckpt/pose.safetensors,seg=/ckpt/seg``.
CHECKPOINTS_ENV = "SAPIENS2_TASK_CHECKPOINTS"


def _known(name: str) -> str:
    if name not in TASKS:
        raise OptionError(f"Unknown task {name!r}; choose one of: {', '.join(TASKS)}.")
    return name


#: The one help text of every ``--checkpoint`` flag (the per-task commands, motion, batch, the app).
CHECKPOINT_HELP = (
    "weights instead of the Hub: a .safetensors file or a folder holding one, or an exported .onnx file, "
    "as PATH or TASK=PATH "
    "(a plain PATH is the command's task, or the task its file holds; repeat the flag per task). "
    "The file decides the model; --size, if given, only checks it"
)


def split_spec(spec: str) -> tuple[str | None, str]:
    """``TASK=PATH`` -> (TASK, PATH); a plain ``PATH`` -> (None, PATH). A spec that exists as a file
    or folder is a path even with a ``=`` in it; ``word=...`` with a word that is no task is an
    OptionError (a typo of a task name, not a path)."""
    spec = str(spec).strip()
    head, sep, tail = spec.partition("=")
    if not spec:
        raise OptionError("--checkpoint needs PATH or TASK=PATH.")
    if not sep or Path(spec).expanduser().exists() or not _WORD.fullmatch(head.strip()):
        return None, spec
    if not tail.strip():
        raise OptionError(f"--checkpoint {spec}: give the path after {head.strip()}=.")
    return _known(head.strip()), tail.strip()


def _declared_task(path: str) -> str:
    """The task a checkpoint file's header declares (a plain PATH where several tasks could use it)."""
    from .loading import describe_checkpoint

    found = Path(path).expanduser()
    if not found.exists():  # no file to ask, nor a task named: say both spellings
        raise OptionError(
            f"--checkpoint {path}: no such file or folder. Give an existing PATH, or TASK=PATH with "
            f"TASK one of: {', '.join(TASKS)}."
        )
    return str(describe_checkpoint(found)["task"])


class Checkpoints(Mapping[str, Path]):
    """Task name -> checkpoint file or folder; immutable. Names are the zoo's (a registered task
    adds its row), checked when the mapping is made."""

    def __init__(self, paths: Mapping[str, str | os.PathLike] | None = None) -> None:
        self._paths = {_known(str(t)): Path(p).expanduser() for t, p in (paths or {}).items()}

    @classmethod
    def parse(cls, specs: Iterable[str] | str | None, tasks: Iterable[str] | None = None) -> Checkpoints:
        """``["pose=/p1", "seg=/p2"]`` or ``"pose=/p1,seg=/p2"``; each spec is ``TASK=PATH`` or a plain
        ``PATH`` (see :func:`split_spec`). A plain path belongs to the one task of ``tasks`` when it
        names one, else to the task its file's header declares. ``tasks`` (when given) are the tasks
        the command runs: a checkpoint for another one is an OptionError, as is a malformed spec, an
        unknown task, or a plain path that does not exist where the file must say its task."""
        if specs is None:
            return cls()
        if isinstance(specs, str):
            specs = [s for s in specs.split(",") if s.strip()]
        allowed = None if tasks is None else list(dict.fromkeys(tasks))
        out: dict[str, str] = {}
        for spec in specs:
            task, path = split_spec(spec)
            if task is None:
                task = allowed[0] if allowed is not None and len(allowed) == 1 else _declared_task(path)
            if allowed is not None and task not in allowed:
                raise OptionError(
                    f"--checkpoint {spec}: a {task} checkpoint, and this command runs {', '.join(allowed)}."
                )
            out[task] = path
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


__all__ = ["CHECKPOINTS_ENV", "CHECKPOINT_HELP", "Checkpoints", "split_spec"]
