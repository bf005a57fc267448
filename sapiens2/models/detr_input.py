"""DETR's input: its resize rule, ImageNet normalisation, and an input made on a CPU for a device.

Follows transformers' DetrImageProcessor for ``facebook/detr-resnet-50`` (preprocessor_config.json)
so the network sees exactly the size the checkpoint was evaluated at.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from ..errors import InputImageError
from . import zoo

# The DETR image processor's defaults for facebook/detr-resnet-50 (preprocessor_config.json).
SHORTEST_EDGE = 800
LONGEST_EDGE = 1333


def resize_shape(
    height: int, width: int, shortest: int = SHORTEST_EDGE, longest: int = LONGEST_EDGE
) -> tuple[int, int]:
    """DETR's resize rule: shortest edge to ``shortest`` unless the longest edge would pass ``longest``.

    Follows transformers' DetrImageProcessor arithmetic (rounded target edge, truncated other
    edge) so the network sees exactly the size the checkpoint was evaluated at.
    """
    short, long = min(height, width), max(height, width)
    target: float = shortest
    exact: float | None = None
    if long / short * shortest > longest:
        exact = longest * short / long
        target = int(round(exact))
    if short == target:
        return height, width
    other = int((exact if exact is not None else target) * long / short)
    target = max(1, int(target))  # very elongated images (2 x 10000) would round to 0 px
    other = max(1, other)
    return (target, other) if height <= width else (other, target)


def resize_for_detr(
    image: np.ndarray, shortest: int = SHORTEST_EDGE, longest: int = LONGEST_EDGE
) -> np.ndarray:
    """(H, W, 3) uint8 RGB at DETR's input size (:func:`resize_shape`; bilinear, PIL), uint8 still:
    the detector's network input before normalisation, a quarter of its float bytes."""
    h, w = resize_shape(image.shape[0], image.shape[1], shortest, longest)
    if (h, w) != image.shape[:2]:
        image = np.array(Image.fromarray(image).resize((w, h), Image.BILINEAR))  # writable copy for torch
    return np.ascontiguousarray(image)


def normalise(
    pixels: np.ndarray, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Resized uint8 RGB -> (1, 3, h, w) network input: /255, ImageNet mean/std."""
    x = torch.from_numpy(pixels).to(device).permute(2, 0, 1)[None].float() / 255.0
    mean = torch.tensor(zoo.IMAGE_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(zoo.IMAGE_STD, device=device).view(1, 3, 1, 1)
    return ((x - mean) / std).to(dtype)


def preprocess(
    image: np.ndarray,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    shortest: int = SHORTEST_EDGE,
    longest: int = LONGEST_EDGE,
) -> torch.Tensor:
    """(H, W, 3) uint8 RGB -> (1, 3, h, w) network input: bilinear resize (PIL), /255, ImageNet mean/std."""
    return normalise(resize_for_detr(image, shortest, longest), device, dtype)


@dataclass
class DetectorInput:
    """One image's detector input made on a CPU (:func:`detector_input`), so a device step can
    find its people without the image: the uint8 pixels at DETR's size (or the image itself when
    DETR would enlarge it: the smaller of the two) and the size of the image the boxes are for."""

    pixels: np.ndarray  # (h, w, 3) uint8: DETR's input size, or the image when that is smaller
    image_hw: tuple[int, int]
    edges: tuple[int, int] = (SHORTEST_EDGE, LONGEST_EDGE)  # the resize rule it is for

    def network_pixels(self) -> np.ndarray:
        """The uint8 pixels at DETR's input size (resized here when the image came as it is)."""
        if tuple(self.pixels.shape[:2]) == tuple(self.image_hw):
            return resize_for_detr(self.pixels, *self.edges)
        return self.pixels


def detector_input(
    image: np.ndarray, shortest: int = SHORTEST_EDGE, longest: int = LONGEST_EDGE
) -> DetectorInput:
    """The detector's input for ``image`` (boxes found in it come back in ``image``'s pixels):
    resized here when that makes it smaller, else the image (enlarged on the device's side)."""
    image = check_image(image)
    h, w = resize_shape(image.shape[0], image.shape[1], shortest, longest)
    pixels = resize_for_detr(image, shortest, longest) if h * w < image.shape[0] * image.shape[1] else image
    return DetectorInput(pixels, image.shape[:2], (shortest, longest))


def check_image(image: Any) -> np.ndarray:
    """``image`` when it is a non-empty (H, W, 3) uint8 RGB array; InputImageError saying how to fix it."""
    if not isinstance(image, np.ndarray):
        raise InputImageError(
            f"The image must be a numpy array (H, W, 3) of uint8 RGB; got {type(image).__name__}. "
            "Load files with sapiens2.load_image first."
        )
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise InputImageError(
            f"The image must be (H, W, 3) uint8 RGB; got shape {image.shape} and dtype {image.dtype}. "
            "Convert it (e.g. drop alpha, expand grey to 3 channels, scale floats to 0..255)."
        )
    if image.shape[0] < 1 or image.shape[1] < 1:
        raise InputImageError(f"The image is empty (shape {image.shape}).")
    return image
