"""BVH of the body skeleton, joint rotations derived from 3D keypoint positions.

Rest pose: a T-pose in a Y-up frame, the person facing +z (their left at +x), centimetres, each
bone as long as its median length over the clip; the spine and the head lean as they do on
the median frame (their direction in the hips' / shoulders' frame). Per frame, each joint's global rotation takes
its rest bone directions to the observed ones: the pelvis and the neck from two directions each
(hips axis + spine, shoulders axis + head), every other joint by the smallest rotation that
carries its parent's rotated rest direction to the observed one (a limb's twist about itself is
not observable from points, so it is left out). Channels: the root's position and, for every
joint, ``Zrotation Xrotation Yrotation`` (local rotation = Rz Rx Ry), degrees. Joints missing in
a frame hold their nearest known position in time (as the GLB does).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...outputs.mesh import OPENCV_TO_GLTF
from ...outputs.writers import NOW, Writer
from ...outputs.writers import prepare as _prepare
from .motion_files import filled_joints
from .skeleton3d import joint_positions, joint_tree

CM = 100.0
#: (joint, parent, rest direction from the parent) of the body skeleton, parents first
BODY: tuple[tuple[str, str | None, tuple[float, float, float]], ...] = (
    ("pelvis", None, (0, 0, 0)),
    ("left_hip", "pelvis", (1, 0, 0)),
    ("left_knee", "left_hip", (0, -1, 0)),
    ("left_ankle", "left_knee", (0, -1, 0)),
    ("left_big_toe", "left_ankle", (0, 0, 1)),
    ("right_hip", "pelvis", (-1, 0, 0)),
    ("right_knee", "right_hip", (0, -1, 0)),
    ("right_ankle", "right_knee", (0, -1, 0)),
    ("right_big_toe", "right_ankle", (0, 0, 1)),
    ("neck", "pelvis", (0, 1, 0)),
    ("left_shoulder", "neck", (1, 0, 0)),
    ("left_elbow", "left_shoulder", (1, 0, 0)),
    ("left_wrist", "left_elbow", (1, 0, 0)),
    ("right_shoulder", "neck", (-1, 0, 0)),
    ("right_elbow", "right_shoulder", (-1, 0, 0)),
    ("right_wrist", "right_elbow", (-1, 0, 0)),
    ("nose", "neck", (0, 1, 0)),
)
#: joints whose rotation comes from two child directions: (first axis from - to, up child)
_FRAMED = {"pelvis": ("left_hip", "right_hip", "neck"), "neck": ("left_shoulder", "right_shoulder", "nose")}
_DEFAULT_CM = 20.0


def body_positions(points: np.ndarray) -> np.ndarray:
    """(F, 308, 3) camera-frame metres -> (F, len(BODY), 3) Y-up centimetres, gaps held."""
    names, parents, _ = joint_tree(False)
    at = {n: i for i, n in enumerate(names)}
    joints = filled_joints(joint_positions(points), parents)
    return joints[:, [at[n] for n, _, _ in BODY]] * OPENCV_TO_GLTF * CM


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-9)


def _swing(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The smallest rotation (3, 3) taking unit ``a`` to unit ``b``."""
    v, c = np.cross(a, b), float(np.dot(a, b))
    if c < -1 + 1e-9:  # opposite: half a turn about any axis across a
        axis = _unit(np.cross(a, [1.0, 0, 0] if abs(a[0]) < 0.9 else [0, 1.0, 0]))
        return 2 * np.outer(axis, axis) - np.eye(3)
    k = np.array([[0, -v[2], v[1]], [v[2], 0, -v[0]], [-v[1], v[0], 0]])
    return np.eye(3) + k + k @ k / (1 + c)


def _framed(side: np.ndarray, up: np.ndarray) -> np.ndarray:
    """Rotation whose x axis is ``side`` and whose y axis is ``up`` made orthogonal to it."""
    x = _unit(side)
    y = _unit(up - np.dot(up, x) * x)
    return np.stack([x, y, np.cross(x, y)], axis=1)


def euler_zxy(r: np.ndarray) -> np.ndarray:
    """Degrees (z, x, y) with ``r = Rz(z) @ Rx(x) @ Ry(y)``."""
    x = np.arcsin(np.clip(r[2, 1], -1.0, 1.0))
    z = np.arctan2(-r[0, 1], r[1, 1])
    y = np.arctan2(-r[2, 0], r[2, 2])
    return np.degrees([z, x, y])


def rotations(pos: np.ndarray, rest: np.ndarray) -> np.ndarray:
    """Global rotations (J, 3, 3) of one frame's joints ``pos`` (J, 3) for rest offsets ``rest``."""
    index = {n: i for i, (n, _, _) in enumerate(BODY)}
    child = {}
    for n, p, _ in BODY:
        child.setdefault(p, n)
    glob = np.tile(np.eye(3), (len(BODY), 1, 1))
    for j, (name, parent, _) in enumerate(BODY):
        if name in _FRAMED:
            a, b, up = (index[x] for x in _FRAMED[name])
            glob[j] = _framed(pos[a] - pos[b], pos[up] - pos[j])
        elif name in child:
            c = index[child[name]]
            base = glob[index[parent]] if parent else np.eye(3)
            seen = pos[c] - pos[j]
            if np.linalg.norm(seen) > 1e-9:
                glob[j] = _swing(_unit(base @ _unit(rest[c])), _unit(seen)) @ base
            else:
                glob[j] = base
        else:  # a leaf: it turns with its parent
            glob[j] = glob[index[parent]] if parent else np.eye(3)
    return glob


def rest_offsets(pos: np.ndarray) -> np.ndarray:
    """(J, 3) rest offsets: each bone's rest direction times its median length over the frames."""
    index = {n: i for i, (n, _, _) in enumerate(BODY)}
    out = np.zeros((len(BODY), 3))
    for j, (_, parent, direction) in enumerate(BODY):
        if parent is None:
            continue
        lengths = np.linalg.norm(pos[:, j] - pos[:, index[parent]], axis=-1)
        lengths = lengths[np.isfinite(lengths)]
        length = float(np.median(lengths)) if len(lengths) else _DEFAULT_CM
        out[j] = np.asarray(direction, float) * (length if length > 1e-6 else _DEFAULT_CM)
    for name, (a, b, up) in _FRAMED.items():  # the up bone: its median direction in the frame
        j, u = index[name], index[up]
        seen = [_framed(f[index[a]] - f[index[b]], f[u] - f[j]).T @ _unit(f[u] - f[j]) for f in pos]
        seen = [d for d in seen if np.isfinite(d).all() and np.linalg.norm(d) > 0.5]
        if seen:
            out[u] = _unit(np.median(seen, axis=0)) * np.linalg.norm(out[u])
    return out


def _hierarchy(rest: np.ndarray) -> list[str]:
    kids: dict[str | None, list[int]] = {}
    for j, (_, parent, _) in enumerate(BODY):
        kids.setdefault(parent, []).append(j)
    lines: list[str] = ["HIERARCHY"]

    def emit(j: int, depth: int) -> None:
        pad = "  " * depth
        name, parent, _ = BODY[j]
        head = "ROOT" if parent is None else "JOINT"
        lines.append(f"{pad}{head} {name}")
        lines.append(f"{pad}{{")
        lines.append(f"{pad}  OFFSET {rest[j][0]:.4f} {rest[j][1]:.4f} {rest[j][2]:.4f}")
        chans = (
            "6 Xposition Yposition Zposition Zrotation Xrotation Yrotation"
            if parent is None
            else "3 Zrotation Xrotation Yrotation"
        )
        lines.append(f"{pad}  CHANNELS {chans}")
        for c in kids.get(name, []):
            emit(c, depth + 1)
        if name not in kids:
            lines.append(f"{pad}  End Site")
            lines.append(f"{pad}  {{")
            lines.append(f"{pad}    OFFSET 0.0000 0.0000 0.0000")
            lines.append(f"{pad}  }}")
        lines.append(f"{pad}}}")

    emit(0, 0)
    return lines


def bvh_text(points: np.ndarray, fps: float) -> str:
    """The BVH of one person's (F, 308, 3) camera-frame keypoints (metres, NaN = missing)."""
    pos = body_positions(points)
    rest = rest_offsets(pos)
    index = {n: i for i, (n, _, _) in enumerate(BODY)}
    lines = _hierarchy(rest)
    lines += ["MOTION", f"Frames: {len(pos)}", f"Frame Time: {1.0 / fps:.6f}"]
    for frame in pos:
        glob = rotations(frame, rest)
        values = [*frame[0]]
        for j, (_, parent, _) in enumerate(BODY):
            local = glob[j] if parent is None else glob[index[parent]].T @ glob[j]
            values += list(euler_zxy(local))
        lines.append(" ".join(f"{v:.4f}" for v in np.nan_to_num(values)))
    return "\n".join(lines) + "\n"


def write_bvh(
    path: str | Path,
    points: np.ndarray,
    present: np.ndarray,
    ids: np.ndarray,
    fps: float,
    *,
    writer: Writer = NOW,
) -> Path:
    """``path``: the BVH of the person present in the most frames (``points`` (F, T, 308, 3));
    an empty skeleton at rest when nobody is."""
    if len(ids) == 0 or not np.asarray(present).any():
        pts = np.full((max(1, len(points)), 308, 3), np.nan, np.float32)
    else:
        pts = points[:, int(np.argmax(np.asarray(present).sum(0)))]
    if not np.isfinite(pts).any():  # nothing known: a rest pose 1 m in front of the camera
        pts = np.zeros_like(pts)
    text = bvh_text(pts, fps)
    return writer.write(_prepare(path), lambda p: p.write_text(text, encoding="ascii"))


__all__ = ["BODY", "bvh_text", "euler_zxy", "rotations", "write_bvh"]
