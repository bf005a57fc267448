"""Sapiens v1 depth in 3D (``sapiens2.tasks.relative_depth.relative_depth_3d``): depth up to one
scale (SAPIENS_V1_SPEC.md 4.4, SiLogLoss) back-projected under an assumed field of view, written
by the pointmap's point-cloud and mesh code, labelled in the files and the page."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest

from sapiens2.tasks import registry
from sapiens2.tasks.base import RunInfo
from sapiens2.tasks.relative_depth import DepthResult
from sapiens2.tasks.relative_depth.relative_depth_3d import (
    ASSUMED_FOV_DEG,
    THREE_D_NOTE,
    assumed_focal_px,
    back_project,
    write_depth_3d,
)


def dome(h: int = 48, w: int = 64, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """A person-like bump: nearer in the middle, a mask around it."""
    yy, xx = np.mgrid[:h, :w]
    r2 = ((xx - w / 2) / (w / 3)) ** 2 + ((yy - h / 2) / (h / 3)) ** 2
    depth = (scale * (3.0 - 0.5 * np.sqrt(np.clip(1 - r2, 0, 1)))).astype(np.float32)
    return depth, r2 < 1


def glb_json(path: Path) -> dict:
    data = path.read_bytes()
    (length,) = struct.unpack_from("<I", data, 12)
    return json.loads(data[20 : 20 + length])


def test_back_projection_is_a_pinhole_of_the_assumed_view_and_scales_with_depth() -> None:
    w = 64
    f = assumed_focal_px(w)
    assert f == pytest.approx(32 / math.tan(math.radians(ASSUMED_FOV_DEG / 2)))
    plane = np.full((48, w), 2.0, np.float32)
    mask = np.ones(plane.shape, bool)
    mask[0, 0] = False
    pts = back_project(plane, mask)
    assert np.isnan(pts[0, 0]).all() and np.allclose(pts[..., 2][mask], 2.0)
    # the last pixel centre sits half a pixel inside the view's edge: x / z = (w/2 - 0.5) / f
    assert pts[10, -1, 0] / 2.0 == pytest.approx((w / 2 - 0.5) / f, rel=1e-6)
    assert pts[-1, 10, 1] > 0 and pts[0, 10, 1] < 0  # y down, as the camera frame of the pointmap
    depth, m = dome()
    assert np.allclose(back_project(7.5 * depth, m)[m], 7.5 * back_project(depth, m)[m], rtol=1e-5)


def test_the_3d_files_are_labelled_and_the_mesh_does_not_depend_on_the_scale(tmp_path: Path) -> None:
    depth, mask = dome()
    image = np.full((*depth.shape, 3), 200, np.uint8)
    meshes = []
    for scale in (1.0, 1000.0):  # the same shape in other units: the same triangles
        out = tmp_path / str(scale)
        ply, glb, preview = write_depth_3d(out, "photo", scale * depth, mask, image)
        head = ply.read_bytes().split(b"end_header\n")[0].decode("ascii")
        assert f"comment {THREE_D_NOTE}" in head and f"element vertex {int(mask.sum())}" in head
        assert THREE_D_NOTE == "relative depth: shape up to scale, assumed 60 deg field of view"
        for path in (glb, preview):
            assert glb_json(path)["asset"]["extras"]["note"] == THREE_D_NOTE
        meshes.append(glb_json(preview)["accessors"][0]["count"])  # the mesh's indices
    assert meshes[0] == meshes[1] > 0


def test_a_depth_result_saves_its_3d_and_the_tab_shows_it_labelled(tmp_path: Path) -> None:
    depth, mask = dome()
    image = np.zeros((*depth.shape, 3), np.uint8)
    result = DepthResult(image=image, info=RunInfo("depth", "v1-1b", "cpu", "float32"), depth=depth,
                         mask=mask, name="photo")  # fmt: skip
    files = result.save(tmp_path)
    names = [p.name for p in files]
    assert names[-3:] == [
        "photo_depth_pointcloud.ply",
        "photo_depth_pointcloud.glb",
        "photo_depth_mesh_preview.glb",
    ]
    described = json.loads((tmp_path / "photo_depth.json").read_text())["3d"]
    assert described["assumed_horizontal_fov_deg"] == 60 and described["shape"].startswith("up to scale")
    task = registry.get("depth")
    json_view, view = task.views
    assert json_view.kind == "json" and view.kind == "model3d"
    assert view.label == "3D mesh (relative depth: shape up to scale, assumed 60° field of view)"
    assert view.value(result, files) == str(tmp_path / "photo_depth_mesh_preview.glb")
    assert "3D shape up to scale" in task.summary
    assert "3D view is the shape up to scale under an assumed 60° field of view" in result.to_dict()["note"]
