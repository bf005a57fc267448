"""A task's batch record: the columns its result gives a ``sapiens2 batch`` row, declared by the task;
and its photo-size arrays (:class:`ResultArray`), described once for the three places that keep
them: the photo's ``save()``, the batch record and a clip's raw NPZ.

The task says what each column holds and how it is kept (:class:`Column`); ``sapiens2.batch.records``
turns the kinds into Arrow types and encodes the values, so this layer needs no pyarrow. A task
without a record (``Task.record=None``) runs everywhere but in a batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from ..errors import OptionError
from ..outputs.export import NOW, Writer, cast_array, safe_path, write_npy, write_png

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


#: ``float16`` where the model's own error is far above its 5e-4 relative step (normals, albedo,
#: alpha); ``float32`` where a download is built on later (the pointmap's on-demand mesh) or the
#: units are unknown (Sapiens v1's relative depth); ``uint8``/``bool`` pictures (labels, masks).
ArrayDtype = Literal["float16", "float32", "uint8", "bool"]
ARRAY_DTYPES: tuple[str, ...] = get_args(ArrayDtype)


@dataclass(frozen=True)
class ResultArray:
    """One photo-size array of a task's result, kept in ``dtype`` wherever it is kept: the files
    ``save()`` writes (``files``: suffixes, ``.npy`` raw or ``.png`` for a uint8/bool picture), the
    batch row (``in_record``: column ``attr``, or ``attr_png`` for a picture) and a clip's per-frame
    NPZ (``in_clip``). Every cast is :func:`sapiens2.outputs.export.cast_array`."""

    attr: str
    dtype: ArrayDtype
    what: str
    files: tuple[str, ...] = ()
    in_record: bool = True
    in_clip: bool = True

    def __post_init__(self) -> None:
        if self.dtype not in ARRAY_DTYPES:
            raise OptionError(f"Array {self.attr!r}: dtype {self.dtype!r} is not one of {ARRAY_DTYPES}.")
        bad = [f for f in self.files if not f.endswith((".npy", ".png"))]
        if bad:
            raise OptionError(f"Array {self.attr!r}: files {self.files!r} must end in .npy or .png.")
        if not self.picture and any(f.endswith(".png") for f in self.files):
            raise OptionError(f"Array {self.attr!r}: a {self.dtype} array is not a PNG picture.")

    @property
    def picture(self) -> bool:
        return self.dtype in ("uint8", "bool")

    @property
    def column(self) -> Column:
        if self.picture:
            return Column(f"{self.attr}_png", "png", self.what)
        return Column(self.attr, "npy", self.what, dtype=self.dtype)

    def kept(self, result: Any) -> np.ndarray | None:
        """The result's array in this dtype (None: the result has none)."""
        value = getattr(result, self.attr, None)
        return None if value is None else cast_array(value, self.dtype)


def array_record(
    arrays: tuple[ResultArray, ...],
    columns: tuple[Column, ...] = (),
    row: Callable[[Any], dict[str, Any]] | None = None,
) -> Record:
    """The batch record of a task with these arrays (those ``in_record``), then its other
    ``columns`` filled by ``row(result)``."""
    kept = tuple(a for a in arrays if a.in_record)

    def full_row(result: Any) -> dict[str, Any]:
        values = {a.column.name: a.kept(result) for a in kept}
        return {**values, **(row(result) if row else {})}

    return Record(tuple(a.column for a in kept) + tuple(columns), full_row)


def clip_fields(arrays: tuple[ResultArray, ...]) -> dict[str, ResultArray]:
    """The arrays a clip keeps per frame, by result attribute."""
    return {a.attr: a for a in arrays if a.in_clip}


def save_arrays(
    result: Any, arrays: tuple[ResultArray, ...], out_dir: str | Path, name: str, *, writer: Writer = NOW
) -> list[Path]:
    """The files of ``save()`` that hold ``arrays`` (a result without one, or with an empty one,
    writes none of its files)."""
    paths = []
    for a in arrays:
        value = getattr(result, a.attr, None)
        for suffix in a.files if value is not None and np.size(value) else ():
            path = safe_path(out_dir, name, suffix)
            if suffix.endswith(".npy"):
                paths.append(write_npy(path, value, a.dtype, writer=writer))
            else:
                paths.append(write_png(path, cast_array(value, a.dtype), writer=writer))
    return paths


__all__ = [
    "ARRAY_DTYPES",
    "KINDS",
    "ArrayDtype",
    "Column",
    "ColumnKind",
    "Record",
    "ResultArray",
    "array_record",
    "clip_fields",
    "save_arrays",
]
