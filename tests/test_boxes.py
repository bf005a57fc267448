"""Box overlap lives once (sapiens2.models.boxes): the detector's NMS and the clip tracker use it."""

from __future__ import annotations

import numpy as np
import torch

from sapiens2.models import boxes, detector
from sapiens2.tasks.pose import track_matching as tracking


def _numpy_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The tracker's former numpy IoU, kept here as the oracle the shared one must match exactly."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(axis=2)
    area_a = np.clip(a[:, 2:] - a[:, :2], 0, None).prod(axis=1)
    area_b = np.clip(b[:, 2:] - b[:, :2], 0, None).prod(axis=1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def _random_boxes(rng: np.random.Generator, n: int) -> np.ndarray:
    xy = rng.uniform(0, 100, (n, 2))
    wh = rng.uniform(-5, 40, (n, 2))  # some empty (negative size) boxes too
    return np.concatenate([xy, xy + wh], axis=1)


def test_the_tracker_and_the_detector_share_one_iou() -> None:
    assert tracking.iou_matrix is boxes.iou_matrix
    assert detector.box_iou is boxes.box_iou and detector.nms is boxes.nms


def test_iou_is_the_same_in_numpy_and_torch() -> None:
    rng = np.random.default_rng(0)
    for n, m in ((7, 5), (0, 3), (4, 0), (30, 30)):
        a, b = _random_boxes(rng, n), _random_boxes(rng, m)
        got = boxes.iou_matrix(a, b)
        assert got.shape == (n, m) and got.dtype == np.float64
        np.testing.assert_array_equal(got, _numpy_iou(a, b))
        t32 = boxes.box_iou(torch.from_numpy(a).float(), torch.from_numpy(b).float()).numpy()
        np.testing.assert_allclose(t32, got, atol=1e-6)
    degenerate = np.array([[5.0, 5.0, 5.0, 9.0]])  # zero width: overlaps nothing, itself included
    assert boxes.iou_matrix(degenerate, degenerate).tolist() == [[0.0]]
