"""A task's batch record: the columns its result gives a ``sapiens2 batch`` row, declared by the task.

The task says what each column holds and how it is kept (:class:`Column`); ``sapiens2.batch.records``
turns the kinds into Arrow types and encodes the values, so this layer needs no pyarrow. A task
without a record (``Task.record=None``) runs everywhere but in a batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

from ..errors import OptionError

#: ``tensor``: a list (one entry per person, or per value when ``shape`` is empty) of fixed-shape
#: float32 cells; ``npy``: a photo-size array as ``.npy`` bytes in ``dtype``; ``png``: a uint8 or
#: bool (H, W) or (H, W, 3) picture as PNG bytes; ``float``: a float32 number; ``string``: text.
ColumnKind = Literal["tensor", "npy", "png", "float", "string"]
KINDS: tuple[str, ...] = get_args(ColumnKind)
NPY_DTYPES: tuple[str, ...] = ("float16", "float32")


@dataclass(frozen=True)
class Column:
    """One column of a task's row: its name, how it is kept, and what it holds (in words)."""

    name: str
    kind: ColumnKind
    what: str = ""
    shape: tuple[int, ...] = ()  # ``tensor``: the shape of one cell, e.g. (308, 2) per person
    dtype: str = "float16"  # ``npy``: the dtype the array is stored in

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise OptionError(f"A record column's name must be an identifier, got {self.name!r}.")
        if self.kind not in KINDS:
            raise OptionError(
                f"Record column {self.name!r}: kind {self.kind!r} is not one of {', '.join(KINDS)}."
            )
        if self.kind == "npy" and self.dtype not in NPY_DTYPES:
            raise OptionError(
                f"Record column {self.name!r}: dtype {self.dtype!r} is not one of {NPY_DTYPES}."
            )
        if any(not isinstance(n, int) or n < 1 for n in self.shape) or (self.shape and self.kind != "tensor"):
            raise OptionError(
                f"Record column {self.name!r}: shape {self.shape!r} needs kind 'tensor' and sizes >= 1."
            )


@dataclass(frozen=True)
class Record:
    """A task's row in a batch table: its columns (after the common ones every row has) and
    ``row(result) -> {column: value}`` with the values as the task has them (numpy arrays, text,
    numbers; None = null). A record with an ``npy`` column holds photo-size arrays: its parts hold
    fewer rows."""

    columns: tuple[Column, ...]
    row: Callable[[Any], dict[str, Any]]

    def __post_init__(self) -> None:
        names = [c.name for c in self.columns]
        if not callable(self.row):
            raise OptionError(f"A record's row must be a function of the result, got {self.row!r}.")
        if not names or len(set(names)) != len(names):
            raise OptionError(f"A record needs one or more columns with distinct names, got {names}.")

    @property
    def dense(self) -> bool:
        return any(c.kind == "npy" for c in self.columns)


__all__ = ["KINDS", "Column", "ColumnKind", "Record"]
