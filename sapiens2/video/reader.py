"""Reading clips: checks before decoding, then RGB frames one at a time (never the whole clip).

Only regular files are opened (a FIFO or device never blocks the server), only containers
recognised by their first bytes are handed to OpenCV's bundled FFmpeg (MP4/MOV, WebM/Matroska,
GIF), so a text playlist or concat script can never make FFmpeg open other files or URLs. Every
failure is an :class:`~sapiens2.errors.InputVideoError` saying what to do.

Limits (:class:`VideoLimits`) are checked on the header first and again while decoding, since a
header can lie: the file size, the clip's duration, the number of frames kept after the stride,
and the frame size. Decoding therefore stops after max_seconds x fps frames (fps <= 240 is
believed, anything else becomes 25 with a notice) whatever the stride. Frames larger than ``max_side`` are downscaled (INTER_AREA) on the way in.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from ..errors import InputVideoError, OptionError

FALLBACK_FPS = 25.0
_MAX_FPS = 240.0  # high-speed phone video; beyond, the header is not believed
_FORMATS = "MP4, MOV, WebM or GIF"
# ISO base media (MP4/MOV/M4V/3GP) files start with a box whose type sits at bytes 4..8
_BMFF_BOXES = (b"ftyp", b"moov", b"mdat", b"free", b"wide", b"skip", b"pnot")
# ISO base media brands of still images (HEIC/HEIF/AVIF): the same boxes, not a clip
_IMAGE_BRANDS = (b"heic", b"heix", b"hevc", b"heim", b"heis", b"mif1", b"msf1", b"avif", b"avis")


@dataclass(frozen=True)
class VideoLimits:
    """What one request may cost. ``max_frames`` counts frames KEPT after the stride, so a
    longer clip fits with a larger stride; ``max_seconds`` bounds decoding time whatever the
    stride. Frames above ``max_pixels`` (before downscaling) are refused; frames with a long side
    above ``max_side`` are downscaled for inference and for the output video."""

    max_bytes: int = 200 * 1024 * 1024
    max_seconds: float = 60.0
    max_frames: int = 300
    max_pixels: int = 3840 * 2160
    max_side: int = 1280

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_frames", "max_pixels", "max_side"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise OptionError(f"VideoLimits.{name} must be a positive integer, got {value!r}.")
        if not (isinstance(self.max_seconds, (int, float)) and math.isfinite(self.max_seconds)):
            raise OptionError(f"VideoLimits.max_seconds must be a finite number, got {self.max_seconds!r}.")
        if self.max_seconds <= 0:
            raise OptionError(f"VideoLimits.max_seconds must be positive, got {self.max_seconds!r}.")


@dataclass
class VideoInfo:
    """What the header says about a clip (``frame_count`` is FFmpeg's estimate for some
    containers, e.g. WebM; decoding counts the real frames)."""

    path: Path
    container: str  # "mp4/mov" | "webm/mkv" | "gif"
    width: int
    height: int
    fps: float
    frame_count: int
    size_bytes: int
    notices: list[str] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return self.frame_count / self.fps


def check_stride(stride: int) -> int:
    if isinstance(stride, bool) or not isinstance(stride, int) or not 1 <= stride <= 1000:
        raise OptionError(f"Frame stride must be a whole number from 1 to 1000, got {stride!r}.")
    return stride


def _container(head: bytes) -> str | None:
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "webm/mkv"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if head[4:8] in _BMFF_BOXES:
        return "mp4/mov"
    return None


def sniff_video(path: str | Path) -> str | None:
    """The container of a clip ("mp4/mov", "webm/mkv", "gif") from a regular file's first bytes;
    None for anything else (an image, a folder, a FIFO: never blocks). A GIF may be a still
    image: callers decide by its frame count."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        head = os.read(fd, 16) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    finally:
        os.close(fd)
    if head[4:8] == b"ftyp" and head[8:12] in _IMAGE_BRANDS:
        return None
    return _container(head)


def _sniff_regular_file(path: Path) -> tuple[str, int]:
    """(container, size) of a regular file, read without ever blocking on a FIFO or device."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise InputVideoError(f"Video file not found: {path.name!r}.") from None
    except OSError as e:
        raise InputVideoError(f"Could not open the video file {path.name!r}: {e.strerror or e}.") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputVideoError(f"{path.name!r} is not a regular file (a folder, pipe or device).")
        head = os.read(fd, 16)
    finally:
        os.close(fd)
    if st.st_size == 0:
        raise InputVideoError("The video file is empty (0 bytes).")
    kind = _container(head)
    if kind is None:
        raise InputVideoError(f"The file is not a video this app reads; upload an {_FORMATS} clip.")
    return kind, int(st.st_size)


def _open(path: Path) -> cv2.VideoCapture:
    # FFmpeg only (never OpenCV's image-sequence reader, which treats '%d' in a name as a
    # pattern); an absolute path so that a ':' in the name is never read as a protocol.
    cap = cv2.VideoCapture(str(path.resolve()), cv2.CAP_FFMPEG)
    if not cap.isOpened():
        cap.release()
        raise InputVideoError(
            f"The video could not be decoded (corrupt, cut off, or an unsupported codec). "
            f"Re-export it as {_FORMATS} (e.g. H.264 MP4) and try again."
        )
    return cap


def probe_video(path: str | Path, limits: VideoLimits = VideoLimits()) -> VideoInfo:
    """Check a clip against ``limits`` from its header; raises InputVideoError."""
    if not isinstance(path, (str, Path)) or not str(path):
        raise InputVideoError(f"Pass the video as a file path, got {type(path).__name__}.")
    path = Path(path)
    kind, size = _sniff_regular_file(path)
    if size > limits.max_bytes:
        raise InputVideoError(
            f"The video file is {size / 2**20:.1f} MB, above the limit of {limits.max_bytes / 2**20:.0f} MB. "
            "Trim or compress it first."
        )
    cap = _open(path)
    try:
        w, h = int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
        fps, count = float(cap.get(cv2.CAP_PROP_FPS)), cap.get(cv2.CAP_PROP_FRAME_COUNT)
    finally:
        cap.release()
    notices: list[str] = []
    if not (math.isfinite(fps) and 0 < fps <= _MAX_FPS):
        notices.append(
            f"The clip does not state a usable frame rate ({fps}); {FALLBACK_FPS:g} fps is assumed."
        )
        fps = FALLBACK_FPS
    count = int(count) if math.isfinite(count) and count > 0 else 0
    info = VideoInfo(path, kind, w, h, fps, count, size, notices)
    _check_frame_size(w, h, limits)
    if info.duration_s > limits.max_seconds:
        raise InputVideoError(_too_long(info.duration_s, limits))
    return info


def _check_frame_size(w: int, h: int, limits: VideoLimits) -> None:
    if w <= 0 or h <= 0:
        raise InputVideoError(f"The video has no picture (frame size {w}x{h}).")
    if w * h > limits.max_pixels:
        raise InputVideoError(
            f"The video frames are {w}x{h} px, above the limit of {limits.max_pixels / 1e6:.1f} megapixels. "
            "Downscale the clip first."
        )


def _too_long(seconds: float, limits: VideoLimits) -> str:
    return (
        f"The clip lasts {seconds:.1f} s, above the limit of {limits.max_seconds:g} s. "
        "Trim it to a shorter section and try again."
    )


def _too_many(limits: VideoLimits, stride: int) -> str:
    return (
        f"The clip has more than {limits.max_frames} frames to process at stride {stride}. "
        f"Use a larger frame stride or a shorter clip."
    )


def planned_frames(info: VideoInfo, stride: int, limits: VideoLimits) -> int:
    """Frames that will be processed by the header's count (raises beyond ``max_frames``)."""
    n = math.ceil(info.frame_count / check_stride(stride))
    if n > limits.max_frames:
        raise InputVideoError(_too_many(limits, stride))
    return n


def fit_side(frame: np.ndarray, max_side: int) -> np.ndarray:
    """The frame itself, or a copy downscaled (INTER_AREA) so that its long side is max_side."""
    h, w = frame.shape[:2]
    if max(h, w) <= max_side:
        return frame
    scale = max_side / max(h, w)
    return cv2.resize(
        frame, (max(1, round(w * scale)), max(1, round(h * scale))), interpolation=cv2.INTER_AREA
    )


def iter_frames(
    info: VideoInfo, *, stride: int = 1, limits: VideoLimits = VideoLimits()
) -> Iterator[tuple[int, np.ndarray]]:
    """(source frame index, (H, W, 3) uint8 RGB) for every ``stride``-th frame, in order.

    Raises InputVideoError when decoding finds more than the limits allow (the header was
    wrong) or no frame at all; a clip that stops early adds a notice to ``info.notices``.
    """
    check_stride(stride)
    cap = _open(info.path)
    index = kept = 0
    try:
        while True:
            ok = cap.grab()
            if not ok:
                break
            if index / info.fps > limits.max_seconds:
                raise InputVideoError(_too_long(index / info.fps, limits))
            if index % stride == 0:
                ok, bgr = cap.retrieve()
                if not ok or bgr is None:
                    break
                kept += 1
                if kept > limits.max_frames:
                    raise InputVideoError(_too_many(limits, stride))
                _check_frame_size(bgr.shape[1], bgr.shape[0], limits)
                yield index, cv2.cvtColor(fit_side(bgr, limits.max_side), cv2.COLOR_BGR2RGB)
            index += 1
    finally:
        cap.release()
    if kept == 0:
        raise InputVideoError(
            f"No frame of the video could be decoded (corrupt or unsupported codec). Re-export it as {_FORMATS}."
        )
    if info.frame_count and index < info.frame_count * 0.9:
        info.notices.append(
            f"Decoding stopped after {index} of the {info.frame_count} frames the header announces "
            "(the file may be cut off); the frames read were processed."
        )
