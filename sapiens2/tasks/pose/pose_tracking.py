"""People over time, one frame at a time: the state a clip and a live stream share.

:class:`PoseTracking` holds the tracker (:mod:`sapiens2.tasks.pose.track_matching`) and the keypoint smoother
(:mod:`sapiens2.tasks.pose.keypoint_smoothing`) and answers, per frame, the two questions a pose stream asks:
which boxes to run the pose model in (:meth:`PoseTracking.people`: the detector's on every K-th
frame, the tracker's carried boxes in between) and where each tracked person's keypoints are
once the model has run (:meth:`PoseTracking.follow`: smoothed along the track, the track's box
moved to them). It keeps nothing per frame, so a stream of any length holds only its live tracks:
a clip (``handlers.PoseFrames``) keeps its own list of frames for the downloads, a live view
(``sapiens2.serving.live``) keeps none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from ...errors import OptionError
from .keypoint_smoothing import KeypointSmoother
from .pose_render import draw_pose, pose_style
from .track_matching import IoUTracker


@dataclass(frozen=True)
class TrackingOptions:
    """Pose over time. ``detect_every``: run the person detector on every K-th PROCESSED frame
    (1 = every frame); boxes are carried by the tracker in between. See
    :mod:`sapiens2.tasks.pose.track_matching` and :mod:`sapiens2.tasks.pose.keypoint_smoothing` for the others."""

    detect_every: int = 5
    iou_threshold: float = 0.3
    max_lost: int = 30
    follow_keypoints: bool = True
    smoothing: bool = True
    min_cutoff: float = 1.0
    beta: float = 0.05
    d_cutoff: float = 1.0

    def __post_init__(self) -> None:
        k = self.detect_every
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 1000:
            raise OptionError(f"detect_every must be a whole number from 1 to 1000, got {k!r}.")


@dataclass
class FramePeople:
    """The people of one frame, before the pose model: track ids, boxes clipped to the frame
    (xyxy, float64) and the detector's box scores (NaN for a box carried by the tracker)."""

    ids: list[int]
    boxes: np.ndarray  # (P, 4)
    box_scores: np.ndarray  # (P,) float32

    def pose_options(self) -> dict[str, Any] | None:
        """The pose pipeline's per-frame options (its ``boxes``), or None: nobody to infer."""
        return {"boxes": self.boxes.astype(np.float32)} if self.ids else None


def clip_boxes(boxes: np.ndarray, w: int, h: int, min_side: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    """(P, 4) boxes clipped to the frame and (P,) bool: still at least ``min_side`` px each way."""
    b = np.asarray(boxes, np.float64).reshape(-1, 4).copy()
    b[:, 0::2] = b[:, 0::2].clip(0, w)
    b[:, 1::2] = b[:, 1::2].clip(0, h)
    return b, ((b[:, 2] - b[:, 0]) >= min_side) & ((b[:, 3] - b[:, 1]) >= min_side)


def label_tracks(canvas: np.ndarray, boxes: np.ndarray, track_ids: list[int]) -> np.ndarray:
    """``#id`` written at each box's top-left corner (white on black, sized like the skeleton)."""
    thickness, _ = pose_style(*canvas.shape[:2])
    scale = 0.4 * thickness
    for (x1, y1, _, _), tid in zip(np.nan_to_num(boxes).astype(int), track_ids, strict=True):
        text = f"#{tid}"
        (tw, th), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, thickness)
        y = max(th + base, y1)
        cv2.rectangle(canvas, (x1, y - th - base), (x1 + tw, y), (0, 0, 0), -1)
        cv2.putText(
            canvas,
            text,
            (x1, y - base),
            cv2.FONT_HERSHEY_SIMPLEX,
            scale,
            (255, 255, 255),
            thickness,
            cv2.LINE_AA,
        )
    return canvas


def draw_people(
    rgb: np.ndarray, people: FramePeople, keypoints: np.ndarray, scores: np.ndarray, options: dict[str, Any]
) -> np.ndarray:
    """One frame's skeletons (``options``: the pose video's render options: threshold,
    show_face, body_only, show_boxes, show_ids), with ``#id`` labels when asked."""
    o = options
    canvas = draw_pose(
        rgb, keypoints, scores, threshold=o["threshold"], show_face=o["show_face"],
        body_only=o["body_only"], boxes=people.boxes if o["show_boxes"] else None,
    )  # fmt: skip
    return label_tracks(canvas, people.boxes, people.ids) if o["show_ids"] else canvas


class PoseTracking:
    """Stable ids and smoothed keypoints, frame by frame (see the module docstring).

    ``threshold``: the keypoint score a point needs to move a box and to be smoothed (the
    render threshold)."""

    def __init__(self, tracking: TrackingOptions, threshold: float) -> None:
        self.options = tracking
        self.tracker = IoUTracker(
            iou_threshold=tracking.iou_threshold, max_lost=tracking.max_lost,
            follow_keypoints=tracking.follow_keypoints, point_threshold=threshold,
        )  # fmt: skip
        self.smoother = KeypointSmoother(
            enabled=tracking.smoothing, min_cutoff=tracking.min_cutoff, beta=tracking.beta,
            d_cutoff=tracking.d_cutoff, score_threshold=threshold,
        )  # fmt: skip

    @property
    def ids_issued(self) -> int:
        return self.tracker.ids_issued

    def detects(self, k: int) -> bool:
        """Whether the ``k``-th processed frame (from 0) runs the person detector."""
        return k % self.options.detect_every == 0

    def people(self, k: int, rgb: np.ndarray, found: Any = None) -> FramePeople:
        """The people of the ``k``-th processed frame: on a detection frame (:meth:`detects`)
        ``found`` (the detector's result, with ``.boxes`` and optionally ``.scores``) matched to
        the tracks; otherwise the tracks' carried boxes (``found`` unused)."""
        if self.detects(k):
            if found is None:
                raise OptionError(f"Frame {k} is a detection frame: the detector's people are needed.")
            boxes = np.asarray(found.boxes, np.float64).reshape(-1, 4)
            ids = self.tracker.update(k, boxes)
            box_scores = np.asarray(getattr(found, "scores", np.ones(len(boxes))), np.float32).reshape(-1)
            self.smoother.keep({t.track_id for t in self.tracker.tracks})  # retired ids: no filter kept
        else:  # carried: nobody scored these boxes on this frame
            ids, boxes = self.tracker.carry()
            box_scores = np.full(len(ids), np.nan, np.float32)
        boxes, keep = clip_boxes(boxes, rgb.shape[1], rgb.shape[0])
        ids = [i for i, ok in zip(ids, keep, strict=True) if ok]
        return FramePeople(ids, boxes[keep], box_scores[keep])

    def follow(self, time_s: float, people: FramePeople, keypoints: Any, scores: Any) -> np.ndarray:
        """(P, K, 2) keypoints smoothed along each person's track at ``time_s`` (seconds); each
        track's box then moves to its raw keypoints. ``keypoints``/``scores``: the pose result's,
        one row per box of ``people`` (an OptionError otherwise)."""
        raw, sc = np.asarray(keypoints, np.float32), np.asarray(scores, np.float32)
        if len(raw) != len(people.ids):
            raise OptionError(f"The pose pipeline returned {len(raw)} people for {len(people.ids)} boxes.")
        smooth = [self.smoother(time_s, t, raw[p], sc[p]) for p, t in enumerate(people.ids)]
        for p, t in enumerate(people.ids):
            self.tracker.observe(t, raw[p], sc[p])
        return np.array(smooth, np.float32).reshape(raw.shape)
