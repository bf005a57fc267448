"""People and depth over time: IoU tracker ids, One-Euro smoothing, clip-wide depth colours."""

from __future__ import annotations

import numpy as np
import pytest
from video_clips import boxes_at

from sapiens2.errors import OptionError
from sapiens2.outputs.render import depth_to_turbo, turbo_lut
from sapiens2.tasks.pointmap.frame_depth_colours import (
    foreground_depth,
    global_depth_bounds,
    render_depth_frame,
)
from sapiens2.tasks.pose.keypoint_smoothing import KeypointSmoother, OneEuroFilter
from sapiens2.tasks.pose.track_matching import IoUTracker, greedy_match, iou_matrix, keypoint_box

# ---------------------------------------------------------------- tracker


def test_iou_matrix_values() -> None:
    a = np.array([[0, 0, 10, 10], [0, 0, 0, 0]])
    b = np.array([[0, 0, 10, 10], [5, 0, 15, 10], [20, 20, 30, 30]])
    np.testing.assert_allclose(iou_matrix(a, b), [[1.0, 50 / 150, 0.0], [0.0, 0.0, 0.0]])
    assert greedy_match(iou_matrix(a, b), 0.3) == [(0, 0)]


def test_ids_stay_with_two_boxes_moving_apart_whatever_the_detection_order() -> None:
    tracker = IoUTracker(follow_keypoints=False)
    seen: list[dict[str, int]] = []
    for i in range(8):
        a, b = boxes_at(i)
        order = (a, b) if i % 2 == 0 else (b, a)  # the detector lists them in any order
        ids = tracker.update(i, np.array(order))
        seen.append({"a": ids[0], "b": ids[1]} if i % 2 == 0 else {"a": ids[1], "b": ids[0]})
    assert all(s == {"a": 0, "b": 1} for s in seen)
    assert tracker.ids_issued == 2


def test_detections_every_k_frames_and_carried_boxes_between() -> None:
    tracker = IoUTracker(follow_keypoints=True, min_points=2)
    for i in range(0, 8, 3):  # detections on frames 0, 3, 6 only: 6 px of motion between them
        ids = tracker.update(i, boxes_at(i))
        assert ids == [0, 1]
        carried_ids, carried = tracker.carry()
        assert carried_ids == [0, 1]
        np.testing.assert_allclose(carried, boxes_at(i))
        for tid in (0, 1):  # the keypoints say where the person went in between
            x1, y1, x2, y2 = boxes_at(i + 2)[tid]
            kp = np.array([[x1 + 2, y1 + 2], [x2 - 2, y2 - 2]], np.float64)
            tracker.observe(tid, kp, np.array([0.9, 0.9]))
        assert tracker.carry()[1][0][0] < boxes_at(i)[0][0]  # box A moved left with its keypoints


def test_leaving_and_coming_back() -> None:
    tracker = IoUTracker(max_lost=5, follow_keypoints=False)
    a, b = boxes_at(0)
    assert tracker.update(0, np.array([a, b])) == [0, 1]
    assert tracker.update(1, np.array([a])) == [0]  # B hidden
    assert tracker.carry()[0] == [0]  # a lost track is not carried (no skeleton in an empty box)
    assert tracker.update(4, np.array([b, a])) == [1, 0]  # back within max_lost: its old id
    tracker.update(5, np.array([a]))
    assert tracker.update(20, np.array([a, b])) == [0, 2]  # gone too long: a new id, never a reused one
    assert tracker.update(21, np.array([[80, 0, 95, 20]])) == [3]  # someone elsewhere: new id


def test_keypoint_box_needs_enough_confident_points() -> None:
    kp = np.array([[10, 10], [20, 30], [np.nan, 5], [100, 100]], np.float64)
    sc = np.array([0.9, 0.8, 0.9, 0.1])
    np.testing.assert_allclose(keypoint_box(kp, sc, 0.3, 2), [9, 8, 21, 32])
    assert keypoint_box(kp, sc, 0.3, 3) is None


def test_tracker_options_are_checked() -> None:
    with pytest.raises(OptionError):
        IoUTracker(iou_threshold=0)
    with pytest.raises(OptionError):
        IoUTracker(max_lost=-1)


# ---------------------------------------------------------------- smoothing


def _jitter(x: np.ndarray) -> float:
    """RMS second difference (px): frame-to-frame shake; ~0 for smooth motion."""
    return float(np.sqrt((np.diff(x, 2, axis=0) ** 2).sum(-1).mean()))


def _error(x: np.ndarray, truth: np.ndarray) -> float:
    return float(np.sqrt(((x - truth) ** 2).sum(-1).mean()))


def _noisy_track(
    speed_amp: float, fps: float = 30.0, n: int = 300
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = np.arange(n) / fps
    truth = np.stack([320 + speed_amp * np.sin(np.pi * t), 240 + 0.5 * speed_amp * np.cos(np.pi * t)], 1)
    noisy = truth + np.random.default_rng(0).normal(0.0, 3.0, truth.shape)
    return t, truth, noisy


@pytest.mark.parametrize("amplitude", [0.0, 100.0])  # a still point; one moving up to 314 px/s
def test_one_euro_reduces_jitter_on_a_noisy_track(amplitude: float) -> None:
    t, truth, noisy = _noisy_track(amplitude)
    smoother = KeypointSmoother()
    scores = np.ones(1)
    out = np.array([smoother(ti, 7, noisy[i : i + 1], scores)[0] for i, ti in enumerate(t)])
    raw_jitter, smooth_jitter = _jitter(noisy[10:]), _jitter(out[10:])
    # measured: still 10.9 -> 2.5 px (-77%); moving 10.5 -> 7.0 px (-34%), error vs truth 4.3 -> 4.5 px
    assert smooth_jitter < (0.3 if amplitude == 0 else 0.75) * raw_jitter
    assert _error(out[10:], truth[10:]) < (0.6 if amplitude == 0 else 1.15) * _error(noisy[10:], truth[10:])
    off = KeypointSmoother(enabled=False)
    np.testing.assert_array_equal(off(0.0, 7, noisy[:1], scores), noisy[:1].astype(np.float32))


def test_low_score_points_pass_through_and_restart_the_filter() -> None:
    f = OneEuroFilter(min_cutoff=0.1, beta=0.0)  # heavy smoothing: a jump is mostly held back
    x0, x1 = np.array([[0.0, 0.0], [0.0, 0.0]]), np.array([[100.0, 0.0], [100.0, 0.0]])
    f(0.0, x0)
    out = f(0.1, x1, valid=np.array([True, False]))
    assert out[0, 0] < 10.0  # smoothed
    assert out[1, 0] == 100.0  # low score: passed through
    out = f(0.2, np.array([[100.0, 0.0], [50.0, 0.0]]))
    assert out[1, 0] == 50.0  # restarted: not dragged from its old position
    with pytest.raises(OptionError, match="min_cutoff"):
        OneEuroFilter(min_cutoff=0)
    with pytest.raises(OptionError, match="beta"):
        KeypointSmoother(beta=-1.0)


# ---------------------------------------------------------------- depth over a clip


def _depth_clip(outlier_px: int) -> list[np.ndarray]:
    """10 frames of 40x25 foreground at 2-3 m with a 5x5 reference patch at 2.5 m; frame 3 also
    has ``outlier_px`` pixels at 50 m."""
    frames = []
    for i in range(10):
        d = np.full((30, 40), np.nan, np.float32)
        d[5:30] = np.linspace(2.0, 3.0, 40, dtype=np.float32)[None] + 0.01 * i
        d[10:15, 10:15] = 2.5
        if i == 3 and outlier_px:
            d[5:6, 40 - outlier_px :] = 50.0
        frames.append(d)
    return frames


def test_depth_colours_use_the_clip_bounds_so_an_outlier_frame_does_not_flicker() -> None:
    clip = _depth_clip(outlier_px=10)
    kept = [foreground_depth(d, np.isfinite(d)) for d in clip]
    bounds = global_depth_bounds(kept)
    assert bounds is not None and 2.0 < bounds[0] < bounds[1] < 3.1  # 10 of 10,000 px do not move the 99th
    ref = [render_depth_frame(k, bounds)[12, 12] for k in kept]
    assert all((c == ref[0]).all() for c in ref)  # the 2.5 m patch keeps its colour in every frame
    assert (render_depth_frame(kept[3], bounds)[5, 39] == turbo_lut()[0]).all()  # outlier clipped to far end
    # per-frame percentiles (the photo rendering) would change the patch colour in frame 3:
    per_frame = [depth_to_turbo(d, np.isfinite(d))[12, 12] for d in clip]
    assert not (per_frame[3] == per_frame[2]).all()
    # the bounds are the whole clip's percentiles, not any single frame's
    all_fg = np.concatenate([k[np.isfinite(k)].astype(np.float32) for k in kept])
    np.testing.assert_allclose(bounds, np.percentile(all_fg, [1, 99]))
    sub = global_depth_bounds(kept, max_samples=1000)  # subsampled: close to the exact bounds
    np.testing.assert_allclose(sub, bounds, atol=0.02)


def test_depth_without_foreground_renders_background() -> None:
    empty = [foreground_depth(np.full((4, 5), np.nan), None)]
    assert global_depth_bounds(empty) is None
    assert (render_depth_frame(empty[0], None) == 100).all()
    with pytest.raises(OptionError, match="near <= far"):
        depth_to_turbo(np.ones((2, 2)), bounds=(3.0, 1.0))
