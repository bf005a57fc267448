"""SegLogits.labels: the class id per photo pixel from compact network logits, exact.

The rule (the code before its fast paths, written plainly here at full size): an output pixel
whose source cell has 4 corners of one class takes that class; any other mixes its corners'
float32 logits x first (``v00 * (1 - ax) + v01 * ax``), then y, and takes torch's argmax (first
index among ties, NaN wins). Both paths (sparse: only the mixed cells' pixels; dense: strips of
every pixel) must give exactly that, and it must match argmax(F.interpolate(...)) on ordinary
logits.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from sapiens2.data.metadata import SEG_PALETTE
from sapiens2.errors import InputImageError
from sapiens2.outputs import export
from sapiens2.tasks.seg import SegResult
from sapiens2.tasks.seg import seg_logits as seg_module
from sapiens2.tasks.seg.seg_logits import SegLogits, finite_logits
from sapiens2.tasks.seg.seg_render import colorize_labels, label_ids

CPU = torch.device("cpu")
# upscale and downscale, non-integer ratios, 1-pixel sides, and the source size itself
SIZES = [(97, 5), (13, 9), (50, 37), (121, 147), (17, 10), (1, 1), (3, 200)]


def rule_labels(logits: torch.Tensor, out_hw: tuple[int, int]) -> torch.Tensor:
    """The rule labels() implements, at full size (small inputs only)."""
    _, h, w = logits.shape
    y0, y1, wy = seg_module._source_index(out_hw[0], h, CPU)
    x0, x1, wx = seg_module._source_index(out_hw[1], w, CPU)
    v = logits.float()
    top = v[:, y0][:, :, x0] * (1 - wx) + v[:, y0][:, :, x1] * wx
    bottom = v[:, y1][:, :, x0] * (1 - wx) + v[:, y1][:, :, x1] * wx
    mixed_argmax = (top * (1 - wy)[:, None] + bottom * wy[:, None]).argmax(0)
    low = v.argmax(0)
    mixed = seg_module._mixed_cells(low)[y0][:, x0]
    return torch.where(mixed, mixed_argmax, low[y0][:, x0]).to(torch.uint8)


def blobs(gen: torch.Generator, c: int, h: int, w: int) -> torch.Tensor:
    """Smooth logits: a few large class regions, boundaries on a few % of the cells."""
    coarse = torch.randn(1, c, 3, 4, generator=gen) * 4
    return F.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=False)[0]


def cases() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    partial = blobs(gen, 29, 40, 30)
    partial[:, :12] = torch.randn(29, 12, 30, generator=gen)
    huge = torch.randn(29, 33, 21, generator=gen).sign() * 3e38  # mixes overflow: inf, and inf * 0 = NaN
    return {
        "random": torch.randn(29, 40, 30, generator=gen),  # a tiny random model: nearly all cells mixed
        "blobs": blobs(gen, 29, 40, 30),
        "partial": partial,
        "ties": torch.randint(0, 3, (29, 24, 18), generator=gen).float(),  # exact ties everywhere
        "huge": huge,
        "zero": torch.zeros(7, 9, 8),  # every class ties; maxima 0 take _argmax's safe path
        "tiny": torch.randn(5, 20, 17, generator=gen) * 1e-38,  # subnormal differences
        "nonfinite": finite_logits(
            torch.where(torch.rand(6, 16, 12, generator=gen) < 0.2, float("nan"), torch.randn(6, 16, 12)), []
        ),
    }


@pytest.fixture(params=[1 << 20, 29 * 50], ids=["default-steps", "many-steps"])
def steps(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """Both the default step and a small one (several strips and steps even on small images)."""
    monkeypatch.setattr(seg_module, "_STEP", {"cpu": request.param, "cuda": request.param})
    return request.param


@pytest.mark.slow
@pytest.mark.parametrize("case", list(cases()))
def test_both_paths_follow_the_rule_exactly(case: str, steps: int) -> None:
    logits = cases()[case]
    compact = SegLogits.from_logits(logits)
    assert torch.equal(compact.low, logits.argmax(0).to(torch.uint8))
    for out_hw in [*SIZES, tuple(logits.shape[1:])]:
        rule = rule_labels(logits, out_hw)
        dense = compact.labels(out_hw, dense=True)
        sparse = compact.labels(out_hw, dense=False)
        assert dense.dtype == torch.uint8 and dense.shape == out_hw
        assert torch.equal(dense, rule), (case, out_hw)
        assert torch.equal(sparse, rule), (case, out_hw)
        assert torch.equal(compact.labels(out_hw), rule)


@pytest.mark.parametrize("case", ["random", "blobs", "partial"])
def test_labels_are_the_argmax_of_interpolate(case: str) -> None:
    logits = cases()[case]
    compact = SegLogits.from_logits(logits)
    for out_hw in SIZES:
        full = F.interpolate(logits[None], size=out_hw, mode="bilinear", align_corners=False)[0].argmax(0)
        for dense in (True, False):
            assert torch.equal(compact.labels(out_hw, dense=dense).long(), full), (case, out_hw, dense)


def test_path_choice_follows_the_mixed_fraction(monkeypatch: pytest.MonkeyPatch) -> None:
    chosen: list[str] = []
    for name in ("_dense_labels", "_sparse_labels"):
        real = getattr(SegLogits, name)

        def spy(self: SegLogits, *args: object, _real=real, _name=name) -> torch.Tensor:
            chosen.append(_name)
            return _real(self, *args)

        monkeypatch.setattr(SegLogits, name, spy)
    for case in ("random", "blobs"):
        SegLogits.from_logits(cases()[case]).labels((50, 37))
    assert chosen == ["_dense_labels", "_sparse_labels"]


def test_from_logits_keeps_every_pixel_without_a_gather_when_all_are_needed() -> None:
    logits = torch.randn(29, 40, 30, generator=torch.Generator().manual_seed(1))
    compact = SegLogits.from_logits(logits)
    assert torch.equal(compact.index, torch.arange(40 * 30, dtype=torch.int32))  # salt and pepper: all
    assert torch.equal(compact.values, logits.reshape(29, -1)[:, compact.index.long()])


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_vectorised_argmax_is_torchs(dim: int, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(2)
    ties = torch.randint(1, 4, (7, 33, 5), generator=gen).float()  # many exact ties, maxima >= 1
    ties[torch.rand(ties.shape, generator=gen) < 0.1] = -0.0  # -0.0 == 0.0 off the maximum
    signed = torch.randn(3, 256, 2, generator=gen)
    special = ties.clone()
    special[0, 0, 0], special[3, 1, 1], special[5, 2, 2] = float("nan"), float("inf"), float("-inf")
    zeros = torch.zeros(4, 6, 3)
    zeros[1, 2, 0] = -0.0
    real_argmax = torch.Tensor.argmax
    slow: list[int] = []

    def counted(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        slow.append(1)
        return real_argmax(self, *args, **kwargs)

    for t, fast in ((ties, True), (signed, True), (ties * 1e-39, False), (special, False), (zeros, False)):
        expected = real_argmax(t, dim)
        monkeypatch.setattr(torch.Tensor, "argmax", counted)
        ours = seg_module._argmax(t, dim)
        work = t.clone()
        in_place = seg_module._argmax(work, dim, work)
        monkeypatch.undo()
        assert ours.dtype == torch.uint8
        assert torch.equal(ours.long(), expected) and torch.equal(in_place.long(), expected)
        assert (not slow) == fast  # the fast path where it is exact, torch's argmax elsewhere
        slow.clear()


# ----------------------------------------------------------------------------- colour PNG


def test_color_png_is_a_palette_png_that_decodes_to_colorize_labels(tmp_path) -> None:
    labels = np.arange(29 * 4, dtype=np.uint8).reshape(4, 29) % 29  # every class
    labels[0, :3] = [200, 29, 255]  # unknown ids: background, as colorize_labels shows them
    res = SegResult(image=np.zeros((4, 29, 3), np.uint8), info=None, name="p", labels=labels, shares={})
    res.save(tmp_path)
    with Image.open(tmp_path / "p_seg_color.png") as im:
        assert im.mode == "P"
        rgb = np.asarray(im.convert("RGB"))
    assert np.array_equal(rgb, colorize_labels(labels))


def test_write_png_palette_round_trips_and_rejects_bad_input(tmp_path) -> None:
    ids = np.random.default_rng(0).integers(0, 29, (31, 17), dtype=np.uint8)
    path = export.write_png_palette(tmp_path / "sub" / "c.png", ids, SEG_PALETTE)
    with Image.open(path) as im:
        assert im.mode == "P" and np.array_equal(np.asarray(im), ids)
        assert np.array_equal(np.asarray(im.convert("RGB")), SEG_PALETTE[ids])
    assert np.array_equal(label_ids(ids), ids)
    for bad, pal, match in [
        (ids.astype(np.int32), SEG_PALETTE, "uint8 ids"),
        (ids[None], SEG_PALETTE, "uint8 ids"),
        (ids, SEG_PALETTE[:, :2], "palette"),
        (ids, SEG_PALETTE[:5], "outside"),
    ]:
        with pytest.raises(InputImageError, match=match):
            export.write_png_palette(tmp_path / "bad.png", bad, pal)


def test_the_dense_path_splits_rows_over_single_threaded_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool's threads run torch on themselves alone (no OpenMP team per operation) and leave
    the caller's thread count as it was; with or without them the labels are the same."""
    pool = seg_module._row_pool()
    if pool is None:
        pytest.skip("one CPU, or no OpenMP runtime whose thread count can be set per thread")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert {pool.submit(torch.get_num_threads).result() for _ in range(8)} == {1}
        assert torch.get_num_threads() == 2
        logits = cases()["random"]
        compact = SegLogits.from_logits(logits)
        monkeypatch.setattr(seg_module, "_STEP", {"cpu": 29 * 50, "cuda": 29 * 50})  # several strips
        used: list[int] = []
        real = pool.submit
        monkeypatch.setattr(pool, "submit", lambda *a, **k: used.append(1) or real(*a, **k))
        split = compact.labels((97, 61), dense=True)
        assert len(used) >= 2  # the groups ran on the pool
        monkeypatch.setattr(seg_module, "_row_pool", lambda: None)
        assert torch.equal(split, compact.labels((97, 61), dense=True))
        assert torch.equal(split, rule_labels(logits, (97, 61)))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.parametrize("case", [*cases(), "raw-nan"])
def test_the_foreground_is_labels_not_background_exactly(case: str, steps: int) -> None:
    """``foreground`` (the mask normal, pointmap and albedo borrow) skips the argmax on the dense
    path; it must still be ``labels != 0`` to the pixel: ties go to the background, a NaN to argmax."""
    if case == "raw-nan":  # NaN logits as a model could return them (the pipeline replaces them first)
        gen = torch.Generator().manual_seed(5)
        logits = torch.randn(6, 16, 12, generator=gen)
        logits[torch.rand(logits.shape, generator=gen) < 0.1] = float("nan")
    else:
        logits = cases()[case]
    compact = SegLogits.from_logits(logits)
    for out_hw in [*SIZES, tuple(logits.shape[1:])]:
        for dense in (True, False):
            expected = compact.labels(out_hw, dense=dense) != 0
            got = compact.foreground(out_hw, dense=dense)
            assert got.dtype == torch.bool and torch.equal(got, expected), (case, out_hw, dense)
        if case != "raw-nan":
            assert torch.equal(compact.foreground(out_hw), rule_labels(logits, out_hw) != 0)


def test_beats_background_gives_ties_to_the_background_and_leaves_nan_to_argmax() -> None:
    x = torch.tensor(
        [
            [
                [1.0, 1.0, 0.0, -0.0],  # the background class, one value per column
                [2.0, 1.0, 0.0, 0.0],  # a tie in columns 1-3 (-0.0 == 0.0)
                [0.0, 0.0, -1.0, 0.0],
            ]
        ]
    )  # (1, C=3, w=4)
    assert seg_module._beats_background(x).tolist() == [[True, False, False, False]]
    assert torch.equal(seg_module._beats_background(x), x.argmax(1) != 0)
    x[0, 1, 0] = float("nan")
    assert seg_module._beats_background(x) is None
