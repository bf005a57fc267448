"""Image intake: whatever a caller hands in, read safely into an upright RGB photo.

On the CPU, in numpy: :func:`load_image` turns whatever a user hands us (path, bytes, file
object, PIL image, numpy array) into an upright 8-bit RGB array plus a possibly downscaled
working copy for inference. Every failure becomes :class:`~sapiens2.errors.InputImageError`
with a message a person can act on. Limits: a path must name a regular file (opened without
blocking, so a FIFO or a device is refused, never read); at most :data:`MAX_FILE_BYTES` are
read from a file, a file object or bytes; decoded pictures stay within Pillow's pixel limit.
A JPEG above that limit (up to :data:`MAX_REDUCED_PIXELS`) is decoded at 1/2, 1/4 or 1/8
scale by libjpeg itself (Pillow's draft mode): the reduced picture *is* the image from then on,
every result is in its pixels, a notice says so and ``Intake.source_size`` keeps the file's
own size (a point ``x`` there is ``(x + 0.5) * Intake.reduction - 0.5`` in the file's pixels).

The network input made from an intake is in :mod:`sapiens2.inputs.network`; person crops for
pose in :mod:`sapiens2.tasks.pose.pose_crops`.
"""

from __future__ import annotations

import io
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import cv2
import numpy as np
from PIL import ExifTags, Image, ImageOps, JpegImagePlugin, UnidentifiedImageError

from ..errors import InputImageError, OptionError
from .limits import MAX_FILE_BYTES, MAX_REDUCED_PIXELS

#: Longest side (px) of the copy used for inference; larger images are downscaled for inference
#: and every result is mapped back to the original size.
DEFAULT_MAX_SIDE = 4096
#: File name endings of the photos a folder or a glob yields (the CLI's folders, ``sapiens2 batch``'s
#: INPUT): the formats this intake reads (Pillow, with HEIF/AVIF through their plugins).
IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif", ".jfif", ".heic", ".heif", ".avif"}
)

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
    from ..outputs.export import file_stem  # local: export pulls in render, which intake does not need

    return file_stem(filename)


def _read_bytes(src: object, max_bytes: int) -> tuple[bytes, str]:
    if isinstance(src, (bytes, bytearray, memoryview)):
        if len(src) > max_bytes:
            raise InputImageError(_too_many_bytes(max_bytes, len(src)))
        return bytes(src), "image"
    if isinstance(src, (str, Path)):
        path = Path(src)
        return read_image_file(path, max_bytes), _safe_stem(path.name)
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


def read_image_file(path: Path, max_bytes: int = MAX_FILE_BYTES) -> bytes:
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
    limit = f"the limit of {_amount(max_bytes)} for one image (sapiens2.inputs.limits.MAX_FILE_BYTES)"
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


def probe(src: str | Path, *, max_bytes: int = MAX_FILE_BYTES) -> None:
    """Raise the InputImageError :func:`load_image` would for a file that is not an image it can
    read (not a regular file, too large, empty, text, HEIC without a plugin, unknown, corrupt
    header), reading only the file's header: a page can say so when the file arrives."""
    data, _ = _read_bytes(src, max_bytes)
    _open(data).close()


def _decode_bytes(data: bytes, notices: list[str]) -> Decoded:
    return _decode_pil(_open(data), notices)


def _open(data: bytes) -> Image.Image:
    """The image in ``data``, opened (its header read, its pixels not yet), or InputImageError."""
    if len(data) == 0:
        raise InputImageError("The image file is empty (0 bytes).")
    kind = _sniff(data)
    try:
        return _large_jpeg(data) or Image.open(io.BytesIO(data))
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
            "(sapiens2.inputs.limits.MAX_REDUCED_PIXELS). Downscale it before uploading."
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


__all__ = ["DEFAULT_MAX_SIDE", "ImageSource", "Intake", "load_image", "probe"]
