"""A switch that forbids loading weights, for code that must only use models already resident.

On ZeroGPU the GPU function runs in a worker process forked from the server, billed to the
visitor's GPU quota: loading a checkpoint there would spend that quota on disk reads and be lost
with the worker, and a worker forked before the server loaded a model does not have it at all.
The server loads what a request needs first, then makes the device call inside
:func:`loading_forbidden` (the same rule holds off ZeroGPU, so it is tested on any machine), and a
ZeroGPU worker forbids loading for its whole life. Every place that reads weights calls
:func:`check_loading_allowed`, so a missing model is a clear error instead of a silent load.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from ..errors import ResidencyError
from . import entry as zerogpu

_FORBIDDEN: ContextVar[str | None] = ContextVar("sapiens2_loading_forbidden", default=None)


@contextmanager
def loading_forbidden(where: str = "a GPU function") -> Iterator[None]:
    """Inside this block (this thread/context only), loading any weights raises ResidencyError."""
    token = _FORBIDDEN.set(where)
    try:
        yield
    finally:
        _FORBIDDEN.reset(token)


def check_loading_allowed(what: str) -> None:
    """Raise ResidencyError naming ``what`` inside :func:`loading_forbidden` or a ZeroGPU worker."""
    where = _FORBIDDEN.get() or ("a ZeroGPU worker" if zerogpu.in_gpu_worker() else None)
    if where is not None:
        raise ResidencyError(
            f"Refused to load {what} in {where}. The server process loads every model a request needs "
            "before the device call; loading here would spend the visitor's GPU time and, on ZeroGPU, "
            "be lost with the worker. This is a bug in the server; please report it."
        )


__all__ = ["check_loading_allowed", "loading_forbidden"]
