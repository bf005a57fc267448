"""Files people download: PNG, NPY, JSON (Sapiens-308, COCO-17, OpenPose BODY_25), PLY, GLB.

Point clouds (and meshes, :mod:`sapiens2.outputs.mesh`) are written by :mod:`sapiens2.outputs.plyglb`; OpenPose COCO-18,
OpenPose's hands and face and the ControlNet picture live in :mod:`sapiens2.outputs.openpose`;
COCO-WholeBody and the keypoint CSV in :mod:`sapiens2.outputs.keypoint_formats`.

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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from ..data.metadata import BODY25_PAIRS, COCO17_INDEX, COCO17_NAMES, KEYPOINT_NAMES, NUM_KEYPOINTS
from ..errors import InputImageError, OptionError
from . import plyglb, png
from .mesh import OPENCV_TO_GLTF
from .openpose import openpose_people
from .render import matte_arrays, to_uint8
from .writers import NOW, Writer
from .writers import prepare as _prepare

GLB_MAX_POINTS = 300_000  # a browser viewer stays responsive below this; the PLY keeps every point
_STEM_MAX = 80

# COCO person skeleton (1-based keypoint ids), as in the COCO keypoint annotations
COCO17_SKELETON = [
    [16, 14], [14, 12], [17, 15], [15, 13], [12, 13], [6, 12], [7, 13], [6, 7], [6, 8], [7, 9],
    [8, 10], [9, 11], [2, 3], [1, 2], [1, 3], [2, 4], [3, 5], [4, 6], [5, 7],
]  # fmt: skip


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


def write_npy(path: str | Path, array: Any, dtype: Any = None, *, writer: Writer = NOW) -> Path:
    """np.save of the array, cast to dtype if given (finite values clipped to a float dtype's range);
    the cast runs with the writing."""
    arr = np.asarray(array)
    dt = None if dtype is None else np.dtype(dtype)

    def save(p: Path) -> None:
        out = arr
        if dt is not None and dt.kind == "f" and arr.dtype.kind == "f":
            lim = float(np.finfo(dt).max)
            out = np.empty(arr.shape, dt)  # clipped and cast in one pass, no full-size temporary
            np.clip(arr, -lim, lim, out=out, casting="unsafe")  # NaN stays NaN; big values do not become inf
        elif dt is not None:
            out = arr.astype(dt)
        with open(p, "wb") as f:
            np.save(f, out, allow_pickle=False)

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


def rgba_cutout(foreground: Any, alpha: Any) -> np.ndarray:
    """(H, W, 4) uint8 RGBA from premultiplied fg (H, W, 3) and alpha (H, W) in [0, 1].

    Colour = fg / alpha where alpha >= 1/255 (else 0), clipped; NaN/inf count as 0.
    """
    fg, a = matte_arrays(foreground, alpha)
    a = np.clip(a, 0.0, 1.0)
    # 255 / alpha where visible, else 0: one multiply un-premultiplies and scales to 0..255
    gain = np.divide(np.float32(255.0), a, out=np.zeros_like(a), where=a >= 1.0 / 255.0)
    rgb = cv2.multiply(fg, cv2.merge([gain] * 3), dtype=cv2.CV_8U)  # saturating: clips to 0..255
    return cv2.merge([rgb, to_uint8(a, 255.0)])


# ---------------------------------------------------------------- pose JSON


def _pose_inputs(keypoints: Any, scores: Any, boxes: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    kp = np.asarray(keypoints, dtype=np.float64).reshape(-1, NUM_KEYPOINTS, 2)
    sc = np.asarray(scores, dtype=np.float64).reshape(kp.shape[0], NUM_KEYPOINTS)
    bx = None if boxes is None else np.asarray(boxes, dtype=np.float64).reshape(kp.shape[0], 4)
    return kp, sc, bx


def _r(v: float, nd: int) -> float | None:
    return round(float(v), nd) if math.isfinite(v) else None


def pose_json(
    keypoints: Any,
    scores: Any,
    boxes: Any,
    *,
    image_size: tuple[int, int],
    box_scores: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Sapiens-308 JSON: per person its box [x1, y1, x2, y2] and 308 {name, x, y, score}.

    image_size is (width, height). Coordinates in image px (2 decimals), non-finite -> null.
    """
    kp, sc, bx = _pose_inputs(keypoints, scores, boxes)
    people = []
    for p in range(kp.shape[0]):
        points = [
            {
                "name": KEYPOINT_NAMES[k],
                "x": _r(kp[p, k, 0], 2),
                "y": _r(kp[p, k, 1], 2),
                "score": _r(sc[p, k], 4),
            }
            for k in range(NUM_KEYPOINTS)
        ]
        person: dict[str, Any] = {"id": p, "box": None if bx is None else [_r(v, 2) for v in bx[p]]}
        if box_scores is not None:
            person["box_score"] = _r(box_scores[p], 4)
        person["keypoints"] = points
        people.append(person)
    w, h = image_size
    return {
        "format": "sapiens2-308",
        "image_size": {"width": int(w), "height": int(h)},
        "num_keypoints": NUM_KEYPOINTS,
        "people": people,
    }


def coco17_json(
    keypoints: Any,
    scores: Any,
    boxes: Any,
    *,
    image_size: tuple[int, int],
    box_scores: Sequence[float] | None = None,
    threshold: float = 0.3,
    image_id: int = 0,
) -> dict[str, Any]:
    """COCO-style person keypoints: one annotation per person, ``keypoints`` = [x, y, v] * 17.

    v = 2 (labelled, visible) when the score >= threshold and the point is finite, else the
    triple is 0, 0, 0 (COCO's "not labelled"). bbox is [x, y, w, h]; ``score`` is the box score
    when given, else the mean score of the visible points; ``keypoint_scores`` keeps all 17.
    """
    kp, sc, bx = _pose_inputs(keypoints, scores, boxes)
    w, h = image_size
    anns = []
    for p in range(kp.shape[0]):
        xy, s = kp[p, COCO17_INDEX], sc[p, COCO17_INDEX]
        vis = np.isfinite(xy).all(1) & np.isfinite(s) & (s >= threshold)
        flat: list[float] = []
        for k in range(17):
            flat += [_r(xy[k, 0], 2), _r(xy[k, 1], 2), 2] if vis[k] else [0, 0, 0]
        ann: dict[str, Any] = {
            "id": p + 1,
            "image_id": image_id,
            "category_id": 1,
            "keypoints": flat,
            "num_keypoints": int(vis.sum()),
            "keypoint_scores": [_r(v, 4) for v in s],
        }
        if bx is not None:
            x1, y1, x2, y2 = bx[p]
            ann["bbox"] = [_r(x1, 2), _r(y1, 2), _r(x2 - x1, 2), _r(y2 - y1, 2)]
        score = box_scores[p] if box_scores is not None else (float(s[vis].mean()) if vis.any() else 0.0)
        ann["score"] = _r(score, 4)
        anns.append(ann)
    return {
        "images": [{"id": image_id, "width": int(w), "height": int(h)}],
        "annotations": anns,
        "categories": [
            {"id": 1, "name": "person", "keypoints": list(COCO17_NAMES), "skeleton": COCO17_SKELETON}
        ],
    }


def body25_arrays(keypoints: Any, scores: Any) -> tuple[np.ndarray, np.ndarray]:
    """(P, 25, 2) points and (P, 25) scores in OpenPose BODY_25 order.

    Neck = midpoint of the shoulders, MidHip = midpoint of the hips, each scored with the lower
    of its two scores (OpenPose's convention, not the 308 set's own ``neck`` point).
    """
    kp, sc, _ = _pose_inputs(keypoints, scores, None)
    a, b = BODY25_PAIRS[:, 0], BODY25_PAIRS[:, 1]
    return (kp[:, a] + kp[:, b]) / 2.0, np.minimum(sc[:, a], sc[:, b])


def openpose_body25_json(
    keypoints: Any,
    scores: Any,
    *,
    threshold: float = 0.3,
    hands: bool = True,
    face: bool = True,
    image_size: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """OpenPose JSON (version 1.3): per person ``pose_keypoints_2d`` = [x, y, c] * 25,
    ``hand_left_keypoints_2d`` / ``hand_right_keypoints_2d`` = [x, y, c] * 21 and
    ``face_keypoints_2d`` = [x, y, c] * 70 (:mod:`sapiens2.outputs.openpose`: OpenPose's hand and
    face orders), the 3D arrays empty. ``image_size`` (width, height), when given, is written as
    ``canvas_width``/``canvas_height``, as the COCO-18 file has it.

    Points below the threshold or not finite are written 0, 0, 0 (OpenPose's "not detected").
    """
    xy, s = body25_arrays(keypoints, scores)
    people = openpose_people(xy, s, keypoints, scores, threshold=threshold, hands=hands, face=face)
    if image_size is None:
        return {"version": 1.3, "people": people}
    w, h = image_size
    return {"version": 1.3, "canvas_width": int(w), "canvas_height": int(h), "people": people}


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


def write_point_cloud_ply(path: str | Path, points: Any, colors: Any = None, *, writer: Writer = NOW) -> Path:
    """Binary little-endian PLY: float x, y, z (+ uchar red, green, blue, alpha = 255);
    non-finite points dropped."""
    pts, cols = _cloud(points, colors)
    return writer.write(_prepare(path), lambda p: plyglb.write_vertex_ply(p, pts, cols))


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
    writer: Writer = NOW,
) -> Path:
    """glTF 2.0 binary with one POINTS primitive (POSITION float32, COLOR_0 RGBA uint8
    normalised when colours are given).

    At most max_points points (a deterministic random subset; keep the full cloud in the PLY).
    opencv_to_gltf: the points are camera coordinates (x right, y down, z forward) and are
    turned into glTF's frame (y up, z toward the viewer) by negating y and z, so a viewer shows
    the person upright. An empty cloud gives a valid file whose one node has no mesh.
    """
    if max_points < 1:
        raise OptionError(f"max_points must be at least 1, got {max_points}.")
    pts, cols = _cloud(points, colors)
    idx = subsample(len(pts), max_points)
    if len(idx) < len(pts):
        pts, cols = pts[idx], None if cols is None else cols[idx]
    flip = OPENCV_TO_GLTF if opencv_to_gltf else None
    return writer.write(_prepare(path), lambda p: plyglb.write_vertex_glb(p, pts, cols, flip=flip))
