"""The mesh from a pointmap (sapiens2.outputs.mesh) and the pointmap task's mesh files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import trimesh

from sapiens2.errors import InputImageError, OptionError
from sapiens2.outputs import mesh as M

F = 500.0  # focal length in pixels of the synthetic camera


def plane_pointmap(h: int, w: int, depth: np.ndarray | float) -> np.ndarray:
    """A pinhole camera (focal F, centre in the middle) seeing depth z per pixel."""
    v, u = np.mgrid[0:h, 0:w].astype(np.float32)
    z = np.broadcast_to(np.asarray(depth, np.float32), (h, w))
    return np.stack([(u - w / 2) / F * z, (v - h / 2) / F * z, z], axis=-1)


def colours(h: int, w: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8)


@pytest.mark.parametrize("step_m", [0.5, 0.05])
def test_no_triangle_spans_a_depth_step(step_m: float) -> None:
    h, w = 40, 60
    z = np.full((h, w), 2.0, np.float32)
    z[:, 30:] += step_m  # a step between columns 29 and 30 (5 cm = 12.5 pixel footprints at 2 m)
    mesh = M.grid_mesh(plane_pointmap(h, w, z), None, colours(h, w), focal_px=F)
    depth = mesh.vertices[mesh.faces][:, :, 2]  # (F, 3) depth of each corner
    assert (np.ptp(depth, axis=1) < step_m / 2).all()  # no face reaches across the step
    # both sides are fully meshed: 2 faces per 2x2 block, only the blocks across the step removed
    assert mesh.num_faces == 2 * (h - 1) * (w - 2)


def test_a_steep_continuous_surface_keeps_every_face() -> None:
    h, w = 40, 60
    # depth rising 3 cm per 4 mm-wide column: ~82 degrees from facing the camera, 7.6 footprints
    ramp = 2.0 + 0.03 * np.arange(w, dtype=np.float32)[None, :].repeat(h, 0)
    mesh = M.grid_mesh(plane_pointmap(h, w, ramp), None, colours(h, w), focal_px=F)
    assert mesh.num_faces == 2 * (h - 1) * (w - 1)


def test_the_step_is_cut_without_a_focal_too() -> None:
    h, w = 20, 30
    z = np.full((h, w), 3.0, np.float32)
    z[10:] = 3.4
    pm = plane_pointmap(h, w, z)
    assert M.estimate_focal(pm, np.ones((h, w), bool)) == pytest.approx(F, rel=1e-3)
    mesh = M.grid_mesh(pm, None, colours(h, w), focal_px=float("nan"))
    depth = mesh.vertices[mesh.faces][:, :, 2]
    assert (np.ptp(depth, axis=1) < 0.01).all() and mesh.num_faces == 2 * (h - 2) * (w - 1)
    # on a grid of every 2nd pixel the estimate is in that grid's pixels: a 20 cm step at 3 m is
    # 17 footprints there (cut); a focal off by 2 would make it 8 (kept)
    z[10:] = 3.2
    coarse = M.grid_mesh(plane_pointmap(h, w, z), None, colours(h, w), focal_px=None, step=2)
    assert coarse.num_faces == 2 * (5 - 1) * (15 - 1) * 2  # two 5-row halves, nothing across


def test_vertices_are_the_foreground_pixels_in_row_major_order() -> None:
    h, w = 30, 40
    pm = plane_pointmap(h, w, 2.0)
    mask = np.zeros((h, w), bool)
    mask[5:25, 8:30] = True
    mask[0, 0] = True  # an isolated pixel: a vertex without a face
    pm[12, 12] = np.nan  # no point here: not a vertex even though the mask says foreground
    img = colours(h, w)
    mesh = M.grid_mesh(pm, mask, img, focal_px=F)
    keep = mask & np.isfinite(pm).all(2)
    assert len(mesh.vertices) == keep.sum() == mask.sum() - 1
    assert np.array_equal(mesh.vertices, pm[keep]) and np.array_equal(mesh.colors, img[keep])
    assert mesh.faces.min() >= 0 and mesh.faces.max() < len(mesh.vertices)
    assert 0 not in mesh.faces  # the isolated pixel (vertex 0) is in no face
    # faces face the camera: normals point to -z in the camera frame
    v = mesh.vertices[mesh.faces]
    normals = np.cross(v[:, 1] - v[:, 0], v[:, 2] - v[:, 0])
    assert (normals[:, 2] < 0).all()


def test_glb_and_ply_load_back_with_faces(tmp_path: Path) -> None:
    h, w = 24, 32
    mesh = M.grid_mesh(plane_pointmap(h, w, 1.5), None, colours(h, w), focal_px=F)
    loaded = trimesh.load(M.write_mesh_glb(tmp_path / "m.glb", mesh), force="mesh", process=False)
    assert len(loaded.faces) == mesh.num_faces == 2 * (h - 1) * (w - 1)
    assert len(loaded.vertices) == h * w
    np.testing.assert_allclose(loaded.vertices, mesh.vertices * [1, -1, -1], atol=1e-6)  # glTF frame
    assert np.array_equal(loaded.visual.vertex_colors[:, :3], mesh.colors)
    ply = trimesh.load(M.write_mesh_ply(tmp_path / "m.ply", mesh), process=False)
    assert np.array_equal(ply.faces, mesh.faces) and np.allclose(ply.vertices, mesh.vertices)  # camera frame
    # glTF keeps the camera-facing winding: normals toward the viewer (+z in glTF)
    assert (loaded.face_normals[:, 2] > 0.99).all()


def _cut_mesh() -> M.GridMesh:
    """A mesh with a cut (a depth step), a hole, an isolated vertex and random colours."""
    h, w = 20, 30
    z = np.full((h, w), 2.0, np.float32)
    z[:, 18:] = 2.6
    mask = np.ones((h, w), bool)
    mask[8:11, 5:9] = False
    mask[0, 1] = False  # pixel (0, 0) keeps no face
    mesh = M.grid_mesh(plane_pointmap(h, w, z), mask, colours(h, w), focal_px=F)
    assert mesh.num_faces and 0 not in mesh.faces
    return mesh


@pytest.mark.parametrize("chunk_rows", [None, 7])
def test_glb_and_ply_hold_exactly_the_mesh_arrays(tmp_path: Path, monkeypatch, chunk_rows) -> None:
    """Read back by trimesh: the same vertices (glTF frame in the GLB), faces and colours, bit
    for bit, also when the writers pack the arrays in many small chunks."""
    from sapiens2.outputs import plyglb

    if chunk_rows:
        monkeypatch.setattr(plyglb, "CHUNK_ROWS", chunk_rows)
    mesh = _cut_mesh()
    glb = trimesh.load(M.write_mesh_glb(tmp_path / "m.glb", mesh), force="mesh", process=False)
    assert np.array_equal(glb.vertices, mesh.vertices * M.OPENCV_TO_GLTF)
    assert np.array_equal(glb.faces, mesh.faces)
    assert (
        np.array_equal(glb.visual.vertex_colors[:, :3], mesh.colors)
        and (glb.visual.vertex_colors[:, 3] == 255).all()
    )
    ply = trimesh.load(M.write_mesh_ply(tmp_path / "m.ply", mesh), process=False)
    assert np.array_equal(ply.vertices, mesh.vertices) and np.array_equal(ply.faces, mesh.faces)
    assert np.array_equal(ply.visual.vertex_colors[:, :3], mesh.colors)


def test_glb_layout_is_aligned_with_position_bounds(tmp_path: Path) -> None:
    """What strict glTF readers check: 4-byte aligned views inside the BIN chunk, uint32 indices,
    POSITION min/max of the written (glTF-frame) positions."""
    import json
    import struct

    mesh = _cut_mesh()
    raw = M.write_mesh_glb(tmp_path / "m.glb", mesh).read_bytes()
    assert struct.unpack_from("<III", raw) == (0x46546C67, 2, len(raw))
    jlen, _ = struct.unpack_from("<II", raw, 12)
    gltf = json.loads(raw[20 : 20 + jlen])
    blen, btype = struct.unpack_from("<II", raw, 20 + jlen)
    assert (
        btype == 0x004E4942 and 28 + jlen + blen == len(raw) == 28 + jlen + gltf["buffers"][0]["byteLength"]
    )
    assert all(v["byteOffset"] % 4 == 0 and v["byteLength"] % 4 == 0 for v in gltf["bufferViews"])
    prim = gltf["meshes"][0]["primitives"][0]
    assert prim["mode"] == 4 and gltf["accessors"][prim["indices"]]["componentType"] == 5125
    pos = gltf["accessors"][prim["attributes"]["POSITION"]]
    flipped = mesh.vertices * M.OPENCV_TO_GLTF
    assert pos["min"] == flipped.min(0).tolist() and pos["max"] == flipped.max(0).tolist()


def test_preview_stays_within_the_face_budget() -> None:
    h, w = 200, 150
    pm, img = plane_pointmap(h, w, 2.0), colours(h, w)
    preview = M.preview_mesh(pm, None, img, focal_px=F, max_faces=5000)
    assert 0 < preview.num_faces <= 5000 and preview.step >= 3
    # the decimated grid is the full grid's every step-th pixel
    assert np.array_equal(preview.vertices, pm[:: preview.step, :: preview.step].reshape(-1, 3))
    assert M.preview_mesh(pm, None, img, focal_px=F).step == 1  # small enough already


def test_empty_and_bad_inputs(tmp_path: Path) -> None:
    pm = plane_pointmap(8, 8, 2.0)
    empty = M.grid_mesh(pm, np.zeros((8, 8), bool), colours(8, 8), focal_px=F)
    assert len(empty.vertices) == empty.num_faces == 0
    assert M.write_mesh_glb(tmp_path / "e.glb", empty).read_bytes()[:4] == b"glTF"
    assert b"element vertex 0" in M.write_mesh_ply(tmp_path / "e.ply", empty).read_bytes()
    cut = M.grid_mesh(np.random.default_rng(0).uniform(1, 9, (8, 8, 3)), None, colours(8, 8), focal_px=F)
    assert cut.num_faces == 0 and len(cut.vertices) == 64  # noise: every triangle cut
    [points] = trimesh.load(M.write_mesh_glb(tmp_path / "c.glb", cut), process=False).geometry.values()
    assert len(points.vertices) == 64  # the vertices survive as points
    one_row = M.grid_mesh(pm[:1], None, colours(1, 8), focal_px=F)
    assert len(one_row.vertices) == 8 and one_row.num_faces == 0
    with pytest.raises(InputImageError, match="share H x W"):
        M.grid_mesh(pm, np.ones((4, 4), bool), colours(8, 8))
    with pytest.raises(OptionError, match="step"):
        M.grid_mesh(pm, None, colours(8, 8), step=0)
    behind = plane_pointmap(8, 8, -1.0)  # points behind the camera are never vertices
    assert len(M.grid_mesh(behind, None, colours(8, 8)).vertices) == 0


def test_pointmap_result_writes_the_mesh_files(tmp_path: Path) -> None:
    """The task's save: full-res mesh GLB/PLY with one vertex per foreground pixel, and the
    preview the 3D viewer shows."""
    from sapiens2.tasks.base import RunInfo
    from sapiens2.tasks.pointmap import TASK, PointmapResult

    h, w = 48, 64
    z = np.full((h, w), 2.0, np.float32)
    z[:, 40:] = 3.0
    pm = plane_pointmap(h, w, z)
    mask = np.zeros((h, w), bool)
    mask[4:44, 10:60] = True
    res = PointmapResult(
        image=colours(h, w), info=RunInfo("pointmap", "0.4b", "cpu", "float32"), name="p",
        pointmap=pm, depth=pm[:, :, 2].copy(), mask=mask, scale=1.0, focal_px=F, focal_px_input=F,
    )  # fmt: skip
    files = {p.name: p for p in res.save(tmp_path)}
    assert {"p_mesh.glb", "p_mesh.ply", "p_mesh_preview.glb", "p_pointcloud.glb"} <= set(files)
    full = trimesh.load(files["p_mesh.glb"], force="mesh", process=False)
    assert len(full.vertices) == mask.sum() == len(res.points()[0])
    np.testing.assert_allclose(full.vertices, res.points()[0] * [1, -1, -1], atol=1e-6)
    assert len(full.faces) == 2 * (40 - 1) * (50 - 2)  # the step at column 40 is cut
    view = TASK.views[0]
    assert view.kind == "model3d" and view.value(res, list(files.values())) == str(
        files["p_mesh_preview.glb"]
    )


def test_point_cloud_keeps_a_foreground_point_the_mesh_leaves_out(tmp_path: Path) -> None:
    """The cloud is the foreground's finite points (``points()``); the mesh also drops z <= 0, so
    when the mask holds such a point (a hand-made result: finish never keeps one) the saved cloud
    is not simply the mesh's vertices."""
    from sapiens2.tasks.base import RunInfo
    from sapiens2.tasks.pointmap import PointmapResult

    h, w = 12, 16
    pm = plane_pointmap(h, w, 2.0)
    pm[3, 4] = [0.1, 0.1, -1.0]  # finite, behind the camera, in the mask
    res = PointmapResult(
        image=colours(h, w), info=RunInfo("pointmap", "0.4b", "cpu", "float32"), name="p",
        pointmap=pm, depth=pm[:, :, 2].copy(), mask=np.ones((h, w), bool), scale=1.0, focal_px=F,
        focal_px_input=F,
    )  # fmt: skip
    files = {p.name: p for p in res.save(tmp_path)}
    cloud = trimesh.load(files["p_pointcloud.ply"], process=False)
    mesh = trimesh.load(files["p_mesh.ply"], process=False)
    assert len(cloud.vertices) == h * w == len(mesh.vertices) + 1
    assert np.array_equal(cloud.vertices, res.points()[0])
    assert np.array_equal(cloud.colors[:, :3], res.points()[1])


def test_cli_writes_the_mesh_by_default(tiny_checkpoints, tmp_path: Path) -> None:
    from PIL import Image

    from sapiens2.cli import main

    src = tmp_path / "in" / "me.png"
    src.parent.mkdir()
    Image.fromarray(colours(30, 40)).save(src)
    args = ["pointmap", str(src), "--checkpoint", str(tiny_checkpoints["pointmap"]), "--no-segmentation"]
    assert main([*args, "--device", "cpu", "--out", str(tmp_path / "out")]) == 0
    folder = tmp_path / "out" / "me"
    pm = np.load(folder / "me_pointmap.npy")
    fg = np.isfinite(pm).all(2) & (pm[:, :, 2] > 0)  # without segmentation: every finite, positive depth
    # (a random tiny model's depth is noise, so most triangles may be cut: count vertices)
    [loaded] = trimesh.load(folder / "me_mesh.glb", process=False).geometry.values()
    assert len(loaded.vertices) == fg.sum()
    ply = trimesh.load(folder / "me_mesh.ply", process=False)
    assert len(ply.vertices) == fg.sum()
    assert (folder / "me_mesh_preview.glb").is_file()
