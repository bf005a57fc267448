"""Synthetic 3D motion for the motion tests (test-only): a stick person walking in place 3 m in
front of the camera, legs and arms swinging, in the camera frame (x right, y down, z forward),
with the hand points around the wrists. Everything else of the 308 points is missing (NaN)."""

from __future__ import annotations

import numpy as np

from sapiens2.data.metadata import KEYPOINT_GROUPS, keypoint_index


def walker(
    frames: int = 20, fps: float = 10.0, x0: float = 0.0, z0: float = 3.0, phase: float = 0.0
) -> np.ndarray:
    """(frames, 308, 3) metres: a person at (x0, 0, z0) walking in place (1 Hz stride)."""
    out = np.full((frames, 308, 3), np.nan, np.float32)
    for f in range(frames):
        a = 0.5 * np.sin(2 * np.pi * f / fps + phase)  # swing angle (rad)
        p: dict[str, tuple[float, float, float]] = {}
        for side, sx in (("left", 1.0), ("right", -1.0)):
            s = a * sx
            hip = (x0 + 0.1 * sx, 0.0, z0)
            knee = (hip[0], 0.45 * np.cos(s), z0 - 0.45 * np.sin(s))
            ankle = (hip[0], knee[1] + 0.45, knee[2] - 0.1 * np.sin(s))
            p |= {f"{side}_hip": hip, f"{side}_knee": knee, f"{side}_ankle": ankle}
            p[f"{side}_big_toe"] = (hip[0] + 0.03 * sx, ankle[1] + 0.05, ankle[2] - 0.15)
            p[f"{side}_small_toe"] = (hip[0] + 0.07 * sx, ankle[1] + 0.05, ankle[2] - 0.12)
            p[f"{side}_heel"] = (hip[0], ankle[1] + 0.05, ankle[2] + 0.05)
            sh = (x0 + 0.2 * sx, -0.5, z0)
            elbow = (sh[0] + 0.02 * sx, sh[1] + 0.3 * np.cos(s), z0 + 0.3 * np.sin(s))
            wrist = (elbow[0], elbow[1] + 0.25, elbow[2] + 0.1 * np.sin(s))
            p |= {f"{side}_shoulder": sh, f"{side}_elbow": elbow, f"{side}_wrist": wrist}
            p[f"{side}_eye"] = (x0 + 0.03 * sx, -0.75, z0 - 0.08)
            p[f"{side}_ear"] = (x0 + 0.07 * sx, -0.73, z0)
        p["nose"] = (x0, -0.7, z0 - 0.1)
        for name, xyz in p.items():
            out[f, keypoint_index(name)] = xyz
        for side in ("left", "right"):
            w = out[f, keypoint_index(f"{side}_wrist")]
            hand = KEYPOINT_GROUPS[f"{side}_hand"]
            offsets = np.stack(
                [np.linspace(-0.04, 0.04, len(hand)), np.linspace(0.02, 0.1, len(hand)), np.zeros(len(hand))],
                1,
            )
            out[f, hand] = w + offsets
    return out


__all__ = ["walker"]
