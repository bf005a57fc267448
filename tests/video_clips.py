"""Synthetic clips for the video tests (test-only): two boxes moving apart on a dark background.

Box A (red) starts left of the centre and moves left, box B (green) starts right of it and moves
right, 2 px a frame (1/8 of their width). Written with OpenCV (MP4/MOV: MPEG-4 Part 2, WebM: VP8) or Pillow (GIF).
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
from PIL import Image

W, H = 96, 64
RED, GREEN = (230, 30, 30), (30, 210, 30)
_FOURCC = {".mp4": "mp4v", ".mov": "mp4v", ".webm": "VP80"}


def boxes_at(i: int) -> np.ndarray:
    """(2, 4) xyxy of box A (red) and box B (green) in frame i."""
    a = [30 - 2 * i, 12, 46 - 2 * i, 52]
    b = [50 + 2 * i, 12, 66 + 2 * i, 52]
    return np.array([a, b], np.float64)


def frame_at(i: int, w: int = W, h: int = H) -> np.ndarray:
    """(H, W, 3) uint8 RGB frame i (boxes scaled with the frame size)."""
    img = np.full((h, w, 3), 20, np.uint8)
    sx, sy = w / W, h / H
    for (x1, y1, x2, y2), color in zip(boxes_at(i), (RED, GREEN), strict=True):
        cv2.rectangle(
            img, (round(x1 * sx), round(y1 * sy)), (round(x2 * sx) - 1, round(y2 * sy) - 1), color, -1
        )
    return img


def write_clip(path: Path, n: int = 8, fps: float = 10.0, size: tuple[int, int] = (W, H)) -> Path:
    """n frames at fps, size (w, h); the container and codec follow the suffix."""
    frames = [frame_at(i, *size) for i in range(n)]
    if path.suffix == ".gif":
        pil = [Image.fromarray(f) for f in frames]
        pil[0].save(path, save_all=True, append_images=pil[1:], duration=round(1000 / fps), loop=0)
        return path
    writer = cv2.VideoWriter(
        str(path), cv2.CAP_FFMPEG, cv2.VideoWriter_fourcc(*_FOURCC[path.suffix]), fps, size
    )
    assert writer.isOpened(), f"OpenCV cannot write {path.suffix} here"
    for f in frames:
        writer.write(cv2.cvtColor(f, cv2.COLOR_RGB2BGR))
    writer.release()
    return path


def find_boxes(rgb: np.ndarray) -> dict[str, np.ndarray]:
    """The red and green boxes of a decoded frame (colour thresholds; survives compression)."""
    r, g, b = (rgb[:, :, c].astype(int) for c in range(3))
    out = {}
    for name, mask in (("red", (r > 120) & (g < 100)), ("green", (g > 120) & (r < 100))):
        ys, xs = np.nonzero(mask)
        if len(xs):
            out[name] = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.float64)
    return out


def count_frames(path: Path) -> tuple[int, float, tuple[int, int]]:
    """(decoded frames, fps, (w, h)) of a video file, read back with OpenCV."""
    cap = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
    n = 0
    while cap.grab():
        n += 1
    out = (
        n,
        cap.get(cv2.CAP_PROP_FPS),
        (int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))),
    )
    cap.release()
    return out
