"""A switch that forbids loading weights, for code that must only use models already resident.

On ZeroGPU the GPU function runs in a worker process forked from the server, billed to the
visitor's GPU quota: loading a checkpoint there would spend that quota on disk reads, and a
worker forked before the server loaded a model does not have it at all. The server loads what a
request needs first, then calls the GPU function inside :func:`loading_forbidden`; every place
that reads weights calls :func:`check_loading_allowed`, so a missing model is a clear error
instead of a silent load.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from .errors import NotResidentError

_FORBIDDEN: ContextVar[str | None] = ContextVar("sapiens2_loading_forbidden", default=None)


@contextmanager
def loading_forbidden(where: str = "a GPU function") -> Iterator[None]:
    """Inside this block (this thread/context only), loading any weights raises NotResidentError."""
    token = _FORBIDDEN.set(where)
    try:
        yield
    finally:
        _FORBIDDEN.reset(token)


def check_loading_allowed(what: str) -> None:
    """Raise NotResidentError naming ``what`` when called inside :func:`loading_forbidden`."""
    where = _FORBIDDEN.get()
    if where is not None:
        raise NotResidentError(
            f"{what} is not loaded in {where}, which never loads weights: the server process must load it "
            "before the call. This is a bug in the server; please report it. Trying again may work."
        )


__all__ = ["check_loading_allowed", "loading_forbidden"]
