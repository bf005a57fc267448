"""OpenPose COCO-18 JSON and the ControlNet conditioning picture (sapiens2.tasks.pose.openpose)."""

from __future__ import annotations

import numpy as np
import pytest

from sapiens2.data.metadata import NUM_KEYPOINTS, keypoint_index
from sapiens2.tasks.pose import openpose as op

# a hand-built person: (x, y) per 308 name; everything else scores 0
BODY = {
    "nose": (250, 80), "left_eye": (262, 70), "right_eye": (238, 70), "left_ear": (275, 78),
    "right_ear": (225, 78), "left_shoulder": (300, 150), "right_shoulder": (200, 150),
    "left_elbow": (320, 230), "right_elbow": (180, 230), "left_wrist": (330, 300),
    "right_wrist": (170, 300), "left_hip": (280, 320), "right_hip": (220, 320),
    "left_knee": (285, 410), "right_knee": (215, 410), "left_ankle": (290, 490),
    "right_ankle": (210, 490),
}  # fmt: skip


def person(points: dict[str, tuple[float, float]], score: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
    kp = np.zeros((1, NUM_KEYPOINTS, 2), np.float32)
    sc = np.zeros((1, NUM_KEYPOINTS), np.float32)
    for name, xy in points.items():
        kp[0, keypoint_index(name)] = xy
        sc[0, keypoint_index(name)] = score
    return kp, sc


def triple(flat: list, k: int) -> list:
    return flat[3 * k : 3 * k + 3]


def test_coco18_order_and_neck_rule() -> None:
    kp, sc = person(BODY)
    doc = op.openpose_coco18_json(kp, sc, image_size=(512, 512), threshold=0.3)
    assert doc["version"] == 1.3 and (doc["canvas_width"], doc["canvas_height"]) == (512, 512)
    flat = doc["people"][0]["pose_keypoints_2d"]
    assert len(flat) == 54 and len(op.COCO18_NAMES) == 18
    expected = {
        0: "nose", 2: "right_shoulder", 3: "right_elbow", 4: "right_wrist", 5: "left_shoulder",
        6: "left_elbow", 7: "left_wrist", 8: "right_hip", 9: "right_knee", 10: "right_ankle",
        11: "left_hip", 12: "left_knee", 13: "left_ankle", 14: "right_eye", 15: "left_eye",
        16: "right_ear", 17: "left_ear",
    }  # fmt: skip
    for k, name in expected.items():
        assert triple(flat, k) == [*BODY[name], pytest.approx(0.9)], op.COCO18_NAMES[k]
    assert triple(flat, 1) == [250.0, 150.0, pytest.approx(0.9)]  # neck: mid-point of the shoulders
    # one shoulder under the threshold: no neck (and no right shoulder), the rest unchanged
    sc[0, keypoint_index("right_shoulder")] = 0.2
    flat = op.openpose_coco18_json(kp, sc, image_size=(512, 512), threshold=0.3)["people"][0][
        "pose_keypoints_2d"
    ]
    assert triple(flat, 1) == [0, 0, 0] and triple(flat, 2) == [0, 0, 0]
    assert triple(flat, 5) == [300.0, 150.0, pytest.approx(0.9)]
    # both shoulders just at the threshold: the neck is kept, scored with the lower score
    sc[0, keypoint_index("right_shoulder")] = 0.3
    sc[0, keypoint_index("left_shoulder")] = 0.5
    flat = op.openpose_coco18_json(kp, sc, image_size=(512, 512), threshold=0.3)["people"][0][
        "pose_keypoints_2d"
    ]
    assert triple(flat, 1) == [250.0, 150.0, pytest.approx(0.3)]


def test_hands_follow_openpose_hand_order() -> None:
    fingers = ("thumb", "forefinger", "middle_finger", "ring_finger", "pinky_finger")
    points = dict(BODY)
    for side, x0 in (("left", 400), ("right", 100)):
        for f, finger in enumerate(fingers):  # x: finger, y: joint from base (third_joint) to tip (4)
            for j, joint in enumerate(("_third_joint", "2", "3", "4")):
                points[f"{side}_{finger}{joint}"] = (x0 + 10 * f, 350 + 10 * j)
    kp, sc = person(points)
    who = op.openpose_coco18_json(kp, sc, image_size=(512, 512))["people"][0]
    for side, x0 in (("left", 400), ("right", 100)):
        flat = who[f"hand_{side}_keypoints_2d"]
        assert len(flat) == 63
        assert triple(flat, 0) == [*BODY[f"{side}_wrist"], pytest.approx(0.9)]  # OpenPose 0: wrist
        for k in range(1, 21):  # OpenPose 1-4 thumb base..tip, 5-8 index, ... 17-20 pinky
            f, j = divmod(k - 1, 4)
            assert triple(flat, k)[:2] == [x0 + 10 * f, 350 + 10 * j], (side, k)
    assert who["face_keypoints_2d"] == [0] * 210  # 70 face points, none placed: "not detected"
    # every 308 hand point is used once, wrists included
    assert len(set(op.HAND_LEFT) | set(op.HAND_RIGHT)) == 42


def test_conditioning_picture_limb_colours_at_known_pixels() -> None:
    pts = {
        "right_shoulder": (100, 100), "right_elbow": (100, 300), "right_wrist": (100, 450),
        "left_shoulder": (400, 100), "left_elbow": (400, 300), "right_thumb_third_joint": (200, 450),
    }  # fmt: skip
    kp, sc = person(pts)
    img = op.draw_openpose(kp, sc, (512, 512), threshold=0.3)
    assert img.shape == (512, 512, 3) and img.dtype == np.uint8
    limb = {pair: i for i, pair in enumerate(op.LIMBS)}

    def dim(i: int) -> list[int]:
        return [int(c * 0.6) for c in op.COLORS[i]]

    assert img[200, 100].tolist() == dim(limb[(2, 3)])  # RShoulder-RElbow: orange at 60%
    assert img[375, 100].tolist() == dim(limb[(3, 4)])  # RElbow-RWrist: yellow at 60%
    assert img[200, 400].tolist() == dim(limb[(5, 6)])  # LShoulder-LElbow: green at 60%
    assert img[100, 175].tolist() == dim(limb[(1, 2)]) == [153, 0, 0]  # Neck-RShoulder: red at 60%
    assert dim(limb[(2, 3)]) == [153, 102, 0] and dim(limb[(5, 6)]) == [102, 153, 0]
    assert img[100, 100].tolist() == list(op.COLORS[2])  # the RShoulder joint, full colour
    assert img[100, 250].tolist() == list(op.COLORS[1])  # the neck joint, between the shoulders
    assert img[10, 10].tolist() == [0, 0, 0] and img[200, 250].tolist() == [0, 0, 0]  # black elsewhere
    assert img[450, 150].tolist() == [255, 0, 0]  # hand edge 0 (wrist -> thumb base): hue 0, red
    assert img[450, 200].tolist() == list(op.HAND_JOINT_COLOR)  # hand joints are blue
    # below the threshold nothing is drawn
    assert not op.draw_openpose(kp, sc * 0.1, (512, 512), threshold=0.3).any()


def test_widths_scale_with_the_photo_and_wild_points_do_not_crash() -> None:
    kp, sc = person({"right_shoulder": (1000, 500), "right_elbow": (1000, 1500)})
    big = op.draw_openpose(kp, sc, (2048, 2048))
    row = big[1000]  # across the vertical limb: 2 x 16 px wide at 4x the reference size
    assert 28 <= int((row.sum(1) > 0).sum()) <= 36
    kp[0, keypoint_index("right_elbow")] = (1e30, -1e30)
    assert op.draw_openpose(kp, sc, (64, 64)).shape == (64, 64, 3)
    kp[0, keypoint_index("right_elbow")] = (np.nan, 5)
    assert op.draw_openpose(kp, sc, (64, 64)).shape == (64, 64, 3)


def test_cli_writes_coco18_and_the_conditioning_picture(tiny_checkpoints, tmp_path) -> None:
    import json

    from PIL import Image

    from sapiens2.cli import main

    src = tmp_path / "in" / "me.png"
    src.parent.mkdir()
    Image.fromarray(np.full((48, 32, 3), 128, np.uint8)).save(src)
    args = ["pose", str(src), "--checkpoint", str(tiny_checkpoints["pose"]), "--no-detector"]
    assert main([*args, "--device", "cpu", "--out", str(tmp_path / "out"), "--threshold", "0"]) == 0
    folder = tmp_path / "out" / "me"
    doc = json.loads((folder / "me_openpose_coco18.json").read_text())
    assert (doc["canvas_width"], doc["canvas_height"]) == (32, 48) and len(doc["people"]) == 1
    assert len(doc["people"][0]["hand_left_keypoints_2d"]) == 63
    picture = np.asarray(Image.open(folder / "me_openpose.png"))
    assert picture.shape == (48, 32, 3) and picture.any()  # threshold 0: every point is drawn
    body25 = json.loads((folder / "me_openpose_body25.json").read_text())  # the CLI writes every format
    assert [len(p["face_keypoints_2d"]) for p in body25["people"]] == [210]
    assert [len(p["face_kpts"]) for p in json.loads((folder / "me_coco_wholebody.json").read_text())] == [204]
    assert len((folder / "me_keypoints.csv").read_text().splitlines()) == 1 + 308
