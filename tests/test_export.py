"""Export files: safe names, PNG/NPY/JSON round trips, pose formats, PLY and GLB parsed back."""

from __future__ import annotations

import json
import re
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np
import pytest
import trimesh
from PIL import Image

from sapiens2.data.metadata import (
    BODY25_NAMES,
    COCO17_INDEX,
    COCO17_NAMES,
    KEYPOINT_NAMES,
    NUM_KEYPOINTS,
    keypoint_index,
)
from sapiens2.errors import InputImageError, OptionError
from sapiens2.outputs import export
from sapiens2.outputs.writers import NOW, Writer
from sapiens2.tasks.matting import matting_render
from sapiens2.tasks.pose import pose_files

# ---------------------------------------------------------------- names and paths

HOSTILE = [
    "../../etc/passwd",
    "/abs/path/x.png",
    "..",
    ".",
    "a/b\\c.jpg",
    "C:\\Windows\\evil",
    "name\x00with-nul",
    "~/.ssh/id_rsa",
    "漢字 photo (1).jpeg",
    "",
    None,
    "x" * 500,
]


@pytest.mark.parametrize("name", HOSTILE)
def test_sanitised_names_cannot_escape_out_dir(tmp_path: Path, name: object) -> None:
    out = tmp_path / "out"
    path = export.safe_path(out, name, "_pose.json")
    assert path.parent == out and re.fullmatch(r"[A-Za-z0-9_-]{1,80}_pose\.json", path.name)
    written = export.write_json(path, {"ok": True})
    assert written.resolve().parent == out.resolve()
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == [path.name]


def test_safe_stem_keeps_readable_names_and_rejects_bad_suffixes(tmp_path: Path) -> None:
    # one rule: dots become '_' and nothing is taken for an extension
    assert export.safe_stem("My photo.final.JPG") == "My_photo_final_JPG"
    assert export.safe_stem("my.photo.v2") == "my_photo_v2"
    assert export.safe_stem("../..") == "image"
    assert export.file_stem("a.v1.jpg") != export.file_stem("a.v2.jpg")
    assert (export.file_stem("a.v1.jpg"), export.file_stem("a.v2.jpg")) == ("a_v1", "a_v2")
    assert export.file_stem("../../etc/x.png") == "x"
    assert export.file_stem("C:\\dir\\my.photo.v2.jpg") == "my_photo_v2"
    assert re.fullmatch(r"[A-Za-z0-9_-]+", export.safe_stem("../../etc/x.png"))
    assert export.safe_stem("a" * 200) == "a" * 80
    for suffix in ["/../x.png", "..png", "a/b"]:
        with pytest.raises(OptionError, match="suffix"):
            export.safe_path(tmp_path, "x", suffix)


# ---------------------------------------------------------------- PNG / NPY / JSON


@pytest.mark.parametrize("shape", [(5, 7), (5, 7, 3), (5, 7, 4)])
def test_png_round_trips_gray_rgb_and_rgba(tmp_path: Path, shape: tuple[int, ...]) -> None:
    arr = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    path = export.write_png(tmp_path / "sub" / "a.png", arr)
    assert path.exists() and (np.asarray(Image.open(path)) == arr).all()


def test_png_handles_bool_and_uint16_and_rejects_floats(tmp_path: Path) -> None:
    mask = np.eye(4, dtype=bool)
    back = np.asarray(Image.open(export.write_png(tmp_path / "m.png", mask)))
    assert back.dtype == np.uint8 and (back == mask * 255).all()
    deep = (np.arange(12, dtype=np.uint16) * 5000).reshape(3, 4)
    assert (cv2.imread(str(export.write_png(tmp_path / "d.png", deep)), cv2.IMREAD_UNCHANGED) == deep).all()
    with pytest.raises(InputImageError, match="uint8/uint16"):
        export.write_png(tmp_path / "f.png", np.zeros((2, 2), np.float32))
    with pytest.raises(InputImageError, match=r"\(H, W, 3\)"):
        export.write_png(tmp_path / "f.png", np.zeros((2, 2, 5), np.uint8))


def test_npy_casts_without_creating_inf(tmp_path: Path) -> None:
    arr = np.array([1.5, 1e6, np.nan, -1e9], np.float32)
    back = np.load(export.write_npy(tmp_path / "a.npy", arr, dtype=np.float16))
    assert back.dtype == np.float16 and back[0] == 1.5 and np.isnan(back[2])
    assert np.isfinite(back[[0, 1, 3]]).all() and back[1] == np.finfo(np.float16).max
    assert (np.load(export.write_npy(tmp_path / "b.npy", np.arange(4))) == np.arange(4)).all()


def _some_files(out: Path, writer: Writer = NOW) -> list[Path]:
    """A save() of several kinds: gray, RGB, RGBA PNGs and NPYs with and without a cast."""
    rng = np.random.default_rng(1)
    return [
        export.write_png(out / "rgb.png", rng.integers(0, 256, (300, 200, 3), dtype=np.uint8), writer=writer),
        export.write_npy(out / "half.npy", rng.standard_normal((300, 200, 3)).astype(np.float32), np.float16,
                         writer=writer),
        export.write_png(out / "gray.png", rng.integers(0, 256, (300, 200), dtype=np.uint8), writer=writer),
        export.write_png(out / "rgba.png", rng.integers(0, 256, (300, 200, 4), dtype=np.uint8), writer=writer),
        export.write_npy(out / "ids.npy", rng.integers(0, 29, (300, 200), dtype=np.uint8), writer=writer),
    ]  # fmt: skip


def test_a_pooled_writer_gives_the_sequential_files_in_the_same_order(tmp_path: Path) -> None:
    one_by_one = _some_files(tmp_path / "seq")
    with ThreadPoolExecutor(3) as pool, Writer(pool) as writer:
        side_by_side = _some_files(tmp_path / "pool", writer)
        assert len(writer.jobs) == len(side_by_side)  # every write went to the pool
    assert [p.name for p in side_by_side] == [p.name for p in one_by_one]
    for a, b in zip(one_by_one, side_by_side, strict=True):
        assert b.read_bytes() == a.read_bytes(), b.name
    assert [job.result() for job in writer.jobs] == side_by_side


def test_a_writer_is_passed_explicitly(tmp_path: Path) -> None:
    """A write given no writer writes at once, whatever pooled writer another caller holds open."""
    elsewhere: list[Path] = []
    with ThreadPoolExecutor(2) as pool, Writer(pool) as writer:
        other = threading.Thread(
            target=lambda: elsewhere.append(export.write_png(tmp_path / "o.png", np.zeros((4, 4), np.uint8)))
        )
        other.start()
        other.join()
        assert elsewhere[0].is_file() and not writer.jobs  # written at once, not one of the writer's jobs
        export.write_png(tmp_path / "now.png", np.zeros((4, 4), np.uint8))
        assert (tmp_path / "now.png").is_file() and not writer.jobs  # the default writes at once


def test_pooled_write_errors_are_those_of_a_sequential_run(tmp_path: Path) -> None:
    big = np.random.default_rng(2).integers(0, 256, (1500, 1500, 3), dtype=np.uint8)
    (tmp_path / "first.png").mkdir()  # a folder where a file should go: the write fails
    (tmp_path / "second.npy").mkdir()

    def save(writer: Writer = NOW) -> None:
        export.write_png(tmp_path / "first.png", big, writer=writer)  # slow: it fails after the next one does
        export.write_npy(tmp_path / "second.npy", np.zeros(3), writer=writer)
        export.write_png(tmp_path / "third.png", big, writer=writer)

    with pytest.raises(IsADirectoryError) as sequential:
        save()
    with pytest.raises(IsADirectoryError) as deferred:
        with ThreadPoolExecutor(3) as pool, Writer(pool) as writer:
            save(writer)
    assert Path(deferred.value.filename).name == Path(sequential.value.filename).name == "first.png"
    # the block's own error after a failed write: the write's error, as a sequential run gives
    with pytest.raises(IsADirectoryError):
        with ThreadPoolExecutor(3) as pool, Writer(pool) as writer:
            export.write_png(tmp_path / "first.png", big, writer=writer)
            export.write_png(
                tmp_path / "bad.png", np.zeros((2, 2), np.float32), writer=writer
            )  # InputImageError
    # the block's own error when every write so far went well; those writes are finished by then
    with pytest.raises(InputImageError, match="uint8/uint16"):
        with ThreadPoolExecutor(3) as pool, Writer(pool) as writer:
            export.write_png(tmp_path / "fine.png", big, writer=writer)
            export.write_png(tmp_path / "bad.png", np.zeros((2, 2), np.float32), writer=writer)
    assert (np.asarray(Image.open(tmp_path / "fine.png")) == big).all()


def test_json_writes_nan_and_inf_as_null(tmp_path: Path) -> None:
    obj = {"a": np.float32(np.nan), "b": [np.inf, 1.0], "c": np.arange(2), 3: (np.int64(4), np.bool_(True))}
    text = export.write_json(tmp_path / "x.json", obj).read_text(encoding="utf-8")
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"a": None, "b": [None, 1.0], "c": [0, 1], "3": [4, True]}


def test_rgba_cutout_unpremultiplies_safely() -> None:
    fg = np.array([[[0.25, 0.1, 0.0], [0.0, 0.0, 0.0], [np.nan, 0.9, np.inf]]], np.float32)
    alpha = np.array([[0.5, 0.0, 0.5]], np.float32)
    out = matting_render.rgba_cutout(fg, alpha)
    assert out.dtype == np.uint8 and out.shape == (1, 3, 4)
    assert out[0, 0].tolist() == [128, 51, 0, 128]  # 0.25 / 0.5 = 0.5 -> 128
    assert out[0, 1].tolist() == [0, 0, 0, 0]
    assert out[0, 2].tolist() == [0, 255, 0, 128]  # 0.9 / 0.5 clipped; NaN/inf -> 0
    with pytest.raises(InputImageError, match=r"alpha \(H, W\)"):
        matting_render.rgba_cutout(fg, np.zeros((2, 2)))


# ---------------------------------------------------------------- pose JSON


def _two_people() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    kp = rng.random((2, NUM_KEYPOINTS, 2)) * [640, 480]
    sc = rng.random((2, NUM_KEYPOINTS)) * 0.5 + 0.5
    boxes = np.array([[10, 20, 110, 220], [200, 40, 300, 400]], np.float64)
    return kp, sc, boxes


def test_pose_json_has_308_named_points_per_person(tmp_path: Path) -> None:
    kp, sc, boxes = _two_people()
    kp[1, 5] = np.nan
    data = pose_files.pose_json(kp, sc, boxes, image_size=(640, 480), box_scores=[0.9, 0.8])
    back = json.loads(export.write_json(tmp_path / "p.json", data).read_text())
    assert back["image_size"] == {"width": 640, "height": 480} and len(back["people"]) == 2
    for p, person in enumerate(back["people"]):
        assert [k["name"] for k in person["keypoints"]] == list(KEYPOINT_NAMES)
        assert person["box"] == boxes[p].tolist()
        assert person["keypoints"][7]["x"] == pytest.approx(kp[p, 7, 0], abs=0.01)
        assert person["keypoints"][7]["score"] == pytest.approx(sc[p, 7], abs=1e-4)
    assert back["people"][1]["keypoints"][5]["x"] is None and back["people"][0]["box_score"] == 0.9


def test_coco17_json_maps_points_and_visibility() -> None:
    kp, sc, boxes = _two_people()
    assert [KEYPOINT_NAMES[i] for i in COCO17_INDEX] == list(COCO17_NAMES)
    sc[0, keypoint_index("left_knee")] = 0.1  # below threshold -> 0, 0, 0
    data = pose_files.coco17_json(kp, sc, boxes, image_size=(640, 480))
    ann = data["annotations"][0]
    assert len(ann["keypoints"]) == 17 * 3 and len(data["categories"][0]["keypoints"]) == 17
    wrist = COCO17_NAMES.index("left_wrist")  # COCO slot 9 <- 308 index 62
    assert ann["keypoints"][wrist * 3 : wrist * 3 + 3] == [
        pytest.approx(kp[0, 62, 0], abs=0.01),
        pytest.approx(kp[0, 62, 1], abs=0.01),
        2,
    ]
    knee = COCO17_NAMES.index("left_knee")
    assert ann["keypoints"][knee * 3 : knee * 3 + 3] == [0, 0, 0] and ann["num_keypoints"] == 16
    assert ann["bbox"] == [10.0, 20.0, 100.0, 200.0]


def test_openpose_body25_neck_is_the_shoulder_midpoint() -> None:
    kp, sc, _ = _two_people()
    data = pose_files.openpose_body25_json(kp, sc)
    assert data["version"] == 1.3 and len(data["people"]) == 2
    flat = data["people"][1]["pose_keypoints_2d"]
    assert len(flat) == 25 * 3 and len(BODY25_NAMES) == 25
    ls, rs = keypoint_index("left_shoulder"), keypoint_index("right_shoulder")
    neck = flat[3:6]
    assert neck[0] == pytest.approx((kp[1, ls, 0] + kp[1, rs, 0]) / 2, abs=0.01)
    assert neck[1] == pytest.approx((kp[1, ls, 1] + kp[1, rs, 1]) / 2, abs=0.01)
    assert neck[2] == pytest.approx(min(sc[1, ls], sc[1, rs]), abs=1e-4)
    heel = BODY25_NAMES.index("RHeel")
    assert flat[heel * 3] == pytest.approx(kp[1, keypoint_index("right_heel"), 0], abs=0.01)
    sc[1, ls] = 0.0  # a missing shoulder hides the neck
    assert pose_files.openpose_body25_json(kp, sc)["people"][1]["pose_keypoints_2d"][3:6] == [0, 0, 0]


# ---------------------------------------------------------------- point clouds


def _read_ply(path: Path) -> tuple[list[str], np.ndarray]:
    raw = path.read_bytes()
    end = raw.index(b"end_header\n") + len(b"end_header\n")
    header = raw[:end].decode("ascii").splitlines()
    types = {"float": "<f4", "uchar": "u1"}
    fields = [(line.split()[2], types[line.split()[1]]) for line in header if line.startswith("property")]
    return header, np.frombuffer(raw[end:], dtype=fields)


def test_ply_parses_back_with_expected_count_and_values(tmp_path: Path) -> None:
    pts = np.random.default_rng(1).normal(size=(50, 3)).astype(np.float32)
    cols = np.random.default_rng(2).integers(0, 256, (50, 3), dtype=np.uint8)
    pts[3] = np.nan  # dropped
    header, rec = _read_ply(export.write_point_cloud_ply(tmp_path / "c.ply", pts, cols))
    assert header[:2] == ["ply", "format binary_little_endian 1.0"] and "element vertex 49" in header
    keep = np.arange(50) != 3
    assert len(rec) == 49 and (rec["x"] == pts[keep, 0]).all() and (rec["z"] == pts[keep, 2]).all()
    assert (rec["green"] == cols[keep, 1]).all() and (rec["alpha"] == 255).all()
    header, rec = _read_ply(export.write_point_cloud_ply(tmp_path / "n.ply", pts[:4]))
    assert rec.dtype.names == ("x", "y", "z") and len(rec) == 3
    with pytest.raises(InputImageError, match="4 points but 3 colours"):
        export.write_point_cloud_ply(tmp_path / "bad.ply", pts[:4], cols[:3])


def test_cloud_files_do_not_depend_on_the_writers_chunk_size(tmp_path: Path, monkeypatch) -> None:
    """The writers pack arrays in chunks of ``plyglb.CHUNK_ROWS`` rows: any chunk size (here
    one that splits the arrays unevenly) writes the same bytes."""
    from sapiens2.outputs import plyglb

    rng = np.random.default_rng(4)
    pts = rng.normal(size=(50, 3)).astype(np.float32)
    cols = rng.integers(0, 256, (50, 3), dtype=np.uint8)
    whole = [
        export.write_point_cloud_ply(tmp_path / "a.ply", pts, cols),
        export.write_point_cloud_glb(tmp_path / "a.glb", pts, cols),
    ]
    monkeypatch.setattr(plyglb, "CHUNK_ROWS", 7)
    chunked = [
        export.write_point_cloud_ply(tmp_path / "b.ply", pts, cols),
        export.write_point_cloud_glb(tmp_path / "b.glb", pts, cols),
    ]
    assert [p.read_bytes() for p in whole] == [p.read_bytes() for p in chunked]


def _read_glb(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    magic, version, length = struct.unpack_from("<III", raw, 0)
    assert (magic, version, length) == (0x46546C67, 2, len(raw))
    jlen, jtype = struct.unpack_from("<II", raw, 12)
    assert jtype == 0x4E4F534A and jlen % 4 == 0
    gltf = json.loads(raw[20 : 20 + jlen])
    binary = b""
    if 20 + jlen < len(raw):
        blen, btype = struct.unpack_from("<II", raw, 20 + jlen)
        assert btype == 0x004E4942 and blen % 4 == 0 and 28 + jlen + blen == len(raw)
        binary = raw[28 + jlen :]
    return gltf, binary


def test_glb_parses_back_with_counts_bounds_and_colours(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    pts = rng.normal(size=(30, 3)).astype(np.float32)
    cols = rng.integers(0, 256, (30, 3), dtype=np.uint8)
    gltf, binary = _read_glb(export.write_point_cloud_glb(tmp_path / "c.glb", pts, cols))
    prim = gltf["meshes"][0]["primitives"][0]
    pos_acc, col_acc = gltf["accessors"][prim["attributes"]["POSITION"]], gltf["accessors"][1]
    assert gltf["asset"]["version"] == "2.0" and prim["mode"] == 0
    assert pos_acc["count"] == col_acc["count"] == 30 and pos_acc["componentType"] == 5126
    assert col_acc["componentType"] == 5121 and col_acc["normalized"] is True
    assert len(binary) >= gltf["buffers"][0]["byteLength"] == 30 * 12 + 30 * 4
    expected = pts * [1, -1, -1]  # camera frame -> glTF frame (y up, z toward the viewer)
    assert pos_acc["min"] == pytest.approx(expected.min(0).tolist())
    assert pos_acc["max"] == pytest.approx(expected.max(0).tolist())
    views = gltf["bufferViews"]
    got = np.frombuffer(binary, "<f4", count=90, offset=views[0]["byteOffset"]).reshape(30, 3)
    rgba = np.frombuffer(binary, np.uint8, count=120, offset=views[1]["byteOffset"]).reshape(30, 4)
    assert np.array_equal(got, expected.astype(np.float32)) and (rgba[:, :3] == cols).all()
    assert (rgba[:, 3] == 255).all()


def test_glb_subsamples_and_handles_empty_clouds(tmp_path: Path) -> None:
    pts = np.arange(150, dtype=np.float32).reshape(50, 3)
    gltf, binary = _read_glb(
        export.write_point_cloud_glb(tmp_path / "s.glb", pts, max_points=10, opencv_to_gltf=False)
    )
    assert gltf["accessors"][0]["count"] == 10
    got = np.frombuffer(binary, "<f4", count=30).reshape(10, 3)
    assert all(any((row == p).all() for p in pts) for row in got)  # a subset of the input
    empty, binary = _read_glb(export.write_point_cloud_glb(tmp_path / "e.glb", np.full((4, 3), np.nan)))
    assert binary == b"" and "meshes" not in empty and "mesh" not in empty["nodes"][0]
    assert trimesh.load(tmp_path / "e.glb").is_empty  # readers accept the empty file
    with pytest.raises(OptionError, match="max_points must be at least 1"):
        export.write_point_cloud_glb(tmp_path / "x.glb", pts, max_points=0)
