"""A clip's 3D motion as files: an animated glTF skeleton per person, the arrays, a long CSV.

* ``write_motion_glb``: glTF 2.0, one skin per person over a node hierarchy (a root node, the
  skin's skeleton root but not a joint, so Blender makes it the armature; under it
  :func:`sapiens2.tasks.pose.skeleton3d.joint_tree`'s joints), and one animation with a keyframe
  per processed frame: every joint's ``translation`` (LINEAR) and each person's root ``scale``
  (STEP: 1 while the person is in the picture, 0 while not). Joints have no rotation: a bone is
  the stick between two joints, drawn by a small mesh skinned to both ends, so it stretches and
  turns with them. Blender's glTF importer makes each skin an armature whose bones carry the
  location keyframes; browsers' glTF viewers play the animation. Frame: glTF's (y up, metres),
  the camera at the origin looking down -z.
* ``write_keypoints_npz``: ``points`` (frames, people, 308, 3) metres in the camera frame (NaN
  where missing), ``scores``, ``ids``, ``fps`` and what the motion was made from.
* ``write_keypoints_csv``: one row per frame, person present and keypoint.

A joint missing in some frames holds its nearest known position in time for the GLB (the NPZ
and CSV keep it missing); a joint never found sits on its parent.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

from ...data.metadata import KEYPOINT_NAMES
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
from ...outputs.writers import NOW, Writer
from ...outputs.writers import prepare as _prepare
from .skeleton3d import BODY_RADIUS, bone_colors, joint_positions, joint_tree, rgba


def filled_joints(joints: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """(F, J, 3) with NaN gaps -> every joint at its nearest known position in time (the earlier
    one first); a joint never known sits on its parent (the root: at the mean of the known
    joints); NaN remains only where no joint is ever known."""
    out = np.asarray(joints, np.float64).copy()
    f = len(out)
    idx = np.arange(f)
    never = []
    for j in range(out.shape[1]):
        known = np.isfinite(out[:, j]).all(-1)
        if not known.any():
            never.append(j)
            continue
        prev = np.maximum.accumulate(np.where(known, idx, -1))
        nxt = np.minimum.accumulate(np.where(known, idx, f)[::-1])[::-1]
        out[:, j] = out[np.where(prev >= 0, prev, nxt), j]
    for j in never:  # parents come before their children in the tree
        if parents[j] >= 0:
            out[:, j] = out[:, parents[j]]
        elif len(never) < out.shape[1]:
            out[:, j] = np.nanmean(np.where(np.isfinite(out), out, np.nan), axis=1)
    return out


def _stick_mesh(rest: np.ndarray, parents: np.ndarray, colors: np.ndarray) -> tuple[np.ndarray, ...]:
    """Vertices, triangles, skin joint per vertex (index into the joints) and colours."""
    bones = np.flatnonzero(parents >= 0)
    sv, sf = sticks(rest[parents[bones]], rest[bones], BODY_RADIUS * 0.6)
    s_joint = np.concatenate([np.repeat(parents[bones][:, None], 4, 1), np.repeat(bones[:, None], 4, 1)], 1)
    kv, kf = knobs(rest, BODY_RADIUS)
    k_joint = np.repeat(np.arange(len(rest)), 6)
    verts = np.concatenate([sv, kv])
    faces = np.concatenate([sf, kf + len(sv)]).astype(np.uint32)
    joint = np.concatenate([s_joint.reshape(-1), k_joint])
    cols = np.concatenate([np.repeat(colors[bones], 8, 0), np.repeat(colors, 6, 0)])
    return verts, faces, joint, cols


def write_motion_glb(
    path: str | Path,
    points: np.ndarray,
    present: np.ndarray,
    times: np.ndarray,
    ids: np.ndarray,
    *,
    face: bool = False,
    writer: Writer = NOW,
) -> Path:
    """The animated skeletons of ``points`` (F, P, 308, 3) metres, camera frame, NaN = missing;
    ``present`` (F, P) bool: the person is in frame t; ``times`` (F,) seconds, increasing;
    ``ids`` (P,) track ids (node names ``person_<id>``). A person never present is left out."""
    names, parents, _ = joint_tree(face)
    colors = bone_colors(face)
    flip = OPENCV_TO_GLTF.astype(np.float64)
    b = GltfBuilder()
    material = b.material(UNLIT_MATERIAL)
    t = np.asarray(times, np.float32).reshape(-1)
    channels: list[tuple[int, str, int, int, str]] = []
    time_acc = b.accessor(t, bounds=True) if len(t) else None
    for p, tid in enumerate(np.asarray(ids).reshape(-1)):
        on = np.asarray(present[:, p], bool)
        joints = filled_joints(joint_positions(points[:, p], face), parents) * flip
        if not on.any() or not np.isfinite(joints).all():
            continue
        first = int(np.flatnonzero(on)[0])
        rest = joints[first]
        name = f"person_{int(tid)}"
        root = b.node(root=True, name=name)
        nodes: list[int] = []
        for j, par in enumerate(parents):
            offset = rest[j] - (rest[par] if par >= 0 else 0.0)
            nodes.append(b.node(name=f"{name}_{names[j]}", translation=offset.astype(np.float32).tolist()))
            b.add_child(root if par < 0 else nodes[par], nodes[-1])
        verts, faces, joint, cols = _stick_mesh(rest, parents, colors)
        ibm = np.tile(np.eye(4, dtype=np.float32), (len(nodes), 1, 1))
        ibm[:, :3, 3] = -rest
        skin = b.skin(f"{name}_skin", nodes, ibm, root)
        wide = np.uint16 if len(nodes) > 255 else np.uint8
        attrs = {
            "POSITION": b.accessor(verts, target=ARRAY_BUFFER, bounds=True),
            "COLOR_0": b.accessor(rgba(cols), target=ARRAY_BUFFER, normalized=True),
            "JOINTS_0": b.accessor(
                np.stack([joint, *[np.zeros_like(joint)] * 3], 1).astype(wide), target=ARRAY_BUFFER
            ),
            "WEIGHTS_0": b.accessor(np.tile(np.float32([1, 0, 0, 0]), (len(verts), 1)), target=ARRAY_BUFFER),
        }
        prim = {"attributes": attrs, "indices": b.accessor(faces.reshape(-1), target=ELEMENT_ARRAY_BUFFER),
                "mode": TRIANGLES, "material": material}  # fmt: skip
        b.node(root=True, name=f"{name}_mesh", mesh=b.mesh(f"{name}_sticks", [prim]), skin=skin)
        local = joints - np.where(parents[None, :, None] >= 0, joints[:, np.maximum(parents, 0)], 0.0)
        for j, node in enumerate(nodes):
            out = b.accessor(local[:, j].astype(np.float32))
            channels.append((node, "translation", time_acc, out, "LINEAR"))
        scale = np.repeat(on.astype(np.float32)[:, None], 3, 1)
        channels.append((root, "scale", time_acc, b.accessor(scale), "STEP"))
    if channels:
        b.animation("motion", channels)
    return writer.write(_prepare(path), b.write)


def write_keypoints_npz(path: str | Path, *, writer: Writer = NOW, **arrays: np.ndarray) -> Path:
    """An uncompressed NPZ of ``arrays`` (``points``, ``scores``, ``ids``, ``fps`` ...)."""

    def save(p: Path) -> None:
        with open(p, "wb") as f:
            np.savez(f, **arrays)

    return writer.write(_prepare(path), save)


def write_keypoints_csv(
    path: str | Path,
    points: np.ndarray,
    scores: np.ndarray,
    present: np.ndarray,
    frames: np.ndarray,
    times: np.ndarray,
    ids: np.ndarray,
    bridged: np.ndarray | None = None,
    *,
    writer: Writer = NOW,
) -> Path:
    """Long CSV: ``frame, time, person, keypoint, x, y, z, score, bridged`` for every frame, person
    present in it and keypoint; x, y, z empty where missing; ``bridged`` 1 where a gap was filled."""

    def write(p: Path) -> None:
        with open(p, "w", newline="", encoding="utf-8") as f:
            _write_rows(csv.writer(f), points, scores, present, frames, times, ids, bridged)

    return writer.write(_prepare(path), write)


def _write_rows(
    w: Any,
    points: np.ndarray,
    scores: np.ndarray,
    present: np.ndarray,
    frames: np.ndarray,
    times: np.ndarray,
    ids: np.ndarray,
    bridged: np.ndarray | None,
) -> None:
    w.writerow(["frame", "time", "person", "keypoint", "x", "y", "z", "score", "bridged"])
    for i in range(len(frames)):
        for q in np.flatnonzero(present[i]):
            xyz = points[i, q]
            known = np.isfinite(xyz).all(-1)
            gap = bridged[i, q] if bridged is not None else np.zeros(len(xyz), bool)
            for k, name in enumerate(KEYPOINT_NAMES):
                x, y, z = (f"{v:.4f}" for v in xyz[k]) if known[k] else ("", "", "")
                s = scores[i, q, k]
                w.writerow([int(frames[i]), f"{times[i]:.4f}", int(ids[q]), name, x, y, z,
                            f"{s:.4f}" if np.isfinite(s) else "", int(gap[k])])  # fmt: skip


__all__ = ["filled_joints", "write_keypoints_csv", "write_keypoints_npz", "write_motion_glb"]
