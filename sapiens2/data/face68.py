"""The 68 iBUG-300W face points (and OpenPose's two pupils) from the 308 named face points.

COCO-WholeBody's face (``face-0`` ... ``face-67``) and OpenPose's face (the same 68, then the right
and left pupils) follow the iBUG-300W convention: jaw 0-16 (from the subject's right ear round the
chin to the left ear), brows 17-26, nose bridge 27-30 and base 31-35, eyes 36-47, outer lips
48-59, inner lips 60-67. The 308 set names its face points by anatomy and has no jaw line, so:

* a point the 308 set names is taken as it is;
* a point between two named points of one contour is interpolated along that contour: the 308
  set places its lid and lip points at eighths of each line and its brow points at quarters,
  iBUG spaces its points evenly between its anchors;
* the jaw is a curve from each ear-lobe attachment to the chin.

Every point that is not one named point is *derived*; it scores the lowest score of its sources.

Order along a line: the 308 release lists each lid line from its outer end (``r_outer_end``,
``r_midpoint_3``, ``r_midpoint_1``, ``r_midpoint_4``, ``r_centerpoint`` ...; the left eye the mirror
of it), so its midpoints are numbered left to right as a frontal face is seen: 1 and 2 the
quarters, 3 to 6 the eighths. The lips use the same numbers and flip pairs (1<->2, 3<->6, 4<->5);
the brows have one centre (``midpoint_1``, its own mirror) and the quarters 2 (left) and 3.
``l_``/``r_`` are the subject's sides, as ``left_eye``/``right_eye``; iBUG's 36-41 are the
subject's right eye (the left one in a frontal picture).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from .metadata import keypoint_index

#: the jaw angle is put below the ear-lobe attachment by the nose-base-to-chin height: with it, the
#: quadratic curve from the lobe (iBUG 2) to the chin (8) put on a mean 300W face shape lands 2-4 %
#: of the face width from that shape's points 3-7
JAW_DEPTH = 1.0


@dataclass(frozen=True)
class FacePoint:
    """One output point: 308 names with weights (summing to 1), where it sits and why."""

    index: int
    part: str
    sources: tuple[tuple[str, float], ...]
    how: str

    @property
    def derived(self) -> bool:
        """Not one named 308 point: interpolated or constructed from several."""
        return len(self.sources) > 1


def _lid(side: str, lid: str) -> tuple[str, ...]:
    """A lash line's 9 points left to right in a frontal view (right eye: outer end first)."""
    mid = [f"{side}_midpoint_{i}_of_{lid}_lash_line" for i in (3, 1, 4)]
    end = [f"{side}_midpoint_{i}_of_{lid}_lash_line" for i in (5, 2, 6)]
    inner, outer = f"{side}_inner_end_of_{lid}_lash_line", f"{side}_outer_end_of_{lid}_lash_line"
    first, last = (outer, inner) if side == "r" else (inner, outer)
    return (first, *mid, f"{side}_centerpoint_of_{lid}_lash_line", *end, last)


def _lip(where: str, centre: str) -> tuple[str, ...]:
    """A lip contour's 9 points left to right in a frontal view (the subject's right corner first)."""
    corner = "outer" if "outer" in where else "inner"
    mids = [f"midpoint_{i}_of_{where}" for i in (3, 1, 4, 5, 2, 6)]
    return (f"r_{corner}_corner_of_mouth", *mids[:3], centre, *mids[3:], f"l_{corner}_corner_of_mouth")


def _brow(side: str) -> tuple[str, ...]:
    """A brow's upper edge left to right in a frontal view (5 points at quarters): the right brow
    from its outer end to its inner start, the left one from its start to its end."""
    mids = tuple(f"upper_midpoint_{i}_of_{side}_eyebrow" for i in (2, 1, 3))
    start, end = f"upper_startpoint_of_{side}_eyebrow", f"end_of_{side}_eyebrow"
    return (end, *mids, start) if side == "r" else (start, *mids, end)


LINES: dict[str, tuple[str, ...]] = {
    "right upper lash line": _lid("r", "upper"),
    "right lower lash line": _lid("r", "lower"),
    "left upper lash line": _lid("l", "upper"),
    "left lower lash line": _lid("l", "lower"),
    "upper outer lip": _lip("upper_outer_lip", "center_of_cupid_bow"),
    "lower outer lip": _lip("lower_outer_lip", "center_of_lower_outer_lip"),
    "upper inner lip": _lip("upper_inner_lip", "center_of_upper_inner_lip"),
    "lower inner lip": _lip("lower_inner_lip", "center_of_lower_inner_lip"),
    "right brow's upper edge": _brow("r"),
    "left brow's upper edge": _brow("l"),
    "nose bridge, root to tip": ("center_of_nose_root", "tip_of_nose"),
}


def _named(index: int, part: str, name: str, how: str) -> FacePoint:
    return FacePoint(index, part, ((name, 1.0),), how)


def _along(index: int, part: str, line: str, t: Fraction | int, note: str = "") -> FacePoint:
    """The point at ``t`` (0..1, left to right) of a line whose points are evenly spaced."""
    t = Fraction(t)
    names = LINES[line]
    pos = t * (len(names) - 1)
    i = min(int(pos), len(names) - 2)
    f = float(pos - i)
    where = {0: f"left end of the {line}", 1: f"right end of the {line}"}.get(t, f"{t} along the {line}")
    how = f"{where}{note}"
    if f in (0.0, 1.0):
        return FacePoint(index, part, ((names[i + int(f)], 1.0),), how)
    return FacePoint(index, part, ((names[i], 1.0 - f), (names[i + 1], f)), how)


def _jaw(index: int, side: str, t: Fraction) -> FacePoint:
    """A quadratic curve from the ear-lobe attachment (t=0) to the chin (t=1), bent through a jaw
    angle below the lobe by the nose-base-to-chin height: as weights of lobe, chin, nose base."""
    u = float(t)
    lobe, chin, nose = f"{side}_bottom_connecting_point_of_ear_lobe", "tip_of_chin", "bottom_center_of_nose"
    bend = 2.0 * u * (1.0 - u) * JAW_DEPTH
    weights = ((lobe, (1.0 - u) ** 2 + 2.0 * u * (1.0 - u)), (chin, u * u + bend), (nose, -bend))
    return FacePoint(index, "jaw", weights, f"jaw curve, {t} of the way from the ear lobe to the chin")


def _face70() -> tuple[FacePoint, ...]:
    pts: list[FacePoint] = []
    for side, ends in (("r", (0, 1, 2)), ("l", (16, 15, 14))):
        tragus, lobe = f"{side}_top_point_of_tragus", f"{side}_bottom_connecting_point_of_ear_lobe"
        pts.append(_named(ends[0], "jaw", tragus, "the tragion: where the face outline meets the ear"))
        pts.append(FacePoint(ends[1], "jaw", ((tragus, 0.5), (lobe, 0.5)), "midway down the ear's front"))
        pts.append(_named(ends[2], "jaw", lobe, "where the ear lobe meets the cheek"))
    for k in range(1, 6):
        pts.append(_jaw(2 + k, "r", Fraction(k, 6)))
        pts.append(_jaw(14 - k, "l", Fraction(k, 6)))
    pts.append(_named(8, "jaw", "tip_of_chin", "the chin"))
    for k in range(5):
        pts.append(_along(17 + k, "right brow", "right brow's upper edge", Fraction(k, 4)))
        pts.append(_along(22 + k, "left brow", "left brow's upper edge", Fraction(k, 4)))
    for k in range(4):
        pts.append(_along(27 + k, "nose bridge", "nose bridge, root to tip", Fraction(k, 3)))
    base = ("outer_corner_of_r_nostril", "inner_corner_of_r_nostril", "bottom_center_of_nose",
            "inner_corner_of_l_nostril", "outer_corner_of_l_nostril")  # fmt: skip
    for k, name in enumerate(base):
        pts.append(_named(31 + k, "nose base", name, "nostril corners and the nose base, left to right"))
    for first, side in ((36, "right"), (42, "left")):
        upper, lower = f"{side} upper lash line", f"{side} lower lash line"
        for k in range(4):  # corner, two upper points, corner: along the upper lash line
            pts.append(_along(first + k, f"{side} eye", upper, Fraction(k, 3)))
        for k, t in ((4, Fraction(2, 3)), (5, Fraction(1, 3))):  # back along the lower lash line
            pts.append(_along(first + k, f"{side} eye", lower, t))
    upper_outer = (0, Fraction(3, 16), Fraction(3, 8), Fraction(1, 2), Fraction(5, 8), Fraction(13, 16), 1)
    peaks = {50: ": the right peak of the cupid's bow", 52: ": the left peak of the cupid's bow",
             49: ", midway from the corner to the peak", 53: ", midway from the peak to the corner"}  # fmt: skip
    for k, t in enumerate(upper_outer):
        pts.append(_along(48 + k, "outer lips", "upper outer lip", t, peaks.get(48 + k, "")))
    for k in range(5):  # 55-59: the lower lip back from the left corner, evenly
        pts.append(_along(55 + k, "outer lips", "lower outer lip", Fraction(5 - k, 6)))
    thirds = (0, Fraction(1, 3), Fraction(1, 2), Fraction(2, 3), 1)
    for k, t in enumerate(thirds):  # 60-64: corner, upper lip at thirds and centre, corner
        pts.append(_along(60 + k, "inner lips", "upper inner lip", t))
    for k, t in enumerate(thirds[3:0:-1]):  # 65-67: the lower lip back from the left
        pts.append(_along(65 + k, "inner lips", "lower inner lip", t))
    pts.append(_named(68, "pupils", "r_center_of_pupil", "OpenPose's right pupil"))
    pts.append(_named(69, "pupils", "l_center_of_pupil", "OpenPose's left pupil"))
    pts.sort(key=lambda p: p.index)
    return tuple(pts)


#: OpenPose's 70 face points (iBUG's 68, then the right and the left pupil), in order
FACE70: tuple[FacePoint, ...] = _face70()
#: COCO-WholeBody's 68 face points: OpenPose's without the pupils
FACE68: tuple[FacePoint, ...] = FACE70[:68]


def _check() -> None:
    assert [p.index for p in FACE70] == list(range(70)), "every face index once, in order"
    for p in FACE70:
        for name, _ in p.sources:
            keypoint_index(name)  # raises on a name the 308 set lacks
        assert abs(sum(w for _, w in p.sources) - 1.0) < 1e-9, p


_check()

__all__ = ["FACE68", "FACE70", "JAW_DEPTH", "LINES", "FacePoint"]
