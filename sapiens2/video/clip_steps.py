"""A clip's device work as steps: the forwards of prepared batches, wherever they run.

:class:`Steps` is what :class:`~sapiens2.video.clip_runner.ClipRun` asks for the forwards (this
process: :class:`LocalSteps`; a server's GPU call: ``sapiens2.serving.clip_call``);
:func:`budget_stop` is the one rule for ending a call before its reservation runs out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from ..inputs.intake import Intake

Infer = Callable[..., list]  # (preps, **options) -> raws: the batch's device work


class OneCallPerFrame:
    """The three stages over a single-call pipeline ``pipe(intake, **options) -> result``."""

    def __init__(self, pipe: Any) -> None:
        self.pipe = pipe

    def prepare(self, intake: Intake, **options: Any) -> tuple[Intake, dict[str, Any]]:
        return intake, options

    def infer(self, preps: list[tuple[Intake, dict[str, Any]]], **_: Any) -> list[Any]:
        return [self.pipe(intake, **options) for intake, options in preps]

    def finish(self, raw: Any, intake: Intake, **_: Any) -> Any:
        return raw


def staged(pipe: Any) -> Any:
    """The pipeline itself when it has prepare/infer/finish, else :class:`OneCallPerFrame`."""
    if all(callable(getattr(pipe, n, None)) for n in ("prepare", "infer", "finish")):
        return pipe
    return OneCallPerFrame(pipe)


class ClipStopped(Exception):
    """Raised by :class:`Steps` when the device call ends before its work is done (its
    reservation was about to run out): the frames done are kept, with ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def budget_stop(budget_s: float | None, elapsed_s: float, last_s: float) -> str | None:
    """Why to stop before the next step of device work, or None to go on: with ``budget_s``
    seconds of work allowed, ``elapsed_s`` done and the last step taking ``last_s``, the next
    one (counted 1.5 times) would pass the budget. The one rule of a local run's own check
    (:class:`ClipRun`) and of a clip's GPU call (``sapiens2.serving.device.Clip``)."""
    if budget_s is not None and elapsed_s + 1.5 * last_s > budget_s:
        return f"the GPU time reserved ({budget_s:.0f} s of work) was about to run out"
    return None


class Steps(Protocol):
    """A clip's device work, wherever it runs (this process, or a server's one GPU call): the
    forwards of prepared batches and the person detections. Nothing else crosses."""

    def stream(
        self, batches: list[list[Any]], options: Mapping[str, Any], last: bool = False
    ) -> Iterator[list[Any]]:
        """Every batch's raws, in order, as each forward is done (batches known in advance).
        ``last``: no device step follows these (a GPU call may end after them)."""
        ...

    def send(self, preps: list[Any], options: Mapping[str, Any], last: bool = False) -> None:
        """Start one batch's forward; :meth:`receive` gives its raws."""
        ...

    def receive(self) -> list[Any]: ...


class LocalSteps:
    """:class:`Steps` in this process: ``infer`` (default: the pipeline's) called directly."""

    def __init__(self, infer: Infer) -> None:
        self.infer = infer
        self._raws: list[Any] = []

    def stream(
        self, batches: list[list[Any]], options: Mapping[str, Any], last: bool = False
    ) -> Iterator[list[Any]]:
        for preps in batches:
            yield list(self.infer(preps, **options))

    def send(self, preps: list[Any], options: Mapping[str, Any], last: bool = False) -> None:
        self._raws = list(self.infer(preps, **options))

    def receive(self) -> list[Any]:
        return self._raws
