"""A triangle mesh from a metric pointmap: neighbouring foreground pixels become triangles.

Every 2x2 block of pixels gives two triangles, (top-left, bottom-left, top-right) and
(top-right, bottom-left, bottom-right); a triangle is kept when its three pixels are foreground
and none of its edges spans a depth discontinuity.

Discontinuity rule: an edge is broken when its 3D length exceeds ``MAX_EDGE_FOOTPRINTS`` (10)
pixel footprints at the nearer end's depth, i.e. ``|e| / z_near > 10 * step / f`` (``f`` the
focal length in pixels, ``step`` the pixel spacing of the grid, x sqrt(2) for the diagonal). A
continuous surface tilted by an angle a away from facing the camera stretches an edge to
``footprint / cos(a)``, so 10 keeps surfaces up to ~84 degrees (the sides of arms and legs) and
cuts steps, which the model's bilinear up-sampling smears into ramps a few pixels wide but still
tens of footprints long per pixel (a 20 cm step at 3 m over 8 pixels of a 12 MP photo is ~30).
Relative to depth and focal, the rule means the same thing at every distance and photo size.

Vertices are every foreground pixel in row-major order (the point cloud's points, the same
order), so the vertex count is the foreground pixel count; coordinates stay in the camera frame
(x right, y down, z forward, metres) and the GLB writer turns them into glTF's frame as the
point-cloud GLB does. Files are written by :mod:`sapiens2.outputs.plyglb` (GLB and binary PLY).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputImageError, OptionError
from . import plyglb
from .writers import NOW, Writer, prepare

MAX_EDGE_FOOTPRINTS = 10.0
#: faces of the browser preview: ~100k vertices, a ~4 MB GLB, small enough for the page's WebGL
#: viewer to load fast and stay responsive (not frame-rate measured); the full mesh is a download
PREVIEW_MAX_FACES = 200_000
#: camera frame (x right, y down, z forward) -> glTF (y up, z toward the viewer): a 180 degree
#: turn about x, so triangle winding (and which side faces the camera) is kept
OPENCV_TO_GLTF = np.array([1.0, -1.0, -1.0], np.float32)


@dataclass
class GridMesh:
    """Vertices (N, 3) float32 (camera frame, metres), colours (N, 3) uint8, faces (F, 3) int32."""

    vertices: np.ndarray
    colors: np.ndarray
    faces: np.ndarray
    step: int = 1  # pixel spacing of the grid the mesh was built on (1 = full resolution)

    @property
    def num_faces(self) -> int:
        return int(len(self.faces))


def _inputs(pointmap: Any, mask: Any, image: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    pm = np.asarray(pointmap, dtype=np.float32)
    if pm.ndim != 3 or pm.shape[2] != 3:
        raise InputImageError(f"A pointmap must be (H, W, 3), got {pm.shape}.")
    hw = pm.shape[:2]
    m = np.ones(hw, bool) if mask is None else np.asarray(mask, dtype=bool)
    img = np.asarray(image)
    if m.shape != hw or img.shape[:2] != hw or img.ndim != 3 or img.shape[2] != 3:
        raise InputImageError(f"Pointmap {hw}, mask {m.shape} and image {img.shape} must share H x W.")
    if img.dtype != np.uint8:
        img = np.clip(np.nan_to_num(img.astype(np.float32)), 0, 255).round().astype(np.uint8)
    return pm, m, img


def estimate_focal(pointmap: np.ndarray, valid: np.ndarray) -> float:
    """Focal length in pixels implied by the points themselves (x/z changes by 1/f per column);
    used when the model's focal is unknown. Falls back to the image width."""
    rows = max(1, pointmap.shape[0] // 256)  # every k-th row: a few hundred rows pin the median
    pointmap, valid = pointmap[::rows], valid[::rows]
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = pointmap[:, :, 0] / pointmap[:, :, 2]
    both = valid[:, 1:] & valid[:, :-1]
    d = np.abs(np.diff(slope, axis=1))[both]
    d = d[np.isfinite(d) & (d > 0)]
    return float(1.0 / np.median(d)) if len(d) else float(pointmap.shape[1])


def _sq_len(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    d = a - b
    return np.einsum("...k,...k->...", d, d)


def grid_mesh(
    pointmap: Any,
    mask: Any,
    image: Any,
    *,
    focal_px: float | None = None,
    step: int = 1,
    max_edge_footprints: float = MAX_EDGE_FOOTPRINTS,
) -> GridMesh:
    """The mesh of the foreground pixels of ``pointmap`` (H, W, 3), on every ``step``-th pixel.

    ``mask`` (H, W) bool: foreground (None = every pixel); pixels with a non-finite point or
    z <= 0 are never used. ``image`` (H, W, 3): vertex colours. ``focal_px``: focal length in
    pixels of this image (None or non-finite: estimated from the points).
    """
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise OptionError(f"step must be a whole number >= 1, got {step!r}.")
    if not max_edge_footprints > 0:
        raise OptionError(f"max_edge_footprints must be positive, got {max_edge_footprints!r}.")
    pm, m, img = _inputs(pointmap, mask, image)
    pm, m, img = pm[::step, ::step], m[::step, ::step], img[::step, ::step]
    z = pm[:, :, 2]
    with np.errstate(invalid="ignore"):
        valid = m & finite_points(pm) & (z > 0)
    if focal_px is not None and math.isfinite(focal_px) and focal_px > 0:
        f = float(focal_px) / step  # the subsampled grid's pixels are `step` times larger
    else:
        f = estimate_focal(pm, valid)  # measured on the subsampled grid: already in its pixels
    index = np.full(valid.shape, -1, np.int32)
    index[valid] = np.arange(int(valid.sum()), dtype=np.int32)
    faces = _faces(pm, z, index, (max_edge_footprints / f) ** 2)
    return GridMesh(pixels_where(pm, valid), pixels_where(img, valid), faces, step)


def finite_points(pm: np.ndarray) -> np.ndarray:
    """(H, W) bool: the pixels of ``pm`` (H, W, 3) whose three coordinates are finite. One test per
    plane: ``np.isfinite(pm).all(axis=2)`` reduces over a length-3 axis ~10x slower."""
    return np.isfinite(pm[:, :, 0]) & np.isfinite(pm[:, :, 1]) & np.isfinite(pm[:, :, 2])


def pixels_where(arr: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """``arr[keep]`` for an (H, W, C) array and an (H, W) mask, in row-major order: the same
    values, gathered ~4x faster by ``np.compress`` on the (H * W, C) rows."""
    return np.compress(keep.ravel(), arr.reshape(-1, arr.shape[2]), axis=0)


def _edge_ok(
    pm: np.ndarray, z: np.ndarray, p: tuple[slice, slice], q: tuple[slice, slice], k2: float
) -> np.ndarray:
    """Edge test between pixels ``pm[p]`` and ``pm[q]``: squared length <= k2 * z_near^2."""
    return _sq_len(pm[p], pm[q]) <= k2 * np.minimum(z[p], z[q]) ** 2


def _faces(pm: np.ndarray, z: np.ndarray, index: np.ndarray, k2: float) -> np.ndarray:
    """(F, 3) triangles of the grid whose vertices exist and whose edges pass the length test
    (squared length <= k2 * z_near^2, twice that for the diagonal)."""
    h, w = index.shape
    if min(h, w) < 2:
        return np.zeros((0, 3), np.int32)
    a, b, c, d = index[:-1, :-1], index[:-1, 1:], index[1:, :-1], index[1:, 1:]
    every, head, tail = slice(None), slice(None, -1), slice(1, None)  # all, all but last, all but first
    with np.errstate(invalid="ignore"):  # NaN points are never vertices; their comparisons are False
        # each horizontal edge is the top of one block and the bottom of the one above it (and each
        # vertical edge a right and a left side): tested once, on the same operands as per block
        across = _edge_ok(pm, z, (every, tail), (every, head), k2)  # (H, W-1): pixel, left neighbour
        along = _edge_ok(pm, z, (tail, every), (head, every), k2)  # (H-1, W): pixel, the one above
        diag = _edge_ok(pm, z, (tail, head), (head, tail), 2 * k2)  # bottom-left, top-right
    shared = (b >= 0) & (c >= 0) & diag
    upper = shared & (a >= 0) & across[:-1] & along[:, :-1]
    lower = shared & (d >= 0) & across[1:] & along[:, 1:]
    # winding (a, c, b): its normal points toward the camera (-z in the camera frame)
    firsts = [_block_starts(blocks) for blocks in (upper, lower)]
    faces = np.empty((sum(len(f) for f in firsts), 3), np.int32)
    flat, rows = index.ravel(), 0
    for first, corners in zip(firsts, [(0, w, 1), (1, w, w + 1)], strict=True):
        for k, offset in enumerate(corners):  # a corner `offset` pixels past the block's top-left
            faces[rows : rows + len(first), k] = flat[offset:][first]
        rows += len(first)
    return faces


def _block_starts(blocks: np.ndarray) -> np.ndarray:
    """Flat pixel positions (row-major) of the top-left corners of the chosen (H-1, W-1) blocks:
    the blocks set on rows of the full width W, so a block's position is its pixel's."""
    on_rows = np.zeros((blocks.shape[0], blocks.shape[1] + 1), bool)
    on_rows[:, :-1] = blocks
    return np.flatnonzero(on_rows)


def preview_step(num_points: int, max_faces: int = PREVIEW_MAX_FACES) -> int:
    """Grid step whose mesh stays within ``max_faces``: a full grid has ~2 faces per point, and
    a step s keeps 1/s^2 of the points."""
    return max(1, math.ceil(math.sqrt(2.0 * num_points / max_faces)))


def preview_mesh(
    pointmap: Any, mask: Any, image: Any, *, focal_px: float | None = None, max_faces: int = PREVIEW_MAX_FACES
) -> GridMesh:
    """A decimated mesh for the browser: the grid mesh on every s-th pixel (s from
    :func:`preview_step`, raised until the face count fits ``max_faces``)."""
    if max_faces < 1:
        raise OptionError(f"max_faces must be at least 1, got {max_faces}.")
    m = np.ones(np.shape(pointmap)[:2], bool) if mask is None else np.asarray(mask, bool)
    step = preview_step(int(m.sum()), max_faces)
    while True:
        mesh = grid_mesh(pointmap, m, image, focal_px=focal_px, step=step)
        if mesh.num_faces <= max_faces:
            return mesh
        step += 1


# ---------------------------------------------------------------- files


def write_mesh_glb(
    path: str | Path,
    mesh: GridMesh,
    *,
    opencv_to_gltf: bool = True,
    note: str | None = None,
    writer: Writer = NOW,
) -> Path:
    """glTF 2.0 binary: one TRIANGLES primitive, POSITION float32, COLOR_0 RGBA uint8 normalised,
    uint32 indices. ``opencv_to_gltf``: camera frame -> glTF frame (see :data:`OPENCV_TO_GLTF`);
    ``note``: what the coordinates mean (the asset's ``extras``).

    A mesh with vertices but no face (every triangle cut) is written as a POINTS primitive, since
    a triangle primitive without indices would draw its vertices as triangles."""
    flip = OPENCV_TO_GLTF if opencv_to_gltf else None
    return writer.write(
        prepare(path),
        lambda p: plyglb.write_vertex_glb(p, mesh.vertices, mesh.colors, mesh.faces, flip=flip, note=note),
    )


def write_mesh_ply(path: str | Path, mesh: GridMesh, *, writer: Writer = NOW) -> Path:
    """Binary little-endian PLY in the camera frame (as the point-cloud PLY): float x, y, z,
    uchar red, green, blue, alpha per vertex; a face list of vertex indices."""
    return writer.write(
        prepare(path), lambda p: plyglb.write_vertex_ply(p, mesh.vertices, mesh.colors, mesh.faces)
    )


__all__ = [
    "MAX_EDGE_FOOTPRINTS",
    "PREVIEW_MAX_FACES",
    "GridMesh",
    "estimate_focal",
    "finite_points",
    "grid_mesh",
    "pixels_where",
    "preview_mesh",
    "preview_step",
    "write_mesh_glb",
    "write_mesh_ply",
]
