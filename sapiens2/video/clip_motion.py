"""A clip to 3D motion: two ordinary clip runs over the same frames (pose with tracks, then the
pointmap through :class:`MotionDepth`, which aligns depth over time and lifts each person's
keypoints on their own mask), then :func:`finish_motion` on the CPU (gaps bridged, each track
smoothed in 3D) writes ``<name>_motion.glb``, ``_keypoints3d.npz``, ``_keypoints3d.csv`` and
``_motion.bvh``. docs/MOTION.md gives the steps and the files; in a server both passes share one
device call (``sapiens2.serving.motion_requests``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import OptionError
from ..outputs.export import file_stem, safe_path
from ..tasks.clip_arrays import RAW_CAP_BYTES, save_npz
from ..tasks.pointmap.pointmap_clip import DepthFrames, people_mask
from ..tasks.pointmap.pointmap_pipeline import TASK as POINTMAP
from ..tasks.pose.keypoint_smoothing import OneEuroFilter
from ..tasks.pose.pose_lift import MIN_SAMPLES, WINDOW, lift_keypoints
from ..tasks.pose.pose_pipeline import TASK as POSE
from ..tasks.pose.pose_tracking import TrackingOptions
from .clip_plan import VideoResult
from .clip_runner import iter_video
from .reader import VideoLimits

LIFTED_SUFFIX = "_lifted.npz"


@dataclass(frozen=True)
class MotionOptions:
    """How 3D keypoints are read, bridged and smoothed (see the module docstring)."""

    window: int = WINDOW  # pointmap window side, pixels
    min_samples: int = MIN_SAMPLES
    score_threshold: float = 0.3  # 2D keypoint score below which a point is missing
    max_gap: int = 5  # processed frames a gap may span to be bridged
    smoothing: bool = True
    min_cutoff: float = 1.0  # Hz
    beta: float = 10.0  # Hz per m/s
    d_cutoff: float = 1.0  # Hz
    face: bool = False  # face points in the GLB skeleton
    bvh: bool = True

    def __post_init__(self) -> None:
        g = self.max_gap
        if isinstance(g, bool) or not isinstance(g, int) or not 0 <= g <= 100:
            raise OptionError(f"max_gap must be a whole number of frames from 0 to 100, got {g!r}.")
        if not 0.0 <= float(self.score_threshold) <= 1.0:
            raise OptionError(f"score_threshold must be from 0 to 1, got {self.score_threshold!r}.")
        OneEuroFilter(min_cutoff=self.min_cutoff, beta=self.beta, d_cutoff=self.d_cutoff)  # checks


class MotionDepth(DepthFrames):
    """The pointmap pass: the depth handler, plus each frame's people lifted to 3D from the pose
    pass's arrays (``pose``: ``_pose_frames.npz`` as a dict; or given by :meth:`use_pose` once
    the pose pass is done, before the first frame is consumed)."""

    def __init__(
        self, pose: Mapping[str, np.ndarray] | None, options: MotionOptions, raw_cap: int = RAW_CAP_BYTES
    ) -> None:
        super().__init__(POINTMAP, {}, raw_cap, (1.0, 99.0))
        self.pose: dict[str, np.ndarray] = {}
        if pose is not None:
            self.use_pose(pose)
        self.options = options
        self.lifted: list[np.ndarray] = []  # per frame (P, 308, 3), not yet aligned
        self.samples: list[np.ndarray] = []

    def use_pose(self, pose: Mapping[str, np.ndarray]) -> None:
        """The pose pass's per-frame arrays (frame, track_ids, boxes, keypoints_raw)."""
        self.pose = {k: np.asarray(pose[k]) for k in ("frame", "track_ids", "boxes", "keypoints_raw")}

    def consume(self, k: int, frame: int, time_s: float, rgb: np.ndarray, result: Any) -> np.ndarray | None:
        out = super().consume(k, frame, time_s, rgb, result)
        if k >= len(self.pose.get("frame", ())) or int(self.pose["frame"][k]) != frame:
            raise OptionError(
                f"The pointmap pass reached frame {frame}, which the pose pass did not process."
            )
        people = self.pose["track_ids"][k] >= 0
        lifted = lift_keypoints(
            self.pose["keypoints_raw"][k][people], result.pointmap, people_mask(result),
            self.pose["boxes"][k][people], window=self.options.window, min_samples=self.options.min_samples,
        )  # fmt: skip
        points = np.full(self.pose["keypoints_raw"][k].shape[:2] + (3,), np.nan, np.float32)
        samples = np.zeros(points.shape[:2], np.int32)
        points[people], samples[people] = lifted.points, lifted.samples
        self.lifted.append(points)
        self.samples.append(samples)
        return out

    def exports(self, out_dir: Path, name: str, *, fps: float, size: tuple[int, int]) -> list[Path]:
        files = super().exports(out_dir, name, fps=fps, size=size)
        n = len(self.lifted)
        save_npz(
            safe_path(out_dir, name, LIFTED_SUFFIX),
            {
                "points": np.stack(self.lifted) if n else np.zeros((0, 0, 308, 3), np.float32),
                "samples": np.stack(self.samples) if n else np.zeros((0, 0, 308), np.int32),
                "depth_factor": self.align(),
                "frame": self.pose["frame"][:n],
            },
        )
        return files


# ----------------------------------------------------------------------------- over time


def bridge_gaps(points: np.ndarray, times: np.ndarray, max_gap: int) -> tuple[np.ndarray, np.ndarray]:
    """(F, ..., 3) points with NaN gaps -> gaps of at most ``max_gap`` frames that have known
    points on both sides filled linearly in time; returns (points, (F, ...) bool bridged)."""
    out = np.array(points, np.float64)
    f = len(out)
    flat = out.reshape(f, -1, 3)
    bridged = np.zeros(flat.shape[:2], bool)
    if max_gap <= 0 or f < 3:
        return out.astype(np.float32), bridged.reshape(out.shape[:-1])
    known = np.isfinite(flat).all(-1)
    for s in np.flatnonzero(known.any(0) & ~known.all(0)):
        at = np.flatnonzero(known[:, s])
        gaps = np.diff(at) - 1
        for i in np.flatnonzero((gaps > 0) & (gaps <= max_gap)):
            a, b = at[i], at[i + 1]
            w = ((times[a + 1 : b] - times[a]) / (times[b] - times[a]))[:, None]
            flat[a + 1 : b, s] = flat[a, s] * (1 - w) + flat[b, s] * w
            bridged[a + 1 : b, s] = True
    return flat.reshape(out.shape).astype(np.float32), bridged.reshape(out.shape[:-1])


def smooth_tracks(points: np.ndarray, times: np.ndarray, options: MotionOptions) -> np.ndarray:
    """(F, T, K, 3) -> each track through its own One-Euro filter (metres; NaN restarts a point)."""
    if not options.smoothing:
        return points
    out = points.copy()
    for t in range(points.shape[1]):
        f = OneEuroFilter(min_cutoff=options.min_cutoff, beta=options.beta, d_cutoff=options.d_cutoff)
        for i in range(len(points)):
            out[i, t] = f(float(times[i]), points[i, t])
    return out.astype(np.float32)


@dataclass
class Motion:
    """Per track (columns in ``ids`` order) and processed frame: what the files hold."""

    frames: np.ndarray  # (F,) source frame index
    times: np.ndarray  # (F,) seconds
    ids: np.ndarray  # (T,) track ids
    points: np.ndarray  # (F, T, 308, 3) metres, camera frame, NaN = missing
    scores: np.ndarray  # (F, T, 308) 2D scores, NaN where the person is not in the frame
    present: np.ndarray  # (F, T) the track is in the frame (bridged frames included)
    bridged: np.ndarray  # (F, T, 308) filled by bridging
    depth_factor: np.ndarray  # (F,) the depth alignment's factor per frame


def assemble(
    pose: Mapping[str, np.ndarray], lifted: Mapping[str, np.ndarray], options: MotionOptions
) -> Motion:
    """The two passes' arrays -> per-track motion: aligned, thresholded, bridged, smoothed."""
    frames, times = np.asarray(pose["frame"]), np.asarray(pose["time_s"], np.float64)
    ids_per_frame = np.asarray(pose["track_ids"])
    raw, factor = np.asarray(lifted["points"], np.float32), np.asarray(lifted["depth_factor"], np.float64)
    n = len(raw)
    frames, times, ids_per_frame = frames[:n], times[:n], ids_per_frame[:n]
    ids = np.unique(ids_per_frame[ids_per_frame >= 0]).astype(np.int64)
    col = {int(t): i for i, t in enumerate(ids)}
    points = np.full((n, len(ids), 308, 3), np.nan, np.float32)
    scores = np.full((n, len(ids), 308), np.nan, np.float32)
    present = np.zeros((n, len(ids)), bool)
    for i in range(n):
        for p, tid in enumerate(ids_per_frame[i]):
            if tid >= 0:
                c = col[int(tid)]
                points[i, c] = raw[i, p] * factor[i]
                scores[i, c] = pose["scores"][i, p]
                present[i, c] = True
    with np.errstate(invalid="ignore"):
        points[~(scores >= options.score_threshold)] = np.nan
    points, bridged = bridge_gaps(points, times, options.max_gap)
    present |= bridged.any(-1)
    points = smooth_tracks(points, times, options)
    return Motion(frames, times, ids, points, scores, present, bridged, factor[:n])


def write_motion_files(
    motion: Motion, out_dir: Path, name: str, fps: float, options: MotionOptions
) -> list[Path]:
    """The motion's downloads: GLB, NPZ, CSV and (``options.bvh``) BVH."""
    from ..tasks.pose.motion_files import write_keypoints_csv, write_keypoints_npz, write_motion_glb

    m = motion
    files = [
        write_motion_glb(safe_path(out_dir, name, "_motion.glb"), m.points, m.present, m.times, m.ids, face=options.face),
        write_keypoints_npz(
            safe_path(out_dir, name, "_keypoints3d.npz"), points=m.points, scores=m.scores, ids=m.ids,
            fps=np.float64(fps), frame=m.frames, time_s=m.times, present=m.present, bridged=m.bridged,
            depth_factor=m.depth_factor,
        ),
        write_keypoints_csv(
            safe_path(out_dir, name, "_keypoints3d.csv"), m.points, m.scores, m.present, m.frames, m.times,
            m.ids, m.bridged,
        ),
    ]  # fmt: skip
    if options.bvh:
        from ..tasks.pose.bvh import write_bvh

        files.append(write_bvh(safe_path(out_dir, name, "_motion.bvh"), m.points, m.present, m.ids, fps))
    return files


# ----------------------------------------------------------------------------- the clip


@dataclass
class MotionResult:
    """A clip's motion: the files (the motion first, then the two passes' videos) and what ran."""

    files: list[Path]
    glb: Path
    frames: int
    fps: float
    people: int
    pose: VideoResult
    pointmap: VideoResult
    notices: list[str] = field(default_factory=list)
    timing: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {
            "task": "motion",
            "frames": self.frames,
            "fps": round(self.fps, 4),
            "people": self.people,
            "files": [p.name for p in self.files],
            "notices": list(self.notices),
            "timing": {k: round(v, 3) for k, v in self.timing.items()},
            **self.details,
        }


def pose_arrays_of(result: VideoResult) -> dict[str, np.ndarray]:
    """The pose pass's per-frame arrays (its ``_pose_frames.npz``)."""
    found = [p for p in result.files if p.name.endswith("_pose_frames.npz")]
    if not found:
        raise OptionError(
            "The pose pass wrote no per-frame arrays (too large for the cap): use fewer frames."
        )
    with np.load(found[0], allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def lifted_arrays_of(result: VideoResult) -> dict[str, np.ndarray]:
    """The pointmap pass's lifted points (``<name>_lifted.npz`` beside its video; removed once
    read: it is how the pass hands them over, not a download)."""
    path = result.video.parent / (result.video.name.removesuffix("_pointmap.webm") + LIFTED_SUFFIX)
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    path.unlink(missing_ok=True)
    return arrays


def finish_motion(
    pose: VideoResult, pointmap: VideoResult, name: str, options: MotionOptions, t0: float,
    pose_frames: Mapping[str, np.ndarray] | None = None,
) -> MotionResult:  # fmt: skip
    """The motion files from the two passes' results, beside the pointmap pass's files
    (``pose_frames``: the pose pass's arrays when the caller has them, else read from its NPZ)."""
    t1 = time.perf_counter()
    arrays = pose_arrays_of(pose) if pose_frames is None else pose_frames
    motion = assemble(arrays, lifted_arrays_of(pointmap), options)
    files = write_motion_files(motion, pointmap.video.parent, name, pointmap.fps, options)
    notices = list(dict.fromkeys([*pose.notices, *pointmap.notices]))
    if not len(motion.ids):
        notices.insert(0, "No person was found in the clip: the motion files are empty.")
    known = np.isfinite(motion.points).all(-1) & motion.present[..., None]
    details = {
        "tracks": [int(t) for t in motion.ids],
        "keypoints_with_depth": int(known.sum()),
        "keypoints_bridged": int(motion.bridged.sum()),
        "depth_alignment": pointmap.details.get("depth_alignment"),
    }
    timing = {"pose_s": pose.timing.get("total_s", 0.0), "pointmap_s": pointmap.timing.get("total_s", 0.0)}
    timing.update(motion_s=time.perf_counter() - t1, total_s=time.perf_counter() - t0)
    return MotionResult(
        files=[*files, pose.video, pointmap.video], glb=files[0], frames=len(motion.frames), fps=pointmap.fps,
        people=len(motion.ids), pose=pose, pointmap=pointmap, notices=notices, timing=timing, details=details,
    )  # fmt: skip


def iter_motion(
    pose_pipe: Any,
    pointmap_pipe: Any,
    source: str | Path,
    out_dir: str | Path,
    *,
    stride: int = 1,
    limits: VideoLimits = VideoLimits(),
    batch_size: int = 8,
    pose_options: Mapping[str, Any] | None = None,
    pointmap_options: Mapping[str, Any] | None = None,
    tracking: TrackingOptions = TrackingOptions(),
    motion: MotionOptions | None = None,
    name: str | None = None,
    take: int | None = None,
    source_video: bool = False,
) -> Iterator[tuple[int, int | None] | MotionResult]:
    """3D motion of every tracked person of the clip at ``source`` into ``out_dir``: yields
    ``(frames done, frames planned)`` over both passes (planned counts each frame twice), then the
    :class:`MotionResult`. ``pose_options`` / ``pointmap_options``: each task's inference options
    (pointmap: ``use_segmentation`` defaults on, for the people's mask)."""
    t0 = time.perf_counter()
    options = motion or MotionOptions(smoothing=tracking.smoothing)
    stem = name or file_stem(Path(source).name, "clip")
    common = {"stride": stride, "limits": limits, "batch_size": batch_size, "name": stem, "take": take}
    pose_result = yield from _pass(
        iter_video(pose_pipe, source, out_dir, task=POSE, options=pose_options, tracking=tracking,
                   render_options={"threshold": options.score_threshold}, source_video=source_video, **common),
        0,
    )  # fmt: skip
    handler = MotionDepth(pose_arrays_of(pose_result), options)
    pm_opts = {"use_segmentation": True, **(pointmap_options or {})}
    pm_result = yield from _pass(
        iter_video(pointmap_pipe, source, out_dir, task=POINTMAP, options=pm_opts, handler=handler, **common),
        pose_result.frames,
    )
    yield finish_motion(pose_result, pm_result, stem, options, t0)


def _pass(run: Iterator[Any], offset: int) -> Any:
    """Progress of one pass, shifted by the frames of the passes before; returns its result."""
    for item in run:
        if isinstance(item, VideoResult):
            return item
        done, planned = item
        yield offset + done, None if planned is None else 2 * planned


def run_motion(
    *args: Any, progress: Callable[[int, int | None], None] | None = None, **kwargs: Any
) -> MotionResult:
    """:func:`iter_motion` to its end; ``progress(done, planned)`` after every batch."""
    for item in iter_motion(*args, **kwargs):
        if isinstance(item, MotionResult):
            return item
        if progress is not None:
            progress(*item)
    raise AssertionError("iter_motion ended without a result")  # pragma: no cover


__all__ = [
    "LIFTED_SUFFIX",
    "POINTMAP",
    "POSE",
    "Motion",
    "MotionDepth",
    "MotionOptions",
    "MotionResult",
    "assemble",
    "bridge_gaps",
    "finish_motion",
    "iter_motion",
    "run_motion",
    "smooth_tracks",
]
