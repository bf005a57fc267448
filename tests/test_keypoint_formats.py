"""Keypoint formats from the 308 points: COCO-WholeBody-133 (read back with pycocotools), OpenPose
with hands and face (key names and lengths as OpenPose writes them), the ControlNet picture's
face, and the long CSV (read back with the csv module and numpy).

Index checks go against ``sapiens2/data/keypoints308.json`` itself (its COCO-WholeBody table, its
flip pairs, its skeleton), never against a copy of the mapping tables under test."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from synthetic_person import SIZE_HW, synthetic_person

from sapiens2.data.face68 import FACE70
from sapiens2.data.metadata import COCO_WHOLEBODY_NAMES, COCO_WHOLEBODY_PARTS, NUM_KEYPOINTS
from sapiens2.tasks.pose import keypoint_formats as kf
from sapiens2.tasks.pose import openpose as op
from sapiens2.tasks.pose.pose_files import openpose_body25_json

ROOT = Path(__file__).resolve().parents[1]
KP308 = json.loads((ROOT / "sapiens2" / "data" / "keypoints308.json").read_text())
NAMES308 = [k["name"] for k in KP308["keypoints"]]
#: COCO-WholeBody's face mirror pairs (its ``swap`` entries: face-0 <-> face-16 ...), 1-based-free
IBUG_MIRROR = (
    [(k, 16 - k) for k in range(8)] + [(17 + k, 26 - k) for k in range(5)] + [(31, 35), (32, 34)]
    + [(36, 45), (37, 44), (38, 43), (39, 42), (40, 47), (41, 46)]
    + [(48, 54), (49, 53), (50, 52), (55, 59), (56, 58), (60, 64), (61, 63), (65, 67), (68, 69)]
)  # fmt: skip
IBUG_SELF = (8, 27, 28, 29, 30, 33, 51, 57, 62, 66)


def names_of(point_map: kf.PointMap, k: int) -> list[tuple[str, float]]:
    return [(NAMES308[i], w) for i, w in zip(point_map.index[k], point_map.weight[k], strict=True) if w]


def test_wholebody_133_order_and_the_names_behind_each_index() -> None:
    assert len(COCO_WHOLEBODY_NAMES) == len(kf.WHOLEBODY) == 133
    sizes = {part: b - a for part, (a, b) in COCO_WHOLEBODY_PARTS.items()}
    assert sizes == {
        "keypoints": 17,
        "foot_kpts": 6,
        "face_kpts": 68,
        "lefthand_kpts": 21,
        "righthand_kpts": 21,
    }
    table = KP308["coco_wholebody_to_sapiens308"]
    for k, name in table["coco_wholebody_names"].items():  # the JSON's names are ours, index for index
        assert COCO_WHOLEBODY_NAMES[int(k)] == name
    for k, i in table["mapping"].items():  # the 53 shared points: exactly the JSON's 308 point
        assert names_of(kf.WHOLEBODY, int(k)) == [(NAMES308[i], 1.0)], COCO_WHOLEBODY_NAMES[int(k)]
    assert len(table["mapping"]) == 53
    links = {(s["from_name"], s["to_name"]) for s in KP308["skeleton"]}
    for side in ("left", "right"):
        root = COCO_WHOLEBODY_NAMES.index(f"{side}_hand_root")
        assert names_of(kf.WHOLEBODY, root) == [(f"{side}_wrist", 1.0)]
        for finger in ("thumb", "forefinger", "middle_finger", "ring_finger", "pinky_finger"):
            base = names_of(kf.WHOLEBODY, COCO_WHOLEBODY_NAMES.index(f"{side}_{finger}1"))
            assert base == [(f"{side}_{finger}_third_joint", 1.0)]
            # the 308 skeleton's chain: wrist -> third_joint -> finger2 (COCO-WholeBody's 1 -> 2)
            assert (f"{side}_wrist", base[0][0]) in links and (base[0][0], f"{side}_{finger}2") in links
    for k in range(68):  # the face block is the 68 of the face table, in order
        assert names_of(kf.WHOLEBODY, 23 + k) == [(n, w) for n, w in FACE70[k].sources if w]


def test_face_table_is_its_own_mirror_under_the_308_flip_pairs() -> None:
    flip = {NAMES308[a]: NAMES308[b] for a, b in enumerate(KP308["flip_index"])}
    pairs = IBUG_MIRROR + [(k, k) for k in IBUG_SELF]
    assert sorted(k for pair in pairs for k in set(pair)) == list(range(70))
    for a, b in pairs:
        mirrored = sorted((flip[n], round(w, 9)) for n, w in FACE70[a].sources)
        assert mirrored == sorted((n, round(w, 9)) for n, w in FACE70[b].sources), (a, b)
    face_names = {NAMES308[i] for i in KP308["groups"]["face"]}
    assert all(n in face_names for p in FACE70 for n, _ in p.sources)
    # named points are taken as they are; the others are marked derived, in the table and the map
    assert [p.derived for p in FACE70] == list(kf.FACE.derived)
    assert {p.index for p in FACE70 if not p.derived} >= {
        8,
        27,
        30,
        33,
        36,
        39,
        42,
        45,
        48,
        51,
        54,
        57,
        68,
        69,
    }
    assert {p.index for p in FACE70 if p.derived} >= {1, 3, 4, 5, 6, 7, 28, 29, 37, 38, 40, 41}


def cross(o: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    return float((a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0]))


def convex_in_order(poly: np.ndarray) -> bool:
    turns = [cross(poly[i - 1], poly[i], poly[(i + 1) % len(poly)]) for i in range(len(poly))]
    return all(t > 0 for t in turns) or all(t < 0 for t in turns)


def test_the_68_land_where_a_face_has_them_on_a_hand_made_person() -> None:
    kp, sc = synthetic_person()
    f, s = kf.face70_arrays(kp, sc)
    f = f[0]
    assert f.shape == (70, 2) and np.isfinite(f).all() and np.allclose(s, 0.9)
    jaw = f[:17]
    assert (np.diff(jaw[:9, 1]) > 0).all() and (np.diff(jaw[8:, 1]) < 0).all()  # down to the chin, up
    assert np.argmax(f[:, 1]) == 8 and abs(jaw[8, 0] - 384) < 1e-6  # the chin: lowest, on the midline
    brow_y, eye_y = f[17:27, 1].max(), f[36:48, 1].min()
    assert brow_y < eye_y < f[30, 1] < f[33, 1] < f[51, 1] < f[57, 1] < f[8, 1]
    assert f[36:42, 0].max() < 384 < f[42:48, 0].min()  # the right eye on the picture's left
    outer_lips = f[[48, 49, 50, 52, 53, 54, 55, 56, 57, 58, 59]]  # 51: the cupid's bow dips
    for ring in (f[36:42], f[42:48], outer_lips, f[60:68], f[[0, 2, 4, 6, 8, 10, 12, 14, 16]]):
        assert convex_in_order(ring)
    assert (np.diff(f[17:22, 0]) > 0).all() and (np.diff(f[22:27, 0]) > 0).all()  # brows left to right
    for pupil, eye in ((68, f[36:42]), (69, f[42:48])):  # each pupil inside its eye
        assert all(cross(eye[i], eye[(i + 1) % 6], f[pupil]) > 0 for i in range(6)) or all(
            cross(eye[i], eye[(i + 1) % 6], f[pupil]) < 0 for i in range(6)
        )
    # a derived point scores the lowest of its sources
    sc2 = sc.copy()
    sc2[0, NAMES308.index("tip_of_chin")] = 0.2
    _, s2 = kf.face70_arrays(kp, sc2)
    assert np.allclose(s2[0, 3:14], 0.2) and s2[0, 2] == pytest.approx(0.9)


def wholebody_ground_truth(kp: np.ndarray, sc: np.ndarray) -> dict:
    """A one-image COCO-WholeBody annotation file whose person is the 133 points themselves."""
    xy, _ = kf.WHOLEBODY(kp, sc)
    ann = {"id": 1, "image_id": 7, "category_id": 1, "iscrowd": 0, "num_keypoints": 17}
    for part, (a, b) in COCO_WHOLEBODY_PARTS.items():
        ann[part] = [v for x, y in xy[0, a:b] for v in (float(x), float(y), 2)]
    x0, y0 = xy[0].min(0)
    x1, y1 = xy[0].max(0)
    ann.update(bbox=[float(x0), float(y0), float(x1 - x0), float(y1 - y0)], area=float((x1 - x0) * (y1 - y0)))
    return {
        "images": [{"id": 7, "width": SIZE_HW[1], "height": SIZE_HW[0], "file_name": "person.png"}],
        "annotations": [ann],
        "categories": [{"id": 1, "name": "person", "keypoints": list(COCO_WHOLEBODY_NAMES[:17])}],
    }


def test_coco_wholebody_results_load_with_pycocotools(tmp_path: Path) -> None:
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    kp, sc = synthetic_person()
    gt_path, res_path = tmp_path / "gt.json", tmp_path / "person_coco_wholebody.json"
    gt_path.write_text(json.dumps(wholebody_ground_truth(kp, sc)))
    results = kf.coco_wholebody_json(kp, sc, box_scores=[0.5], image_id=7)
    res_path.write_text(json.dumps(results))
    gt = COCO(str(gt_path))
    dt = gt.loadRes(str(res_path))  # what COCO-WholeBody's evaluation does with a results file
    (ann,) = dt.loadAnns(dt.getAnnIds(imgIds=[7]))
    assert ann["category_id"] == 1 and ann["score"] == pytest.approx(0.45)  # 0.9 mean x 0.5 box
    assert [len(ann[p]) for p in COCO_WHOLEBODY_PARTS] == [51, 18, 204, 63, 63]
    assert len(ann["face_kpts_derived"]) == 68 and sum(ann["face_kpts_derived"]) == int(
        kf.FACE.derived[:68].sum()
    )
    # the evaluation concatenates body + foot + face + left hand + right hand: the 133 in order
    whole = np.array([v for p in COCO_WHOLEBODY_PARTS for v in ann[p]]).reshape(133, 3)
    xy, _ = kf.WHOLEBODY(kp, sc)
    assert np.allclose(whole[:, :2], xy[0], atol=0.006) and np.allclose(whole[:, 2], 0.9)
    body = COCOeval(gt, dt, "keypoints")  # COCO's own evaluation of the body part: a perfect match
    body.evaluate()
    body.accumulate()
    body.summarize()
    assert body.stats[0] == pytest.approx(1.0)


def test_coco_wholebody_scores_and_missing_points() -> None:
    kp, sc = synthetic_person()
    kp, sc = np.repeat(kp, 2, 0), np.repeat(sc, 2, 0)
    sc[1] = 0.1  # the second person: nothing above the threshold
    kp[0, NAMES308.index("nose")] = np.nan
    people = kf.coco_wholebody_json(
        kp, sc, threshold=0.3, image_id=3, extra=[{"track_id": 4}, {"track_id": 5}]
    )
    assert [p["image_id"] for p in people] == [3, 3] and [p["track_id"] for p in people] == [4, 5]
    assert people[0]["keypoints"][:3] == [0, 0, 0]  # not finite: zeros, never null
    assert people[0]["score"] == pytest.approx(0.9) and people[1]["score"] == 0.0
    assert people[1]["keypoints"][5] == pytest.approx(0.1)  # results keep every score
    assert "bbox" not in people[0]  # pycocotools would read the entries as box results
    assert kf.coco_wholebody_json(np.zeros((0, NUM_KEYPOINTS, 2)), np.zeros((0, NUM_KEYPOINTS))) == []


OPENPOSE_PERSON_KEYS = {
    "person_id", "pose_keypoints_2d", "face_keypoints_2d", "hand_left_keypoints_2d",
    "hand_right_keypoints_2d", "pose_keypoints_3d", "face_keypoints_3d", "hand_left_keypoints_3d",
    "hand_right_keypoints_3d",
}  # fmt: skip


def test_openpose_json_with_hands_and_face_reads_as_openpose_writes_it() -> None:
    kp, sc = synthetic_person()
    for doc, body in (
        (openpose_body25_json(kp, sc), 25),
        (op.openpose_coco18_json(kp, sc, image_size=(768, 1024)), 18),
    ):
        doc = json.loads(json.dumps(doc))  # as a reader sees the file
        assert doc["version"] == 1.3 and "part_candidates" not in doc
        (person,) = doc["people"]
        assert set(person) == OPENPOSE_PERSON_KEYS
        arrays = {k: np.array(person[k], float).reshape(-1, 3) for k in OPENPOSE_PERSON_KEYS - {"person_id"}
                  if k.endswith("_2d")}  # fmt: skip
        assert {k: len(v) for k, v in arrays.items()} == {
            "pose_keypoints_2d": body, "face_keypoints_2d": 70, "hand_left_keypoints_2d": 21,
            "hand_right_keypoints_2d": 21,
        }  # fmt: skip
        assert all(person[k] == [] for k in OPENPOSE_PERSON_KEYS if k.endswith("_3d"))
        for side in ("left", "right"):  # OpenPose hand 0 is the wrist, 4 the thumb tip
            hand = arrays[f"hand_{side}_keypoints_2d"]
            assert np.allclose(hand[0, :2], kp[0, NAMES308.index(f"{side}_wrist")], atol=0.006)
            assert np.allclose(hand[4, :2], kp[0, NAMES308.index(f"{side}_thumb4")], atol=0.006)
        face = arrays["face_keypoints_2d"]
        assert np.allclose(face[68, :2], kp[0, NAMES308.index("r_center_of_pupil")], atol=0.006)
        assert np.allclose(face[8, :2], kp[0, NAMES308.index("tip_of_chin")], atol=0.006)
        assert np.allclose(face[:, 2], 0.9)
    sc[0, NAMES308.index("l_center_of_pupil")] = 0.1  # below the threshold: "not detected"
    face = openpose_body25_json(kp, sc)["people"][0]["face_keypoints_2d"]
    assert face[69 * 3 : 70 * 3] == [0, 0, 0] and face[68 * 3 + 2] == pytest.approx(0.9)


def test_controlnet_picture_draws_the_face_as_white_dots(tmp_path: Path) -> None:
    kp, sc = synthetic_person()
    img = op.draw_openpose(kp, sc, SIZE_HW)
    no_face = op.draw_openpose(kp, sc, SIZE_HW, face=False)
    f, _ = kf.face70_arrays(kp, sc)
    for x, y in f[0, [0, 8, 16, 30, 48, 54]]:  # jaw ends, chin, nose tip, mouth corners
        assert img[round(y), round(x)].tolist() == [255, 255, 255]
    changed = (img != no_face).any(-1)
    assert changed.sum() > 70 * 20 and (img[changed] == 255).all()  # only white dots added
    wrist = kp[0, NAMES308.index("right_wrist")].round().astype(int)
    assert img[wrist[1], wrist[0]].tolist() == list(op.HAND_JOINT_COLOR)


def test_the_docs_picture_is_what_the_code_draws() -> None:
    from PIL import Image

    picture = ROOT / "docs" / "images" / "controlnet-pose-hands-face.png"
    kp, sc = synthetic_person()
    drawn = op.draw_openpose(kp, sc, SIZE_HW)
    stored = np.asarray(Image.open(picture).convert("RGB"))
    assert stored.shape == drawn.shape
    # the same picture, allowing an antialiasing pixel or two from another OpenCV build
    assert (stored != drawn).any(-1).mean() < 0.001, (
        "regenerate it: PYTHONPATH=. python tests/synthetic_person.py"
    )


def test_keypoints_csv_reads_back_with_csv_and_numpy(tmp_path: Path) -> None:
    kp, sc = synthetic_person()
    kp, sc = np.concatenate([kp, kp + 5]), np.concatenate([sc, sc * 0.5])
    kp[1, 3] = np.nan
    path = kf.write_keypoints_csv(tmp_path / "me_keypoints.csv", "me", kp, sc)
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(kf.PHOTO_COLUMNS) and len(rows) == 2 * 308
    assert [r["name"] for r in rows[:308]] == NAMES308 and {r["image"] for r in rows} == {"me"}
    assert [int(r["person"]) for r in rows[::308]] == [0, 1] and rows[308 + 3]["x"] == ""
    table = np.genfromtxt(path, delimiter=",", names=True, dtype=None, encoding="utf-8")
    assert np.allclose(table["x"].reshape(2, 308)[0], kp[0, :, 0], atol=0.006)
    assert np.isnan(table["x"][308 + 3]) and np.allclose(table["score"][308:], 0.45)
    assert np.array_equal(table["keypoint_id"][:308], np.arange(308))


def face_table() -> str:
    """The face mapping table docs/USAGE.md shows, made from the table in sapiens2/data/face68.py."""
    from fractions import Fraction

    def term(name: str, w: float, first: bool) -> str:
        f = Fraction(w).limit_denominator(96)
        sign = "" if first else (" + " if f > 0 else " − ")
        weight = "" if abs(f) == 1 else f"{abs(f)} "
        return f"{sign}{'−' if first and f < 0 else ''}{weight}`{name}`"

    rows = ["| # | part | from the 308 points | derived | where |", "|---|---|---|---|---|"]
    for p in FACE70:
        sources = "".join(term(n, w, i == 0) for i, (n, w) in enumerate(p.sources))
        rows.append(f"| {p.index} | {p.part} | {sources} | {'yes' if p.derived else ''} | {p.how} |")
    return "\n".join(rows)


def test_usage_shows_the_face_table_as_the_code_has_it() -> None:
    usage = (ROOT / "docs" / "USAGE.md").read_text(encoding="utf-8")
    assert face_table() in usage, "paste tests/test_keypoint_formats.py's face_table() into docs/USAGE.md"
