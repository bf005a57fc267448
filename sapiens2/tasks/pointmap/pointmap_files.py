"""The pointmap's full-resolution files: every foreground pixel a vertex of the mesh (GLB and PLY)
and a point of the cloud (PLY). At 12 MP they outweigh the rest of a request's files, so the app
makes them only on request (``sapiens2.serving.on_demand``), from what
:func:`full_resolution_source` keeps and the pointmap download: the same bytes either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ...outputs.export import safe_path, safe_stem, write_point_cloud_ply
from ...outputs.mesh import finite_points, grid_mesh, pixels_where, write_mesh_glb, write_mesh_ply
from ...outputs.writers import NOW, Writer


def foreground_points(
    pointmap: np.ndarray, mask: np.ndarray, image: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The points of ``pointmap`` (H, W, 3) under ``mask`` that are finite, (N, 3) float32, and
    their ``image`` colours (N, 3) uint8, in row-major order."""
    keep = mask & finite_points(pointmap)
    return pixels_where(pointmap, keep), pixels_where(image, keep)


#: The files ``save(..., later=True)`` leaves out, made on request, in this order.
FULL_RESOLUTION = ("_mesh.glb", "_mesh.ply", "_pointcloud.ply")


def write_full_resolution(
    folder: Path,
    name: str,
    pointmap: np.ndarray,
    mask: np.ndarray,
    image: np.ndarray,
    focal_px: float,
    points: tuple[np.ndarray, np.ndarray] | None = None,
    *,
    writer: Writer = NOW,
) -> list[Path]:
    """The :data:`FULL_RESOLUTION` files of a result into ``folder``, in that order: the mesh
    (:func:`sapiens2.outputs.mesh.grid_mesh`) as GLB and PLY, and every foreground point as a PLY.
    ``points``: :func:`foreground_points` of these arrays, when the caller has them already.
    With a pooled writer the cloud is written while the mesh is built."""
    glb, ply, cloud = (safe_path(folder, name, suffix) for suffix in FULL_RESOLUTION)
    cloud_points = points if points is not None else foreground_points(pointmap, mask, image)
    write_point_cloud_ply(cloud, *cloud_points, writer=writer)
    full = grid_mesh(pointmap, mask, image, focal_px=focal_px)
    return [write_mesh_glb(glb, full, writer=writer), write_mesh_ply(ply, full, writer=writer), cloud]


def full_resolution_source(mask: np.ndarray, image: np.ndarray, focal_px: float, name: str) -> dict[str, Any]:
    """What the full-resolution files are made from besides ``<name>_pointmap.npy`` (a download):
    the mask as bits, the photo (the colours), the focal length and the name."""
    return {"mask": np.packbits(mask, axis=None), "image": image, "focal_px": np.float64(focal_px),
            "name": np.str_(name)}  # fmt: skip


def full_resolution_names(source: Mapping[str, Any]) -> list[str]:
    """The file names :func:`make_full_resolution` writes, in its order."""
    return [f"{safe_stem(str(source['name']))}{suffix}" for suffix in FULL_RESOLUTION]


def make_full_resolution(
    source: Mapping[str, Any], folder: Path, out: Path, writer: Writer = NOW
) -> list[Path]:
    """The :data:`FULL_RESOLUTION` files, into ``out``, from ``source`` and the pointmap download
    in ``folder``: the same files, byte for byte, that a pointmap result's ``save()`` writes at once."""
    name, image = str(source["name"]), source["image"]
    pointmap = np.load(safe_path(folder, name, "_pointmap.npy"), allow_pickle=False)
    h, w = image.shape[:2]
    mask = np.unpackbits(source["mask"], count=h * w).reshape(h, w).astype(bool)
    focal = float(source["focal_px"])
    return write_full_resolution(out, name, pointmap, mask, image, focal, writer=writer)


__all__ = [
    "FULL_RESOLUTION",
    "foreground_points",
    "full_resolution_names",
    "full_resolution_source",
    "make_full_resolution",
    "write_full_resolution",
]
