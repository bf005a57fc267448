"""The rows of ``sapiens2 batch``: one declared Arrow schema per task, and the function that makes a
task's row from its result (today's ``TaskResult`` objects).

Every row has ``source`` (the input's path or URI), ``error`` (null when it worked), ``width`` and
``height`` (the pixels the results are in) and ``notices``; then the task's own columns, kept
compact:

* pose: ``keypoints`` (people x 308 x 2, x then y in photo pixels), ``scores`` (people x 308),
  ``boxes`` (people x 4, x1 y1 x2 y2), ``box_scores``, ``detection`` (how people were found),
  ``keypoint_set`` (a Sapiens v1 17/133 model's points are lifted into the 308 layout);
* seg: ``labels_png``, the class ids (0-28) as a one-channel 8-bit PNG;
* normal, pointmap, albedo, matting: photo-size arrays as ``.npy`` bytes in float16
  (:func:`read_array`), compressed by Parquet (zstd), with the person mask as a PNG where there
  is one; pointmap adds ``scale`` and the focal lengths;
* depth (Sapiens v1): ``depth``, relative depth as float32 ``.npy`` bytes, and ``mask_png``;
* features: ``embedding``, the backbone's CLS vector.

Why arrays inside the table and not files beside it: a part of the table is committed in one
step (one rename, or one object put), rows and arrays together, so a crash never leaves rows
without their arrays or files without rows; a bucket holds one object per part instead of one
per photo and array; Parquet is columnar, so a reader of ``source``, ``error`` or the pose columns
never reads the arrays. Sizes are in docs/SCALE.md. Parts of tasks with large rows hold fewer
rows (:attr:`Record.rows_per_part`) and their row groups are cut by bytes (``store``).

Read a task's rows with ``pyarrow.dataset.dataset("OUT/<task>")``; :func:`column_arrays` turns a
nested list column into numpy arrays, :func:`read_array` and :func:`read_png` decode a cell.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
import pyarrow as pa

from ..data.metadata import NUM_KEYPOINTS
from ..outputs.png import png_chunks
from ..tasks.registry import Task

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


@dataclass(frozen=True)
class Record:
    """A task's row: its own columns (after :data:`COMMON`) and the maker from a result."""

    fields: tuple[pa.Field, ...]
    #: result -> {column: value} for the task's own columns (numpy arrays, bytes, numbers)
    make: Callable[[Any], dict[str, Any]]
    rows_per_part: int = COMPACT_ROWS

    def schema(self, task: str, metadata: Mapping[str, str] | None = None) -> pa.Schema:
        return pa.schema([*COMMON, *self.fields], metadata={"sapiens2.task": task, **(metadata or {})})

    @property
    def png_columns(self) -> tuple[str, ...]:
        """Binary columns already compressed (PNG): Parquet stores them as they are."""
        return tuple(f.name for f in self.fields if f.name.endswith("_png"))


# ----------------------------------------------------------------------------- encoders


def png_bytes(image: np.ndarray) -> bytes:
    """A PNG of a uint8 (H, W) or (H, W, 3) array (bool -> 0/255), as :mod:`sapiens2.outputs.png`
    writes the app's downloads."""
    arr = np.asarray(image)
    if arr.dtype == bool:
        arr = arr.astype(np.uint8) * 255
    return b"".join(png_chunks(arr))


def npy_bytes(array: np.ndarray, dtype: Any = np.float16) -> bytes:
    """``.npy`` bytes of ``array`` cast to ``dtype`` (finite values clipped to its range; NaN stays)."""
    arr = np.asarray(array)
    dt = np.dtype(dtype)
    if dt.kind == "f" and arr.dtype.kind == "f" and arr.dtype != dt:
        lim = float(np.finfo(dt).max)
        out = np.empty(arr.shape, dt)
        np.clip(arr, -lim, lim, out=out, casting="unsafe")
        arr = out
    buf = io.BytesIO()
    np.save(buf, arr.astype(dt, copy=False), allow_pickle=False)
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


# ----------------------------------------------------------------------------- per task


def _pose(result: Any) -> dict[str, Any]:
    return {
        "keypoints": result.keypoints,
        "scores": result.scores,
        "boxes": result.boxes,
        "box_scores": result.box_scores,
        "detection": result.detection_source,
        "keypoint_set": getattr(result, "keypoint_set", "goliath308"),  # a v1 17/133 model's, lifted
    }


def _mask(mask: np.ndarray | None) -> bytes | None:
    return None if mask is None else png_bytes(mask)


def _seg(result: Any) -> dict[str, Any]:
    return {"labels_png": png_bytes(result.labels)}


def _normal(result: Any) -> dict[str, Any]:
    return {"normals": npy_bytes(result.normals), "mask_png": _mask(result.mask)}


def _pointmap(result: Any) -> dict[str, Any]:
    return {
        "pointmap": npy_bytes(result.pointmap),
        "mask_png": _mask(result.mask),
        "scale": result.scale,
        "focal_px": result.focal_px,
        "focal_px_input": result.focal_px_input,
    }


def _depth(result: Any) -> dict[str, Any]:
    return {"depth": npy_bytes(result.depth, np.float32), "mask_png": _mask(result.mask)}


def _matting(result: Any) -> dict[str, Any]:
    return {"alpha": npy_bytes(result.alpha), "foreground": npy_bytes(result.foreground)}


def _albedo(result: Any) -> dict[str, Any]:
    return {"albedo": npy_bytes(result.albedo), "mask_png": _mask(result.mask)}


def _features(result: Any) -> dict[str, Any]:
    return {"embedding": np.asarray(result.embedding, np.float32)}


_ARRAY = pa.large_binary()  # one photo's array can pass 2 GB only at ~300 MP; large_ is free

#: The record of every task, by its name (round 2 may move these onto the task declarations).
RECORDS: dict[str, Record] = {
    "pose": Record(
        (
            pa.field("keypoints", _tensor(NUM_KEYPOINTS, 2)),
            pa.field("scores", _tensor(NUM_KEYPOINTS)),
            pa.field("boxes", _tensor(4)),
            pa.field("box_scores", pa.list_(pa.float32())),
            pa.field("detection", pa.string()),
            pa.field("keypoint_set", pa.string()),
        ),
        _pose,
    ),
    "seg": Record((pa.field("labels_png", pa.binary()),), _seg),
    "normal": Record((pa.field("normals", _ARRAY), pa.field("mask_png", pa.binary())), _normal, DENSE_ROWS),
    "pointmap": Record(
        (
            pa.field("pointmap", _ARRAY),
            pa.field("mask_png", pa.binary()),
            pa.field("scale", pa.float32()),
            pa.field("focal_px", pa.float32()),
            pa.field("focal_px_input", pa.float32()),
        ),
        _pointmap,
        DENSE_ROWS,
    ),
    "depth": Record((pa.field("depth", _ARRAY), pa.field("mask_png", pa.binary())), _depth, DENSE_ROWS),
    "matting": Record((pa.field("alpha", _ARRAY), pa.field("foreground", _ARRAY)), _matting, DENSE_ROWS),
    "albedo": Record((pa.field("albedo", _ARRAY), pa.field("mask_png", pa.binary())), _albedo, DENSE_ROWS),
    "features": Record((pa.field("embedding", pa.list_(pa.float32())),), _features),
}


def record_for(task: Task) -> Record:
    """The record of ``task``; KeyError names the tasks that have one."""
    try:
        return RECORDS[task.name]
    except KeyError:
        raise KeyError(
            f"No batch record for {task.name!r}; records exist for: {', '.join(RECORDS)}."
        ) from None


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
    schema = record_for(task).schema(task.name, metadata)
    columns = [_column(f, [row.get(f.name) for row in rows]) for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def result_row(task: Task, source: str, result: Any) -> dict[str, Any]:
    """The row of a finished result: the common columns and the task's record."""
    h, w = result.image.shape[:2]
    row = {"source": source, "error": None, "width": w, "height": h, "notices": list(result.notices)}
    row.update(record_for(task).make(result))
    return row


def error_row(source: str, error: str) -> dict[str, Any]:
    return {"source": source, "error": error}


__all__ = [
    "COMMON",
    "RECORDS",
    "Record",
    "column_arrays",
    "error_row",
    "npy_bytes",
    "png_bytes",
    "read_array",
    "read_png",
    "record_for",
    "result_row",
    "rows_table",
]
