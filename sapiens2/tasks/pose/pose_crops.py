"""Top-down person crops for pose: the release's UDP affine crop of each person box to the
network input, and the matrices that bring keypoints back to the photo.

Coordinate convention: keypoints are in pixel units with integer values at pixel centres (the
convention of ``cv2.warpAffine`` and the release). Boxes are ``(x1, y1, x2, y2)`` in the same
pixel units.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from ...errors import OptionError
from ...inputs import network as network_input
from ...models.zoo import INPUT_SIZE


def box_to_center_scale(
    box: np.ndarray, padding: float = 1.25, aspect: float = INPUT_SIZE[1] / INPUT_SIZE[0]
) -> tuple[np.ndarray, np.ndarray]:
    """(N, 4) or (4,) xyxy boxes -> centres (N, 2) and crop sizes (N, 2) = (w, h) in image px.

    Size = box size x ``padding``, then the shorter side is widened to the aspect ``w/h``
    (0.75 for 768x1024), as the release's top-down pipeline does, in float32 as it does (the
    crop's pixels depend on the matrix's last bits: float64 changes ~1 in 10,000 by a grey level).
    """
    b = np.asarray(box, dtype=np.float32).reshape(-1, 4)
    center = np.stack([(b[:, 0] + b[:, 2]) * np.float32(0.5), (b[:, 1] + b[:, 3]) * np.float32(0.5)], axis=1)
    w = (b[:, 2] - b[:, 0]) * np.float32(padding)
    h = (b[:, 3] - b[:, 1]) * np.float32(padding)
    a = np.float32(aspect)
    wide = w > h * a
    scale = np.stack([np.where(wide, w, h * a), np.where(wide, w / a, h)], axis=1)
    # a degenerate box (zero area) still needs a usable crop: at least one pixel
    return center, np.maximum(scale, np.float32([aspect, 1.0]))


def warp_matrix(
    center: np.ndarray, scale: np.ndarray, out_wh: tuple[int, int] = (INPUT_SIZE[1], INPUT_SIZE[0])
) -> np.ndarray:
    """(N, 2, 3) float32 affine maps image px -> crop px (UDP: box edges land on crop pixels 0
    and W-1): ``u = (x - cx + sw/2) * (W-1)/sw``, the release's ``get_udp_warp_matrix`` without
    rotation, in its float32 arithmetic.
    """
    c = np.asarray(center, dtype=np.float32).reshape(-1, 2)
    s = np.asarray(scale, dtype=np.float32).reshape(-1, 2)
    kx, ky = np.float32(out_wh[0] - 1) / s[:, 0], np.float32(out_wh[1] - 1) / s[:, 1]
    half = np.float32(0.5)
    m = np.zeros((len(c), 2, 3), dtype=np.float32)
    m[:, 0, 0], m[:, 0, 2] = kx, kx * (half * s[:, 0] - c[:, 0])
    m[:, 1, 1], m[:, 1, 2] = ky, ky * (half * s[:, 1] - c[:, 1])
    return m


def invert_affine(m: np.ndarray) -> np.ndarray:
    """Invert (N, 2, 3) affine matrices in float64 with OpenCV's own formula (``warpAffine``
    inverts its matrix this way), so sampling with the inverse reproduces its pixels."""
    m = np.asarray(m, dtype=np.float64).reshape(-1, 2, 3)
    d = m[:, 0, 0] * m[:, 1, 1] - m[:, 0, 1] * m[:, 1, 0]
    d = np.where(d != 0, 1.0 / np.where(d != 0, d, 1.0), 0.0)
    out = np.empty_like(m)
    out[:, 0, 0], out[:, 1, 1] = m[:, 1, 1] * d, m[:, 0, 0] * d
    out[:, 0, 1], out[:, 1, 0] = -m[:, 0, 1] * d, -m[:, 1, 0] * d
    out[:, 0, 2] = -out[:, 0, 0] * m[:, 0, 2] - out[:, 0, 1] * m[:, 1, 2]
    out[:, 1, 2] = -out[:, 1, 0] * m[:, 0, 2] - out[:, 1, 1] * m[:, 1, 2]
    return out


def inverse_warp_matrix(
    center: np.ndarray, scale: np.ndarray, out_wh: tuple[int, int] = (INPUT_SIZE[1], INPUT_SIZE[0])
) -> np.ndarray:
    """(N, 2, 3) float64 crop px -> image px: ``x = u * sw/(W-1) + cx - sw/2``, the inverse of
    :func:`warp_matrix` before its float32 rounding (the release maps keypoints back this way)."""
    c = np.asarray(center, dtype=np.float64).reshape(-1, 2)
    s = np.asarray(scale, dtype=np.float64).reshape(-1, 2)
    m = np.zeros((len(c), 2, 3), dtype=np.float64)
    m[:, 0, 0], m[:, 0, 2] = s[:, 0] / (out_wh[0] - 1), c[:, 0] - 0.5 * s[:, 0]
    m[:, 1, 1], m[:, 1, 2] = s[:, 1] / (out_wh[1] - 1), c[:, 1] - 0.5 * s[:, 1]
    return m


def apply_affine(
    points: np.ndarray | torch.Tensor, m: np.ndarray | torch.Tensor
) -> np.ndarray | torch.Tensor:
    """Apply (N, 2, 3) matrices to (N, K, 2) points (numpy or torch; torch stays on its device)."""
    if isinstance(points, torch.Tensor):
        wide = torch.float32 if points.device.type == "mps" else torch.float64  # MPS has no float64
        mt = torch.as_tensor(np.asarray(m), dtype=wide, device=points.device)
        p = points.to(wide)
        out = p @ mt[:, :, :2].transpose(1, 2) + mt[:, None, :, 2]
        return out.to(points.dtype)
    m = np.asarray(m, dtype=np.float64)
    p = np.asarray(points, dtype=np.float64)
    return p @ m[:, :, :2].transpose(0, 2, 1) + m[:, None, :, 2]


@dataclass
class CropInfo:
    """Geometry of a batch of person crops (one row per box)."""

    centers: np.ndarray  # (N, 2) image px
    scales: np.ndarray  # (N, 2) crop window (w, h) in image px
    matrices: np.ndarray  # (N, 2, 3) image px -> crop px
    inverse: np.ndarray  # (N, 2, 3) crop px -> image px
    out_hw: tuple[int, int]


CropBackend = Literal["auto", "cv2", "torch"]


def crop_geometry(boxes: np.ndarray, out_hw: tuple[int, int] = INPUT_SIZE, padding: float = 1.25) -> CropInfo:
    """Centres, crop sizes and matrices of the person crops of (N, 4) xyxy ``boxes``."""
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    out_wh = (out_hw[1], out_hw[0])
    center, scale = box_to_center_scale(boxes, padding, out_hw[1] / out_hw[0])
    mats = warp_matrix(center, scale, out_wh)
    return CropInfo(center, scale, mats, inverse_warp_matrix(center, scale, out_wh), tuple(out_hw))


def _enlarges(info: CropInfo) -> np.ndarray:
    # zoom > 1 means the crop enlarges the picture: bicubic; otherwise bilinear
    return np.minimum(info.matrices[:, 0, 0], info.matrices[:, 1, 1]) >= 1.0


def warp_crops(
    img: np.ndarray, boxes: np.ndarray, *, out_hw: tuple[int, int] = INPUT_SIZE, padding: float = 1.25
) -> tuple[np.ndarray, CropInfo]:
    """The release's person crops of an (H, W, 3) uint8 image: (N, *out_hw, 3) uint8.

    ``cv2.warpAffine`` with the UDP matrix, zero border, ``INTER_CUBIC`` when the crop enlarges
    the picture and ``INTER_AREA`` otherwise (which warpAffine runs as ``INTER_LINEAR``).
    """
    info = crop_geometry(boxes, out_hw, padding)
    crops = np.empty((len(info.matrices), out_hw[0], out_hw[1], 3), dtype=np.uint8)
    src = np.ascontiguousarray(img)
    for i, (m, up) in enumerate(zip(info.matrices, _enlarges(info), strict=True)):
        crops[i] = cv2.warpAffine(
            src,
            m,
            (out_hw[1], out_hw[0]),
            flags=cv2.INTER_CUBIC if up else cv2.INTER_AREA,
            borderMode=cv2.BORDER_CONSTANT,
            borderValue=0,
        )
    return crops, info


def crop_people(
    img: np.ndarray,
    boxes: np.ndarray,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    out_hw: tuple[int, int] = INPUT_SIZE,
    padding: float = 1.25,
    backend: CropBackend = "auto",
) -> tuple[torch.Tensor, CropInfo]:
    """Affine-crop every box of an (H, W, 3) uint8 image to ``out_hw``; normalised (N, 3, *out_hw).

    Two backends: ``cv2`` (the release's own warp, :func:`warp_crops`, on the CPU; the uint8
    crops are uploaded) and ``torch`` (grid_sample on ``device`` after uploading the image once,
    sampling at the same points, rounded to whole grey levels as the uint8 warp: within 1 grey
    level of it, nearly all pixels equal). ``auto`` uses torch on CUDA and cv2 elsewhere.
    """
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if backend == "auto":
        backend = "torch" if dev.type == "cuda" else "cv2"
    if backend not in ("cv2", "torch"):
        raise OptionError(f"Unknown crop backend {backend!r}; choose one of: auto, cv2, torch.")
    if backend == "cv2" or len(np.asarray(boxes).reshape(-1, 4)) == 0:
        crops, info = warp_crops(img, boxes, out_hw=out_hw, padding=padding)
        return network_input.normalize(torch.from_numpy(crops).to(dev).permute(0, 3, 1, 2), dtype), info
    info = crop_geometry(boxes, out_hw, padding)
    return network_input.normalize(_grid_crops(img, info, dev), dtype), info


def crops_to_device(
    crops: np.ndarray, boxes: np.ndarray, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, CropInfo]:
    """(N, H, W, 3) uint8 crops made by :func:`warp_crops` -> normalised on ``device``, with the
    geometry of ``boxes`` at their size."""
    pixels = torch.from_numpy(crops).permute(0, 3, 1, 2)
    x = network_input.normalize(network_input.to_device(pixels, device), dtype)
    return x, crop_geometry(boxes, crops.shape[1:3])


def _grid_crops(img: np.ndarray, info: CropInfo, dev: torch.device) -> torch.Tensor:
    src = network_input.to_device(img, dev).float()  # (1, 3, H, W)
    h, w = src.shape[-2:]
    oh, ow = info.out_hw
    enlarge = _enlarges(info)
    # crop px -> img px as warpAffine inverts its matrix
    inv = torch.as_tensor(invert_affine(info.matrices), dtype=torch.float32, device=dev)
    ys, xs = torch.meshgrid(
        torch.arange(oh, dtype=torch.float32, device=dev),
        torch.arange(ow, dtype=torch.float32, device=dev),
        indexing="ij",
    )
    # source pixel of every crop pixel, then grid_sample's [-1, 1] with align_corners=False
    # (pixel i's centre at -1 + (2i+1)/size: well defined even for a 1-pixel-wide image)
    sx = inv[:, 0, 0, None, None] * xs + inv[:, 0, 2, None, None]
    sy = inv[:, 1, 1, None, None] * ys + inv[:, 1, 2, None, None]
    grid = torch.stack([(2 * sx + 1) / w - 1, (2 * sy + 1) / h - 1], dim=-1)
    out = torch.empty((len(inv), 3, oh, ow), dtype=torch.float32, device=dev)
    for mode, mask in (("bicubic", enlarge), ("bilinear", ~enlarge)):
        idx = torch.from_numpy(np.flatnonzero(mask)).to(dev)
        if len(idx):
            out[idx] = F.grid_sample(
                src.expand(len(idx), -1, -1, -1),
                grid[idx],
                mode=mode,
                padding_mode="zeros",
                align_corners=False,
            )
    return out.clamp_(0, 255).round_()  # the release's warp gives uint8: saturated and rounded


__all__ = [
    "CropInfo",
    "apply_affine",
    "box_to_center_scale",
    "crop_geometry",
    "crop_people",
    "crops_to_device",
    "invert_affine",
    "inverse_warp_matrix",
    "warp_crops",
    "warp_matrix",
]
