"""The dense pipelines feed the network, and map its outputs back, exactly as the release does
(SPEC section 4.1), checked against straightforward cv2 / PIL / F.interpolate implementations of
each rule written here; bf16 models keep their outputs' resolution; what crosses the device
boundary stays small.

Photos: 600x471 and 471x600 (W x H: landscape and portrait, truncation and odd padding) and
3400x4300 (more than 4x the 768x1024 input both ways; read with a long-side limit above it so
the rule sees the photo itself).
"""

from __future__ import annotations

import pickle

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from sapiens2.inputs.intake import load_image
from sapiens2.models.loading import load_model
from sapiens2.models.nn.outputs import MattingOutput, NormalOutput, PointmapOutput, SegOutput
from sapiens2.models.zoo import IMAGE_MEAN, IMAGE_STD
from sapiens2.tasks.matting import MattingPipeline
from sapiens2.tasks.normal import NormalPipeline
from sapiens2.tasks.pointmap import PointmapPipeline
from sapiens2.tasks.seg import SegLogits, SegPipeline

NET_W, NET_H = 768, 1024
SIZES = [(600, 471), (471, 600), (3400, 4300)]  # (W, H)
MEAN, STD = np.array(IMAGE_MEAN) * 255, np.array(IMAGE_STD) * 255


def photo(w: int, h: int, seed: int = 0) -> np.ndarray:
    """Smooth gradients plus sensor-like noise: resampling rules differ visibly on it."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([xx / w * 200, yy / h * 200, 100 + 80 * np.sin(xx / 37 + yy / 23)], -1)
    return np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)


def intake(w: int, h: int):
    return load_image(photo(w, h), max_side=8192)


def field(c: int, h: int, w: int, seed: int = 0) -> torch.Tensor:
    """A smooth random (1, c, h, w) field (a few bumps), like a network's dense output."""
    gen = torch.Generator().manual_seed(seed)
    return F.interpolate(torch.randn(1, c, 6, 5, generator=gen), size=(h, w), mode="bicubic")


class Recorder(torch.nn.Module):
    """A fake model: records its input, returns ``make(x)``."""

    def __init__(self, make) -> None:
        super().__init__()
        self.make, self.seen = make, []
        self.anchor = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor):
        self.seen.append(x.clone())
        return self.make(x)


def seg_model() -> Recorder:
    return Recorder(lambda x: SegOutput(logits=field(29, *x.shape[-2:]).expand(len(x), -1, -1, -1) * 4))


def pointmap_model() -> Recorder:
    def make(x):
        pm = field(3, *x.shape[-2:], seed=1) + torch.tensor([0.0, 0.0, 3.0]).view(1, 3, 1, 1)
        return PointmapOutput(pointmap=pm.expand(len(x), -1, -1, -1), scale=torch.full((len(x), 1), 0.5))

    return Recorder(make)


def normal_model() -> Recorder:
    return Recorder(
        lambda x: NormalOutput(normals=field(3, *x.shape[-2:], seed=2).expand(len(x), -1, -1, -1))
    )


def matting_model() -> Recorder:
    def make(x):
        out = field(4, *x.shape[-2:], seed=3).sigmoid().expand(len(x), -1, -1, -1)
        return MattingOutput(foreground=out[:, :3], alpha=out[:, 3:])

    return Recorder(make)


def as_pixels(x: torch.Tensor) -> np.ndarray:
    """The model's normalised input back to 0-255 (H, W, 3)."""
    return x[0].permute(1, 2, 0).double().numpy() * STD + MEAN


# ----------------------------------------------------------------- reference implementations


def release_stretch(img: np.ndarray) -> np.ndarray:
    h, w = img.shape[:2]
    flag = cv2.INTER_AREA if NET_W < w else cv2.INTER_CUBIC
    return cv2.resize(img, (NET_W, NET_H), interpolation=flag)


def release_letterbox(img: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    h, w = img.shape[:2]
    scale = min(NET_W / w, NET_H / h)
    nw, nh = int(w * scale), int(h * scale)
    left, top = (NET_W - nw) // 2, (NET_H - nh) // 2
    canvas = np.zeros((NET_H, NET_W, 3), np.uint8)
    canvas[top : top + nh, left : left + nw] = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_LINEAR)
    return canvas, (top, left, nh, nw)


def release_pointmap_back(pm: np.ndarray, box, scale: float, out_hw) -> np.ndarray:
    """(3, 1024, 768) canonical -> (H, W, 3) metric, the demo's way."""
    top, left, nh, nw = box
    crop = np.ascontiguousarray(pm[:, top : top + nh, left : left + nw].transpose(1, 2, 0)) / scale
    if out_hw[0] > nh or out_hw[1] > nw:
        for _ in range(4):
            crop = cv2.GaussianBlur(crop, (3, 3), 0.8, borderType=cv2.BORDER_REFLECT_101)
    return cv2.resize(crop, (out_hw[1], out_hw[0]), interpolation=cv2.INTER_LINEAR)


# ----------------------------------------------------------------------------- inputs


@pytest.mark.slow
@pytest.mark.parametrize("wh", SIZES)
def test_seg_input_is_the_release_stretch(wh) -> None:
    model = seg_model()
    pipe = SegPipeline(model=model)
    item = intake(*wh)
    ref = release_stretch(item.rgb)
    prep = pipe.prepare(item)
    assert prep.pixels.dtype == np.uint8 and np.array_equal(prep.pixels, ref)  # exact
    pipe.infer([prep])
    assert np.abs(as_pixels(model.seen[0]) - ref).max() < 1e-3  # normalised on the device, nothing else


@pytest.mark.slow
@pytest.mark.parametrize("wh", SIZES)
@pytest.mark.parametrize("cls", [NormalPipeline, PointmapPipeline])
def test_letterbox_is_the_release_rule(wh, cls) -> None:
    model = pointmap_model() if cls is PointmapPipeline else normal_model()
    pipe = cls(model=model)
    item = intake(*wh)
    ref, (top, left, nh, nw) = release_letterbox(item.rgb)
    prep = pipe.prepare(item, use_segmentation=False, remove_background=False)
    assert np.array_equal(prep.pixels, ref)
    assert (prep.pad.top, prep.pad.left, prep.pad.inner_hw) == (top, left, (nh, nw))
    pipe.infer([prep])
    assert np.abs(as_pixels(model.seen[0]) - ref).max() < 1e-3


def test_truncation_differs_from_rounding_on_a_landscape_photo() -> None:
    """600x471: 471 * 1.28 = 602.88 -> 602 rows (rounding gave 603 and moved the picture)."""
    prep = NormalPipeline(model=normal_model()).prepare(intake(600, 471))
    assert prep.pad.inner_hw == (602, 768) and prep.pad.top == 211


@pytest.mark.slow
@pytest.mark.parametrize("wh", SIZES)
def test_matting_input_is_transformers_antialiased_bilinear(wh) -> None:
    item = intake(*wh)
    prep = MattingPipeline(model=matting_model()).prepare(item)
    ref = np.asarray(Image.fromarray(item.rgb).resize((NET_W, NET_H), Image.BILINEAR))
    # torch's uint8 antialiased bilinear is Pillow's algorithm; large shrinks round 0.1% of
    # values one grey level apart
    diff = np.abs(prep.pixels.astype(int) - ref)
    assert diff.max() <= 1 and (diff > 0).mean() < 0.005


# ----------------------------------------------------------------------------- outputs


@pytest.mark.slow
@pytest.mark.parametrize("wh", SIZES)
def test_pointmap_back_to_the_photo_is_the_release_rule(wh) -> None:
    model = pointmap_model()
    item = intake(*wh)
    res = PointmapPipeline(model=model)(item, use_segmentation=False)
    net = model.make(model.seen[0]).pointmap[0].numpy()
    _, box = release_letterbox(item.rgb)
    ref = release_pointmap_back(net, box, 0.5, item.size_hw)
    assert res.pointmap.shape == ref.shape
    np.testing.assert_allclose(res.pointmap, ref, atol=2e-5 * np.abs(ref).max())


@pytest.mark.slow
def test_pointmap_blur_only_when_enlarging() -> None:
    """Without the blur a 4x enlargement keeps the network's pixel steps; with it they are
    smoothed: the result equals the reference only with the blur applied."""
    model = pointmap_model()
    item = intake(3400, 4300)
    res = PointmapPipeline(model=model)(item, use_segmentation=False)
    net = model.make(model.seen[0]).pointmap[0].numpy()
    _, (top, left, nh, nw) = release_letterbox(item.rgb)
    crop = np.ascontiguousarray(net[:, top : top + nh, left : left + nw].transpose(1, 2, 0)) / 0.5
    plain = cv2.resize(crop, (3400, 4300), interpolation=cv2.INTER_LINEAR)
    assert np.abs(res.pointmap - plain).max() > 1e-4  # the blur is there


@pytest.mark.slow
@pytest.mark.parametrize("wh", SIZES)
def test_normals_back_to_the_photo(wh) -> None:
    model = normal_model()
    item = intake(*wh)
    res = NormalPipeline(model=model)(item)
    net = model.make(model.seen[0]).normals[0].numpy().transpose(1, 2, 0)
    _, (top, left, nh, nw) = release_letterbox(item.rgb)
    crop = net[top : top + nh, left : left + nw]
    crop = crop / np.maximum(np.linalg.norm(crop, axis=-1, keepdims=True), 1e-8)
    ref = cv2.resize(np.ascontiguousarray(crop), (wh[0], wh[1]), interpolation=cv2.INTER_LINEAR)
    ref /= np.maximum(np.linalg.norm(ref, axis=-1, keepdims=True), 1e-8)
    np.testing.assert_allclose(res.normals, ref, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("wh", SIZES)
def test_seg_labels_equal_full_interpolation_then_argmax(wh) -> None:
    model = seg_model()
    item = intake(*wh)
    res = SegPipeline(model=model)(item)
    assert_argmax_of_interpolated(torch.from_numpy(res.labels), model.make(model.seen[0]).logits[0])


def assert_argmax_of_interpolated(labels: torch.Tensor, logits: torch.Tensor) -> None:
    """``labels`` = argmax of F.interpolate(logits) to their size: exact, except where two classes
    tie to float32 rounding (another summation order: 3 pixels of 14.6 M at 3400x4300, gap 4.8e-7)."""
    full = F.interpolate(logits[None], size=labels.shape, mode="bilinear", align_corners=False)[0]
    ref, ours = full.argmax(0), labels.long()
    diff = (ours != ref).nonzero()
    assert len(diff) <= 1e-6 * ref.numel()
    for y, x in diff.tolist():
        assert full[ref[y, x], y, x] - full[ours[y, x], y, x] < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("wh", SIZES)
def test_matting_back_to_the_photo(wh) -> None:
    model = matting_model()
    item = intake(*wh)
    res = MattingPipeline(model=model)(item)
    out = model.make(model.seen[0])
    both = torch.cat([out.foreground, out.alpha], 1)[0].numpy().transpose(1, 2, 0)
    ref = np.clip(cv2.resize(np.ascontiguousarray(both), wh, interpolation=cv2.INTER_LINEAR), 0, 1)
    np.testing.assert_allclose(res.alpha, ref[..., 3], atol=1e-5)
    np.testing.assert_allclose(res.foreground, ref[..., :3], atol=1e-5)


@pytest.mark.slow
def test_seg_logits_compact_form_is_exact_and_small() -> None:
    logits = field(29, 1024, 768)[0] * 4
    compact = SegLogits.from_logits(logits)
    assert compact.values.shape[1] < 0.1 * 1024 * 768  # only around class boundaries
    for out_hw in [(471, 600), (4300, 3400), (7, 5)]:
        assert_argmax_of_interpolated(compact.labels(out_hw), logits)


# ----------------------------------------------------------------------------- precision


@pytest.mark.slow
@pytest.mark.parametrize(("task", "name", "channel"), [("pointmap", "pointmap", 2), ("normal", "normals", 0)])
def test_bf16_keeps_the_output_resolution(tiny_checkpoints, task: str, name: str, channel: int) -> None:
    """bf16 backbone, fp32 last projection: distinct values at network resolution stay >= 25% of
    fp32's (an all-bf16 model kept ~0.4%: 3449 of 782,619 here), and the values stay close."""
    from sapiens2.inputs.network import letterbox_release, network_batch

    x8, _ = letterbox_release(photo(600, 471))
    outs = {}
    for dt in (torch.float32, torch.bfloat16):
        model = load_model(task, checkpoint=tiny_checkpoints[task], device="cpu", dtype=dt)
        head = model.decode_head
        assert all(p.dtype == torch.float32 for m in head.fp32_modules for p in getattr(head, m).parameters())
        assert next(model.backbone.parameters()).dtype == dt  # dtype= still means the backbone's
        with torch.inference_mode():
            out = getattr(model(network_batch([x8], "cpu", dt)), name)
        assert out.dtype == torch.float32
        outs[dt] = out[0, channel]
    full, half = outs[torch.float32], outs[torch.bfloat16]
    assert torch.unique(half).numel() >= 0.25 * torch.unique(full).numel()
    # a random tiny model amplifies the backbone's bf16 rounding; real weights do far better
    err = (half - full).abs()
    assert err.mean() < 0.05 * full.abs().mean() and err.quantile(0.99) < 0.25 * full.abs().mean()


@pytest.mark.slow
def test_bf16_pointmap_pipeline_depth_is_float32_and_not_terraced(tiny_checkpoints) -> None:
    model = load_model(
        "pointmap", checkpoint=tiny_checkpoints["pointmap"], device="cpu", dtype=torch.bfloat16
    )
    res = PointmapPipeline(model=model)(photo(600, 471), use_segmentation=False)
    assert res.depth.dtype == np.float32
    assert np.unique(res.depth).size > 0.25 * res.depth.size


# ----------------------------------------------------------------------------- boundary sizes

MB = 1 << 20
# (pipeline, model, options, bound on pickled prep, bound on pickled raw) for a 4000x3000 photo
BOUNDARY = [
    (SegPipeline, seg_model, {}, 2.4 * MB, 5.0 * MB),  # ~4% of pixels at a class boundary here
    (NormalPipeline, normal_model, {"remove_background": True}, 4.8 * MB, 10.5 * MB),
    (PointmapPipeline, pointmap_model, {"use_segmentation": True}, 4.8 * MB, 10.5 * MB),
    (MattingPipeline, matting_model, {}, 2.4 * MB, 12.7 * MB),
]


@pytest.mark.parametrize(("cls", "make", "opts", "prep_max", "raw_max"), BOUNDARY)
def test_pickled_sizes_at_12_megapixels(cls, make, opts, prep_max, raw_max) -> None:
    """What crosses ZeroGPU's process boundary: the uint8 network input(s) in, network-resolution
    outputs back (before: the whole photo in, photo-sized float arrays back, 36 to 240 MB)."""
    kwargs = {"seg": SegPipeline(model=seg_model())} if cls in (NormalPipeline, PointmapPipeline) else {}
    pipe = cls(model=make(), **kwargs)
    item = load_image(np.zeros((3000, 4000, 3), np.uint8))
    prep = pipe.prepare(item, **opts)
    [raw] = pipe.infer([prep], **opts)
    assert len(pickle.dumps(prep)) < prep_max
    assert len(pickle.dumps(raw)) < raw_max
    assert pipe.finish(raw, item, **opts).image.shape == (3000, 4000, 3)
