"""Files a result makes only when asked (``Task.on_demand``: the pointmap's full-resolution mesh).

A run in the app saves its result with ``later=True`` (those files left out), and :func:`keep`
stores next to its downloads what the task says they are made from. :func:`make`, called with the
result's request folder, writes them there: each file appears whole (written under a temporary
folder first, then renamed), files already made are returned as they are, and two requests at
once never see half a file.
"""

from __future__ import annotations

import secrets
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ResultNotFoundError
from ..outputs.writers import WRITE_WORKERS, Writer, prepare
from ..tasks.registry import OnDemand

#: The folder of a request folder holding what on-demand files are made from (not a download).
SOURCES = "on_demand"


def source_path(folder: Path, entry: OnDemand) -> Path:
    """Where :func:`keep` stores ``entry``'s source in the request folder ``folder``."""
    return Path(folder) / SOURCES / f"{entry.api_name}.npz"


def keep(entry: OnDemand, result: Any, folder: Path, writer: Writer) -> Path:
    """Store what ``entry``'s files are made from (``entry.source(result)``) in ``folder``."""
    arrays = entry.source(result)

    def write(path: Path) -> None:
        with open(path, "wb") as f:
            np.savez(f, **arrays)

    return writer.write(prepare(source_path(folder, entry)), write)


def make(entry: OnDemand, folder: Path) -> list[Path]:
    """``entry``'s files of the result in ``folder``, made there now unless they already are.
    ResultNotFoundError when the folder kept no source for them."""
    try:
        with np.load(source_path(folder, entry), allow_pickle=False) as kept:
            source = {key: kept[key] for key in kept.files}
    except (OSError, KeyError, ValueError) as err:
        raise ResultNotFoundError(entry.missing) from err
    targets = [Path(folder) / name for name in entry.names(source)]
    if all(p.is_file() for p in targets):
        return targets
    work = Path(folder) / f".making-{secrets.token_hex(8)}"
    try:
        with (
            ThreadPoolExecutor(WRITE_WORKERS, thread_name_prefix="sapiens2-write") as pool,
            Writer(pool) as writer,
        ):  # side by side, as a run writes them
            made = entry.make(source, Path(folder), work, writer)
        for src, dst in zip(made, targets, strict=True):
            Path(src).replace(dst)  # atomic on one file system: a reader sees all or nothing
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return targets


__all__ = ["SOURCES", "keep", "make", "source_path"]
