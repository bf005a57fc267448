"""Image bytes or a PIL image decoded to upright 8-bit RGB within Pillow's pixel limit (a large
JPEG decoded reduced by libjpeg), and numpy arrays of any mode brought to the same."""

from __future__ import annotations

import io
import re

import numpy as np
from PIL import ExifTags, Image, ImageOps, JpegImagePlugin, UnidentifiedImageError

from ..errors import InputImageError
from .limits import MAX_REDUCED_PIXELS

_JPEG_REDUCTIONS = (2, 4, 8)  # the scales libjpeg decodes to directly (1/2, 1/4, 1/8)


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


def decode_bytes(data: bytes, notices: list[str]) -> Decoded:
    return decode_pil(open_image(data), notices)


def open_image(data: bytes) -> Image.Image:
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


def decode_pil(im: Image.Image, notices: list[str]) -> Decoded:
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
        check_pixels(w, h)
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


def check_pixels(w: int, h: int) -> None:
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


def array_to_rgb(arr: np.ndarray, notices: list[str]) -> np.ndarray:
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
    check_pixels(arr.shape[1], arr.shape[0])
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
