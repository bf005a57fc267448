"""People over time: an IoU tracker giving each person a stable id across a clip.

The detector runs on every K-th frame only. On such a frame, :meth:`IoUTracker.update` matches
the detections to the known tracks by box overlap (greedy, highest IoU first, IoU >=
``iou_threshold``, against the track's current box or its last detected box, whichever
overlaps more); unmatched detections start new tracks with fresh ids. In between,
:meth:`IoUTracker.carry` hands out the boxes of the tracks seen at the last detection so pose
runs in those boxes, and :meth:`IoUTracker.observe` moves each box to where the person's
keypoints now are, so a box follows its person between detections.

Leaving and coming back: a track unmatched at a detection stops being carried (nobody is drawn
in an empty box) but is remembered for ``max_lost`` frames. A detection overlapping its last
box within that time takes its old id back (someone briefly hidden); after that the id is
retired, and a person who returns gets a new id. IoU says nothing about who a person is, so a
person re-entering elsewhere in the picture also gets a new id. Ids are never reused.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import OptionError
from ...models.boxes import iou_matrix

_BOX_PAD = 0.1  # a keypoint box is widened by 10% per side, about the margin of a detector box


def greedy_match(iou: np.ndarray, threshold: float) -> list[tuple[int, int]]:
    """(row, col) pairs taken by decreasing IoU, each row and column at most once, IoU >= threshold."""
    pairs: list[tuple[int, int]] = []
    if iou.size == 0:
        return pairs
    used_r, used_c = set(), set()
    order = np.argsort(-iou, axis=None, kind="stable")
    for r, c in zip(*np.unravel_index(order, iou.shape), strict=True):
        if iou[r, c] < threshold:
            break
        if r not in used_r and c not in used_c:
            pairs.append((int(r), int(c)))
            used_r.add(r)
            used_c.add(c)
    return pairs


def keypoint_box(
    keypoints: np.ndarray, scores: np.ndarray, threshold: float, min_points: int
) -> np.ndarray | None:
    """xyxy box around the keypoints scoring >= threshold (padded), or None with too few of them."""
    ok = np.isfinite(keypoints).all(axis=1) & np.isfinite(scores) & (scores >= threshold)
    if int(ok.sum()) < min_points:
        return None
    pts = keypoints[ok]
    (x1, y1), (x2, y2) = pts.min(axis=0), pts.max(axis=0)
    px, py = (x2 - x1) * _BOX_PAD, (y2 - y1) * _BOX_PAD
    return np.array([x1 - px, y1 - py, x2 + px, y2 + py], np.float64)


@dataclass
class Track:
    track_id: int
    box: np.ndarray  # (4,) xyxy, last known position (moved by the keypoints between detections)
    detected: np.ndarray  # (4,) xyxy, the box of its last detection
    last_seen: int  # frame index of the last detection match
    active: bool = True  # matched at the most recent detection: carried between detections


class IoUTracker:
    """Stable person ids over a clip from boxes (see the module docstring for the rules).

    ``iou_threshold``: least overlap for a detection to continue a track. ``max_lost``: frames a
    lost track is remembered for re-association. ``follow_keypoints``: move carried boxes to the
    keypoints (at least ``min_points`` scoring >= ``point_threshold``); off keeps them where the
    detector put them.
    """

    def __init__(
        self,
        *,
        iou_threshold: float = 0.3,
        max_lost: int = 30,
        follow_keypoints: bool = True,
        point_threshold: float = 0.3,
        min_points: int = 4,
    ) -> None:
        if not 0.0 < float(iou_threshold) <= 1.0:
            raise OptionError(f"iou_threshold must be in (0, 1], got {iou_threshold!r}.")
        if isinstance(max_lost, bool) or not isinstance(max_lost, int) or max_lost < 0:
            raise OptionError(f"max_lost must be a whole number >= 0, got {max_lost!r}.")
        self.iou_threshold = float(iou_threshold)
        self.max_lost = max_lost
        self.follow_keypoints = follow_keypoints
        self.point_threshold = point_threshold
        self.min_points = min_points
        self.tracks: list[Track] = []
        self._next_id = 0

    @property
    def ids_issued(self) -> int:
        return self._next_id

    def update(self, frame: int, boxes: np.ndarray) -> list[int]:
        """Associate a detection frame's (N, 4) boxes; returns the track id of each box, in order."""
        boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
        self.tracks = [t for t in self.tracks if t.active or frame - t.last_seen <= self.max_lost]
        # a detection may overlap where the track now is or where it was last detected (a box
        # moved to the keypoints has another shape than the detector's): the better of the two
        now = np.array([t.box for t in self.tracks]).reshape(-1, 4)
        then = np.array([t.detected for t in self.tracks]).reshape(-1, 4)
        iou = np.maximum(iou_matrix(boxes, now), iou_matrix(boxes, then))
        ids = [-1] * len(boxes)
        matched_tracks = set()
        for r, c in greedy_match(iou, self.iou_threshold):
            track = self.tracks[c]
            track.box, track.detected, track.last_seen, track.active = (
                boxes[r].copy(),
                boxes[r].copy(),
                frame,
                True,
            )
            ids[r] = track.track_id
            matched_tracks.add(c)
        for i, track in enumerate(self.tracks):
            if i not in matched_tracks:
                track.active = False
        for r in range(len(boxes)):
            if ids[r] < 0:
                self.tracks.append(Track(self._next_id, boxes[r].copy(), boxes[r].copy(), frame))
                ids[r] = self._next_id
                self._next_id += 1
        return ids

    def carry(self) -> tuple[list[int], np.ndarray]:
        """(ids, (P, 4) boxes) of the active tracks, for a frame without detection."""
        active = [t for t in self.tracks if t.active]
        return [t.track_id for t in active], np.array([t.box for t in active], np.float64).reshape(-1, 4)

    def observe(self, track_id: int, keypoints: np.ndarray, scores: np.ndarray) -> None:
        """Move a track's box to its keypoints (when ``follow_keypoints`` and enough are found)."""
        if not self.follow_keypoints:
            return
        box = keypoint_box(np.asarray(keypoints), np.asarray(scores), self.point_threshold, self.min_points)
        if box is None:
            return
        for t in self.tracks:
            if t.track_id == track_id:
                t.box = box
