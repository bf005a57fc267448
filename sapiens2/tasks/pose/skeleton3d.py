"""3D skeletons from 3D keypoints: the joint tree the motion files animate, the 3D keypoint JSON
of a photo, and the photo's point cloud with its skeletons drawn inside (GLB).

The joint tree (:data:`JOINTS`) covers the body, feet, hands and head of the 308-point set:
``pelvis`` (midpoint of the hips) is the root; ``neck`` (midpoint of the shoulders) carries the
arms and the head (nose, eyes, ears); each hand hangs its 20 finger points off the wrist, knuckle
to tip. The 238 face points are optional (children of the nose). Colours are the 2D drawing's:
a bone takes the colour of its link in the 2D skeleton, else its child point's colour.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from ...data.metadata import KEYPOINT_COLORS, KEYPOINT_GROUPS, KEYPOINT_NAMES, SKELETON, keypoint_index
from ...outputs.gltf_scene import (
    ARRAY_BUFFER,
    ELEMENT_ARRAY_BUFFER,
    TRIANGLES,
    UNLIT_MATERIAL,
    GltfBuilder,
    knobs,
    sticks,
)
from ...outputs.mesh import OPENCV_TO_GLTF
from ...outputs.plyglb import POINTS_MATERIAL
from ...outputs.writers import NOW, Writer
from ...outputs.writers import prepare as _prepare

_FINGERS = ("thumb", "forefinger", "middle_finger", "ring_finger", "pinky_finger")


def _tree() -> list[tuple[str, tuple[str, ...], str | None]]:
    """(joint, the keypoints it is the midpoint of, parent joint), parents first."""
    t: list[tuple[str, tuple[str, ...], str | None]] = [
        ("pelvis", ("left_hip", "right_hip"), None),
        ("neck", ("left_shoulder", "right_shoulder"), "pelvis"),
    ]
    for side in ("left", "right"):
        leg = [f"{side}_hip", f"{side}_knee", f"{side}_ankle"]
        t += [(n, (n,), p) for n, p in zip(leg, ["pelvis", *leg[:-1]], strict=True)]
        t += [(f"{side}_{n}", (f"{side}_{n}",), f"{side}_ankle") for n in ("big_toe", "small_toe", "heel")]
        arm = [f"{side}_shoulder", f"{side}_elbow", f"{side}_wrist"]
        t += [(n, (n,), p) for n, p in zip(arm, ["neck", *arm[:-1]], strict=True)]
        for finger in _FINGERS:
            chain = [f"{side}_{finger}_third_joint", *(f"{side}_{finger}{k}" for k in (2, 3, 4))]
            t += [(n, (n,), p) for n, p in zip(chain, [f"{side}_wrist", *chain[:-1]], strict=True)]
    t += [("nose", ("nose",), "neck")]
    t += [(f"{s}_eye", (f"{s}_eye",), "nose") for s in ("left", "right")]
    t += [(f"{s}_ear", (f"{s}_ear",), f"{s}_eye") for s in ("left", "right")]
    return t


@cache
def joint_tree(face: bool = False) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    """(joint names, parent index per joint (-1: root), (J, 2) keypoint indices each joint is
    the midpoint of: a single point repeats its index). ``face`` adds the face points."""
    tree = _tree()
    if face:
        tree += [(KEYPOINT_NAMES[i], (KEYPOINT_NAMES[i],), "nose") for i in KEYPOINT_GROUPS["face"]]
    names = tuple(n for n, _, _ in tree)
    at = {n: i for i, n in enumerate(names)}
    parents = np.array([-1 if p is None else at[p] for _, _, p in tree], np.int64)
    sources = np.array([[keypoint_index(s[0]), keypoint_index(s[-1])] for _, s, _ in tree], np.int64)
    for arr in (parents, sources):
        arr.setflags(write=False)
    return names, parents, sources


def joint_positions(points: np.ndarray, face: bool = False) -> np.ndarray:
    """(..., 308, 3) keypoints -> (..., J, 3) joints (a midpoint is NaN unless both ends are known)."""
    _, _, src = joint_tree(face)
    p = np.asarray(points, np.float32)
    return (p[..., src[:, 0], :] + p[..., src[:, 1], :]) / 2


@cache
def _link_colors() -> dict[tuple[int, int], tuple[int, int, int]]:
    out: dict[tuple[int, int], tuple[int, int, int]] = {}
    for a, b, rgb in SKELETON:
        out[(a, b)] = out[(b, a)] = rgb
    return out


def bone_colors(face: bool = False) -> np.ndarray:
    """(J, 3) uint8: the colour of the bone from each joint's parent to it (the root: its own)."""
    _, parents, src = joint_tree(face)
    links = _link_colors()
    out = KEYPOINT_COLORS[src[:, 0]].copy()
    for j, p in enumerate(parents):
        if p >= 0:
            out[j] = links.get((int(src[p, 0]), int(src[j, 0])), tuple(KEYPOINT_COLORS[src[j, 0]]))
    return out


def _hand_or_face() -> np.ndarray:
    small = np.zeros(len(KEYPOINT_NAMES), bool)
    for group in ("left_hand", "right_hand", "face"):
        small[KEYPOINT_GROUPS[group]] = True
    small[[keypoint_index("left_wrist"), keypoint_index("right_wrist")]] = False
    return small


# ----------------------------------------------------------------------------- a photo's files


def keypoints3d_json(
    points: np.ndarray,
    keypoints: np.ndarray,
    scores: np.ndarray,
    samples: np.ndarray,
    *,
    image_size: tuple[int, int],
    focal_px: float | None,
    boxes: np.ndarray | None = None,
) -> dict[str, Any]:
    """``sapiens2-308-3d``: per person and keypoint its name, x, y, z (metres, camera frame; null
    where no depth was found), the pixel it was read at, its 2D score and the samples used."""

    def num(v: float, nd: int) -> float | None:
        return round(float(v), nd) if np.isfinite(v) else None

    people = []
    for p in range(len(points)):
        kps = [
            {
                "name": KEYPOINT_NAMES[k],
                "x": num(points[p, k, 0], 4),
                "y": num(points[p, k, 1], 4),
                "z": num(points[p, k, 2], 4),
                "u": num(keypoints[p, k, 0], 2),
                "v": num(keypoints[p, k, 1], 2),
                "score": num(scores[p, k], 4),
                "samples": int(samples[p, k]),
            }
            for k in range(points.shape[1])
        ]
        person: dict[str, Any] = {"keypoints": kps, "with_depth": int(np.isfinite(points[p]).all(-1).sum())}
        if boxes is not None:
            person["box"] = [num(v, 2) for v in boxes[p]]
        people.append(person)
    return {
        "format": "sapiens2-308-3d",
        "units": "metres",
        "frame": "camera: x right, y down, z forward (the pointmap's)",
        "image_size": {"width": int(image_size[0]), "height": int(image_size[1])},
        "focal_px": num(focal_px, 3) if focal_px is not None else None,
        "people": people,
    }


#: Stick radius (metres) of body links and of hand links; joint knobs are 1.5 times as wide.
BODY_RADIUS, HAND_RADIUS = 0.012, 0.004


def skeleton_geometry(points: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The 2D skeleton's links and points in 3D for every person of ``points`` (P, 308, 3):
    (vertices (V, 3) float32 camera frame, triangles (F, 3) uint32, colours (V, 3) uint8). A link
    is drawn when both its points are known; face points are left out."""
    small = _hand_or_face()
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for person in np.asarray(points, np.float32).reshape(-1, len(KEYPOINT_NAMES), 3):
        known = np.isfinite(person).all(-1)
        for thin in (False, True):
            links = [(a, b, c) for a, b, c in SKELETON if known[a] and known[b] and small[b] == thin]
            if links:
                a, b, rgb = (np.array(x) for x in zip(*links, strict=True))
                v, f = sticks(person[a], person[b], HAND_RADIUS if thin else BODY_RADIUS)
                parts.append((v, f, np.repeat(rgb.astype(np.uint8), 8, axis=0)))
            at = np.flatnonzero(known & (small == thin) & ~_face_mask())
            if len(at):
                v, f = knobs(person[at], 1.5 * (HAND_RADIUS if thin else BODY_RADIUS))
                parts.append((v, f, np.repeat(KEYPOINT_COLORS[at], 6, axis=0)))
    return _merged(parts)


def _face_mask() -> np.ndarray:
    face = np.zeros(len(KEYPOINT_NAMES), bool)
    face[KEYPOINT_GROUPS["face"]] = True
    return face


def _merged(
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    verts, faces, cols, base = [], [], [], 0
    for v, f, c in parts:
        verts.append(v)
        faces.append(f + base)
        cols.append(c)
        base += len(v)
    if not parts:
        return np.zeros((0, 3), np.float32), np.zeros((0, 3), np.uint32), np.zeros((0, 3), np.uint8)
    return np.concatenate(verts), np.concatenate(faces).astype(np.uint32), np.concatenate(cols)


def rgba(colors: np.ndarray) -> np.ndarray:
    c = np.asarray(colors, np.uint8).reshape(-1, 3)
    return np.concatenate([c, np.full((len(c), 1), 255, np.uint8)], axis=1)


def write_skeleton_cloud_glb(
    path: str | Path, cloud: np.ndarray, colors: np.ndarray, points: np.ndarray, *, writer: Writer = NOW
) -> Path:
    """A GLB of the point cloud ``cloud`` (N, 3) with image ``colors`` and the skeletons of
    ``points`` (P, 308, 3) inside it, in the glTF frame (y up), like the pointmap's GLBs."""
    b = GltfBuilder()
    flip = OPENCV_TO_GLTF.astype(np.float32)
    cloud = np.asarray(cloud, np.float32).reshape(-1, 3)
    if len(cloud):
        attrs = {
            "POSITION": b.accessor(cloud * flip, target=ARRAY_BUFFER, bounds=True),
            "COLOR_0": b.accessor(rgba(colors), target=ARRAY_BUFFER, normalized=True),
        }
        mesh = b.mesh(
            "point_cloud", [{"attributes": attrs, "mode": 0, "material": b.material(POINTS_MATERIAL)}]
        )
        b.node(root=True, name="point_cloud", mesh=mesh)
    verts, faces, cols = skeleton_geometry(points)
    if len(faces):
        attrs = {
            "POSITION": b.accessor(verts * flip, target=ARRAY_BUFFER, bounds=True),
            "COLOR_0": b.accessor(rgba(cols), target=ARRAY_BUFFER, normalized=True),
        }
        prim = {
            "attributes": attrs,
            "indices": b.accessor(faces.reshape(-1), target=ELEMENT_ARRAY_BUFFER),
            "mode": TRIANGLES,
            "material": b.material(UNLIT_MATERIAL),
        }
        b.node(root=True, name="skeletons", mesh=b.mesh("skeletons", [prim]))
    return writer.write(_prepare(path), b.write)


__all__ = [
    "BODY_RADIUS",
    "HAND_RADIUS",
    "bone_colors",
    "joint_positions",
    "joint_tree",
    "keypoints3d_json",
    "rgba",
    "skeleton_geometry",
    "write_skeleton_cloud_glb",
]
