"""Image intake and the geometry between an image and the network input.

Two halves:

* **Intake** (CPU, numpy): :func:`load_image` turns whatever a user hands us (path, bytes, file
  object, PIL image, numpy array) into an upright 8-bit RGB array plus a possibly downscaled
  working copy for inference. Every failure becomes :class:`~sapiens2.errors.InputImageError`
  with a message a person can act on. Limits: a path must name a regular file (opened without
  blocking, so a FIFO or a device is refused, never read); at most :data:`MAX_FILE_BYTES` are
  read from a file, a file object or bytes; decoded pictures stay within Pillow's pixel limit.
  A JPEG above that limit (up to :data:`MAX_REDUCED_PIXELS`) is decoded at 1/2, 1/4 or 1/8
  scale by libjpeg itself (Pillow's draft mode): the reduced picture *is* the image from then on,
  every result is in its pixels, a notice says so and ``Intake.source_size`` keeps the file's
  own size (a point ``x`` there is ``(x + 0.5) * Intake.reduction - 0.5`` in the file's pixels).
* **Network input** (torch, on the model's device): upload ``uint8`` once, then resize, pad,
  normalise (:func:`stretch_to`, :func:`letterbox`) or crop people (:func:`crop_people`) there;
  and the inverses that bring outputs back (:func:`unletterbox`, :func:`resize_to`,
  :func:`crop_to_image`).

Coordinate convention: keypoints are in pixel units with integer values at pixel centres (the
convention of ``cv2.warpAffine`` and the release). Boxes are ``(x1, y1, x2, y2)`` in the same
pixel units.
"""

from __future__ import annotations

import io
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from PIL import ExifTags, Image, ImageOps, JpegImagePlugin, UnidentifiedImageError

from .errors import InputImageError, OptionError
from .limits import MAX_FILE_BYTES, MAX_REDUCED_PIXELS
from .zoo import IMAGE_MEAN, IMAGE_STD, INPUT_SIZE

#: Longest side (px) of the copy used for inference; larger images are downscaled for inference
#: and every result is mapped back to the original size.
DEFAULT_MAX_SIDE = 4096

_JPEG_REDUCTIONS = (2, 4, 8)  # the scales libjpeg decodes to directly (1/2, 1/4, 1/8)

ImageSource = str | Path | bytes | bytearray | IO[bytes] | Image.Image | np.ndarray


# --------------------------------------------------------------------------------------------
# Intake
# --------------------------------------------------------------------------------------------


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
        rgb = _array_to_rgb(src, notices)
    elif isinstance(src, Image.Image):
        name = _safe_stem(getattr(src, "filename", "") or "")
        rgb, reduction, source_size = _decode_pil(src, notices)
    else:
        data, name = _read_bytes(src, max_bytes)
        rgb, reduction, source_size = _decode_bytes(data, notices)
    _check_pixels(rgb.shape[1], rgb.shape[0])
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


def _safe_stem(filename: str | Path) -> str:
    """The export stem of a file name: one rule for the whole package (export.file_stem)."""
    from .export import file_stem  # local: export pulls in render, which intake does not need

    return file_stem(filename)


def _read_bytes(src: object, max_bytes: int) -> tuple[bytes, str]:
    if isinstance(src, (bytes, bytearray, memoryview)):
        if len(src) > max_bytes:
            raise InputImageError(_too_many_bytes(max_bytes, len(src)))
        return bytes(src), "image"
    if isinstance(src, (str, Path)):
        path = Path(src)
        return _read_file(path, max_bytes), _safe_stem(path.name)
    if hasattr(src, "read"):
        return _read_capped(src, max_bytes), _safe_stem(getattr(src, "name", "") or "")
    raise InputImageError(
        f"Unsupported image input of type {type(src).__name__}; pass a file path, bytes, a PIL image "
        "or a numpy array."
    )


_NOT_REGULAR = {  # what a path names when it is not a regular file, for the message
    stat.S_IFDIR: "a folder",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def _check_regular(mode: int, name: str) -> None:
    if not stat.S_ISREG(mode):
        kind = _NOT_REGULAR.get(stat.S_IFMT(mode), "not a regular file")
        raise InputImageError(f"{name!r} is {kind}, not an image file.")


def _read_file(path: Path, max_bytes: int) -> bytes:
    """The bytes of a regular file, at most ``max_bytes`` (never blocks, never reads a device).

    ``stat`` first, so a device is never even opened (opening some has side effects); then an
    ``O_NONBLOCK`` open, so a FIFO swapped in meanwhile cannot block, and ``fstat`` on what was
    actually opened, so nothing but a regular file is ever read.
    """
    name = path.name
    flags = (
        os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)
    )
    try:
        _check_regular(os.stat(path).st_mode, name)
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputImageError(f"Image file not found: {name!r}.") from None
    except OSError as e:
        raise InputImageError(f"Could not read the image file {name!r}: {e.strerror or e}.") from None
    with open(fd, "rb") as f:  # owns fd from here: closed on every path
        info = os.fstat(fd)
        _check_regular(info.st_mode, name)
        if info.st_size > max_bytes:
            raise InputImageError(_too_many_bytes(max_bytes, info.st_size))
        try:
            return _read_capped(f, max_bytes)
        except OSError as e:
            raise InputImageError(f"Could not read the image file {name!r}: {e.strerror or e}.") from None


def _read_capped(f: IO[bytes], max_bytes: int) -> bytes:
    """Read a binary file object to its end, refusing it once it gives more than ``max_bytes``."""
    chunks: list[bytes] = []
    total = 0
    while total <= max_bytes:
        chunk = f.read(max_bytes + 1 - total)
        if not isinstance(chunk, (bytes, bytearray)):
            raise InputImageError("The file object must be opened in binary mode ('rb') and blocking.")
        if not chunk:
            return b"".join(chunks)
        chunks.append(bytes(chunk))
        total += len(chunk)
    raise InputImageError(_too_many_bytes(max_bytes))


def _too_many_bytes(max_bytes: int, size: int | None = None) -> str:
    limit = f"the limit of {_amount(max_bytes)} for one image (sapiens2.limits.MAX_FILE_BYTES)"
    head = (
        f"The image file is {_amount(size)}, above {limit}"
        if size
        else f"The image data is larger than {limit}"
    )
    return f"{head}. Save it as a JPEG (quality 90 is plenty) or downscale it."


def _amount(n: int) -> str:
    return f"{n / 2**20:.1f} MB" if n >= 2**20 else f"{n} bytes"


def _sniff(data: bytes) -> str | None:
    """Name formats Pillow may not read, so the error can say what the file is."""
    head = data[:64]
    if head[4:8] == b"ftyp":
        brand = head[8:12]
        if brand in (b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"mif1", b"msf1"):
            return "HEIC/HEIF"
        if brand in (b"avif", b"avis"):
            return "AVIF"
    if head.lstrip()[:1] in (b"<", b"{", b"[") or (
        head and all(32 <= b < 127 or b in (9, 10, 13) for b in head)
    ):
        return "text"
    return None


Decoded = tuple[np.ndarray, int, tuple[int, int] | None]  # rgb, reduction, source (w, h) when reduced


def _decode_bytes(data: bytes, notices: list[str]) -> Decoded:
    if len(data) == 0:
        raise InputImageError("The image file is empty (0 bytes).")
    kind = _sniff(data)
    try:
        im = _large_jpeg(data) or Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as e:
        raise InputImageError(_bomb_message(e)) from None
    except UnidentifiedImageError:
        if kind in ("HEIC/HEIF", "AVIF") and _pillow_reads(kind):  # readable format: the file is at fault
            raise InputImageError(
                f"The {kind} file is damaged and could not be decoded. Re-export it, or convert it to "
                "JPEG or PNG, and try again."
            ) from None
        if kind in ("HEIC/HEIF", "AVIF"):
            article = "an" if kind == "AVIF" else "a"
            raise InputImageError(
                f"This is {article} {kind} image, which this installation cannot decode. Convert it to JPEG "
                "or PNG (or install a Pillow plugin for it, e.g. pillow-heif) and try again."
            ) from None
        if kind == "text":
            raise InputImageError(
                "The file is not an image (it contains text). Upload a JPEG, PNG, WebP, BMP, TIFF or GIF."
            ) from None
        raise InputImageError(
            "The file is not an image Pillow can read (unknown or corrupt format). Upload a JPEG, PNG, "
            "WebP, BMP, TIFF or GIF."
        ) from None
    except Exception as e:  # any other decoder failure on hostile input (e.g. cut off in its header)
        raise InputImageError(_broken_message(e)) from None
    return _decode_pil(im, notices)


def _large_jpeg(data: bytes) -> Image.Image | None:
    """A JPEG whose header is above Pillow's pixel limit, opened without ``Image.open``'s bomb
    check (which refuses it before it could be decoded reduced); None for anything else."""
    limit = Image.MAX_IMAGE_PIXELS
    if limit is None or data[:3] != b"\xff\xd8\xff":
        return None
    try:
        im = JpegImagePlugin.JpegImageFile(io.BytesIO(data))  # reads the header only
    except Exception:  # Image.open names the problem
        return None
    return im if im.size[0] * im.size[1] > limit else None


def _decode_pil(im: Image.Image, notices: list[str]) -> Decoded:
    """Decode a (lazily opened) PIL image within the pixel limit, a large JPEG reduced."""
    stored = im.size
    reduction = _reduce_to_limit(im)
    rgb = _pil_to_rgb(im, notices)
    if reduction == 1:
        return rgb, 1, None
    h, w = rgb.shape[:2]
    source = stored[::-1] if (w, h) != im.size else stored  # EXIF turned it by 90 degrees
    notices.append(
        f"The photo is {source[0]}x{source[1]} px ({source[0] * source[1] / 1e6:.1f} megapixels), above "
        f"the {_limit_mp()} megapixel limit for a full decode: it was decoded at 1/{reduction} scale "
        f"({w}x{h} px) and every result is in the pixels of that copy."
    )
    return rgb, reduction, source


def _reduce_to_limit(im: Image.Image) -> int:
    """Check the pixel limit before decoding; a JPEG above it is set to decode at 1/2, 1/4 or 1/8
    scale (libjpeg's scaled IDCT: never a full-size buffer). Returns the reduction (1: none)."""
    w, h = im.size
    limit = Image.MAX_IMAGE_PIXELS
    if limit is None or w * h <= limit:
        _check_pixels(w, h)
        return 1
    if not isinstance(im, JpegImagePlugin.JpegImageFile):
        raise InputImageError(_bomb_message(None, w, h))
    if w * h > MAX_REDUCED_PIXELS:
        raise InputImageError(
            f"The JPEG is {w}x{h} px ({w * h / 1e6:.1f} megapixels), above the limit of "
            f"{MAX_REDUCED_PIXELS / 1e6:.1f} megapixels for photos decoded at reduced size "
            "(sapiens2.limits.MAX_REDUCED_PIXELS). Downscale it before uploading."
        )
    for s in _JPEG_REDUCTIONS:
        size = (-(-w // s), -(-h // s))
        if size[0] * size[1] <= limit:
            # draft() picks the largest reduction the requested size allows: exactly s here
            if im.draft(im.mode, (max(1, w // s), max(1, h // s))) is not None and im.size == size:
                return s
            break
    raise InputImageError(_bomb_message(None, w, h))  # already decoded, or too thin to reduce


def _pillow_reads(kind: str) -> bool:
    """Whether this Pillow has a decoder registered for a format named by :func:`_sniff`."""
    return any(name in Image.OPEN for name in {"AVIF": ("AVIF",), "HEIC/HEIF": ("HEIF", "HEIC")}[kind])


def _broken_message(err: Exception) -> str:
    """One wording for a file Pillow recognised but could not decode, wherever decoding failed."""
    if "truncated" in str(err).lower():
        return "The image file is truncated (incomplete download or upload?). Re-save or re-upload it."
    return f"The image data is corrupt and could not be decoded ({type(err).__name__}: {err})."


def _limit_mp() -> str:
    return f"{(Image.MAX_IMAGE_PIXELS or 0) / 1e6:.1f}"


def _bomb_message(err: Exception | None = None, w: int | None = None, h: int | None = None) -> str:
    limit = Image.MAX_IMAGE_PIXELS or 0
    if w and h:
        size = f"{w}x{h} px ({w * h / 1e6:.1f} megapixels)"
    else:  # Pillow refused it while opening; its message carries the pixel count
        found = re.search(r"\((\d+) pixels\)", str(err))
        size = f"{int(found.group(1)) / 1e6:.1f} megapixels" if found else "too large"
    return (
        f"The image is {size}, above the limit of {_limit_mp()} megapixels ({limit} pixels, "
        "Pillow's decompression-bomb guard PIL.Image.MAX_IMAGE_PIXELS). Downscale it before uploading "
        f"(only JPEG photos of up to {MAX_REDUCED_PIXELS / 1e6:.0f} megapixels are decoded at reduced size)."
    )


def _check_pixels(w: int, h: int) -> None:
    if w <= 0 or h <= 0:
        raise InputImageError(f"The image has no pixels ({w}x{h}).")
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and w * h > limit:
        raise InputImageError(_bomb_message(None, w, h))


def _pil_to_rgb(im: Image.Image, notices: list[str]) -> np.ndarray:
    try:
        frames = getattr(im, "n_frames", 1)
        if frames > 1:
            im.seek(0)
            notices.append(f"Animated image with {frames} frames: the first frame was used.")
        im.load()
        try:  # exif_transpose copies even an upright picture: only call it to turn one
            if im.getexif().get(ExifTags.Base.Orientation, 1) != 1:
                im = ImageOps.exif_transpose(im) or im
        except Exception:  # a broken EXIF block must not lose the picture
            notices.append("The EXIF orientation tag could not be read; the image is used as stored.")
        return _mode_to_rgb(im, notices)
    except Image.DecompressionBombError as e:
        raise InputImageError(_bomb_message(e)) from None
    except InputImageError:
        raise
    except Exception as e:
        raise InputImageError(_broken_message(e)) from None


def _mode_to_rgb(im: Image.Image, notices: list[str]) -> np.ndarray:
    mode = im.mode
    if mode == "RGB":
        return np.asarray(im, dtype=np.uint8)
    if mode == "1":
        return _gray_to_rgb(np.asarray(im.convert("L"), dtype=np.uint8))
    if mode == "L":
        return _gray_to_rgb(np.asarray(im, dtype=np.uint8))
    if mode in ("P", "PA"):
        has_alpha = mode == "PA" or "transparency" in im.info
        im = im.convert("RGBA" if has_alpha else "RGB")
        return _over_white(np.asarray(im)) if has_alpha else np.asarray(im, dtype=np.uint8)
    if mode in ("RGBA", "RGBa", "LA", "La"):
        arr = np.asarray(im.convert("RGBA" if mode.startswith("RGB") else "LA"))
        return _over_white(arr)
    if mode.startswith("I;16"):
        arr = np.asarray(im).astype(np.float64) / 257.0  # full 16-bit range -> 8 bits
        return _gray_to_rgb(_round_u8(arr))
    if mode in ("I", "F"):
        return _gray_to_rgb(_values_to_u8(np.asarray(im), notices))
    try:  # CMYK, YCbCr, LAB, HSV, ...: Pillow knows the conversion
        return np.asarray(im.convert("RGB"), dtype=np.uint8)
    except Exception as e:
        raise InputImageError(f"Images in Pillow mode {mode!r} are not supported ({e}).") from None


def _array_to_rgb(arr: np.ndarray, notices: list[str]) -> np.ndarray:
    if arr.ndim == 3 and arr.shape[2] not in (1, 2, 3, 4) and arr.shape[0] in (1, 3, 4):
        raise InputImageError(
            f"The array has shape {arr.shape}, which looks channels-first; pass (H, W, C), e.g. "
            "arr.transpose(1, 2, 0)."
        )
    if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[2] not in (1, 2, 3, 4)):
        raise InputImageError(
            f"The array has shape {arr.shape}; expected (H, W) or (H, W, C) with C = 1, 2, 3 or 4."
        )
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise InputImageError(f"The image has no pixels (array shape {arr.shape}).")
    _check_pixels(arr.shape[1], arr.shape[0])
    if arr.dtype == np.uint8:
        u8 = arr
    elif arr.dtype == np.uint16:
        u8 = _round_u8(arr.astype(np.float64) / 257.0)
    elif arr.dtype == np.bool_:
        u8 = arr.astype(np.uint8) * 255
    elif np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating):
        u8 = _values_to_u8(arr, notices)
    else:
        raise InputImageError(f"Arrays of dtype {arr.dtype} are not supported; use uint8, uint16 or float.")
    if u8.ndim == 2:
        return _gray_to_rgb(u8)
    c = u8.shape[2]
    if c == 1:
        return _gray_to_rgb(u8[..., 0])
    if c == 3:
        return np.ascontiguousarray(u8)
    return _over_white(u8)  # 2 = gray + alpha, 4 = RGBA


def _values_to_u8(arr: np.ndarray, notices: list[str]) -> np.ndarray:
    """The value rule for integer/float data without a known bit depth (see load_image)."""
    a = arr.astype(np.float64)
    finite = np.isfinite(a)
    if not finite.all():
        notices.append("The image contained NaN or infinite values; they were set to 0.")
        a = np.where(finite, a, 0.0)
    lo, hi = (float(a.min()), float(a.max())) if a.size else (0.0, 0.0)
    if lo >= 0 and hi <= 1.0 and np.issubdtype(arr.dtype, np.floating):
        return _round_u8(a * 255.0)
    if lo >= 0 and hi <= 255.0:
        return _round_u8(a)
    notices.append(
        f"Pixel values span [{lo:g}, {hi:g}]; they were stretched to 0-255 for display and inference."
    )
    return _round_u8((a - lo) * (255.0 / (hi - lo)))


def _round_u8(a: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(a), 0, 255).astype(np.uint8)


def _gray_to_rgb(g: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.repeat(g[..., None], 3, axis=2))


def _over_white(arr: np.ndarray) -> np.ndarray:
    """Composite (H, W, 2|4) uint8 colour+alpha over white: transparent parts become white."""
    color = arr[..., :-1].astype(np.float32)
    if color.shape[2] == 1:
        color = np.repeat(color, 3, axis=2)
    alpha = arr[..., -1:].astype(np.float32) / 255.0
    return _round_u8(color * alpha + 255.0 * (1.0 - alpha))


# --------------------------------------------------------------------------------------------
# Network input on the device
# --------------------------------------------------------------------------------------------

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
    x = to_device(img).float()
    mean, std = _MEAN.to(x.device), _STD.to(x.device)
    return ((x - mean) / std).to(dtype)


def _resize_float(x: torch.Tensor, hw: tuple[int, int], antialias: bool) -> torch.Tensor:
    if tuple(x.shape[-2:]) == tuple(hw):
        return x
    # bilinear, half-pixel centres: the same sampling as cv2.INTER_LINEAR (the release's resize)
    return F.interpolate(x, size=hw, mode="bilinear", align_corners=False, antialias=antialias)


def stretch_to(
    img: np.ndarray | torch.Tensor,
    hw: tuple[int, int] = INPUT_SIZE,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    *,
    antialias: bool = False,
) -> torch.Tensor:
    """Resize to ``hw`` ignoring the aspect ratio (seg/matting/features), normalise: (B, 3, *hw).

    ``antialias=False`` matches the release (cv2.INTER_LINEAR); True is kinder to large photos.
    """
    x = to_device(img, device).float()
    x = _resize_float(x, hw, antialias).clamp(0, 255)
    return normalize(x, dtype)


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


def letterbox(
    img: np.ndarray | torch.Tensor,
    hw: tuple[int, int] = INPUT_SIZE,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    *,
    antialias: bool = False,
) -> tuple[torch.Tensor, PadInfo]:
    """Aspect-preserving resize into ``hw`` with centred zero padding, then normalise.

    The padding is 0 in pixel values before normalising, so it reads ``-mean/std`` in the
    returned tensor, as in the release (normal, pointmap, albedo).
    """
    x = to_device(img, device).float()
    pad = pad_info(tuple(x.shape[-2:]), hw)
    inner = _resize_float(x, pad.inner_hw, antialias).clamp(0, 255)
    canvas = x.new_zeros((x.shape[0], 3, *hw))
    canvas[:, :, pad.top : pad.top + pad.inner_hw[0], pad.left : pad.left + pad.inner_hw[1]] = inner
    return normalize(canvas, dtype), pad


def resize_to(t: torch.Tensor, out_hw: tuple[int, int], mode: str = "bilinear") -> torch.Tensor:
    """Resize (B, C, H, W) to ``out_hw`` (no-op when equal); bilinear uses half-pixel centres."""
    if tuple(t.shape[-2:]) == tuple(out_hw):
        return t
    if mode == "nearest":
        return F.interpolate(t, size=out_hw, mode="nearest-exact")
    return F.interpolate(t, size=out_hw, mode=mode, align_corners=False)


def unletterbox(
    t: torch.Tensor, pad: PadInfo, out_hw: tuple[int, int] | None = None, mode: str = "bilinear"
) -> torch.Tensor:
    """Crop the letterbox padding off a (B, C, H, W) output and resize it to ``out_hw``.

    Outputs at a different resolution than the canvas (e.g. a head at 1/4 size) are handled
    by scaling the pad geometry. ``out_hw`` defaults to ``pad.source_hw``.
    """
    return resize_to(crop_padding(t, pad), out_hw or pad.source_hw, mode)


def crop_padding(t: torch.Tensor, pad: PadInfo) -> torch.Tensor:
    """The letterbox padding cut off a (..., H, W) output (geometry scaled to its resolution)."""
    fy, fx = t.shape[-2] / pad.canvas_hw[0], t.shape[-1] / pad.canvas_hw[1]
    top, left = round(pad.top * fy), round(pad.left * fx)
    ih, iw = max(1, round(pad.inner_hw[0] * fy)), max(1, round(pad.inner_hw[1] * fx))
    return t[..., top : top + ih, left : left + iw]


# --------------------------------------------------------------------------------------------
# Top-down person crops (pose)
# --------------------------------------------------------------------------------------------


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


def crop_to_image(points: np.ndarray | torch.Tensor, inverse: np.ndarray) -> np.ndarray | torch.Tensor:
    """(N, K, 2) crop px -> image px with the inverse matrices from :func:`crop_people`."""
    return apply_affine(points, inverse)


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
        return normalize(torch.from_numpy(crops).to(dev).permute(0, 3, 1, 2), dtype), info
    info = crop_geometry(boxes, out_hw, padding)
    return normalize(_grid_crops(img, info, dev), dtype), info


def _grid_crops(img: np.ndarray, info: CropInfo, dev: torch.device) -> torch.Tensor:
    src = to_device(img, dev).float()  # (1, 3, H, W)
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
    "DEFAULT_MAX_SIDE",
    "CropInfo",
    "Intake",
    "PadInfo",
    "apply_affine",
    "box_to_center_scale",
    "crop_people",
    "crop_to_image",
    "crop_geometry",
    "invert_affine",
    "inverse_warp_matrix",
    "letterbox",
    "load_image",
    "normalize",
    "pad_info",
    "resize_to",
    "stretch_to",
    "to_device",
    "unletterbox",
    "warp_crops",
    "warp_matrix",
]
