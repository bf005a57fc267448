"""Writing a result's files: the output folder made on demand, and writes that can be handed to
a thread pool (:func:`deferred_writes`), so one result's files are written side by side.

Every writer of :mod:`sapiens2.outputs.export` and :mod:`sapiens2.outputs.mesh` checks its input in the calling
thread (raising at once, as always) and passes the encoding and writing to :func:`write_or_defer`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

#: Threads writing one result's files (PNG/JPEG encoding and np.save release the GIL): enough for
#: matting's three PNGs at once. They gain where cores are free; on a CPU already kept busy by
#: other work they cost a few per cent (cache, page faults) against writing one after another.
WRITE_WORKERS = 3


def prepare(path: str | Path) -> Path:
    """``path`` as a Path, its folder created."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


#: The pool and the jobs of the innermost ``deferred_writes`` of this thread (a ContextVar, so
#: concurrent requests, each in its own thread or context, never share one).
_DEFERRED: ContextVar[tuple[Executor, list[Future[Path]]] | None] = ContextVar(
    "sapiens2_deferred_writes", default=None
)


@contextmanager
def deferred_writes(pool: Executor) -> Iterator[list[Future[Path]]]:
    """Within the block, the writers called in this thread (``export.write_png``, ``write_npy``,
    ``write_ply``, ``write_glb``, ``mesh.write_mesh_glb`` ...) check their input
    (raising at once, as always), return the path, and leave the encoding and the writing to
    ``pool``; the block yields those jobs in call order. Leaving the block waits for every job.

    Errors are those of a sequential run: the first write that failed, in call order, is
    raised (the same exception object); an exception of the block itself is raised when no
    write started before it failed."""
    jobs: list[Future[Path]] = []
    token = _DEFERRED.set((pool, jobs))
    try:
        yield jobs
    except BaseException:
        if (failed := _first_error(jobs)) is not None:
            raise failed from None  # it came first: a sequential run stopped there, never saw this
        raise
    finally:
        _DEFERRED.reset(token)
    if (failed := _first_error(jobs)) is not None:
        raise failed


def _first_error(jobs: list[Future[Path]]) -> BaseException | None:
    """Waits for every job (none keeps writing after the caller moves on); the first error."""
    errors = [job.exception() for job in jobs]
    return next((e for e in errors if e is not None), None)


def write_or_defer(path: Path, write: Callable[[Path], None]) -> Path:
    """``write(path)`` now, or on the pool of the active ``deferred_writes``; returns ``path``."""
    deferred = _DEFERRED.get()
    if deferred is None:
        write(path)
    else:
        pool, jobs = deferred
        jobs.append(pool.submit(_written, write, path))
    return path


def _written(write: Callable[[Path], None], path: Path) -> Path:
    write(path)
    return path
