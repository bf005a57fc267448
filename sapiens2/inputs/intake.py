"""Image intake: whatever a caller hands in, read safely into an upright RGB photo.

On the CPU, in numpy: :func:`load_image` turns whatever a user hands us (path, bytes, file
object, PIL image, numpy array) into an upright 8-bit RGB array plus a possibly downscaled
working copy for inference. Every failure becomes :class:`~sapiens2.errors.InputImageError`
with a message a person can act on. Limits (:mod:`.limits`): a path must name a regular file
(:mod:`.image_file`); at most ``MAX_FILE_BYTES`` are read from a file, a file object or bytes;
decoded pictures stay within Pillow's pixel limit (:mod:`.image_decode`). A JPEG above that
limit (up to ``MAX_REDUCED_PIXELS``) is decoded at 1/2, 1/4 or 1/8
scale by libjpeg itself (Pillow's draft mode): the reduced picture *is* the image from then on,
every result is in its pixels, a notice says so and ``Intake.source_size`` keeps the file's
own size (a point ``x`` there is ``(x + 0.5) * Intake.reduction - 0.5`` in the file's pixels).

The network input made from an intake is in :mod:`sapiens2.inputs.network`; person crops for
pose in :mod:`sapiens2.tasks.pose.pose_crops`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import cv2
import numpy as np
from PIL import Image

from ..errors import OptionError
from .image_decode import array_to_rgb, check_pixels, decode_bytes, decode_pil, open_image
from .image_file import read_bytes, safe_stem
from .limits import MAX_FILE_BYTES

#: Longest side (px) of the copy used for inference; larger images are downscaled for inference
#: and every result is mapped back to the original size.
DEFAULT_MAX_SIDE = 4096
#: File name endings of the photos a folder or a glob yields (the CLI's folders, ``sapiens2 batch``'s
#: INPUT): the formats this intake reads (Pillow, with HEIF/AVIF through their plugins).
IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif", ".jfif", ".heic", ".heif", ".avif"}
)

ImageSource = str | Path | bytes | bytearray | IO[bytes] | Image.Image | np.ndarray


@dataclass
class Intake:
    """An input image ready for the pipelines.

    ``rgb`` is the upright original (what results are reported on); ``work`` is what inference
    sees: ``rgb`` itself, or a copy downscaled (INTER_AREA) so that its long side is at most
    ``max_side``. Very small images (even 1x1 or 2x10000) are kept as they are: every task resizes
    or crops to the fixed network input anyway, so no minimum size is needed.
    """

    rgb: np.ndarray  # (H, W, 3) uint8, upright original
    work: np.ndarray  # (h, w, 3) uint8, rgb or its downscaled copy
    scale: float  # work / original along the long side (1.0 when not downscaled)
    notices: list[str] = field(default_factory=list)
    name: str = "image"  # safe file stem for exports
    #: A JPEG above the pixel limit is decoded reduced (see the module docstring): ``rgb`` is then
    #: 1/``reduction`` of the file's upright picture, whose (width, height) is ``source_size``.
    reduction: int = 1
    source_size: tuple[int, int] | None = None

    @property
    def downscaled(self) -> bool:
        return self.work.shape[:2] != self.rgb.shape[:2]

    @property
    def size_hw(self) -> tuple[int, int]:
        return int(self.rgb.shape[0]), int(self.rgb.shape[1])

    @property
    def scale_xy(self) -> tuple[float, float]:
        """Exact per-axis factors work / original (sizes are rounded, so x and y differ a bit)."""
        return self.work.shape[1] / self.rgb.shape[1], self.work.shape[0] / self.rgb.shape[0]

    def points_to_original(self, points: np.ndarray) -> np.ndarray:
        """Map (..., 2) points in work pixels to original pixels (pixel centres stay centres)."""
        sx, sy = self.scale_xy
        out = np.array(points, dtype=np.float64, copy=True)
        out[..., 0] = (out[..., 0] + 0.5) / sx - 0.5
        out[..., 1] = (out[..., 1] + 0.5) / sy - 0.5
        return out.astype(np.float32)

    def boxes_to_original(self, boxes: np.ndarray) -> np.ndarray:
        sx, sy = self.scale_xy
        return (np.asarray(boxes, dtype=np.float64) / [sx, sy, sx, sy]).astype(np.float32)

    def boxes_to_work(self, boxes: object) -> np.ndarray:
        """xyxy boxes in original pixels -> working-copy pixels. Anything not shaped (..., 4) is
        returned unscaled, so the caller's shape check can name the shape it got."""
        try:
            arr = np.asarray(boxes, dtype=np.float64)
        except (TypeError, ValueError):
            raise OptionError("boxes must be numbers shaped (P, 4) as x1, y1, x2, y2 in pixels.") from None
        if arr.size == 0 or arr.ndim == 0 or arr.shape[-1] != 4:
            return arr
        sx, sy = self.scale_xy
        return (arr * [sx, sy, sx, sy]).astype(np.float32)


def load_image(
    src: ImageSource | Intake, *, max_side: int = DEFAULT_MAX_SIDE, max_bytes: int = MAX_FILE_BYTES
) -> Intake:
    """Read an image from a path, bytes, a binary file object, a PIL image or a numpy array.

    * A path must name a regular file: it is opened without blocking and checked with ``fstat``
      before anything is read, so a FIFO, a device, a socket or a folder is refused at once.
    * At most ``max_bytes`` (default :data:`MAX_FILE_BYTES`, 40 MiB) are read from a path, a
      file object or bytes; a longer input is refused (a stream is never read past the budget).
    * EXIF orientation is applied, so the result is upright; animations give their first frame.
    * PIL modes: RGBA/LA/PA/P-with-transparency are composited over white; L, I;16, I and F are
      scaled to 8 bits (rules below) and repeated to RGB; CMYK, YCbCr, LAB, HSV and 1-bit are
      converted with Pillow.
    * numpy arrays are taken as RGB(A), not OpenCV's BGR: (H, W), (H, W, 1|2|3|4). ``uint8`` as
      is; ``uint16`` divided by 257 (full 16-bit range); ``bool`` -> 0/255. Other integer and float
      arrays follow the value rule: NaN/inf -> 0; values within [0, 1] are intensities (x255);
      within [0, 255] are taken as 8-bit values; anything else is min-max stretched to [0, 255]
      (with a notice). Pillow's ``I`` and ``F`` modes use the same rule.
    * Pillow's decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS``, about 89.5 megapixels by
      default) is enforced for every kind of input and raises InputImageError, except that a JPEG
      of up to :data:`MAX_REDUCED_PIXELS` is decoded at the first of 1/2, 1/4, 1/8 scale that fits
      the limit; ``Intake.reduction`` and ``Intake.source_size`` record it and a notice says so.
    * Images whose long side exceeds ``max_side`` are downscaled (INTER_AREA) for inference;
      ``Intake.downscaled`` says so and a notice explains it.
    * An :class:`Intake` is returned as it is (already read), so one upload can feed several tasks.
    """
    if isinstance(src, Intake):
        return src
    if not isinstance(max_side, int) or max_side < 16:
        raise OptionError(f"max_side must be an integer >= 16 (got {max_side!r}).")
    if not isinstance(max_bytes, int) or max_bytes < 1:
        raise OptionError(f"max_bytes must be a positive integer (got {max_bytes!r}).")
    notices: list[str] = []
    name = "image"
    reduction, source_size = 1, None
    if isinstance(src, np.ndarray):
        rgb = array_to_rgb(src, notices)
    elif isinstance(src, Image.Image):
        name = safe_stem(getattr(src, "filename", "") or "")
        rgb, reduction, source_size = decode_pil(src, notices)
    else:
        data, name = read_bytes(src, max_bytes)
        rgb, reduction, source_size = decode_bytes(data, notices)
    check_pixels(rgb.shape[1], rgb.shape[0])
    rgb = np.ascontiguousarray(rgb)
    work, scale = rgb, 1.0
    h, w = rgb.shape[:2]
    if max(h, w) > max_side:
        scale = max_side / max(h, w)
        ww, wh = max(1, round(w * scale)), max(1, round(h * scale))
        work = cv2.resize(rgb, (ww, wh), interpolation=cv2.INTER_AREA)
        notices.append(
            f"The image is {w}x{h} px; inference ran on a {ww}x{wh} copy (long side limit "
            f"{max_side} px) and the results were mapped back to {w}x{h}."
        )
    return Intake(rgb, work, scale, notices, name, reduction, source_size)


def probe(src: str | Path, *, max_bytes: int = MAX_FILE_BYTES) -> None:
    """Raise the InputImageError :func:`load_image` would for a file that is not an image it can
    read (not a regular file, too large, empty, text, HEIC without a plugin, unknown, corrupt
    header), reading only the file's header: a page can say so when the file arrives."""
    data, _ = read_bytes(src, max_bytes)
    open_image(data).close()


__all__ = ["DEFAULT_MAX_SIDE", "ImageSource", "Intake", "load_image", "probe"]
