"""Rendering: skeletons, segmentation, normals, depth, composites, PCA (numpy only, small images)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from sapiens2.data.metadata import (
    KEYPOINT_COLORS,
    KEYPOINT_GROUPS,
    NUM_KEYPOINTS,
    SEG_CLASS_NAMES,
    SEG_PALETTE,
    seg_class_ids,
)
from sapiens2.errors import InputImageError, OptionError
from sapiens2.outputs import render
from sapiens2.tasks.features import features_render
from sapiens2.tasks.matting import matting_render
from sapiens2.tasks.normal import normal_render
from sapiens2.tasks.pose import pose_render
from sapiens2.tasks.seg import seg_render

H, W = 120, 160


def _patch(img: np.ndarray, x: float, y: float, r: int = 3) -> np.ndarray:
    return img[int(y) - r : int(y) + r + 1, int(x) - r : int(x) + r + 1]


def _person(points: dict[int, tuple[float, float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """One person: NaN everywhere except the given index -> (x, y, score)."""
    kp = np.full((1, NUM_KEYPOINTS, 2), np.nan)
    sc = np.zeros((1, NUM_KEYPOINTS))
    for k, (x, y, s) in points.items():
        kp[0, k], sc[0, k] = (x, y), s
    return kp, sc


# ---------------------------------------------------------------- output contract


def test_every_renderer_returns_rgb_uint8_of_the_input_size() -> None:
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
    labels = rng.integers(0, 29, (H, W))
    kp = rng.random((2, NUM_KEYPOINTS, 2)) * [W, H]
    outs = [
        pose_render.draw_pose(img, kp, rng.random((2, NUM_KEYPOINTS))),
        seg_render.colorize_labels(labels),
        seg_render.blend_segmentation(img, labels),
        normal_render.normals_to_rgb(rng.normal(size=(H, W, 3)), labels > 0, background=img),
        render.depth_to_turbo(rng.random((H, W)) + 1, labels > 0),
        matting_render.composite(rng.random((H, W, 3)) * 0.5, rng.random((H, W))),
        features_render.pca_rgb(rng.normal(size=(16, 12, 16)), out_hw=(H, W)),
    ]
    for out in outs:
        assert out.shape == (H, W, 3) and out.dtype == np.uint8


def test_nan_and_inf_inputs_give_finite_uint8_without_crashing() -> None:
    bad = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30])
    rng = np.random.default_rng(1)
    img = np.zeros((H, W, 3), np.uint8)
    kp = rng.choice(bad, size=(2, NUM_KEYPOINTS, 2))
    kp[:, :20] = rng.random((2, 20, 2)) * [W, H]  # mix of valid and broken points
    sc = rng.choice(np.r_[bad, 0.9], size=(2, NUM_KEYPOINTS))
    normals = rng.choice(bad, size=(H, W, 3))
    feats = rng.normal(size=(8, 6, 8))
    feats[0, 0, 0], feats[3, 2, 2], feats[5, 1, 1] = np.nan, np.inf, 1e30
    outs = [
        pose_render.draw_pose(img, kp, sc, boxes=[[np.nan, 0, 10, 10], [1e30, -1e30, 5, 5]]),
        seg_render.colorize_labels(rng.choice(bad, size=(H, W))),
        seg_render.blend_segmentation(img, rng.choice(bad, size=(H, W))),
        normal_render.normals_to_rgb(normals),
        render.depth_to_turbo(rng.choice(np.r_[bad, 2.0, 3.0], size=(H, W)), np.ones((H, W), bool)),
        render.depth_to_turbo(np.full((H, W), np.nan), np.ones((H, W), bool)),
        matting_render.composite(rng.choice(bad, size=(H, W, 3)), rng.choice(bad, size=(H, W))),
        features_render.pca_rgb(feats, out_hw=(H, W)),
        features_render.pca_rgb(np.full((4, 5, 5), np.nan)),
    ]
    for out in outs:
        assert out.dtype == np.uint8 and out.ndim == 3


# ---------------------------------------------------------------- pose


def test_pose_draws_visible_points_and_links_and_skips_low_scores() -> None:
    img = np.zeros((H, W, 3), np.uint8)
    # left ankle (13) - left knee (11) is a green link; left elbow (7) is scored below threshold
    kp, sc = _person({13: (20, 60, 0.9), 11: (100, 60, 0.9), 7: (140, 20, 0.1)})
    out = pose_render.draw_pose(img, kp, sc, threshold=0.3)
    assert not out.any(axis=2).all() and img.max() == 0  # input untouched
    assert np.abs(_patch(out, 20, 60).astype(int) - KEYPOINT_COLORS[13]).sum(axis=2).min() <= 3
    mid = _patch(out, 60, 60, 1)
    assert mid[..., 1].max() > 150 and mid[..., 0].max() < 60  # the link's green (0, 255, 0)
    assert _patch(out, 140, 20, 6).max() == 0
    assert _patch(pose_render.draw_pose(img, kp, sc, threshold=0.05), 140, 20).max() > 0


def test_pose_face_and_body_only_options_change_what_is_drawn() -> None:
    img = np.zeros((H, W, 3), np.uint8)
    face, hand, knee = int(KEYPOINT_GROUPS["face"][10]), 21, 11
    kp, sc = _person({face: (30, 30, 1.0), hand: (120, 30, 1.0), knee: (70, 90, 1.0)})
    full = pose_render.draw_pose(img, kp, sc)
    no_face = pose_render.draw_pose(img, kp, sc, show_face=False)
    body = pose_render.draw_pose(img, kp, sc, body_only=True)
    assert _patch(full, 30, 30).max() > 0 and _patch(no_face, 30, 30, 6).max() == 0
    assert _patch(full, 120, 30).max() > 0 and _patch(body, 120, 30, 6).max() == 0
    assert _patch(body, 70, 90).max() > 0 and _patch(body, 30, 30, 6).max() == 0


def test_pose_sizes_scale_with_the_image_and_boxes_are_drawn() -> None:
    assert pose_render.pose_style(1024, 768) == (2, 3)
    assert pose_render.pose_style(1080, 1920) == (4, 6)
    assert pose_render.pose_style(10, 10) == (1, 2)
    kp, sc = _person({})
    out = pose_render.draw_pose(np.zeros((H, W, 3), np.uint8), kp, sc, boxes=[[10, 10, 100, 80]])
    r, g, b = out[10, 50].tolist()  # antialiased edge of the green box
    assert g > 150 and r == b == 0 and out[45, 50].max() == 0


def test_pose_rejects_bad_threshold_and_shapes() -> None:
    kp, sc = _person({})
    img = np.zeros((8, 8, 3), np.uint8)
    with pytest.raises(OptionError, match=r"threshold must be a number in \[0, 1\]"):
        pose_render.draw_pose(img, kp, sc, threshold=1.5)
    with pytest.raises(InputImageError, match=r"keypoints must have shape \(P, 308, 2\)"):
        pose_render.draw_pose(img, np.zeros((1, 17, 2)), sc)
    with pytest.raises(InputImageError, match=r"scores must have shape \(1, 308\)"):
        pose_render.draw_pose(img, kp, np.zeros((1, 17)))


# ---------------------------------------------------------------- segmentation


def test_colorize_and_blend_follow_the_palette_and_formula() -> None:
    labels = np.array([[0, 4], [15, 99]])  # 99 is not a class: shown as background
    img = np.full((2, 2, 3), 200, np.uint8)
    colours = seg_render.colorize_labels(labels)
    assert (colours[0, 1] == SEG_PALETTE[4]).all() and (colours[1, 1] == SEG_PALETTE[0]).all()
    blend = seg_render.blend_segmentation(img, labels, opacity=0.5).astype(int)
    expected = (img.astype(int) + SEG_PALETTE[np.where(labels == 99, 0, labels)]) / 2
    assert np.abs(blend - expected).max() <= 1  # background (class 0) is blended too
    kept = seg_render.blend_segmentation(img, labels, classes=["hair"])
    assert (kept[0, 1] == blend[0, 1]).all() and (kept[[0, 1, 1], [0, 0, 1]] == 200).all()
    assert (seg_render.blend_segmentation(img, labels, classes=[4]) == kept).all()


def test_blend_rejects_bad_opacity_and_mismatched_labels() -> None:
    img = np.zeros((4, 4, 3), np.uint8)
    with pytest.raises(OptionError, match=r"opacity must be a number in \[0, 1\]"):
        seg_render.blend_segmentation(img, np.zeros((4, 4), int), opacity=2)
    with pytest.raises(InputImageError, match="label map has size"):
        seg_render.blend_segmentation(img, np.zeros((3, 4), int))


def test_legend_lists_exactly_the_classes_present() -> None:
    labels = np.zeros((20, 20), int)
    labels[:5] = 4  # Hair: 25 %
    labels[5:7] = 15  # Right_Hand: 10 %
    present = np.unique(labels)
    shares = seg_render.class_shares(labels)
    assert shares[4] == pytest.approx(0.25) and shares.sum() == pytest.approx(1.0)
    legend = seg_render.segmentation_legend(present, shares)
    assert legend.dtype == np.uint8 and legend.shape[
        0
    ] == 2 * seg_render.LEGEND_PAD + seg_render.LEGEND_ROW_H * len(present)
    flat = legend.reshape(-1, 3)
    for c in range(len(SEG_CLASS_NAMES)):
        colour = SEG_PALETTE[c]
        count = int((flat == colour).all(axis=1).sum())
        if c in present:
            assert count >= seg_render.LEGEND_SWATCH**2
        elif len(set(colour.tolist())) > 1:  # grey colours may appear in antialiased text
            assert count == 0, SEG_CLASS_NAMES[c]
    assert seg_render.segmentation_legend([]).shape[0] == 2 * seg_render.LEGEND_PAD + seg_render.LEGEND_ROW_H
    with pytest.raises(OptionError, match="Valid classes .*Background, Apparel"):
        seg_render.segmentation_legend([3, 40])


def _text_height(legend: np.ndarray) -> int:
    """Rows of the first entry's text (dark pixels right of the swatch): the glyphs' height."""
    x0 = seg_render.LEGEND_PAD * 2 + seg_render.LEGEND_SWATCH
    dark = (legend[: seg_render.LEGEND_PAD + seg_render.LEGEND_ROW_H, x0:] < 100).all(axis=2).any(axis=1)
    rows = np.flatnonzero(dark)
    return int(rows[-1] - rows[0] + 1)


def test_legend_text_is_readable_and_skips_classes_at_zero_percent() -> None:
    labels = np.zeros((100, 100), int)
    labels[:30] = 4  # Hair: 30 %
    labels[0, 0] = 7  # 0.01 %: prints as 0.0 %, so it is left out
    shares = seg_render.class_shares(labels)
    legend = seg_render.segmentation_legend(np.unique(labels), shares)
    assert (
        legend.shape[0] == 2 * seg_render.LEGEND_PAD + 2 * seg_render.LEGEND_ROW_H
    )  # Background and Hair only
    assert (legend.reshape(-1, 3) == SEG_PALETTE[7]).all(axis=1).sum() == 0
    assert _text_height(legend) >= 16  # capitals about 17 px high (the old legend: 11 px, shown ~8 px)
    # many classes: columns, so the legend stays wide rather than tall
    everything = seg_render.segmentation_legend(range(len(SEG_CLASS_NAMES)))
    assert (
        everything.shape[0]
        == 2 * seg_render.LEGEND_PAD + seg_render.LEGEND_ROW_H * seg_render.LEGEND_ROWS_PER_COLUMN
    )
    assert everything.shape[1] > everything.shape[0]


def test_seg_class_ids_matches_loosely_and_lists_valid_names_on_error() -> None:
    assert seg_class_ids(["left hand", "LEFT_HAND", "Face-Neck", 0]) == [0, 3, 6]
    with pytest.raises(OptionError) as err:
        seg_class_ids(["hair", "wings"])
    msg = str(err.value)
    assert "'wings'" in msg and all(name in msg for name in SEG_CLASS_NAMES)


# ---------------------------------------------------------------- normals and depth


def test_normals_map_axes_to_channels_and_mask_shows_background() -> None:
    n = np.zeros((2, 3, 3), np.float32)
    n[0, 0] = (1, 0, 0)
    n[0, 1] = (0, -1, 0)
    n[0, 2] = (0, 0, 1)
    n[1, :] = (0, 0, 1)
    n[1, 2] = np.nan
    mask = np.array([[True, True, True], [False, True, True]])
    photo = np.full((2, 3, 3), 7, np.uint8)
    out = normal_render.normals_to_rgb(n, mask)
    assert out[0].tolist() == [[255, 128, 128], [128, 0, 128], [128, 128, 255]]
    assert out[1, 0].tolist() == [0, 0, 0] and out[1, 2].tolist() == [0, 0, 0]
    on_photo = normal_render.normals_to_rgb(n, mask, background=photo)
    assert on_photo[1, 0].tolist() == [7, 7, 7] and on_photo[1, 1].tolist() == [128, 128, 255]
    with pytest.raises(OptionError, match="'black', 'white' or an image"):
        normal_render.normals_to_rgb(n, background="purple")


def test_turbo_bounds_are_the_foreground_percentiles() -> None:
    lut = render.turbo_lut()
    depth = np.full(121, 1000.0)
    depth[:101] = 1.0 + np.arange(101)  # foreground 1..101 -> 1st pct = 2, 99th pct = 100
    mask = np.zeros(121, bool)
    mask[:101] = True
    out = render.depth_to_turbo(depth.reshape(11, 11), mask.reshape(11, 11)).reshape(-1, 3)
    assert out[1].tolist() == lut[255].tolist()  # depth 2: near bound -> red end
    assert out[99].tolist() == lut[0].tolist()  # depth 100: far bound -> blue end
    assert out[0].tolist() == lut[255].tolist() and out[100].tolist() == lut[0].tolist()  # clipped
    assert (out[101:] == 100).all()  # background grey
    flat = render.depth_to_turbo(np.full((3, 3), 2.0), np.ones((3, 3), bool))
    assert (flat == lut[128]).all()
    empty = render.depth_to_turbo(np.ones((3, 3)), np.zeros((3, 3), bool), background=(1, 2, 3))
    assert (empty == [1, 2, 3]).all()
    with pytest.raises(OptionError, match="0 <= low < high <= 100"):
        render.depth_to_turbo(depth.reshape(11, 11), percentiles=(99, 1))


# ---------------------------------------------------------------- matting


def test_composite_equals_the_formula() -> None:
    fg = np.array([[[0.2, 0.1, 0.0], [0.9, 0.9, 0.9]]], np.float32)
    alpha = np.array([[0.5, 0.25]], np.float32)
    bg = np.array([100, 50, 0], np.float32) / 255
    expected = np.clip(fg + (1 - alpha[..., None]) * bg, 0, 1) * 255
    out = matting_render.composite(fg, alpha, (100, 50, 0))
    assert np.abs(out - expected).max() <= 0.5 + 1e-4
    assert out[0, 1].tolist() == [255, 255, 230]  # red and green clamped
    green = matting_render.composite(np.zeros((1, 1, 3)), np.zeros((1, 1)))
    assert green[0, 0].tolist() == list(matting_render.CHROMA_GREEN)
    assert matting_render.composite(np.zeros((1, 1, 3)), np.zeros((1, 1)), "#ff8000")[0, 0].tolist() == [
        255,
        128,
        0,
    ]
    with pytest.raises(OptionError, match="three numbers in 0-255"):
        matting_render.composite(fg, alpha, (300, 0, 0))
    with pytest.raises(OptionError, match="'#rrggbb'"):
        matting_render.composite(fg, alpha, "#zz")


@pytest.mark.parametrize("mode", ["RGBA", "L", "RGB", "numpy-L", "numpy-RGBA"])
def test_composite_background_image_of_other_size_and_mode(mode: str) -> None:
    ramp = np.tile(np.linspace(0, 255, 40).astype(np.uint8), (10, 1))  # 10 x 40, varies along x
    rgb = np.stack([ramp, ramp, ramp], axis=2)
    if mode == "RGBA":
        bg = Image.fromarray(np.dstack([rgb, np.full_like(ramp, 255)]), "RGBA")
    elif mode == "L":
        bg = Image.fromarray(ramp, "L")
    elif mode == "RGB":
        bg = Image.fromarray(rgb, "RGB")
    elif mode == "numpy-L":
        bg = ramp
    else:
        bg = np.dstack([rgb, np.full_like(ramp, 255)])
    out = matting_render.composite(np.zeros((20, 20, 3)), np.zeros((20, 20)), bg)
    assert out.shape == (20, 20, 3) and out.dtype == np.uint8
    # cover: 10x40 -> 20x80, centre crop keeps the middle quarter of the ramp
    assert 80 < out[10, 0, 0] < 110 and 145 < out[10, 19, 0] < 175
    assert (out[:, :, 0] == out[:, :, 1]).all()


def test_cover_resize_of_a_transparent_background_uses_white() -> None:
    clear = np.zeros((5, 5, 4), np.uint8)
    assert (matting_render.cover_resize(clear, (3, 7)) == 255).all()


def test_cover_resize_of_an_extreme_strip_stays_small() -> None:
    strip = np.zeros((2, 10000, 3), np.uint8)
    strip[:, 4990:5010] = 255  # covering 50 x 60 keeps only ~2 source columns: the white centre
    out = matting_render.cover_resize(strip, (50, 60))
    assert out.shape == (50, 60, 3) and out.min() == 255
    strip[:, 4990:5010], strip[:, :100] = 0, 255
    assert matting_render.cover_resize(strip, (50, 60)).max() == 0


# ---------------------------------------------------------------- PCA


def test_pca_rgb_recovers_the_leading_component_and_honours_the_mask() -> None:
    rng = np.random.default_rng(3)
    d, h, w = 100, 10, 12  # D > 64 and N > 64: the randomised path
    scores = rng.normal(size=(h * w, 3)) * [10.0, 5.0, 2.0]
    basis = np.linalg.qr(rng.normal(size=(d, 3)))[0]
    x = scores @ basis.T + rng.normal(size=(h * w, d)) * 0.01
    feats = x.T.reshape(d, h, w)
    out = features_render.pca_rgb(feats)
    assert out.shape == (h, w, 3)
    corr = np.corrcoef(out[..., 0].ravel().astype(float), scores[:, 0])[0, 1]
    assert abs(corr) > 0.95
    assert (features_render.pca_rgb(feats) == out).all()  # deterministic
    mask = np.zeros((h, w), bool)
    mask[:, : w // 2] = True
    masked = features_render.pca_rgb(feats, mask=mask)
    assert masked[:, w // 2 :].max() == 0 and masked[:, : w // 2].max() > 0
    small = features_render.pca_rgb(feats[:2])  # fewer than 3 channels: missing components stay 0
    assert small[..., 2].max() == 0 and small[..., 0].max() > 0
    with pytest.raises(InputImageError, match=r"\(D, h, w\)"):
        features_render.pca_rgb(np.zeros((3, 3)))


@pytest.mark.parametrize("block", [1, 7, 53 * 3 + 5, 1 << 20])
def test_depth_colours_in_blocks_of_rows_equal_the_whole_picture_at_once(monkeypatch, block: int) -> None:
    """depth_to_turbo works through blocks of rows (small temporaries); every pixel must get what
    the whole-picture computation gives it, including NaN, negative and masked-out pixels."""
    from sapiens2.outputs import render as R

    rng = np.random.default_rng(3)
    depth = (1.5 + 2 * rng.random((41, 53))).astype(np.float32)
    depth[rng.random(depth.shape) < 0.05] = np.nan
    depth[rng.random(depth.shape) < 0.05] = -1.0
    mask = rng.random(depth.shape) < 0.8

    def whole(d: np.ndarray, m: np.ndarray | None, lo: float, hi: float) -> np.ndarray:
        lut = np.vstack([R.turbo_lut(), np.full((1, 3), 100, np.uint8)])
        fg = np.isfinite(d) & (d > 0) & (True if m is None else m)
        index = np.full(d.shape, 256, np.intp)
        vals = d[fg]
        near, far = np.percentile(vals, [lo, hi])
        t = (1.0 / vals - 1.0 / far) / (1.0 / near - 1.0 / far)
        index[fg] = np.round(np.clip(t, 0.0, 1.0) * 255)
        return lut[index]

    monkeypatch.setattr(R, "_RENDER_BLOCK", block)
    for m, (lo, hi) in ((mask, (1.0, 99.0)), (None, (0.0, 100.0)), (mask, (10.0, 60.0))):
        got = R.depth_to_turbo(depth, m, percentiles=(lo, hi))
        np.testing.assert_array_equal(got, whole(depth, m, lo, hi))
    flat = R.depth_to_turbo(np.full((5, 9), 2.0, np.float32))  # one depth: mid-scale everywhere
    assert (flat == R.turbo_lut()[128]).all()
