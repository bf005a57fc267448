"""The motion files: the animated GLB's structure against the glTF 2.0 rules (and the Khronos
validator / Blender when they are installed), the NPZ and CSV shapes, gap bridging, 3D
smoothing and the BVH's rotations."""

from __future__ import annotations

import csv
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from motion_synth import walker

from sapiens2.tasks.pose.bvh import BODY, bvh_text, euler_zxy
from sapiens2.tasks.pose.motion_files import write_keypoints_csv, write_keypoints_npz, write_motion_glb
from sapiens2.tasks.pose.skeleton3d import joint_tree, write_skeleton_cloud_glb
from sapiens2.video.clip_motion import (
    Motion,
    MotionOptions,
    assemble,
    bridge_gaps,
    smooth_tracks,
    write_motion_files,
)

FRAMES, FPS = 24, 12.0
_SIZES = {5120: 4, 5121: 1, 5123: 2, 5125: 4}
_WIDTH = {"SCALAR": 1, "VEC2": 2, "VEC3": 3, "VEC4": 4, "MAT4": 16}


def read_glb(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    magic, version, total = struct.unpack("<III", data[:12])
    assert (magic, version, total) == (0x46546C67, 2, len(data))
    n, kind = struct.unpack("<II", data[12:20])
    assert kind == 0x4E4F534A and n % 4 == 0
    doc = json.loads(data[20 : 20 + n])
    rest = data[20 + n :]
    if not rest:
        return doc, b""
    m, kind = struct.unpack("<II", rest[:8])
    assert kind == 0x004E4942 and m % 4 == 0 and len(rest) == 8 + m
    return doc, rest[8:]


def accessor_array(doc: dict, binary: bytes, i: int) -> np.ndarray:
    acc = doc["accessors"][i]
    view = doc["bufferViews"][acc["bufferView"]]
    dtype = {5126: "<f4", 5121: "u1", 5123: "<u2", 5125: "<u4"}[acc["componentType"]]
    width = _WIDTH[acc["type"]]
    start = view["byteOffset"] + acc.get("byteOffset", 0)
    return np.frombuffer(binary, dtype, acc["count"] * width, start).reshape(acc["count"], width)


def check_structure(doc: dict, binary: bytes) -> None:
    """The glTF 2.0 rules a writer can break: buffer and views within bounds and 4-byte aligned,
    accessors inside their views, min/max where required, skins and animations consistent."""
    assert doc["asset"]["version"] == "2.0"
    assert doc["buffers"][0]["byteLength"] == len(binary)
    for view in doc["bufferViews"]:
        assert view["byteOffset"] % 4 == 0 and view["byteOffset"] + view["byteLength"] <= len(binary)
    for acc in doc["accessors"]:
        view = doc["bufferViews"][acc["bufferView"]]
        need = (
            acc["count"]
            * _WIDTH[acc["type"]]
            * _SIZES[acc["componentType"] if acc["componentType"] != 5126 else 5125]
        )
        assert acc.get("byteOffset", 0) + need <= view["byteLength"]
    n_nodes = len(doc["nodes"])
    for node in doc["nodes"]:
        assert all(0 <= c < n_nodes for c in node.get("children", []))
        if "skin" in node:
            assert "mesh" in node  # a skin is always on a mesh node
    for skin in doc.get("skins", []):
        ibm = doc["accessors"][skin["inverseBindMatrices"]]
        assert ibm["type"] == "MAT4" and ibm["count"] == len(skin["joints"])
        assert "target" not in doc["bufferViews"][ibm["bufferView"]]
    for anim in doc.get("animations", []):
        for s in anim["samplers"]:
            inp, out = doc["accessors"][s["input"]], doc["accessors"][s["output"]]
            assert inp["count"] == out["count"] and "min" in inp and "max" in inp
            times = accessor_array(doc, binary, s["input"])[:, 0]
            assert (np.diff(times) > 0).all()
        for c in anim["channels"]:
            assert (
                c["target"]["path"] in ("translation", "rotation", "scale") and c["target"]["node"] < n_nodes
            )
    for mesh in doc["meshes"]:
        for prim in mesh["primitives"]:
            pos = doc["accessors"][prim["attributes"]["POSITION"]]
            assert "min" in pos and "max" in pos
            assert all(doc["accessors"][a]["count"] == pos["count"] for a in prim["attributes"].values())


@pytest.fixture(scope="module")
def two_walkers() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(F, 2, 308, 3) points, (F, 2) presence (the second person arrives at frame 5), times."""
    points = np.stack([walker(FRAMES, FPS, x0=-0.6), walker(FRAMES, FPS, x0=0.6, phase=1.0)], 1)
    present = np.ones((FRAMES, 2), bool)
    present[:5, 1] = False
    points[:5, 1] = np.nan
    return points, present, np.arange(FRAMES) / FPS


def test_motion_glb_has_a_skin_per_person_and_a_keyframe_per_frame(two_walkers, tmp_path: Path) -> None:
    points, present, times = two_walkers
    path = write_motion_glb(tmp_path / "m.glb", points, present, times, np.array([3, 7]))
    doc, binary = read_glb(path)
    check_structure(doc, binary)
    names, parents, _ = joint_tree(False)
    assert len(doc["skins"]) == 2 and all(len(s["joints"]) == len(names) for s in doc["skins"])
    roots = [doc["nodes"][s["skeleton"]]["name"] for s in doc["skins"]]
    assert roots == ["person_3", "person_7"]
    # the node hierarchy follows the joint tree: pelvis under the root, knees under hips ...
    skin = doc["skins"][0]
    node_of = {"root": skin["skeleton"], **dict(zip(names, skin["joints"], strict=True))}
    children = {i: n.get("children", []) for i, n in enumerate(doc["nodes"])}
    for j, p in enumerate(parents):
        parent_node = node_of["root"] if p < 0 else node_of[names[p]]
        assert node_of[names[j]] in children[parent_node]
    [anim] = doc["animations"]
    assert len(anim["channels"]) == 2 * (len(names) + 1)
    counts = {doc["accessors"][s["input"]]["count"] for s in anim["samplers"]}
    assert counts == {FRAMES}  # one keyframe per processed frame
    # the animation moves the joints where the points are: pelvis = hips' midpoint, glTF frame
    pelvis = next(c for c in anim["channels"] if c["target"]["node"] == node_of["pelvis"])
    moved = accessor_array(doc, binary, anim["samplers"][pelvis["sampler"]]["output"])
    hips = (points[:, 0, 9] + points[:, 0, 10]) / 2 * np.array([1, -1, -1])
    assert np.allclose(moved, hips, atol=1e-5)
    # a person is shown (root scale 1) only while present
    scales = [c for c in anim["channels"] if c["target"]["path"] == "scale"]
    assert [c["target"]["node"] for c in scales] == [s["skeleton"] for s in doc["skins"]]
    second = accessor_array(doc, binary, anim["samplers"][scales[1]["sampler"]]["output"])[:, 0]
    assert second[:5].tolist() == [0] * 5 and (second[5:] == 1).all()


def test_motion_glb_reads_back_with_trimesh(two_walkers, tmp_path: Path) -> None:
    trimesh = pytest.importorskip("trimesh")
    points, present, times = two_walkers
    scene = trimesh.load(write_motion_glb(tmp_path / "m.glb", points, present, times, np.array([0, 1])))
    assert len(scene.geometry) == 2  # the two people's stick meshes


def validator() -> tuple[str, dict[str, str]] | None:
    node = shutil.which("node")
    npm = shutil.which("npm")
    if not node or not npm:
        return None
    root = subprocess.run([npm, "root", "-g"], capture_output=True, text=True, timeout=60).stdout.strip()
    env = {**os.environ, "NODE_PATH": root}
    found = subprocess.run(
        [node, "-e", "require.resolve('gltf-validator')"], env=env, capture_output=True, timeout=60
    )
    return (node, env) if found.returncode == 0 else None


_VALIDATE = """
const v = require('gltf-validator'); const fs = require('fs');
v.validateBytes(new Uint8Array(fs.readFileSync(process.argv[1]))).then(r => {
  console.log(JSON.stringify({errors: r.issues.numErrors, warnings: r.issues.numWarnings,
    messages: r.issues.messages.slice(0, 10), animations: r.info.animationCount, skins: r.info.hasSkins}));
});
"""


@pytest.mark.subprocess
def test_khronos_validator_finds_no_error_or_warning(two_walkers, tmp_path: Path) -> None:
    found = validator()
    if found is None:
        pytest.skip("the Khronos glTF validator is not installed (npm install -g gltf-validator; needs node)")
    node, env = found
    points, present, times = two_walkers
    rng = np.random.default_rng(0)
    files = [
        write_motion_glb(tmp_path / "m.glb", points, present, times, np.array([0, 1])),
        write_motion_glb(tmp_path / "face.glb", points, present, times, np.array([0, 1]), face=True),
        write_skeleton_cloud_glb(
            tmp_path / "s.glb", rng.normal(size=(500, 3)), rng.integers(0, 255, (500, 3)), points[0]
        ),
    ]
    for path in files:
        out = subprocess.run(
            [node, "-e", _VALIDATE, str(path)], env=env, capture_output=True, text=True, timeout=120
        )
        report = json.loads(out.stdout)
        assert report["errors"] == 0 and report["warnings"] == 0, (path.name, report["messages"])
    assert report["animations"] == 0  # the photo's GLB has no animation; the motion ones do


_BLENDER = """
import sys, bpy
bpy.ops.wm.read_factory_settings(use_empty=True)
bpy.ops.import_scene.gltf(filepath=sys.argv[-1])
arms = [o for o in bpy.data.objects if o.type == "ARMATURE"]
keys = set()
for a in bpy.data.actions:
    try:
        curves = list(a.fcurves)
    except AttributeError:
        curves = [fc for l in a.layers for s in l.strips for b in s.channelbags for fc in b.fcurves]
    keys |= {round(k.co[0], 3) for fc in curves for k in fc.keyframe_points}
print("RESULT", len(arms), sum(len(o.data.bones) for o in arms), len(keys))
"""


@pytest.mark.subprocess
def test_blender_imports_an_armature_with_keyframes(two_walkers, tmp_path: Path) -> None:
    """Runs only where a Python with Blender's ``bpy`` is named in $SAPIENS2_BLENDER_PYTHON (bpy is
    a ~400 MB wheel: not a test requirement)."""
    python = os.environ.get("SAPIENS2_BLENDER_PYTHON")
    if not python:
        pytest.skip(
            "set SAPIENS2_BLENDER_PYTHON to a Python with bpy (pip install bpy) to import into Blender"
        )
    points, present, times = two_walkers
    glb = write_motion_glb(tmp_path / "m.glb", points, present, times, np.array([0, 1]))
    script = tmp_path / "check.py"
    script.write_text(_BLENDER)
    out = subprocess.run([python, str(script), "--", str(glb)], capture_output=True, text=True, timeout=300)
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT"))
    armatures, bones, keys = map(int, line.split()[1:])
    names, _, _ = joint_tree(False)
    assert (armatures, bones, keys) == (2, 2 * len(names), FRAMES)  # an armature per person


# ----------------------------------------------------------------------------- arrays and table


def test_npz_and_csv_shapes(two_walkers, tmp_path: Path) -> None:
    points, present, times = two_walkers
    scores = np.where(present[..., None], 0.9, np.nan).astype(np.float32).repeat(308, -1)
    bridged = np.zeros(points.shape[:-1], bool)
    bridged[7, 0, 9] = True
    motion = Motion(
        np.arange(FRAMES) * 2, times, np.array([4, 9]), points, scores, present, bridged, np.ones(FRAMES)
    )
    files = write_motion_files(motion, tmp_path, "clip", FPS, MotionOptions())
    assert [p.name for p in files] == [
        "clip_motion.glb",
        "clip_keypoints3d.npz",
        "clip_keypoints3d.csv",
        "clip_motion.bvh",
    ]
    with np.load(files[1]) as z:
        assert z["points"].shape == (FRAMES, 2, 308, 3) and z["points"].dtype == np.float32
        assert (
            z["scores"].shape == (FRAMES, 2, 308) and z["ids"].tolist() == [4, 9] and float(z["fps"]) == FPS
        )
        assert np.isnan(z["points"][:5, 1]).all() and z["bridged"][7, 0, 9]
    with open(files[2], newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["frame", "time", "person", "keypoint", "x", "y", "z", "score", "bridged"]
    assert len(rows) - 1 == int(present.sum()) * 308  # every present person's 308 points per frame
    first = rows[1]
    assert first[:4] == ["0", "0.0000", "4", "nose"] and float(first[6]) == pytest.approx(
        points[0, 0, 0, 2], abs=1e-4
    )
    missing = next(r for r in rows[1:] if r[3] == "tip_of_chin")
    assert missing[4:7] == ["", "", ""]  # no depth: empty, never a made-up number
    assert sum(r[8] == "1" for r in rows[1:]) == 1
    npz = write_keypoints_npz(tmp_path / "x.npz", points=points[:0])
    csv_empty = write_keypoints_csv(
        tmp_path / "x.csv", points[:0], scores[:0], present[:0], np.zeros(0), np.zeros(0), np.zeros(0)
    )
    assert np.load(npz)["points"].shape == (0, 2, 308, 3) and csv_empty.read_text().count("\n") == 1


def test_gaps_of_a_few_frames_are_bridged_and_marked() -> None:
    t = np.arange(12) / 10.0
    x = np.stack([t, 2 * t, 3 + 0 * t], 1)[:, None].repeat(2, 1)  # (12, 2, 3): two points moving
    x[3:6, 0] = np.nan  # a 3-frame gap: bridged
    x[2:10, 1] = np.nan  # an 8-frame gap: left missing
    out, bridged = bridge_gaps(x, t, max_gap=5)
    assert np.allclose(out[3:6, 0], np.stack([t, 2 * t, 3 + 0 * t], 1)[3:6], atol=1e-6)
    assert bridged[:, 0].tolist() == [False] * 3 + [True] * 3 + [False] * 6
    assert np.isnan(out[2:10, 1]).all() and not bridged[:, 1].any()
    edge = x.copy()
    edge[:2, 0] = np.nan  # a gap at the start has no known point before it: not bridged
    assert np.isnan(bridge_gaps(edge, t, 5)[0][:2, 0]).all()


def test_one_euro_in_3d_steadies_a_still_point_and_follows_a_moving_one() -> None:
    rng = np.random.default_rng(0)
    t = np.arange(90) / 30.0
    truth = np.stack([0.3 * np.sin(2 * np.pi * 0.5 * t), 0 * t, 3 + 0 * t], 1)
    noisy = truth + rng.normal(0, 0.01, truth.shape)  # 1 cm noise
    still = np.full_like(noisy, 0.0) + [0, 0, 3] + rng.normal(0, 0.01, truth.shape)
    pts = np.stack([still, noisy], 1)[:, None]  # (90, 1, 2, 3)
    out = smooth_tracks(pts.astype(np.float32), t, MotionOptions())

    def jitter(a: np.ndarray) -> float:
        return float(np.sqrt((np.diff(a, 2, axis=0) ** 2).sum(-1).mean()))

    assert jitter(out[:, 0, 0]) < 0.35 * jitter(pts[:, 0, 0])
    assert jitter(out[:, 0, 1]) < 0.7 * jitter(pts[:, 0, 1])
    err = np.sqrt(((out[30:, 0, 1] - truth[30:]) ** 2).sum(-1).mean())
    raw = np.sqrt(((pts[30:, 0, 1] - truth[30:]) ** 2).sum(-1).mean())
    assert err < 1.5 * raw  # a moving point is not dragged far behind
    off = smooth_tracks(pts.astype(np.float32), t, MotionOptions(smoothing=False))
    assert np.array_equal(off, pts.astype(np.float32))


def test_assemble_applies_factors_thresholds_and_tracks() -> None:
    pts = walker(6, 10.0)
    pose = {
        "frame": np.arange(6), "time_s": np.arange(6) / 10.0,
        "track_ids": np.array([[2, -1]] * 3 + [[-1, 2]] * 3, np.int32),
        "scores": np.full((6, 2, 308), 0.9, np.float32),
    }  # fmt: skip
    pose["scores"][:, :, 0] = 0.1  # the nose scores too low everywhere
    raw = np.full((6, 2, 308, 3), np.nan, np.float32)
    raw[:3, 0], raw[3:, 1] = pts[:3], pts[3:]
    lifted = {"points": raw, "depth_factor": np.array([1, 1, 1, 2, 2, 2], np.float64)}
    m = assemble(pose, lifted, MotionOptions(smoothing=False))
    assert m.ids.tolist() == [2] and m.points.shape == (6, 1, 308, 3) and m.present.all()
    assert np.allclose(m.points[4, 0, 9], 2 * pts[4, 9]) and np.isnan(m.points[:, 0, 0]).all()


# ----------------------------------------------------------------------------- BVH


def _fk(text: str) -> tuple[list[str], dict[str, np.ndarray], np.ndarray]:
    lines = text.splitlines()
    m = lines.index("MOTION")
    offsets, names, cur, end = {}, [], None, False
    for line in lines[:m]:
        t = line.split()
        if t[0] in ("ROOT", "JOINT"):
            cur, end = t[1], False
            names.append(cur)
        elif t[0] == "End":
            end = True
        elif t[0] == "OFFSET" and not end:
            offsets[cur] = np.array(t[1:], float)
    values = np.array([line.split() for line in lines[m + 3 :]], float)
    return names, offsets, values


def _rot(z: float, x: float, y: float) -> np.ndarray:
    z, x, y = np.radians([z, x, y])
    rz = np.array([[np.cos(z), -np.sin(z), 0], [np.sin(z), np.cos(z), 0], [0, 0, 1]])
    rx = np.array([[1, 0, 0], [0, np.cos(x), -np.sin(x)], [0, np.sin(x), np.cos(x)]])
    ry = np.array([[np.cos(y), 0, np.sin(y)], [0, 1, 0], [-np.sin(y), 0, np.cos(y)]])
    return rz @ rx @ ry


def test_bvh_rotations_rebuild_the_bone_directions() -> None:
    pts = walker(FRAMES, FPS)
    names, offsets, values = _fk(bvh_text(pts, FPS))
    assert names == [n for n, _, _ in BODY] and values.shape == (FRAMES, 3 + 3 * len(BODY))
    parent = {n: p for n, p, _ in BODY}
    from sapiens2.tasks.pose.bvh import body_positions

    want = body_positions(pts)
    index = {n: i for i, n in enumerate(names)}
    worst = 0.0
    for f in range(FRAMES):
        glob, pos = {}, {"pelvis": values[f, :3]}
        for i, n in enumerate(names):
            local = _rot(*values[f, 3 + 3 * i : 6 + 3 * i])
            if parent[n] is None:
                glob[n] = local
                continue
            pos[n] = pos[parent[n]] + glob[parent[n]] @ offsets[n]
            glob[n] = glob[parent[n]] @ local
            d1, d2 = pos[n] - pos[parent[n]], want[f, index[n]] - want[f, index[parent[n]]]
            cos = d1 @ d2 / np.linalg.norm(d1) / np.linalg.norm(d2)
            worst = max(worst, float(np.degrees(np.arccos(np.clip(cos, -1, 1)))))
    assert worst < 0.05  # every bone points where the keypoints say
    assert np.allclose(values[:, :3], want[:, 0], atol=1e-3)  # the root moves with the pelvis (cm)


def test_euler_zxy_round_trips() -> None:
    rng = np.random.default_rng(0)
    for z, x, y in rng.uniform(-80, 80, (20, 3)):
        assert np.allclose(euler_zxy(_rot(z, x, y)), [z, x, y], atol=1e-6)
