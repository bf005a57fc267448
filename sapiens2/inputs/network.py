"""The network input made from a photo, and the geometry that maps outputs back.

* The release's inputs as uint8 on the CPU (the pipelines' ``prepare``): :func:`stretch_release`
  (segmentation), :func:`letterbox_release` with its :class:`PadInfo` (normal, pointmap, albedo),
  :func:`stretch_antialiased` (matting).
* On the model's device: :func:`network_batch` uploads uint8 inputs once and normalises them
  there (:func:`to_device`, :func:`normalize`).
* Back to the photo: :func:`crop_padding` (the letterbox padding off an output at any
  resolution) and :func:`resize_to`, or :func:`resize_hwc` for channel-last arrays on the CPU.

Person crops for top-down pose live in ``sapiens2.tasks.pose.pose_crops``.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from ..errors import InputImageError, OptionError
from ..models.zoo import IMAGE_MEAN, IMAGE_STD, INPUT_SIZE

_MEAN = torch.tensor(IMAGE_MEAN, dtype=torch.float32).view(1, 3, 1, 1) * 255.0
_STD = torch.tensor(IMAGE_STD, dtype=torch.float32).view(1, 3, 1, 1) * 255.0


def to_device(img: np.ndarray | torch.Tensor, device: str | torch.device | None = None) -> torch.Tensor:
    """(H, W, 3) uint8 array/tensor or (B, 3, H, W) tensor -> (B, 3, H, W) tensor on ``device``.

    Uploads the bytes as they are (uint8 is 4x less traffic than float32) and converts there.
    """
    if isinstance(img, np.ndarray):
        arr = np.ascontiguousarray(img)
        if not arr.flags.writeable:  # torch would warn on read-only memory (e.g. a cached photo)
            arr = arr.copy()
        t = torch.from_numpy(arr)
    else:
        t = img
    if t.ndim == 3:
        t = t.permute(2, 0, 1).unsqueeze(0)
    if t.ndim != 4 or t.shape[1] != 3:
        raise InputImageError(
            f"Expected an (H, W, 3) image or a (B, 3, H, W) batch, got shape {tuple(t.shape)}."
        )
    return t.to(device) if device is not None else t


def normalize(img: np.ndarray | torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(x/255 - mean)/std`` with the ImageNet mean/std the weights expect; (B, 3, H, W) out.

    Takes uint8 (or float in 0-255) as (B, 3, H, W) or (H, W, 3); computed in float32 on the
    tensor's own device, returned in ``dtype``.
    """
    x = to_device(img)
    mean, std = _MEAN.to(x.device), _STD.to(x.device)
    if x.dtype != torch.uint8:
        return ((x.float() - mean) / std).to(dtype)
    # A permuted (B, H, W, 3) batch has its 3 channels innermost, which makes the broadcast
    # arithmetic several times slower: do it channel-first and in place (the same values), then
    # give the model the layout ``x.float()`` has (another layout changes a convolution's last bits)
    layout = torch.contiguous_format
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        layout = torch.channels_last
    return x.contiguous().float().sub_(mean).div_(std).contiguous(memory_format=layout).to(dtype)


@dataclass(frozen=True)
class PadInfo:
    """Where the resized image sits inside the letterboxed network input."""

    top: int
    left: int
    inner_hw: tuple[int, int]  # size of the resized image inside the canvas
    canvas_hw: tuple[int, int]  # network input size
    source_hw: tuple[int, int]  # size of the image that was letterboxed

    @property
    def bottom(self) -> int:
        return self.canvas_hw[0] - self.top - self.inner_hw[0]

    @property
    def right(self) -> int:
        return self.canvas_hw[1] - self.left - self.inner_hw[1]


def pad_info(source_hw: tuple[int, int], hw: tuple[int, int] = INPUT_SIZE) -> PadInfo:
    """The release's letterbox geometry: ``scale = min(W / w, H / h)``, new size ``int(w * scale)``
    (truncated, as the release does; rounding shifts landscape photos by a pixel), centred with
    top/left = pad // 2. Sizes are kept >= 1 so a 2x10000 strip still has a row."""
    h, w = source_hw
    scale = min(hw[1] / w, hw[0] / h)  # the release's expression, so float ties truncate alike
    ih, iw = min(hw[0], max(1, int(h * scale))), min(hw[1], max(1, int(w * scale)))
    return PadInfo((hw[0] - ih) // 2, (hw[1] - iw) // 2, (ih, iw), tuple(hw), (h, w))


#: The sides a network input may take: the backbone cuts it into 16 px patches.
PATCH = 16
MIN_SIDE, MAX_SIDE = 64, 4096


def check_input_hw(hw: object) -> tuple[int, int]:
    """A caller's network input size, (H, W) whole multiples of :data:`PATCH` from
    :data:`MIN_SIDE` to :data:`MAX_SIDE` px; OptionError otherwise. Sizes other than the
    checkpoint's own run (faster when smaller) but are not what the weights were trained on."""
    ok = isinstance(hw, (tuple, list)) and len(hw) == 2
    sides = [int(v) for v in hw if isinstance(v, (int, np.integer)) and not isinstance(v, bool)] if ok else []
    if len(sides) != 2 or any(v % PATCH or not MIN_SIDE <= v <= MAX_SIDE for v in sides):
        raise OptionError(
            f"The network input must be (height, width) in whole multiples of {PATCH} px from "
            f"{MIN_SIDE} to {MAX_SIDE}; got {hw!r}."
        )
    return sides[0], sides[1]


# --- the release's network inputs made on the CPU as uint8 (the stages' ``prepare``) ---------


def stretch_release(img: np.ndarray, hw: tuple[int, int] = INPUT_SIZE) -> np.ndarray:
    """(H, W, 3) uint8 -> ``hw`` uint8, aspect ignored, with the release's segmentation rule:
    ``cv2.INTER_AREA`` when the width shrinks, ``cv2.INTER_CUBIC`` otherwise."""
    flag = cv2.INTER_AREA if hw[1] < img.shape[1] else cv2.INTER_CUBIC
    return cv2.resize(np.ascontiguousarray(img), (hw[1], hw[0]), interpolation=flag)


def letterbox_release(img: np.ndarray, hw: tuple[int, int] = INPUT_SIZE) -> tuple[np.ndarray, PadInfo]:
    """(H, W, 3) uint8 -> (``hw``, 3) uint8 canvas: :func:`pad_info`'s size, ``cv2.INTER_LINEAR``,
    zero padding (the normalised tensor then reads ``-mean/std`` there, as in the release)."""
    pad = pad_info(img.shape[:2], hw)
    inner = cv2.resize(np.ascontiguousarray(img), pad.inner_hw[::-1], interpolation=cv2.INTER_LINEAR)
    canvas = np.zeros((*hw, 3), np.uint8)
    canvas[pad.top : pad.top + pad.inner_hw[0], pad.left : pad.left + pad.inner_hw[1]] = inner
    return canvas, pad


def stretch_linear(img: np.ndarray, hw: tuple[int, int] = INPUT_SIZE) -> np.ndarray:
    """(H, W, 3) uint8 -> ``hw`` uint8, aspect ignored, ``cv2.INTER_LINEAR`` (Sapiens v1's dense
    and pretrain input: SAPIENS_V1_SPEC.md 3.1)."""
    return cv2.resize(np.ascontiguousarray(img), (hw[1], hw[0]), interpolation=cv2.INTER_LINEAR)


def dense_input(
    img: np.ndarray, hw: tuple[int, int], resize: str, *, letterbox: bool = False
) -> tuple[np.ndarray, PadInfo]:
    """The network input of a dense task under a generation's ``Rules.dense_resize``: "release"
    = Sapiens2's (seg's stretch, or the letterbox for the tasks that ask), "stretch" = the whole
    photo bilinearly (no padding: the returned geometry covers the canvas)."""
    if resize == "stretch":
        return stretch_linear(img, hw), PadInfo(0, 0, tuple(hw), tuple(hw), tuple(img.shape[:2]))
    if resize != "release":
        raise OptionError(f"Unknown dense resize rule {resize!r}; choose release or stretch.")
    if letterbox:
        return letterbox_release(img, hw)
    return stretch_release(img, hw), PadInfo(0, 0, tuple(hw), tuple(hw), tuple(img.shape[:2]))


def stretch_antialiased(img: np.ndarray, hw: tuple[int, int] = INPUT_SIZE) -> np.ndarray:
    """(H, W, 3) uint8 -> ``hw`` uint8 the way transformers' Sapiens2 processor does (matting's
    only published path): torchvision's bilinear resize with antialias on the uint8 image, which
    is torch's own uint8 antialiased bilinear on the CPU."""
    arr = np.ascontiguousarray(img)
    t = torch.from_numpy(arr if arr.flags.writeable else arr.copy()).permute(2, 0, 1)[None]
    if tuple(t.shape[-2:]) != tuple(hw):
        t = F.interpolate(t, size=hw, mode="bilinear", align_corners=False, antialias=True)
    return np.ascontiguousarray(t[0].permute(1, 2, 0).numpy())


def network_batch(
    images: list[np.ndarray], device: str | torch.device | None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Prepared (h, w, 3) uint8 inputs of one size -> normalised (B, 3, h, w) on ``device``: the
    bytes travel as uint8 (4x less than float) and are normalised there."""
    batch = torch.from_numpy(np.stack(images))  # a fresh, writable array
    return normalize(to_device(batch.permute(0, 3, 1, 2), device), dtype)


def resize_to(t: torch.Tensor, out_hw: tuple[int, int], mode: str = "bilinear") -> torch.Tensor:
    """Resize (B, C, H, W) to ``out_hw`` (no-op when equal); bilinear uses half-pixel centres."""
    if tuple(t.shape[-2:]) == tuple(out_hw):
        return t
    if mode == "nearest":
        return F.interpolate(t, size=out_hw, mode="nearest-exact")
    return F.interpolate(t, size=out_hw, mode=mode, align_corners=False)


def resize_hwc(x: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
    """A new (H, W[, C]) float32 array: ``x`` (h, w[, C<=4]) resized bilinearly to ``out_hw``,
    half-pixel centres (the rule of :func:`resize_to`, to ~1e-6; the release's own cv2 call).

    Channel-last in and out: at 12 MP, 10x faster than ``resize_to`` on one thread, and no
    (C, H, W) -> (H, W, C) copy afterwards. Always a fresh array (callers modify it in place)."""
    src = np.ascontiguousarray(x, dtype=np.float32)
    if src.ndim not in (2, 3) or (src.ndim == 3 and not 1 <= src.shape[2] <= 4):
        raise InputImageError(f"resize_hwc needs an (H, W) or (H, W, C<=4) array, got {src.shape}.")
    if tuple(src.shape[:2]) == tuple(out_hw):
        return src.copy()
    out = cv2.resize(src, (int(out_hw[1]), int(out_hw[0])), interpolation=cv2.INTER_LINEAR)
    return out.reshape(*out.shape[:2], *src.shape[2:])  # cv2 drops a last axis of 1


def crop_padding(t: torch.Tensor, pad: PadInfo) -> torch.Tensor:
    """The letterbox padding cut off a (..., H, W) output (geometry scaled to its resolution)."""
    fy, fx = t.shape[-2] / pad.canvas_hw[0], t.shape[-1] / pad.canvas_hw[1]
    top, left = round(pad.top * fy), round(pad.left * fx)
    ih, iw = max(1, round(pad.inner_hw[0] * fy)), max(1, round(pad.inner_hw[1] * fx))
    return t[..., top : top + ih, left : left + iw]


__all__ = [
    "PadInfo",
    "check_input_hw",
    "crop_padding",
    "dense_input",
    "letterbox_release",
    "network_batch",
    "normalize",
    "pad_info",
    "resize_hwc",
    "resize_to",
    "stretch_antialiased",
    "stretch_linear",
    "stretch_release",
    "to_device",
]
