"""Relative depth in 3D: the foreground back-projected through a pinhole of an assumed field of view.

Sapiens v1 depth was trained with a scale-invariant log loss (SAPIENS_V1_SPEC.md 4.4,
``SiLogLoss``: it compares log depths, so one factor on every depth of a photo costs nothing,
while a shift does). Its output is depth up to one scale, not up to a scale and a shift and not
inverse depth, so the back-projected points have the person's shape up to that scale, given the
field of view. The photo's field of view is not known: :data:`ASSUMED_FOV_DEG` is assumed and
said wherever the 3D is shown (where the true view is wider, the shape shown is too deep for
its width; where narrower, too flat).
The depth is taken as the distance along the optical axis (z), as rendered depth maps give it.
The point cloud and mesh are written by the pointmap's code (``sapiens2.outputs``).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ...outputs.export import (
    GLB_MAX_POINTS,
    safe_path,
    write_point_cloud_glb,
    write_point_cloud_ply,
)
from ...outputs.mesh import PREVIEW_MAX_FACES, preview_mesh, write_mesh_glb
from ...outputs.writers import NOW, Writer

#: the horizontal field of view the back-projection assumes: a middle value (a phone's main
#: camera sees about 65-75°, a portrait lens or a crop less)
ASSUMED_FOV_DEG = 60.0
#: how the 3D is labelled in the page ("°") and in the files (ASCII)
THREE_D_LABEL = f"relative depth: shape up to scale, assumed {ASSUMED_FOV_DEG:g}° field of view"
THREE_D_NOTE = THREE_D_LABEL.replace("°", " deg")
#: the files :func:`write_depth_3d` writes, in order
THREE_D_FILES = ("_depth_pointcloud.ply", "_depth_pointcloud.glb", "_depth_mesh_preview.glb")


def assumed_focal_px(width: int, fov_deg: float = ASSUMED_FOV_DEG) -> float:
    """The focal length in pixels of a photo ``width`` pixels wide seen over ``fov_deg`` degrees."""
    return 0.5 * width / math.tan(math.radians(fov_deg) / 2)


def back_project(depth: np.ndarray, mask: np.ndarray, fov_deg: float = ASSUMED_FOV_DEG) -> np.ndarray:
    """(H, W, 3) float32 camera-frame points (x right, y down, z forward; the depth's units) of
    the ``mask`` pixels, NaN elsewhere: pixel centres through a pinhole at the photo's centre."""
    h, w = depth.shape
    f = assumed_focal_px(w, fov_deg)
    z = np.where(mask, depth, np.nan).astype(np.float32)
    u = ((np.arange(w, dtype=np.float32) + 0.5 - w / 2) / f)[None, :]
    v = ((np.arange(h, dtype=np.float32) + 0.5 - h / 2) / f)[:, None]
    return np.stack([u * z, v * z, z], axis=-1)


def write_depth_3d(
    out_dir: str | Path,
    name: str,
    depth: np.ndarray,
    mask: np.ndarray,
    image: np.ndarray,
    *,
    writer: Writer = NOW,
) -> list[Path]:
    """The :data:`THREE_D_FILES`: every foreground point as a PLY, at most ``GLB_MAX_POINTS`` of
    them as a GLB, and the decimated mesh the 3D viewer shows (at most ``PREVIEW_MAX_FACES``
    faces, the pointmap's discontinuity rule, which compares lengths to depths and so holds at
    any scale); each file carries :data:`THREE_D_NOTE`."""
    points = back_project(depth, mask)
    focal = assumed_focal_px(depth.shape[1])
    at = np.flatnonzero(mask)
    ply, glb, preview = (safe_path(out_dir, name, suffix) for suffix in THREE_D_FILES)
    cloud = points.reshape(-1, 3)[at], image.reshape(-1, 3)[at]
    mesh = preview_mesh(points, mask, image, focal_px=focal, max_faces=PREVIEW_MAX_FACES)
    return [
        write_point_cloud_ply(ply, *cloud, note=THREE_D_NOTE, writer=writer),
        write_point_cloud_glb(glb, *cloud, max_points=GLB_MAX_POINTS, note=THREE_D_NOTE, writer=writer),
        write_mesh_glb(preview, mesh, note=THREE_D_NOTE, writer=writer),
    ]


__all__ = [
    "ASSUMED_FOV_DEG",
    "THREE_D_FILES",
    "THREE_D_LABEL",
    "THREE_D_NOTE",
    "assumed_focal_px",
    "back_project",
    "write_depth_3d",
]
