"""Pose's clip handler: people found every K frames, tracked and smoothed between, drawn with
their track ids, and the track exports."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import OptionError
from ...outputs.export import safe_path
from ..clip_arrays import cap_notice, save_npz
from ..clip_frames import Detect, DetectMany, FrameHandler
from ..registry import Task
from .pose_clip_files import (
    PoseFrame,
    pose_arrays,
    write_coco_tracks,
    write_keypoints_csv,
    write_openpose_video,
    write_openpose_zip,
    write_pose_tracks,
    write_wholebody_tracks,
)
from .pose_tracking import FramePeople, PoseTracking, TrackingOptions, draw_people


class PoseFrames(FrameHandler):
    """Keypoints with tracks : the task's detection hook every K frames,
    tracker between, One-Euro on each track."""

    @classmethod
    def build(
        cls, task: Task, pipe: Any, options: Mapping[str, Any], render: Mapping[str, Any], **kw: Any
    ) -> FrameHandler:
        hook = task.video.detect if task.video else None
        detect = kw["detect"] or (hook(pipe, options) if hook else None)
        if detect is None:
            raise OptionError(
                f"The {task.api_name} video needs person boxes: its declaration has no detect hook."
            )
        return cls(task, render, kw["raw_cap"], kw["tracking"], detect, kw["detect_many"])

    @staticmethod
    def render_kwargs(task: Task, render_opts: Mapping[str, Any]) -> dict[str, Any]:
        return dict(render_opts)  # the photo's names, checked against the declaration's here

    def __init__(
        self,
        task: Task,
        render_options: Mapping[str, Any],
        raw_cap: int,
        tracking: TrackingOptions,
        detect: Detect,
        detect_many: DetectMany | None = None,
    ) -> None:
        self.task = task.name
        opts = task.video_render_defaults()  # the declaration's, plus video's
        unknown = set(render_options) - set(opts)
        if unknown:
            raise OptionError(
                f"Unknown {task.name} video render option(s) {sorted(unknown)}; allowed: {sorted(opts)}."
            )
        super().__init__({**opts, **render_options}, raw_cap)
        self.tracking, self.detect, self.detect_many = tracking, detect, detect_many
        self._detected: dict[int, Any] = {}  # k -> detections fetched for the batch
        self.people = PoseTracking(tracking, self.render_options["threshold"])
        self.frames: list[PoseFrame] = []
        self._pending: dict[int, FramePeople] = {}

    def prefetch(self, frames: list[tuple[int, np.ndarray]]) -> None:
        """With ``detect_many``: the batch's detection frames in one call (one GPU call)."""
        todo = [(k, rgb) for k, rgb in frames if self.people.detects(k)]
        if self.detect_many is None or not todo:
            return
        found = list(self.detect_many([rgb for _, rgb in todo]))
        if len(found) != len(todo):
            raise OptionError(f"Detection returned {len(found)} results for {len(todo)} frames.")
        self._detected.update((k, f) for (k, _), f in zip(todo, found, strict=True))

    def options_for(self, k: int, rgb: np.ndarray) -> dict[str, Any] | None:
        found = None
        if self.people.detects(k):
            found = self._detected.pop(k) if k in self._detected else self.detect(rgb)
            for n in getattr(found, "notices", []):
                self.note(n)
        people = self._pending[k] = self.people.people(k, rgb, found)
        return people.pose_options()

    def consume(self, k: int, frame: int, time_s: float, rgb: np.ndarray, result: Any) -> np.ndarray | None:
        people = self._pending.pop(k)
        raw = (
            np.zeros((0, 308, 2), np.float32) if result is None else np.asarray(result.keypoints, np.float32)
        )
        scores = np.zeros((0, 308), np.float32) if result is None else np.asarray(result.scores, np.float32)
        for n in getattr(result, "notices", []):
            self.note(n)
        smooth = self.people.follow(time_s, people, raw, scores)
        native = None if result is None else getattr(result, "native", None)
        if native is not None:
            native = (np.asarray(native[0], np.float32), np.asarray(native[1], np.float32))
        self.frames.append(
            PoseFrame(
                frame,
                time_s,
                people.ids,
                people.boxes.astype(np.float32),
                people.box_scores,
                smooth,
                raw,
                scores,
                native,
                getattr(result, "keypoint_set", "goliath308"),
            )
        )
        return draw_people(rgb, people, smooth, scores, self.render_options)

    def exports(self, out_dir: Path, name: str, *, fps: float, size: tuple[int, int]) -> list[Path]:
        thr = float(self.render_options["threshold"])
        meta = {"tracking": {**self.tracking.__dict__}, "keypoint_threshold": thr}
        paths = [
            write_pose_tracks(out_dir, name, self.frames, size=size, fps=fps, meta=meta),
            write_coco_tracks(out_dir, name, self.frames, size=size, threshold=thr),
            write_wholebody_tracks(out_dir, name, self.frames, threshold=thr),
            write_openpose_zip(out_dir, name, self.frames, threshold=thr, size=size),
            write_openpose_zip(out_dir, name, self.frames, threshold=thr, size=size, coco18=True),
            write_keypoints_csv(out_dir, name, self.frames),
        ]
        video = write_openpose_video(out_dir, name, self.frames, size=size, fps=fps, threshold=thr)
        paths += [video] if video else []
        arrays = {**pose_arrays(self.frames), "fps": np.float64(fps)}
        needed = sum(int(a.nbytes) for a in arrays.values())
        if needed <= self.raw.cap_bytes:
            paths.append(save_npz(safe_path(out_dir, name, f"_{self.task}_frames.npz"), arrays))
        else:
            self.note(cap_notice(self.task, needed, self.raw.cap_bytes))
        return paths

    def summary(self) -> dict[str, Any]:
        return {
            "tracks": self.people.ids_issued,
            "people_max": max([len(f.track_ids) for f in self.frames] or [0]),
        }
