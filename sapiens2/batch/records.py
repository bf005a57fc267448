"""The rows of ``sapiens2 batch`` in Arrow: each task declares its columns and how its result fills
them (``Task.record``, :class:`sapiens2.tasks.result_record.Record`); this module turns the
declared kinds into an Arrow schema and encodes the values (PNG, ``.npy`` bytes, tensors).

Every row has ``source`` (the input's path or URI), ``error`` (null when it worked), ``width`` and
``height`` (the pixels the results are in) and ``notices``; then the task's own columns, kept
compact (as the built-in tasks declare them):

* pose: ``keypoints`` (people x 308 x 2, x then y in photo pixels), ``scores`` (people x 308),
  ``boxes`` (people x 4, x1 y1 x2 y2), ``box_scores``, ``detection`` (how people were found),
  ``keypoint_set`` (a Sapiens v1 17/133 model's points are lifted into the 308 layout);
* seg: ``labels_png``, the class ids (0-28) as a one-channel 8-bit PNG;
* normal, pointmap, albedo, matting, depth (Sapiens v1): photo-size arrays as ``.npy`` bytes in
  the dtype the task's ``ResultArray`` declares, the same as its photo download and its clip NPZ
  (normals, albedo, alpha, foreground float16; pointmap and v1 depth float32; :func:`read_array`),
  compressed by Parquet (zstd), with the person mask as a PNG where there is one; pointmap adds
  ``scale`` and the focal lengths;
* features: ``embedding``, the backbone's CLS vector.

Why arrays inside the table and not files beside it: a part of the table is committed in one
step (one rename, or one object put), rows and arrays together, so a crash never leaves rows
without their arrays or files without rows; a bucket holds one object per part instead of one
per photo and array; Parquet is columnar, so a reader of ``source``, ``error`` or the pose columns
never reads the arrays. Sizes are in docs/SCALE.md. Parts of tasks with large rows hold fewer
rows (:func:`rows_per_part`) and their row groups are cut by bytes (``store``).

Read a task's rows with ``pyarrow.dataset.dataset("OUT/<task>")``; :func:`column_arrays` turns a
nested list column into numpy arrays, :func:`read_array` and :func:`read_png` decode a cell.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import cv2
import numpy as np
import pyarrow as pa

from ..errors import OptionError
from ..outputs.export import cast_array
from ..outputs.png import png_chunks
from ..tasks import registry
from ..tasks.registry import Task
from ..tasks.result_record import Column, Record

#: The columns of every task's rows, first.
COMMON: tuple[pa.Field, ...] = (
    pa.field("source", pa.string(), nullable=False),
    pa.field("error", pa.string()),
    pa.field("width", pa.int32()),
    pa.field("height", pa.int32()),
    pa.field("notices", pa.list_(pa.string())),
)

#: Rows per committed part: compact rows (a few KB) and photo-size arrays (MBs each).
COMPACT_ROWS, DENSE_ROWS = 256, 16


def _tensor(*shape: int, dtype: pa.DataType | None = None) -> pa.DataType:
    """A list (one entry per person) of fixed-shape ``shape`` float32 cells."""
    inner = dtype or pa.float32()
    for n in reversed(shape):
        inner = pa.list_(inner, n)
    return pa.list_(inner)


# ----------------------------------------------------------------------------- encoders


def png_bytes(image: np.ndarray) -> bytes:
    """A PNG of a uint8 (H, W) or (H, W, 3) array (bool -> 0/255), as :mod:`sapiens2.outputs.png`
    writes the app's downloads."""
    arr = np.asarray(image)
    if arr.dtype == bool:
        arr = arr.astype(np.uint8) * 255
    if arr.dtype != np.uint8:  # png_chunks would write the bytes of any dtype as 8-bit rows
        raise OptionError(f"A PNG column needs uint8 or bool pixels, got {arr.dtype}.")
    return b"".join(png_chunks(arr))


def npy_bytes(array: np.ndarray, dtype: Any = np.float16) -> bytes:
    """``.npy`` bytes of ``array`` cast to ``dtype`` (finite values clipped to its range; NaN stays)."""
    buf = io.BytesIO()
    np.save(buf, cast_array(array, dtype), allow_pickle=False)
    return buf.getvalue()


def read_array(cell: bytes | pa.Scalar | None) -> np.ndarray | None:
    """The numpy array of an array cell (``.npy`` bytes); None for a null cell."""
    if isinstance(cell, pa.Scalar):
        cell = cell.as_py()
    return None if cell is None else np.load(io.BytesIO(cell), allow_pickle=False)


def read_png(cell: bytes | pa.Scalar | None) -> np.ndarray | None:
    """The pixels of a PNG cell: (H, W) for one channel, (H, W, 3) RGB; None for a null cell."""
    if isinstance(cell, pa.Scalar):
        cell = cell.as_py()
    if cell is None:
        return None
    img = cv2.imdecode(np.frombuffer(cell, np.uint8), cv2.IMREAD_UNCHANGED)
    return img if img.ndim == 2 else cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def column_arrays(column: pa.ChunkedArray | pa.Array) -> list[np.ndarray | None]:
    """A list column of fixed-shape cells (``keypoints``, ``scores``, ``boxes``) -> one numpy
    array per row, shaped (people, ...); None for a null row."""
    if isinstance(column, pa.ChunkedArray):
        return [a for chunk in column.chunks for a in column_arrays(chunk)]
    shape: list[int] = []
    kind = column.type.value_type
    while pa.types.is_fixed_size_list(kind):
        shape.append(kind.list_size)
        kind = kind.value_type
    values = column.values  # the whole child: the offsets below index it
    for _ in shape:
        values = values.flatten()
    flat = values.to_numpy(zero_copy_only=False).reshape(-1, *shape)
    offsets = column.offsets.to_numpy()
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    return [flat[offsets[i] : offsets[i + 1]] if valid[i] else None for i in range(len(column))]


# ----------------------------------------------------------------------------- a task's record


_ARRAY = pa.large_binary()  # one photo's array can pass 2 GB only at ~300 MP; large_ is free
_TYPES: dict[str, pa.DataType] = {
    "npy": _ARRAY,
    "png": pa.binary(),
    "float": pa.float32(),
    "string": pa.string(),
}


def arrow_type(column: Column) -> pa.DataType:
    """The Arrow type a record column of this kind is kept in."""
    return _tensor(*column.shape) if column.kind == "tensor" else _TYPES[column.kind]


def record_for(task: Task) -> Record:
    """The record ``task`` declares (``Task.record``); KeyError names the tasks that have one."""
    if task.record is None:
        raise KeyError(f"No batch record for {task.name!r}; records exist for: {', '.join(batch_tasks())}.")
    return task.record


def batch_tasks() -> list[str]:
    """The declared tasks that have a batch record, by name."""
    return [name for name, task in registry.declared().items() if task.record is not None]


def schema(task: Task, metadata: Mapping[str, str] | None = None) -> pa.Schema:
    """The task's table: the common columns, then its record's."""
    own = [pa.field(c.name, arrow_type(c)) for c in record_for(task).columns]
    clash = {f.name for f in own} & {f.name for f in COMMON}
    if clash:
        raise OptionError(f"{task.name}'s record repeats a common column: {', '.join(sorted(clash))}.")
    return pa.schema([*COMMON, *own], metadata={"sapiens2.task": task.name, **(metadata or {})})


def rows_per_part(task: Task) -> int:
    """Rows per committed part: fewer for a record of photo-size arrays."""
    return DENSE_ROWS if record_for(task).dense else COMPACT_ROWS


def png_columns(task: Task) -> tuple[str, ...]:
    """Binary columns already compressed (PNG): Parquet stores them as they are."""
    return tuple(c.name for c in record_for(task).columns if c.kind == "png")


def _encoded(column: Column, value: Any) -> Any:
    if value is None:
        return None
    if column.kind == "png":
        return png_bytes(value)
    if column.kind == "npy":
        return npy_bytes(value, column.dtype)
    return value


def record_row(task: Task, result: Any) -> dict[str, Any]:
    """The task's own columns of a result's row, encoded for Arrow (``Record.row``, then each
    column by its kind); a key the record does not declare is an error naming it."""
    record = record_for(task)
    values = record.row(result)
    columns = {c.name: c for c in record.columns}
    unknown = sorted(set(values) - set(columns))
    if unknown:
        raise OptionError(f"{task.name}'s record row gives undeclared columns: {', '.join(unknown)}.")
    return {name: _encoded(columns[name], values.get(name)) for name in columns}


# ----------------------------------------------------------------------------- rows -> table


def _column(field: pa.Field, values: Sequence[Any]) -> pa.Array:
    """One column from per-row values (None = null); nested tensor columns built from numpy."""
    kind = field.type
    if pa.types.is_list(kind) and pa.types.is_fixed_size_list(kind.value_type):
        return _tensor_column(kind, values)
    if pa.types.is_list(kind) and pa.types.is_floating(kind.value_type):
        return _tensor_column(kind, values)
    return pa.array(list(values), type=kind)


def _tensor_column(kind: pa.DataType, values: Sequence[Any]) -> pa.Array:
    """A list<fixed_size_list<...>> (or list<float>) column from (n_i, ...) float arrays."""
    shape: list[int] = []
    inner = kind.value_type
    while pa.types.is_fixed_size_list(inner):
        shape.append(inner.list_size)
        inner = inner.value_type
    dtype = inner.to_pandas_dtype()
    arrays = [None if v is None else np.asarray(v, dtype).reshape(-1, *shape) for v in values]
    counts = [0 if a is None else len(a) for a in arrays]
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    flat = np.concatenate([a.reshape(-1) for a in arrays if a is not None] or [np.empty(0, dtype)])
    cells: pa.Array = pa.array(flat, type=inner)
    for n in reversed(shape):
        cells = pa.FixedSizeListArray.from_arrays(cells, n)
    mask = pa.array([a is None for a in arrays])
    return pa.ListArray.from_arrays(offsets, cells, type=kind, mask=mask)


def rows_table(
    task: Task, rows: Sequence[Mapping[str, Any]], metadata: Mapping[str, str] | None = None
) -> pa.Table:
    """The table of ``rows`` (dicts holding the common and the task's columns; missing = null)
    in the task's declared schema."""
    schema_ = schema(task, metadata)
    columns = [_column(f, [row.get(f.name) for row in rows]) for f in schema_]
    return pa.Table.from_arrays(columns, schema=schema_)


def result_row(task: Task, source: str, result: Any) -> dict[str, Any]:
    """The row of a finished result: the common columns and the task's record."""
    h, w = result.image.shape[:2]
    row = {"source": source, "error": None, "width": w, "height": h, "notices": list(result.notices)}
    row.update(record_row(task, result))
    return row


def error_row(source: str, error: str) -> dict[str, Any]:
    return {"source": source, "error": error}


__all__ = [
    "COMMON",
    "arrow_type",
    "batch_tasks",
    "column_arrays",
    "error_row",
    "npy_bytes",
    "png_bytes",
    "read_array",
    "read_png",
    "png_columns",
    "record_for",
    "record_row",
    "result_row",
    "rows_per_part",
    "rows_table",
    "schema",
]
