"""Files people download, shared by the tasks: PNG, NPY, JSON, PLY, GLB, and the one file-name rule.

Point clouds (and meshes, :mod:`sapiens2.outputs.mesh`) are written by :mod:`sapiens2.outputs.plyglb`.
A format only one task writes is in its package (pose's JSON formats: ``sapiens2.tasks.pose``).

Every writer takes a path and returns the Path it wrote. File names come from ``safe_path``:
a caller's name is reduced to [A-Za-z0-9_-] so it can never leave the output folder.

Every writer checks its input at once and hands the encoding and writing to its ``writer``
(:class:`sapiens2.outputs.writers.Writer`): at once by default, or on a thread pool (cv2, zlib and
numpy release the GIL), so a result's files are written side by side.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputImageError, OptionError
from . import plyglb, png
from .mesh import OPENCV_TO_GLTF
from .writers import NOW, Writer
from .writers import prepare as _prepare

GLB_MAX_POINTS = 300_000  # a browser viewer stays responsive below this; the PLY keeps every point
_STEM_MAX = 80

# ---------------------------------------------------------------- names and paths


def safe_stem(name: Any, default: str = "image") -> str:
    """A file-name stem made only of [A-Za-z0-9_-] (other runs, dots included, -> '_'), at most
    80 chars. The package's one sanitiser: it never drops an "extension", so "a.v1" and "a.v2"
    stay apart; callers holding a file name strip its extension first (see :func:`file_stem`)."""
    stem = re.sub(r"[^A-Za-z0-9_-]+", "_", str(name) if name is not None else "")
    stem = stem.strip("_-")[:_STEM_MAX].strip("_-")
    return stem or default


def file_stem(filename: Any, default: str = "image") -> str:
    """safe_stem of a file name without its directory and last extension ("a.v1.jpg" -> "a_v1")."""
    text = str(filename).replace("\\", "/") if filename else ""
    return safe_stem(Path(text).stem, default)


def safe_path(out_dir: str | Path, name: Any, suffix: str) -> Path:
    """out_dir / (safe_stem(name) + suffix); the suffix is checked too (e.g. '.png', '_alpha.png')."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]{0,40}", suffix) or ".." in suffix:
        raise OptionError(f"File suffix {suffix!r} may only use letters, digits, '_', '-' and '.' (no '..').")
    base = Path(out_dir)
    path = base / f"{safe_stem(name)}{suffix}"
    if path.parent != base:  # cannot happen after sanitising; kept as the last line of defence
        raise OptionError(f"Refusing to write outside {base}: {path}.")
    return path


# ---------------------------------------------------------------- images and arrays


def write_png(path: str | Path, image: Any, *, writer: Writer = NOW) -> Path:
    """PNG of a uint8 (or uint16) gray (H, W), RGB (H, W, 3) or RGBA (H, W, 4) array; bool -> 0/255.

    Written fast (:mod:`sapiens2.outputs.png`): zlib level 1, the "sub" row filter only, and the rows
    deflated in blocks on every CPU (docs/PERFORMANCE.md has the timings).
    """
    arr = np.asarray(image)
    if arr.dtype == bool:
        arr = arr.astype(np.uint8) * 255
    if arr.dtype not in (np.uint8, np.uint16):
        raise InputImageError(f"write_png needs a uint8/uint16 image, got dtype {arr.dtype}.")
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[2] in (3, 4))) or 0 in arr.shape:
        raise InputImageError(f"write_png needs an (H, W), (H, W, 3) or (H, W, 4) image, got {arr.shape}.")
    return writer.write(_prepare(path), lambda p: png.write_png_file(p, arr))


def write_png_palette(path: str | Path, ids: Any, palette: Any, *, writer: Writer = NOW) -> Path:
    """PNG of a palette picture: (H, W) uint8 ids into ``palette`` ((K, 3) uint8 RGB, K <= 256),
    stored as indices (PNG colour type 3), so it decodes to exactly ``palette[ids]``.

    For a picture of a few flat colours (a class map) this is the fast way: 1 byte a pixel to
    compress instead of 3, and a smaller file. Encoded as write_png encodes
    (:mod:`sapiens2.outputs.png`).
    """
    arr, pal = np.asarray(ids), np.asarray(palette)
    if arr.dtype != np.uint8 or arr.ndim != 2 or 0 in arr.shape:
        raise InputImageError(f"write_png_palette needs (H, W) uint8 ids, got {arr.dtype} {arr.shape}.")
    if pal.dtype != np.uint8 or pal.ndim != 2 or pal.shape[1] != 3 or not 0 < len(pal) <= 256:
        raise InputImageError(
            f"write_png_palette needs a (K, 3) uint8 palette, K <= 256; got {pal.dtype} {pal.shape}."
        )
    if int(arr.max()) >= len(pal):
        raise InputImageError(f"Id {int(arr.max())} is outside the {len(pal)}-colour palette.")

    return writer.write(_prepare(path), lambda p: png.write_png_file(p, arr, pal))


def cast_array(array: Any, dtype: Any = None) -> np.ndarray:
    """``array`` in ``dtype`` (None: as it is), the one cast every kept array goes through (a photo's
    ``.npy``, a batch cell, a clip's NPZ): finite floats clipped to the dtype's range, NaN kept."""
    arr = np.asarray(array)
    dt = None if dtype is None else np.dtype(dtype)
    if dt is None or arr.dtype == dt:
        return arr
    if dt.kind == "f" and arr.dtype.kind == "f":
        lim = float(np.finfo(dt).max)
        out = np.empty(arr.shape, dt)  # clipped and cast in one pass, no full-size temporary
        np.clip(arr, -lim, lim, out=out, casting="unsafe")  # NaN stays NaN; big values do not become inf
        return out
    return arr.astype(dt)


def write_npy(path: str | Path, array: Any, dtype: Any = None, *, writer: Writer = NOW) -> Path:
    """np.save of the array, cast to dtype if given (:func:`cast_array`); the cast runs with the
    writing."""
    arr = np.asarray(array)

    def save(p: Path) -> None:
        with open(p, "wb") as f:
            np.save(f, cast_array(arr, dtype), allow_pickle=False)

    return writer.write(_prepare(path), save)


def jsonable(obj: Any) -> Any:
    """Plain JSON types: numpy scalars/arrays -> Python, NaN/inf -> None, tuples -> lists."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def write_json(path: str | Path, obj: Any, *, writer: Writer = NOW) -> Path:
    """UTF-8 JSON; NaN/inf become null so every JSON reader accepts the file."""
    text = json.dumps(jsonable(obj), allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    return writer.write(_prepare(path), lambda p: p.write_text(text, encoding="utf-8"))


# ---------------------------------------------------------------- point clouds


def _cloud(points: Any, colors: Any) -> tuple[np.ndarray, np.ndarray | None]:
    pts = np.asarray(points, dtype=np.float32).reshape(-1, 3)
    cols = None
    if colors is not None:
        cols = np.asarray(colors)
        if cols.dtype != np.uint8:
            cols = np.clip(np.nan_to_num(cols.astype(np.float32)), 0, 255).round().astype(np.uint8)
        cols = cols.reshape(-1, 3)
        if len(cols) != len(pts):
            raise InputImageError(f"{len(pts)} points but {len(cols)} colours.")
    if np.isfinite(pts).all():  # the usual case: nothing to drop, no copy
        return pts, cols
    keep = np.isfinite(pts).all(axis=1)  # NaN/inf points are dropped, never written
    return pts[keep], None if cols is None else cols[keep]


def write_point_cloud_ply(
    path: str | Path, points: Any, colors: Any = None, *, note: str | None = None, writer: Writer = NOW
) -> Path:
    """Binary little-endian PLY: float x, y, z (+ uchar red, green, blue, alpha = 255);
    non-finite points dropped. ``note``: a header comment on what the coordinates mean."""
    pts, cols = _cloud(points, colors)
    return writer.write(_prepare(path), lambda p: plyglb.write_vertex_ply(p, pts, cols, note=note))


def subsample(n: int, max_points: int) -> np.ndarray:
    """Sorted indices of an even, deterministic random subset of at most max_points of n."""
    if n <= max_points:
        return np.arange(n)
    return np.sort(np.random.default_rng(0).choice(n, size=max_points, replace=False))


def write_point_cloud_glb(
    path: str | Path,
    points: Any,
    colors: Any = None,
    *,
    max_points: int = GLB_MAX_POINTS,
    opencv_to_gltf: bool = True,
    note: str | None = None,
    writer: Writer = NOW,
) -> Path:
    """glTF 2.0 binary with one POINTS primitive (POSITION float32, COLOR_0 RGBA uint8
    normalised when colours are given).

    At most max_points points (a deterministic random subset; keep the full cloud in the PLY).
    opencv_to_gltf: the points are camera coordinates (x right, y down, z forward) and are
    turned into glTF's frame (y up, z toward the viewer) by negating y and z, so a viewer shows
    the person upright. An empty cloud gives a valid file whose one node has no mesh. ``note``:
    what the coordinates mean (the asset's ``extras``).
    """
    if max_points < 1:
        raise OptionError(f"max_points must be at least 1, got {max_points}.")
    pts, cols = _cloud(points, colors)
    idx = subsample(len(pts), max_points)
    if len(idx) < len(pts):
        pts, cols = pts[idx], None if cols is None else cols[idx]
    flip = OPENCV_TO_GLTF if opencv_to_gltf else None
    return writer.write(_prepare(path), lambda p: plyglb.write_vertex_glb(p, pts, cols, flip=flip, note=note))
