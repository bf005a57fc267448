"""Writing the rendered clip as a video that browsers play.

Codec: VP8 in WebM. The FFmpeg bundled with opencv-python(-headless) has no H.264 encoder
(``avc1`` fails to open: H.264 encoders are GPL/patent-encumbered and left out of the wheels),
and its ``mp4v`` (MPEG-4 Part 2) files do not play in Chromium. It does have libvpx: VP8 and VP9
in WebM both open and play in Chromium (tests/test_video_browser.py); VP8 encoded 3.4x (320x240)
to 4.7x (1280x720) faster than VP9 at the same PSNR here (bench/video.py --codecs, docs/VIDEO.md),
so VP8 is the choice and VP9 the fallback. Gradio's
``gr.Video`` passes ``.webm`` + VP8 through without conversion (its own list of playable pairs).

The encoder's bit rate is OpenCV's (it does not pass encoder options through), and audio is not
written: OpenCV's writer has no audio track, so the output is silent.
"""

from __future__ import annotations

import math
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

import cv2
import numpy as np

from ..errors import InputImageError, OptionError, VideoEncodeError

#: (fourcc, file suffix) in order of preference; the first one that opens is used.
CODECS: tuple[tuple[str, str], ...] = (("VP80", ".webm"), ("VP90", ".webm"))
VIDEO_SUFFIX = ".webm"

#: What OpenCV's FFmpeg writer prints on every WebM open: WebM's tag table holds no fourcc, so no
#: fourcc avoids it, and the file is the VP8/VP9 WebM asked for all the same.
_TAG_NOTE = re.compile(
    r"^OpenCV: FFMPEG: tag 0x[0-9a-f]+/'.{4}' is not supported with codec id \d+ and format 'webm"
)
_FD2 = threading.Lock()  # one open at a time holds the process's stderr


@contextmanager
def _without_tag_note() -> Iterator[None]:
    """Run the writer's open with file descriptor 2 on a temporary file (OpenCV prints from C, past
    Python's ``sys.stderr``); every line but :data:`_TAG_NOTE` is passed on to stderr."""
    with _FD2, tempfile.TemporaryFile() as held:
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError):  # no stderr to hold: nothing to keep quiet
            yield
            return
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            lines = held.read().decode(errors="replace").splitlines(keepends=True)
            rest = "".join(line for line in lines if not _TAG_NOTE.match(line))
            if rest:
                sys.stderr.write(rest)


def even_frame(rgb: np.ndarray) -> np.ndarray:
    """The frame padded by one edge row/column where its size is odd (4:2:0 video needs even
    sizes; OpenCV would otherwise crop the frame silently)."""
    h, w = rgb.shape[:2]
    if h % 2 == 0 and w % 2 == 0:
        return rgb
    return cv2.copyMakeBorder(rgb, 0, h % 2, 0, w % 2, cv2.BORDER_REPLICATE)


class VideoWriter:
    """``with VideoWriter(path, fps) as out: out.write(rgb)``: frames of one size, RGB uint8.

    ``path`` must end in ``.webm``. The size is taken from the first frame (padded to even);
    a later frame of another size raises InputImageError. Raises VideoEncodeError when no codec
    of :data:`CODECS` can be opened here.
    """

    def __init__(self, path: str | Path, fps: float) -> None:
        self.path = Path(path)
        if self.path.suffix != VIDEO_SUFFIX:
            raise OptionError(f"The output video must be a {VIDEO_SUFFIX} file, got {self.path.name!r}.")
        if not (isinstance(fps, (int, float)) and math.isfinite(fps) and 0 < fps <= 1000):
            raise OptionError(f"The output frame rate must be in (0, 1000], got {fps!r}.")
        self.fps = float(fps)
        self.codec: str | None = None
        self.frames = 0
        self._size: tuple[int, int] | None = None
        self._writer: cv2.VideoWriter | None = None

    def _open(self, size: tuple[int, int]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for fourcc, _ in CODECS:
            with _without_tag_note():
                writer = cv2.VideoWriter(
                    str(self.path), cv2.CAP_FFMPEG, cv2.VideoWriter_fourcc(*fourcc), self.fps, size
                )
            if writer.isOpened():
                self._writer, self.codec, self._size = writer, fourcc, size
                return
            writer.release()
        raise VideoEncodeError(
            "This OpenCV build cannot encode VP8 or VP9 (no libvpx in its FFmpeg), so no browser-playable "
            "video can be written. Install opencv-python-headless from PyPI (its wheels include libvpx)."
        )

    def write(self, rgb: np.ndarray) -> None:
        frame = np.asarray(rgb)
        if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
            raise InputImageError(
                f"Video frames must be (H, W, 3) uint8 RGB, got {frame.dtype} {frame.shape}."
            )
        frame = even_frame(frame)
        size = (frame.shape[1], frame.shape[0])
        if self._writer is None:
            self._open(size)
        elif size != self._size:
            raise InputImageError(f"Frame {self.frames} is {size[0]}x{size[1]}, the video {self._size}.")
        self._writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))  # type: ignore[union-attr]
        self.frames += 1

    def close(self) -> Path:
        """Finish the file (idempotent) and return its path; raises when nothing was written."""
        if self._writer is not None:
            self._writer.release()
            self._writer = None
        if self.frames == 0:
            raise VideoEncodeError("No frame was written, so there is no video.")
        return self.path

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._writer is not None:
            self._writer.release()
            self._writer = None
