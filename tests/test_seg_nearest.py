"""Live's body-part labels (``tasks/seg/seg_nearest.py``): the argmax at the network's resolution,
its non-finite check folded into the max, enlarged nearest-neighbour; where that can differ from
the photo tab's exact labels (only inside class-edge cells); and the borrowed foreground of a
pointmap frame. The photo path's exact labels are tests/test_seg_labels.py's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sapiens2.inputs.intake import load_image
from sapiens2.inputs.network import PadInfo
from sapiens2.tasks import registry
from sapiens2.tasks.pointmap.pointmap_pipeline import PointmapRaw
from sapiens2.tasks.seg import seg_logits as exact_module
from sapiens2.tasks.seg.seg_logits import SegLogits, finite_logits
from sapiens2.tasks.seg.seg_nearest import NearestLabels, nearest_index, network_labels


def _logits(c: int, h: int, w: int, seed: int = 0) -> torch.Tensor:
    x = torch.from_numpy(np.random.default_rng(seed).standard_normal((c, h, w)).astype(np.float32))
    x[3, 0, :5] = x[7, 0, :5] = 50.0  # ties: the first class wins
    x[:, 1, 0] = 0.0
    x[2, 1, 0] = -0.0  # -0 == 0: a tie, class 0 first
    x[:, 1, 1] = 1e-40  # subnormal maxima (the old trick's slow path); exact here
    x[9, 1, 1] = 2e-40
    return x


@pytest.mark.parametrize("step", [exact_module._CPU_STEP, 7])
def test_the_network_argmax_is_torch_s_with_ties_to_the_first_class(step, monkeypatch) -> None:
    monkeypatch.setattr(exact_module, "_CPU_STEP", step)  # 7: many steps and a short last one
    x = _logits(29, 9, 11)
    notices: list[str] = []
    got = network_labels(x, notices)
    assert got.dtype == torch.uint8 and got.shape == (9, 11) and not notices
    assert torch.equal(got, x.argmax(0).to(torch.uint8))
    assert int(got[0, 0]) == 3 and int(got[1, 0]) == 0 and int(got[1, 1]) == 9


def test_a_non_finite_maximum_takes_the_photo_s_finite_stand_ins_with_its_notice() -> None:
    x = _logits(12, 4, 6)
    x[2, 1, 1] = float("nan")
    x[4, 2, 3] = float("inf")
    x[1, 0, 0] = float("-inf")
    notices: list[str] = []
    got = network_labels(x, notices)
    fixed = finite_logits(x.clone(), [])
    assert torch.equal(got, fixed.argmax(0).to(torch.uint8)) and int(got[2, 3]) == 4
    assert notices == ["The segmentation model returned non-finite values; they were ignored."]
    # a -inf below every pixel's maximum changes no label: no second pass, no notice
    y = _logits(12, 4, 6)
    y[0, 2, 2] = float("-inf")
    quiet: list[str] = []
    assert torch.equal(network_labels(y, quiet), y.argmax(0).to(torch.uint8)) and not quiet


def test_nearest_index_takes_the_source_pixel_whose_centre_is_nearest() -> None:
    for n_in in (1, 2, 5, 14, 96, 384):
        for n_out in (1, 3, 7, 99, 120, 640):
            src = nearest_index(n_out, n_in)
            centre = (np.arange(n_out) + 0.5) * n_in / n_out  # output centres in source units
            assert np.all(np.abs(src + 0.5 - centre) <= 0.5 + 1e-12)
            torch_s = F.interpolate(
                torch.arange(n_in, dtype=torch.float64)[None, None, None],
                size=(1, n_out),
                mode="nearest-exact",
            )[0, 0, 0].long()
            off = src != torch_s.numpy()  # only where two centres are equally near
            assert np.allclose(np.abs(src[off] + 0.5 - centre[off]), 0.5)


def test_a_constructed_label_map_is_enlarged_and_shrunk_nearest_neighbour() -> None:
    # three classes in a 2x3 network map: winners placed by hand
    low = torch.tensor([[0, 1, 2], [2, 2, 0]], dtype=torch.uint8)
    logits = torch.full((3, 2, 3), -1.0)
    logits.scatter_(0, low.long()[None], 4.0)
    labels = NearestLabels.from_logits(logits, []).labels((4, 6))
    want = torch.tensor(
        [[0, 0, 1, 1, 2, 2], [0, 0, 1, 1, 2, 2], [2, 2, 2, 2, 0, 0], [2, 2, 2, 2, 0, 0]], dtype=torch.uint8
    )
    assert torch.equal(labels, want)
    assert torch.equal(NearestLabels(low).foreground((4, 6)), want != 0)
    assert torch.equal(NearestLabels(low).labels((1, 3)), low[1:2])  # shrinking: the nearest rows
    with pytest.raises(ValueError, match="positive"):
        NearestLabels(low).labels((0, 3))


@pytest.mark.parametrize("out_hw", [(120, 160), (480, 640), (33, 17)])
def test_live_labels_differ_from_the_exact_ones_only_inside_class_edge_cells(out_hw) -> None:
    """A smooth map (a trained model's kind): where the 2x2 network pixels around an output pixel
    agree both give that class; elsewhere Live's is one of those four."""
    h, w = 48, 36
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    centres = [(10, 10), (30, 20), (20, 30), (40, 5)]
    x = torch.from_numpy(np.stack([-np.hypot(yy - a, xx - b) / 6 for a, b in centres]).astype(np.float32))
    exact = SegLogits.from_logits(x)
    live = NearestLabels.from_logits(x, [])
    assert torch.equal(live.low, exact.low)
    got, want = live.labels(out_hw), exact.labels(out_hw)
    y0, _, _ = exact_module._source_index(out_hw[0], h, torch.device("cpu"))
    x0, _, _ = exact_module._source_index(out_hw[1], w, torch.device("cpu"))
    mixed = exact_module._mixed_cells(exact.low)[y0][:, x0]
    assert torch.equal(got[~mixed], want[~mixed])
    assert bool(mixed.any()) and int((got != want).sum()) <= int(mixed.sum())
    y1, x1 = (y0 + 1).clamp(max=h - 1), (x0 + 1).clamp(max=w - 1)
    corners = [exact.low[a][:, b] for a in (y0, y1) for b in (x0, x1)]
    assert bool(torch.stack([got == c for c in corners]).any(0).all())


def test_a_live_depth_frame_s_foreground_is_the_nearest_enlarged_network_mask(tiny_checkpoints) -> None:
    """Pointmap's finish with Live's borrowed labels: the mask is their nearest enlargement (not
    background) where the depth is valid."""
    pipe = registry.get("pointmap").pipeline(None, checkpoint=tiny_checkpoints["pointmap"], device="cpu")
    intake = load_image(np.zeros((6, 8, 3), np.uint8))
    low = torch.zeros((4, 3), dtype=torch.uint8)
    low[1:3, 1] = 5
    low[0, 2] = 1
    raw = PointmapRaw(pad=PadInfo(0, 0, (6, 8), (6, 8), (6, 8)), seg=NearestLabels(low), scale=1.0)
    raw.pointmap = np.ones((3, 6, 8), np.float32)
    raw.pointmap[2, 5, 7] = -1.0  # behind the camera: never foreground
    result = pipe.finish(raw, intake)
    want = (low.numpy() != 0).take(nearest_index(6, 4), 0).take(nearest_index(8, 3), 1)
    want[5, 7] = False
    np.testing.assert_array_equal(result.mask, want)
    assert result.mask.any()
