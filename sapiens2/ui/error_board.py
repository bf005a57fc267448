"""How an endpoint's outcome is shown: package errors become ``gr.Error`` with a title chosen by
type and the visitor's wording (the operator's details go to the log), notices ``gr.Warning``,
anything else a short error while the server carries on; and the last error of each page session
is kept (:class:`ErrorBoard`) so the tab can show it until the next run.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import gradio as gr

from .. import serving
from ..errors import (
    CheckpointError,
    DeviceError,
    DiskFullError,
    InputImageError,
    InputVideoError,
    OptionError,
    OutOfMemoryError,
    ResidencyError,
    ResultNotFoundError,
    Sapiens2Error,
    VideoEncodeError,
    WeightsUnavailableError,
    for_visitor,
)
from ..serving import ModelManager, trim_after_out_of_memory

log = logging.getLogger("sapiens2.app")

ERROR_TITLES: list[tuple[type[Exception], str]] = [  # the first match wins: subclasses first
    (DiskFullError, "Disk full"),
    (ResidencyError, "Server error"),
    (WeightsUnavailableError, "Weights unavailable"),
    (CheckpointError, "Unusable checkpoint"),
    (InputVideoError, "Video problem"),
    (VideoEncodeError, "Video encoder missing"),
    (InputImageError, "Image problem"),
    (OptionError, "Invalid option"),
    (ResultNotFoundError, "Result not found"),
    (OutOfMemoryError, "Out of GPU memory"),
    (DeviceError, "GPU problem"),
]


def user_error(err: BaseException) -> gr.Error:
    """The visitor's error for a package error: its title by type, its plain wording where it has
    one (the full message, with paths and settings, is logged and kept as ``details`` for a
    local page's operator fold)."""
    title = next((t for cls, t in ERROR_TITLES if isinstance(err, cls)), "Error")
    shown = gr.Error(for_visitor(err), title=title, print_exception=False)
    shown.details = str(err) if for_visitor(err) != str(err) else ""  # type: ignore[attr-defined]
    if shown.details:  # type: ignore[attr-defined]
        log.warning("%s: %s", title, err)
    return shown


@contextmanager
def reported(manager: ModelManager) -> Iterator[None]:
    """Package errors -> gr.Error with their message; anything else -> a short gr.Error (logged).
    Every request ends here, so this is also where its freed memory goes back to the system and
    its thread's idle OpenMP workers are let go (the next request may run on another thread)."""
    try:
        yield
    except gr.Error:
        raise
    except Sapiens2Error as err:
        raise user_error(err) from None
    except Exception as err:
        if trim_after_out_of_memory(manager, err):
            raise gr.Error(
                "Out of memory. Try a smaller model size or a smaller photo.", title="Out of GPU memory"
            ) from None
        log.exception("unexpected error")
        raise gr.Error(
            f"Unexpected error ({type(err).__name__}). The server is still running: try again or another photo.",
            print_exception=False,
        ) from None
    finally:
        serving.release_memory()  # looked up at call time (tests count the calls)
        serving.release_cpu_threads()


_TOLD: set[str] = set()  # notices already shown as a pop-up by this server
_TOLD_LOCK = threading.Lock()


def warn(notices: list[str], prefix: str = "") -> None:
    """A pop-up per notice, once per server for the same words: a standing condition (e.g. the
    person detector's weights are missing) would otherwise cover the page on every run. Every
    notice is also in the result's run info, every time."""
    for notice in notices:
        with _TOLD_LOCK:
            new = notice not in _TOLD
            _TOLD.add(notice)
        if new:
            gr.Warning(f"{prefix}{notice}")


@dataclass(frozen=True)
class Shown:
    """An error as the page keeps it: the text for the tab, and the operator's details (or "")."""

    text: str
    details: str = ""


class ErrorBoard:
    """The last error of each page session and event, until the page asks for it.

    An endpoint records what it raises (:meth:`catching`); the page's ``.failure`` step takes it
    (:meth:`take`) and puts it in the tab. API callers never take theirs: the oldest entries go
    once ``size`` are held."""

    def __init__(self, size: int = 512) -> None:
        self.size = size
        self._items: OrderedDict[tuple[str, str], Shown] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _session(request: Any) -> str | None:
        return getattr(request, "session_hash", None) if request is not None else None

    @contextmanager
    def catching(self, request: Any, event: str, what: str) -> Iterator[None]:
        """Record a gr.Error raised inside (``what`` names the run: "Pose"), then let it go on."""
        try:
            yield
        except gr.Error as err:
            session = self._session(request)
            if session is not None:
                title = f"{err.title}: " if err.title and err.title != "Error" else ""
                shown = Shown(f"{what} did not run. {title}{err.message}", getattr(err, "details", ""))
                with self._lock:
                    self._items[(session, event)] = shown
                    self._items.move_to_end((session, event))
                    while len(self._items) > self.size:
                        self._items.popitem(last=False)
            raise

    def take(self, request: Any, event: str) -> Shown | None:
        with self._lock:
            return self._items.pop((self._session(request), event), None)


#: Errors of every endpoint, per page session (see ErrorBoard); the page shows them in the tab.
BOARD = ErrorBoard()


def shown_error(event: str, operator: bool) -> Callable[..., Any]:
    """The page's ``.failure`` step of ``event``: the error it raised, for the tab's run info,
    then (where ``operator``: a local launch) the operator's fold (visible or not) and its text."""

    def show(request: gr.Request) -> Any:
        shown = BOARD.take(request, event)
        text = shown.text if shown else "The run stopped with an error (see the message that popped up)."
        if not operator:
            return text  # one output: its value
        details = shown.details if shown else ""
        return [text, gr.Accordion(visible=bool(details)), details]

    return show
