"""A hand-made standing person with all 308 keypoints where a frontal person has them (no model
weights here): body, feet, hands with spread fingers, and a face with brows, lids, irises,
pupils, nose, lips, chin and ears, placed from the 308 names' anatomy.

Image coordinates, the person facing the camera (the subject's right on the image's left), on a
768 x 1024 canvas. The lid and lip midpoints are placed left to right in the view as the 308
names number them (1, 2: the quarters; 3-6: the eighths; the brows' 1: the centre, 2 and 3 its
left and right quarters).
"""

from __future__ import annotations

import math

import numpy as np

from sapiens2.data.metadata import KEYPOINT_NAMES, NUM_KEYPOINTS

SIZE_HW = (1024, 768)
FACE = np.array([384.0, 170.0])  # between the eyes, a little below
#: where a numbered midpoint sits along a line, left to right in the view
EIGHTHS = {3: 1 / 8, 1: 2 / 8, 4: 3 / 8, 5: 5 / 8, 2: 6 / 8, 6: 7 / 8}
BROW = {2: 1 / 4, 1: 2 / 4, 3: 3 / 4}
FINGERS = ("thumb", "forefinger", "middle_finger", "ring_finger", "pinky_finger")


def _body() -> dict[str, tuple[float, float]]:
    return {
        "nose": (384, 192), "left_eye": (414, 160), "right_eye": (354, 160), "left_ear": (447, 175),
        "right_ear": (321, 175), "neck": (384, 285), "left_shoulder": (470, 315),
        "right_shoulder": (298, 315), "left_acromion": (462, 305), "right_acromion": (306, 305),
        "left_elbow": (505, 450), "right_elbow": (240, 250), "left_olecranon": (512, 455),
        "right_olecranon": (232, 258), "left_cubital_fossa": (497, 445), "right_cubital_fossa": (247, 243),
        "left_wrist": (520, 585), "right_wrist": (215, 120), "left_hip": (430, 590),
        "right_hip": (338, 590), "left_knee": (440, 770), "right_knee": (330, 770),
        "left_ankle": (445, 940), "right_ankle": (325, 940), "left_big_toe": (470, 985),
        "left_small_toe": (492, 975), "left_heel": (440, 962), "right_big_toe": (300, 985),
        "right_small_toe": (278, 975), "right_heel": (330, 962),
    }  # fmt: skip


def _hand(side: str, wrist: tuple[float, float], toward: float) -> dict[str, tuple[float, float]]:
    """Fingers fanned around the direction ``toward`` (degrees, image frame), thumb first."""
    sign = 1.0 if side == "right" else -1.0  # the thumb is on the body's outer side
    spread = (-55, -18, 0, 14, 28)
    base_len = (18, 44, 47, 44, 39)
    bones = ((18, 14, 12), (20, 13, 10), (22, 14, 10), (20, 13, 10), (14, 10, 9))
    out = {}
    for finger, a, base, bone in zip(FINGERS, spread, base_len, bones, strict=True):
        ang = math.radians(toward + sign * a)
        d = np.array([math.cos(ang), math.sin(ang)])
        p = np.array(wrist, float) + base * d
        out[f"{side}_{finger}_third_joint"] = tuple(p)
        for j, length in zip((2, 3, 4), bone, strict=True):
            p = p + length * d
            out[f"{side}_{finger}{j}"] = tuple(p)
    return out


def _along(p0: np.ndarray, p1: np.ndarray, t: float, bulge: float) -> tuple[float, float]:
    """A point at ``t`` on an arc from p0 to p1 bulging ``bulge`` px upward (negative: down)."""
    p = p0 + t * (p1 - p0)
    return float(p[0]), float(p[1] - bulge * math.sin(math.pi * t))


def _eye(side: str) -> dict[str, tuple[float, float]]:
    cx = FACE[0] + (-30 if side == "r" else 30)
    cy = FACE[1] - 10
    left, right = np.array([cx - 14, cy]), np.array([cx + 14, cy])
    inner_is_left = side == "l"
    out: dict[str, tuple[float, float]] = {}
    for lid, bulge in (("upper", 7.0), ("lower", -5.0)):
        for kind, shift in (("lash", 0.0), ("eyelid", 1.0 if lid == "upper" else -1.0)):
            a, b = left + (0, shift), right + (0, shift)
            for k, t in EIGHTHS.items():
                out[f"{side}_midpoint_{k}_of_{lid}_{kind}_line"] = _along(a, b, t, bulge)
            out[f"{side}_centerpoint_of_{lid}_{kind}_line"] = _along(a, b, 0.5, bulge)
            outer = tuple(b if inner_is_left else a)
            out[f"{side}_outer_end_of_{lid}_{kind}_line"] = (float(outer[0]), float(outer[1]))
        inner = tuple(left if inner_is_left else right)
        out[f"{side}_inner_end_of_{lid}_lash_line"] = (float(inner[0]), float(inner[1]))
    for k, t in EIGHTHS.items():  # the crease, above the upper lid
        out[f"{side}_midpoint_{k}_of_upper_crease_line"] = _along(left - (0, 6), right - (0, 6), t, 7.0)
    out[f"{side}_centerpoint_of_upper_crease_line"] = _along(left - (0, 6), right - (0, 6), 0.5, 7.0)
    for ring, r in (("iris", 6.0), ("pupil", 2.5)):
        out[f"{side}_center_of_{ring}"] = (cx, cy)
        for hour in (12, 3, 6, 9):
            ang = math.radians(90 - 30 * hour)
            out[f"{side}_border_of_{ring}_{hour}"] = (cx + r * math.cos(ang), cy - r * math.sin(ang))
        for k, hour in ((1, 1.5), (2, 4.5), (3, 7.5), (4, 10.5)):  # clockwise from 12
            ang = math.radians(90 - 30 * hour)
            out[f"{side}_border_of_{ring}_midpoint_{k}"] = (cx + r * math.cos(ang), cy - r * math.sin(ang))
    return out


def _brow(side: str) -> dict[str, tuple[float, float]]:
    inner_x, outer_x = (-9, -46) if side == "r" else (9, 46)
    y = FACE[1] - 30
    start, end = np.array([FACE[0] + inner_x, y]), np.array([FACE[0] + outer_x, y + 4])
    left, right = (end, start) if side == "r" else (start, end)
    out = {f"end_of_{side}_eyebrow": (float(end[0]), float(end[1]))}
    for edge, dy in (("upper", -3.0), ("lower", 3.0)):
        out[f"{edge}_startpoint_of_{side}_eyebrow"] = (float(start[0]), float(start[1] + dy))
        for k, t in BROW.items():
            out[f"{edge}_midpoint_{k}_of_{side}_eyebrow"] = _along(left + (0, dy), right + (0, dy), t, 5.0)
    return out


def _mouth() -> dict[str, tuple[float, float]]:
    x0, y0 = FACE
    out: dict[str, tuple[float, float]] = {}
    for corner, half, y in (("outer", 25.0, y0 + 62), ("inner", 20.0, y0 + 63)):
        left, right = np.array([x0 - half, y]), np.array([x0 + half, y])
        out[f"r_{corner}_corner_of_mouth"] = (float(left[0]), float(left[1]))
        out[f"l_{corner}_corner_of_mouth"] = (float(right[0]), float(right[1]))
        bulges = {"upper": 8.0, "lower": -10.0} if corner == "outer" else {"upper": 2.0, "lower": -2.5}
        for lip, bulge in bulges.items():
            for k, t in {**EIGHTHS}.items():
                out[f"midpoint_{k}_of_{lip}_{corner}_lip"] = _along(left, right, t, bulge)
    out["center_of_cupid_bow"] = (x0, y0 + 62 - 6.5)  # the dip between the bow's peaks
    out["center_of_lower_outer_lip"] = (x0, y0 + 72)
    out["center_of_upper_inner_lip"] = (x0, y0 + 61)
    out["center_of_lower_inner_lip"] = (x0, y0 + 65.5)
    return out


def _nose_chin_ears() -> dict[str, tuple[float, float]]:
    x0, y0 = FACE
    out = {
        "center_of_glabella": (x0, y0 - 28), "center_of_nose_root": (x0, y0 - 8),
        "midpoint_1_of_nose_bridge": (x0, y0 + 4), "midpoint_2_of_nose_bridge": (x0, y0 + 12),
        "midpoint_3_of_nose_bridge": (x0, y0 + 20), "tip_of_nose_bridge": (x0, y0 + 26),
        "tip_of_nose": (x0, y0 + 30), "bottom_center_of_nose": (x0, y0 + 40),
        "r_outer_corner_of_nose": (x0 - 15, y0 + 33), "l_outer_corner_of_nose": (x0 + 15, y0 + 33),
        "outer_corner_of_r_nostril": (x0 - 11, y0 + 38), "inner_corner_of_r_nostril": (x0 - 4, y0 + 39),
        "upper_corner_of_r_nostril": (x0 - 8, y0 + 35), "outer_corner_of_l_nostril": (x0 + 11, y0 + 38),
        "inner_corner_of_l_nostril": (x0 + 4, y0 + 39), "upper_corner_of_l_nostril": (x0 + 8, y0 + 35),
        "center_of_labiomental_groove": (x0, y0 + 82), "tip_of_chin": (x0, y0 + 100),
    }  # fmt: skip
    ear = {  # the right ear, outward = -x; mirrored for the left
        "top_point_of_tragus": (56, -4), "bottom_point_of_tragus": (57, 8), "protruding_point_of_tragus": (55, 2),
        "bottom_connecting_point_of_ear_lobe": (57, 32), "top_connecting_point_of_helix": (58, -30),
        "tip_of_ear_lobe": (62, 38), "highest_point_of_antitragus": (61, 12), "deepest_point_of_concha": (62, 2),
        "start_point_of_crus_of_helix": (60, -10), "midpoint_between_22_15": (64, 26),
        "start_of_antihelix": (63, 18), "end_of_antihelix": (65, -26), "midpoint_1_of_antihelix": (64, 8),
        "midpoint_2_of_antihelix": (65, -4), "midpoint_3_of_antihelix": (65, -16),
        "top_end_of_inferior_crus": (61, -22), "top_end_of_superior_crus": (66, -32),
        "midpoint_1_of_inferior_crus": (63, -18),
    }  # fmt: skip
    for k in range(1, 9):  # the inner helix, from the top round the back
        ang = math.radians(100 - 25 * k)
        ear[f"point_{k}_of_inner_helix"] = (66 + 5 * math.cos(ang), -8 - 26 * math.sin(ang))
    for name, (dx, dy) in ear.items():
        out[f"r_{name}"] = (x0 - dx, y0 + dy)
        out[f"l_{name}"] = (x0 + dx, y0 + dy)
    return out


def synthetic_person(score: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
    """(1, 308, 2) keypoints and (1, 308) scores of the hand-made person; every name placed."""
    pts: dict[str, tuple[float, float]] = {**_body(), **_nose_chin_ears(), **_mouth()}
    pts.update(_hand("left", pts["left_wrist"], 95.0))  # the left hand hangs down
    pts.update(_hand("right", pts["right_wrist"], -100.0))  # the right one is raised
    for side in ("r", "l"):
        pts.update(_eye(side))
        pts.update(_brow(side))
    missing = set(KEYPOINT_NAMES) - set(pts)
    unknown = set(pts) - set(KEYPOINT_NAMES)
    assert not missing and not unknown, (sorted(missing)[:5], sorted(unknown)[:5])
    kp = np.array([[pts[n] for n in KEYPOINT_NAMES]], np.float32)
    return kp, np.full((1, NUM_KEYPOINTS), score, np.float32)


if __name__ == "__main__":  # the docs' picture: PYTHONPATH=. python tests/synthetic_person.py
    from pathlib import Path

    from PIL import Image

    from sapiens2.tasks.pose.openpose import draw_openpose

    out = Path(__file__).resolve().parents[1] / "docs" / "images" / "controlnet-pose-hands-face.png"
    Image.fromarray(draw_openpose(*synthetic_person(), SIZE_HW)).save(out, optimize=True)
    print(out)
