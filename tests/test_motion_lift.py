"""3D keypoints from pose + pointmap: the lifting on synthetic pointmaps, and the pose task's
``keypoints_3d`` option on tiny models (files, view, what it loads, what it costs)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from sapiens2.errors import OptionError
from sapiens2.models import cost
from sapiens2.tasks import registry
from sapiens2.tasks.pose import pose_3d
from sapiens2.tasks.pose.pose_lift import lift_keypoints

H, W, F, CX, CY = 120, 160, 150.0, 80.0, 60.0
A, B, C = 0.3, -0.2, 2.5  # the person's plane: z = A x + B y + C


def plane_pointmap(a: float = A, b: float = B, c: float = C) -> np.ndarray:
    """(H, W, 3) the camera rays of a pinhole camera meeting the plane z = a x + b y + c."""
    v, u = np.mgrid[0:H, 0:W].astype(np.float64)
    dx, dy = (u - CX) / F, (v - CY) / F
    z = c / (1 - a * dx - b * dy)
    return np.stack([dx * z, dy * z, z], -1).astype(np.float32)


def person() -> tuple[np.ndarray, np.ndarray]:
    mask = np.zeros((H, W), bool)
    mask[20:100, 50:110] = True
    return mask, np.array([[50, 20, 110, 100]], np.float32)


def test_points_on_a_plane_come_back_on_it() -> None:
    pm = plane_pointmap()
    mask, box = person()
    rng = np.random.default_rng(0)
    kp = np.stack([rng.uniform(50, 109, 300), rng.uniform(20, 99, 300)], 1)[None]  # inside, edges too
    lifted = lift_keypoints(kp, pm, mask, box)
    p = lifted.points[0].astype(np.float64)
    assert lifted.valid.all() and (lifted.samples > 0).all()
    assert np.abs(p[:, 2] - (A * p[:, 0] + B * p[:, 1] + C)).max() < 1e-5  # on the plane
    # and where the keypoint is: its ray (x/z, y/z) within the 7 px window's half-width
    u, v = p[:, 0] / p[:, 2] * F + CX, p[:, 1] / p[:, 2] * F + CY
    assert np.abs(u - kp[0, :, 0]).max() <= 3.5 and np.abs(v - kp[0, :, 1]).max() <= 3.5
    centre = (kp[0, :, 0] > 55) & (kp[0, :, 0] < 104) & (kp[0, :, 1] > 25) & (kp[0, :, 1] < 94)
    assert np.abs(u - kp[0, :, 0])[centre].max() < 0.6  # a full window is centred on the point


def test_background_pixels_are_never_used() -> None:
    """The background is a far wall; keypoints on the person's edge must keep the person's depth."""
    pm = plane_pointmap()
    mask, box = person()
    wall = plane_pointmap(0.0, 0.0, 9.0)
    pm[~mask] = wall[~mask]
    edge = np.array([[[50.2, 60.0], [109.4, 30.0], [80.0, 20.1], [80.0, 99.6], [50.0, 20.0]]])
    p = lift_keypoints(edge, pm, mask, box).points[0]
    assert np.isfinite(p).all()
    assert np.abs(p[:, 2] - (A * p[:, 0] + B * p[:, 1] + C)).max() < 1e-5
    assert (p[:, 2] < 4).all()  # never the wall at 9 m
    # the same keypoints without a mask would take the wall in: the mask is what keeps it out
    mixed = lift_keypoints(edge, pm, None, box).points[0]
    assert (np.abs(mixed[:, 2] - p[:, 2]) > 1e-3).any()


def test_a_keypoint_off_the_mask_or_the_box_is_missing_not_invented() -> None:
    pm = plane_pointmap()
    mask, box = person()
    kp = np.array([[[10.0, 10.0], [150.0, 110.0], [80.0, 60.0], [np.nan, np.nan], [-50.0, 400.0]]])
    lifted = lift_keypoints(kp, pm, mask, box)
    assert lifted.valid[0].tolist() == [False, False, True, False, False]
    assert np.isnan(lifted.points[0, [0, 1, 3, 4]]).all() and (lifted.samples[0, [0, 1, 3, 4]] == 0).all()
    # on the mask but in another person's box only: not this person's
    other = np.array([[0, 0, 30, 30]], np.float32)
    assert not lift_keypoints(kp[:, 2:3], pm, mask, other).valid.any()
    # NaN / non-positive depth is no sample either
    holed = pm.copy()
    holed[55:66, 75:86] = np.nan
    assert not lift_keypoints(kp[:, 2:3], holed, mask, box).valid.any()


def test_one_stray_sample_does_not_move_the_point() -> None:
    pm = plane_pointmap()
    mask, box = person()
    kp = np.array([[[80.0, 60.0]]])
    clean = lift_keypoints(kp, pm, mask, box).points
    pm[61, 81] = (0.0, 0.0, 0.3)  # one wild value inside the window
    assert np.allclose(lift_keypoints(kp, pm, mask, box).points, clean, atol=2e-3)


def test_bad_inputs_are_refused_with_a_message() -> None:
    pm = plane_pointmap()
    with pytest.raises(OptionError, match="keypoints must be"):
        lift_keypoints(np.zeros((3, 2)), pm, None)
    with pytest.raises(OptionError, match="pointmap must be"):
        lift_keypoints(np.zeros((1, 3, 2)), pm[..., 0], None)
    with pytest.raises(OptionError, match="mask must be"):
        lift_keypoints(np.zeros((1, 3, 2)), pm, np.ones((4, 4), bool))
    with pytest.raises(OptionError, match="odd"):
        lift_keypoints(np.zeros((1, 3, 2)), pm, None, window=4)
    with pytest.raises(OptionError, match="boxes"):
        lift_keypoints(np.zeros((2, 3, 2)), pm, None, np.zeros((1, 4)))
    assert lift_keypoints(np.zeros((0, 308, 2)), pm, None).points.shape == (0, 308, 3)


# ----------------------------------------------------------------------------- the pose option


def test_the_option_is_declared_off_and_borrows_the_pointmap() -> None:
    task = registry.get("pose")
    opt = next(o for o in task.options if o.name == "keypoints_3d")
    assert opt.default is False and opt.stage == "infer" and opt.gpu_default is None
    pointmap, seg = registry.get("pointmap"), registry.get("seg")
    assert task.borrows == (pointmap,)
    assert task.needs({"keypoints_3d": True}) == (pointmap, seg) and task.needs({}) == ()
    # the two borrowed forwards are in the cost of a photo and of a clip
    with_3d, plain = task.work({"keypoints_3d": True}), task.work({})
    assert (with_3d.borrowed, plain.borrowed) == (2, 0)
    assert cost.photo_seconds("0.4b", with_3d) - cost.photo_seconds("0.4b", plain) == pytest.approx(
        2 * cost.tflops("0.4b") / cost.SUSTAINED_TFLOPS
    )
    assert cost.clip_seconds("0.4b", with_3d, 8, 8, 5) > cost.clip_seconds("0.4b", plain, 8, 8, 5)
    assert [v.kind for v in task.views] == ["json"]  # /pose keeps its outputs (the GLB is a download)


def glb_json(path: Path) -> dict:
    data = path.read_bytes()
    magic, version, total = struct.unpack("<III", data[:12])
    assert (magic, version, total) == (0x46546C67, 2, len(data))
    n, kind = struct.unpack("<II", data[12:20])
    assert kind == 0x4E4F534A
    return json.loads(data[20 : 20 + n])


@pytest.mark.slow
def test_pose_photo_with_3d_keypoints_on_tiny_models(tiny_checkpoints, tmp_path: Path) -> None:
    from sapiens2.tasks.pointmap import PointmapPipeline
    from sapiens2.tasks.pose import PosePipeline
    from sapiens2.tasks.seg import SegPipeline

    seg = SegPipeline(checkpoint=tiny_checkpoints["seg"], device="cpu")
    pm = PointmapPipeline(checkpoint=tiny_checkpoints["pointmap"], device="cpu", seg=seg)
    pose = PosePipeline(checkpoint=tiny_checkpoints["pose"], device="cpu", detector=None, pointmap=lambda: pm)
    photo = (np.random.default_rng(1).random((96, 128, 3)) * 255).astype(np.uint8)
    plain = pose(photo)
    assert plain.keypoints_3d is None
    assert not any("keypoints3d" in p.name for p in plain.save(tmp_path / "plain"))
    result = pose(photo, keypoints_3d=True)
    k3 = result.keypoints_3d
    assert k3 is not None and k3.points.shape == (1, 308, 3) and k3.samples.shape == (1, 308)
    known = np.isfinite(k3.points).all(-1)
    assert known.any() and (k3.samples[known] >= 4).all() and (k3.samples[~known] == 0).all()
    files = result.save(tmp_path / "out", threshold=0.0)
    names = [p.name for p in files]
    assert names[-2:] == ["image_keypoints3d.json", "image_skeleton3d.glb"]
    doc = json.loads(files[-2].read_text())
    assert doc["format"] == "sapiens2-308-3d" and doc["units"] == "metres"
    kps = doc["people"][0]["keypoints"]
    assert len(kps) == 308 and kps[0]["name"] == "nose"
    assert sum(k["z"] is not None for k in kps) == int(known.sum()) == doc["people"][0]["with_depth"]
    gltf = glb_json(files[-1])
    assert [m["name"] for m in gltf["meshes"]][0] == "point_cloud"
    assert pose_3d.skeleton_view(result, files) == str(files[-1])
    assert result.summary()["keypoints_with_depth"] == int(known.sum())


def test_pose_3d_says_so_when_the_pointmap_is_missing(tiny_checkpoints, monkeypatch, tmp_path) -> None:
    from sapiens2.errors import WeightsUnavailableError
    from sapiens2.tasks.pose import PosePipeline

    def missing():
        raise WeightsUnavailableError("no pointmap weights here")

    pose = PosePipeline(checkpoint=tiny_checkpoints["pose"], device="cpu", detector=None, pointmap=missing)
    result = pose(np.zeros((64, 48, 3), np.uint8), keypoints_3d=True)
    assert result.keypoints_3d is None
    assert any("No 3D keypoints" in n and "no pointmap weights" in n for n in result.notices)
    with pytest.raises(OptionError):
        pose_3d.LazyPointmap(42, pose)
