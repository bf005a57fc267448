"""Writing a result's files: a :class:`Writer` says where the encoding and the writing happen.

Every writer of :mod:`sapiens2.outputs.export` and :mod:`sapiens2.outputs.mesh` takes one
(``writer=``): it checks its input in the calling thread (raising at once, as always), then hands
the encoding and writing to ``writer.write(path, fn)``. :data:`NOW` writes there and then;
``Writer(pool)`` writes on a thread pool, so one result's files are written side by side, and
leaving its ``with`` block waits for them all. A result's ``save(out_dir, writer=...)`` passes its
writer to each file it writes.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from pathlib import Path
from types import TracebackType

#: Threads writing one result's files (PNG/JPEG encoding and np.save release the GIL): enough for
#: matting's three PNGs at once. They gain where cores are free; on a CPU already kept busy by
#: other work they cost a few per cent (cache, page faults) against writing one after another.
WRITE_WORKERS = 3


def prepare(path: str | Path) -> Path:
    """``path`` as a Path, its folder created."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


class Writer:
    """Where files are written: at once (no ``pool``) or on ``pool`` (the jobs kept in call order).

    As a context manager, leaving the block waits for every job, and errors are those of a
    sequential run: the first write that failed, in call order, is raised (the same exception
    object); an exception of the block itself is raised when no write started before it failed.
    A writer with a pool is for one thread's block (one result); :data:`NOW` is shared."""

    def __init__(self, pool: Executor | None = None) -> None:
        self.pool = pool
        self.jobs: list[Future[Path]] = []

    def write(self, path: Path, write: Callable[[Path], None]) -> Path:
        """``write(path)`` now, or on the pool; returns ``path``."""
        if self.pool is None:
            write(path)
        else:
            self.jobs.append(self.pool.submit(_written, write, path))
        return path

    def __enter__(self) -> Writer:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        failed = self.wait()
        if failed is not None:
            raise failed from None  # it came first: a sequential run stopped there
        # otherwise the block's own exception, if any, propagates

    def wait(self) -> BaseException | None:
        """Wait for every job (none keeps writing after the caller moves on); the first error."""
        errors = [job.exception() for job in self.jobs]
        return next((e for e in errors if e is not None), None)


#: Writes each file at once, in the calling thread.
NOW = Writer()


def _written(write: Callable[[Path], None], path: Path) -> Path:
    write(path)
    return path


__all__ = ["NOW", "WRITE_WORKERS", "Writer", "prepare"]
