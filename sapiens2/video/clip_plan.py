"""A clip's plan (checked before any inference) and its result (the rendered video and downloads)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .reader import VideoInfo, VideoLimits, check_stride, planned_frames, probe_video


@dataclass
class VideoPlan:
    """A checked clip before any inference: what the UI shows (and estimates time from) first."""

    info: VideoInfo
    stride: int
    frames: int | None  # frames that will be processed by the header (None: header gives no count)

    @property
    def fps_out(self) -> float:
        return self.info.fps / self.stride


def plan_video(source: str | Path, *, stride: int = 1, limits: VideoLimits = VideoLimits()) -> VideoPlan:
    """Probe and check a clip; raises InputVideoError (not a video, too big, too long, too many
    frames by its header) before anything expensive runs."""
    info = probe_video(source, limits)
    n = planned_frames(info, check_stride(stride), limits) if info.frame_count else None
    return VideoPlan(info, stride, n)


@dataclass
class VideoResult:
    """A processed clip: the rendered video and the downloads, all inside ``out_dir``."""

    task: str
    video: Path  # rendered clip, VP8 in WebM, silent
    files: list[Path]  # downloads: the video first, then JSON / ZIP / NPZ
    source: VideoInfo
    frames: int  # frames processed (= frames in the output video)
    fps: float  # output frame rate = source fps / stride (so the duration is kept)
    size: tuple[int, int]  # (width, height) of the output frames (even-padded in the video)
    codec: str  # fourcc actually used ("VP80"; "VP90" only if VP8 cannot be opened)
    notices: list[str] = field(default_factory=list)
    timing: dict[str, float] = field(default_factory=dict)  # decode_s, infer_s, model_s, total_s
    details: dict[str, Any] = field(default_factory=dict)  # pose: tracks; pointmap: depth bounds
    source_video: Path | None = None  # the frames read, as a playable WebM (``source_video=True``)

    def summary(self) -> dict[str, Any]:
        """JSON-friendly description for UIs, logs and the API."""
        return {
            "task": self.task,
            "frames": self.frames,
            "fps": round(self.fps, 4),
            "source_fps": round(self.source.fps, 4),
            "size": list(self.size),
            "codec": self.codec,
            "audio": "dropped",
            "files": [p.name for p in self.files],
            "notices": list(self.notices),
            "timing": {k: round(v, 3) for k, v in self.timing.items()},
            **self.details,
        }


#: Byte patterns of an audio track: MP4/MOV's sound handler ("hdlr" box, then "soun") and the
#: Matroska/WebM codec ids of audio tracks. GIFs never have sound.
_AUDIO = re.compile(rb"hdlr.{8}soun|A_(?:OPUS|VORBIS|AAC|MPEG|AC3|EAC3|FLAC|PCM)", re.DOTALL)


def has_audio(path: str | Path, chunk: int = 4 * 1024 * 1024) -> bool:
    """Whether the clip's container declares an audio track (a scan of its bytes, no decoder)."""
    try:
        with open(path, "rb") as fh:
            tail = b""
            while block := fh.read(chunk):
                if _AUDIO.search(tail + block):
                    return True
                tail = block[-32:]
    except OSError:
        return False
    return False
