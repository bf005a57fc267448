"""A Sapiens v1 17-keypoint model's own points reach a clip's files and a batch row, besides their
308 lift (the photo's files already carry them: tests/test_sapiens_v1.py)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from v1_models import save_v1
from video_clips import write_clip

import sapiens2
from sapiens2.batch.records import column_arrays, result_row, rows_table
from sapiens2.data.keypoint_sets import COCO17
from sapiens2.models.detector import Detections
from sapiens2.tasks import registry
from sapiens2.video import TrackingOptions, run_video


@pytest.fixture(scope="module")
def pose17(tmp_path_factory: pytest.TempPathFactory) -> object:
    folder = tmp_path_factory.mktemp("v1_pose17")
    save_v1("pose17", folder)
    return sapiens2.pipeline(
        "pose", checkpoint=folder / "sapiens_tiny_pose17_torchscript.pt2", device="cpu", detector=None
    )


def one_person(rgb: np.ndarray) -> Detections:
    h, w = rgb.shape[:2]
    return Detections(
        np.array([[w * 0.2, h * 0.1, w * 0.8, h * 0.9]], np.float32), np.ones(1, np.float32), "test", 1
    )


def test_a_clip_keeps_a_17_point_models_own_points(pose17: object, tmp_path: Path) -> None:
    clip = write_clip(tmp_path / "walk.mp4", n=3, fps=10.0)
    result = run_video(
        pose17, clip, tmp_path / "out", batch_size=3, options={"flip_test": False},
        tracking=TrackingOptions(detect_every=1), detect=one_person,
    )  # fmt: skip
    files = {p.name.removeprefix("walk_"): p for p in result.files}
    arrays = np.load(files["pose_frames.npz"])
    assert str(arrays["keypoint_set"]) == "coco17"
    assert arrays["native_keypoints"].shape == (3, 1, 17, 2) and arrays["native_scores"].shape == (3, 1, 17)
    assert np.isfinite(arrays["native_keypoints"]).all()
    # the tracks' raw 308 points are the lift of these: each of the 17 at its 308 slot
    lifted, _ = COCO17.lift(arrays["native_keypoints"][0], arrays["native_scores"][0])
    np.testing.assert_allclose(lifted, arrays["keypoints_raw"][0])
    with open(files["keypoints.csv"], newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 * 17 and rows[0]["name"] == "nose" and rows[16]["name"] == COCO17.names[16]
    first = arrays["native_keypoints"][0, 0, 0]
    assert float(rows[0]["x"]) == pytest.approx(float(first[0]), abs=0.01)
    tracks = json.loads(files["pose_tracks.json"].read_text())
    assert tracks["keypoint_set"] == "coco17"


def test_a_batch_row_keeps_a_17_point_models_own_points(pose17: object) -> None:
    photo = np.random.default_rng(2).integers(0, 256, (120, 90, 3), dtype=np.uint8)
    result = pose17(photo, flip_test=False)
    pose = registry.get("pose")
    table = rows_table(pose, [result_row(pose, "a.jpg", result), result_row(pose, "b.jpg", result)])
    assert table["keypoint_set"].to_pylist() == ["coco17", "coco17"]
    points, scores = column_arrays(table["native_keypoints"]), column_arrays(table["native_scores"])
    assert [len(p) for p in points] == [17 * 2] * 2 and [len(s) for s in scores] == [17] * 2
    np.testing.assert_allclose(points[1].reshape(1, 17, 2), result.native[0])
    np.testing.assert_allclose(scores[0].reshape(1, 17), result.native[1])
