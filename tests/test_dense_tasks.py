"""Dense task pipelines (seg, normal, pointmap, matting, features) end to end, offline.

Two kinds of model: the tiny random checkpoints (real architecture, real output shapes) prove
the plumbing; small fake models with known outputs prove the arithmetic (metric scale, focal
length, masks, unit normals).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from sapiens2.errors import OptionError, WeightsUnavailableError
from sapiens2.models.nn.outputs import NormalOutput, PointmapOutput, SegOutput
from sapiens2.tasks.borrowed_seg import LazySeg
from sapiens2.tasks.features import FeaturesPipeline, FeaturesResult, cosine_similarity
from sapiens2.tasks.matting import MattingPipeline
from sapiens2.tasks.normal import NormalPipeline
from sapiens2.tasks.pointmap import PointmapPipeline
from sapiens2.tasks.seg import SegLogits, SegPipeline
from sapiens2.tasks.seg import seg_logits as seg_module
from sapiens2.tasks.seg.seg_render import colorize_labels

H, W = 45, 61  # odd, non-square: letterbox padding and rounding are exercised
# Tiny models run at a quarter of the native input to keep CPU tests fast; the pointmap keeps
# 1024x768 because its scale branch is sized for that grid.
SMALL = (256, 192)


def photo(h: int = H, w: int = W, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    img = np.zeros((h, w, 3), np.uint8)
    img[:] = np.linspace(0, 255, w, dtype=np.uint8)[None, :, None]
    img[h // 4 : 3 * h // 4, w // 3 : 2 * w // 3] = rng.integers(0, 255, (3,), dtype=np.uint8)
    return img


@pytest.fixture(scope="module")
def photo_path(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("img") / "person.png"
    Image.fromarray(photo()).save(path)
    return path


@pytest.fixture(scope="module")
def pipes(tiny_checkpoints):
    """One pipeline per task on the tiny checkpoints, built on first use."""
    made: dict[str, object] = {}
    classes = {
        "seg": SegPipeline,
        "normal": NormalPipeline,
        "pointmap": PointmapPipeline,
        "matting": MattingPipeline,
        "features": FeaturesPipeline,
    }

    def get(task: str):
        if task not in made:
            made[task] = classes[task](checkpoint=tiny_checkpoints[task], device="cpu")
            if task != "pointmap":
                made[task].input_hw = SMALL
        return made[task]

    return get


# --------------------------------------------------------------------- fake models


class Fake(torch.nn.Module):
    """A model whose output is made by ``fn(x)``; one parameter so pipelines find device/dtype."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn
        self.anchor = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor):
        return self.fn(x)


def halves_seg(x: torch.Tensor) -> SegOutput:
    """Class 0 (background) on the left half of the network input, class 5 on the right half."""
    b, _, h, w = x.shape
    logits = torch.zeros(b, 29, h, w)
    logits[:, 0, :, : w // 2] = 10.0
    logits[:, 5, :, w // 2 :] = 10.0
    return SegOutput(logits=logits)


class Poison(torch.nn.Module):
    """Wraps a model: NaN in the top third and +inf in the last pixel of every output tensor
    (scale and CLS outputs become entirely NaN)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor):
        out = self.inner(x)
        for f in dataclasses.fields(out):
            t = getattr(out, f.name).clone()
            if t.ndim == 4:
                t[:, :, : t.shape[2] // 3] = float("nan")
                t[:, :, -1, -1] = float("inf")
            else:
                t[:] = float("nan")
            setattr(out, f.name, t)
        return out


def small(pipe):
    pipe.input_hw = SMALL
    return pipe


def read_png(path) -> np.ndarray:
    return np.asarray(Image.open(path))


# --------------------------------------------------------------------- segmentation


@pytest.mark.parametrize("out_hw", [(50, 37), (13, 9), (24, 18), (97, 5)])
def test_compact_logits_argmax_equals_interpolate_then_argmax(out_hw, monkeypatch):
    monkeypatch.setattr(
        seg_module, "_STEP", {"cpu": 29 * 64, "cuda": 29 * 64}
    )  # several steps even on small images
    gen = torch.Generator().manual_seed(0)
    noisy = torch.randn(29, 24, 18, generator=gen)  # nearly every pixel on a class boundary
    smooth = F.interpolate(torch.randn(1, 29, 4, 3, generator=gen), size=(24, 18), mode="bilinear")[0]
    for logits in (noisy, smooth):
        full = F.interpolate(logits[None], size=out_hw, mode="bilinear", align_corners=False)[0].argmax(0)
        compact = SegLogits.from_logits(logits)
        for dense in (None, True, False):
            ours = compact.labels(out_hw, dense=dense)
            assert ours.dtype == torch.uint8 and ours.shape == out_hw
            assert torch.equal(ours.long(), full)


def test_seg_end_to_end_tiny(pipes, photo_path, tmp_path):
    res = pipes("seg")(photo_path)
    assert res.labels.shape == (H, W) and res.labels.dtype == np.uint8
    assert res.labels.max() < 29
    assert set(res.shares) == set(np.unique(res.labels).tolist())
    assert sum(res.shares.values()) == pytest.approx(1.0)
    assert res.person_masks is None and res.name == "person"
    img = res.render()
    assert img.shape == (H, W, 3) and img.dtype == np.uint8
    legend = res.legend()
    assert legend.ndim == 3 and legend.shape[2] == 3 and legend.dtype == np.uint8
    paths = res.save(tmp_path)
    names = sorted(p.name for p in paths)
    assert names == sorted(
        ["person_seg_labels.png", "person_seg_labels.npy", "person_seg_color.png", "person_seg.png"]
    )
    assert all(p.is_file() for p in paths)
    assert np.array_equal(read_png(tmp_path / "person_seg_labels.png"), res.labels)
    assert np.array_equal(np.load(tmp_path / "person_seg_labels.npy"), res.labels)
    with Image.open(tmp_path / "person_seg_color.png") as color:  # a palette PNG
        assert np.array_equal(np.asarray(color.convert("RGB")), colorize_labels(res.labels))
    assert np.array_equal(read_png(tmp_path / "person_seg.png"), img)
    assert "seg" in res.info.line() and res.info.model_s > 0


def test_seg_known_output_shares_and_person_masks(tmp_path):
    pipe = small(SegPipeline(model=Fake(halves_seg)))
    img = photo(40, 60)
    boxes = [[0, 0, 60, 20], [30, 10, 45, 40]]
    res = pipe(img, boxes=boxes)
    assert (res.labels[:, :30] == 0).all() and (res.labels[:, 30:] == 5).all()
    assert res.shares == {0: 0.5, 5: 0.5}
    assert res.person_masks.shape == (2, 40, 60) and res.person_masks.dtype == bool
    expect0 = np.zeros((40, 60), bool)
    expect0[:20, 30:] = True
    expect1 = np.zeros((40, 60), bool)
    expect1[10:40, 30:45] = True
    assert np.array_equal(res.person_masks[0], expect0)
    assert np.array_equal(res.person_masks[1], expect1)
    saved = {p.name for p in res.save(tmp_path)}
    assert "image_seg_person_masks.npy" in saved
    assert np.load(tmp_path / "image_seg_person_masks.npy").shape == (2, 40, 60)
    # keeping only the background class: class-5 pixels show the plain photo
    only_bg = res.render(classes=["background"])
    assert np.array_equal(only_bg[:, 30:], img[:, 30:])
    assert not np.array_equal(only_bg[:, :30], img[:, :30])


def test_save_writes_the_given_rendering_instead_of_a_default_one(tmp_path):
    res = small(SegPipeline(model=Fake(halves_seg)))(photo(40, 60))
    custom = res.render(opacity=1.0, classes=[5])  # what a viewer with its own options shows
    assert not np.array_equal(custom, res.render())
    res.save(tmp_path / "custom", rendered=custom)
    assert np.array_equal(read_png(tmp_path / "custom" / "image_seg.png"), custom)
    res.save(tmp_path / "default")
    assert np.array_equal(read_png(tmp_path / "default" / "image_seg.png"), res.render())


def test_seg_bad_options_are_explained():
    pipe = small(SegPipeline(model=Fake(halves_seg)))
    with pytest.raises(OptionError, match=r"boxes must be shaped \(N, 4\).*got shape \(1, 3\)"):
        pipe(photo(), boxes=[[1, 2, 3]])
    with pytest.raises(OptionError, match="'detect'"):
        pipe(photo(), boxes="people")
    res = pipe(photo())
    with pytest.raises(OptionError, match="opacity"):
        res.render(opacity=1.5)
    with pytest.raises(OptionError, match="Unknown body-part class 'tail'"):
        res.render(classes=["tail"])


# --------------------------------------------------------------------- normals


def test_normal_end_to_end_tiny(pipes, photo_path, tmp_path):
    res = pipes("normal")(photo_path)
    assert res.normals.shape == (H, W, 3) and res.normals.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(res.normals, axis=2), 1.0, atol=1e-4)
    assert res.mask is None
    black, over_photo = res.render(), res.render(background="photo")
    for img in (black, over_photo):
        assert img.shape == (H, W, 3) and img.dtype == np.uint8
    paths = res.save(tmp_path)
    assert sorted(p.name for p in paths) == ["person_normal.npy", "person_normal.png"]
    arr = np.load(tmp_path / "person_normal.npy")
    assert arr.dtype == np.float16 and arr.shape == (H, W, 3)
    np.testing.assert_allclose(arr, res.normals, atol=2e-3)
    assert np.array_equal(read_png(tmp_path / "person_normal.png"), black)
    with pytest.raises(OptionError, match="'black' or 'photo'"):
        res.render(background="blue")


def test_unit_normalise_in_place_keeps_zero_vectors():
    from sapiens2.ops.maps import unit_normalise

    x = np.random.default_rng(0).standard_normal((300, 7, 3)).astype(np.float32) * 50
    x[5, 3] = 0.0
    ref = x / np.maximum(np.linalg.norm(x, axis=2, keepdims=True), 1e-8)
    out = unit_normalise(x)
    assert out is x  # in place: no photo-sized copy
    np.testing.assert_allclose(x, ref, atol=1e-6)
    assert (x[5, 3] == 0).all()


def test_normal_known_output_and_background_from_seg():
    def normals(x):
        return NormalOutput(
            normals=torch.tensor([0.0, 0.0, -2.0]).view(1, 3, 1, 1).expand(1, 3, *x.shape[2:])
        )

    seg = small(SegPipeline(model=Fake(halves_seg)))
    pipe = small(NormalPipeline(model=Fake(normals), seg=seg))
    img = photo(40, 60)
    res = pipe(img, remove_background=True)
    np.testing.assert_allclose(res.normals, np.broadcast_to([0, 0, -1], (40, 60, 3)), atol=1e-6)
    assert res.mask.dtype == bool and res.mask.shape == (40, 60)
    assert not res.mask[:, :30].any() and res.mask[:, 30:].all()
    out = res.render()
    assert (out[:, :30] == 0).all()  # background black
    assert (out[:, 30:] == [128, 128, 0]).all()  # (n + 1) / 2 * 255 for n = (0, 0, -1)
    assert np.array_equal(res.render(background="photo")[:, :30], img[:, :30])


def test_seg_factory_is_asked_on_every_use_and_never_kept():
    """The server's model manager owns a factory's pipeline: after it evicts the model, the next
    use must get the new one, not a private copy kept alive here."""
    first, second = small(SegPipeline(model=Fake(halves_seg))), small(SegPipeline(model=Fake(halves_seg)))
    handed = iter([first, second])
    pipe = small(NormalPipeline(model=Fake(lambda x: NormalOutput(normals=torch.ones(1, 3, *x.shape[2:])))))
    pipe.seg = LazySeg(lambda: next(handed), pipe)
    assert pipe.seg.get() is first
    assert pipe.seg.get() is second
    assert pipe.seg._pipe is None  # nothing memoised from the factory
    given = SegPipeline(model=Fake(halves_seg))
    assert LazySeg(given, pipe).get() is given
    with pytest.raises(OptionError, match="seg factory must return a SegPipeline; got str"):
        LazySeg(lambda: "seg", pipe).get()


def test_normal_seg_unavailable_keeps_pixels_and_retries():
    calls = []

    def no_seg():
        calls.append(1)
        raise WeightsUnavailableError("Weights for facebook/sapiens2-seg-0.4b are not available here.")

    def normals(x):
        return NormalOutput(normals=torch.ones(1, 3, *x.shape[2:]))

    pipe = small(NormalPipeline(model=Fake(normals), seg=no_seg))
    res = pipe(photo(), remove_background=True)
    assert res.mask is None
    assert any("segmentation model is unavailable" in n and "not available here" in n for n in res.notices)
    pipe(photo(), remove_background=True)
    assert len(calls) == 2  # the failed load was not remembered as a success
    assert pipe(photo()).notices == []  # without the option, seg is never asked for
    assert len(calls) == 2
    with pytest.raises(OptionError, match="seg must be a SegPipeline"):
        NormalPipeline(model=Fake(normals), seg="0.4b")


def test_a_photo_far_below_the_network_input_gets_a_notice():
    def normals(x):
        return NormalOutput(normals=torch.ones(1, 3, *x.shape[2:]))

    pipe = NormalPipeline(model=Fake(normals))  # the release's 1024x768 input
    [tiny] = [n for n in pipe(np.full((8, 8, 3), 128, np.uint8)).notices if "far below" in n]
    assert tiny.startswith("The image is 8x8 px, far below the network's 768x1024 input") and "96x" in tiny
    assert not [n for n in pipe(photo()).notices if "far below" in n]  # 61x45: enlarged 12.6x, no notice


# --------------------------------------------------------------------- pointmap


def parse_ply(path) -> tuple[int, np.ndarray]:
    data = path.read_bytes()
    end = data.index(b"end_header\n") + len(b"end_header\n")
    header = data[:end].decode("ascii").splitlines()
    assert header[:2] == ["ply", "format binary_little_endian 1.0"]
    count = int(next(line for line in header if line.startswith("element vertex")).split()[-1])
    rec = np.frombuffer(
        data[end:],
        dtype=[("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("r", "u1"), ("g", "u1"), ("b", "u1"), ("a", "u1")],
    )
    assert len(rec) == count
    return count, rec


def test_pointmap_end_to_end_tiny(pipes, photo_path, tmp_path):
    pipe = PointmapPipeline(model=pipes("pointmap").model, seg=pipes("seg"))
    res = pipe(photo_path)
    assert res.pointmap.shape == (H, W, 3) and res.pointmap.dtype == np.float32
    assert res.depth.shape == (H, W) and res.depth.dtype == np.float32
    assert np.array_equal(res.depth, res.pointmap[:, :, 2], equal_nan=True)
    assert res.mask.shape == (H, W) and res.mask.dtype == bool
    img = res.render()
    assert img.shape == (H, W, 3) and img.dtype == np.uint8
    paths = res.save(tmp_path)
    assert sorted(p.name for p in paths) == sorted(
        [
            "person_depth.npy",
            "person_pointmap.npy",
            "person_depth.png",
            "person_pointcloud.ply",
            "person_pointcloud.glb",
            "person_mesh.glb",
            "person_mesh.ply",
            "person_mesh_preview.glb",
        ]
    )
    assert np.load(tmp_path / "person_pointmap.npy").shape == (H, W, 3)
    assert np.load(tmp_path / "person_depth.npy").shape == (H, W)
    count, _ = parse_ply(tmp_path / "person_pointcloud.ply")
    assert count == len(res.points()[0])
    assert (tmp_path / "person_pointcloud.glb").read_bytes()[:4] == b"glTF"


def const_pointmap(x: torch.Tensor) -> PointmapOutput:
    """Every pixel at canonical (1, -1, 2), scale 0.5: metric (2, -2, 4)."""
    b, _, h, w = x.shape
    pm = torch.zeros(b, 3, h, w)
    pm[:, 0] = 1.0
    pm[:, 1] = -1.0
    pm[:, 2] = 2.0
    return PointmapOutput(pointmap=pm, scale=torch.full((b, 1), 0.5))


def test_pointmap_known_output_metric_focal_and_mask(tmp_path):
    img = photo(40, 60)  # letterboxed into 1024x768: 60 px wide -> 768 px, rows padded
    pipe = PointmapPipeline(model=Fake(const_pointmap), seg=small(SegPipeline(model=Fake(halves_seg))))
    res = pipe(img)
    np.testing.assert_allclose(res.pointmap, np.broadcast_to([2.0, -2.0, 4.0], (40, 60, 3)), rtol=1e-6)
    assert res.scale == 0.5
    assert res.focal_px_input == pytest.approx(768 / 0.5)
    assert res.focal_px == pytest.approx(1536 * 60 / 768)  # 120 px in the 60 px wide photo
    assert not res.mask[:, :30].any() and res.mask[:, 30:].all()
    out = res.render()
    assert (out[:, :30] == 100).all() and not (out[:, 30:] == 100).all()
    res.save(tmp_path)
    count, rec = parse_ply(tmp_path / "image_pointcloud.ply")
    assert count == 40 * 30
    assert np.allclose(rec["z"], 4.0)
    assert np.array_equal(np.stack([rec["r"], rec["g"], rec["b"]], 1), img[:, 30:].reshape(-1, 3))
    # without segmentation: every finite, positive depth is foreground, no notice
    res2 = pipe(img, use_segmentation=False)
    assert res2.mask.all() and res2.notices == []


def test_pointmap_seg_unavailable_falls_back_with_notice():
    def pointmap(x):
        b, _, h, w = x.shape
        pm = torch.ones(b, 3, h, w)
        pm[:, 2, : h // 2] = -1.0  # top half behind the camera: never foreground
        return PointmapOutput(pointmap=pm, scale=torch.ones(b, 1))

    def no_seg():
        raise WeightsUnavailableError("no seg weights")

    res = PointmapPipeline(model=Fake(pointmap), seg=no_seg)(photo(40, 60))
    # the notice says it plainly (a page shows it); the error's own details go to the log
    assert any(
        "segmentation model is unavailable (its weights are not available here)" in n for n in res.notices
    )
    assert any("finite, positive depth" in n for n in res.notices)
    assert res.mask.any() and not res.mask.all()
    assert (res.depth[res.mask] > 0).all()


# --------------------------------------------------------------------- matting


def test_matting_end_to_end_tiny(pipes, photo_path, tmp_path):
    res = pipes("matting")(photo_path)
    assert res.foreground.shape == (H, W, 3) and res.foreground.dtype == np.float32
    assert res.alpha.shape == (H, W) and res.alpha.dtype == np.float32
    for a in (res.foreground, res.alpha):
        assert a.min() >= 0.0 and a.max() <= 1.0
    green = res.render()
    assert green.shape == (H, W, 3) and green.dtype == np.uint8
    # a background image of another size and mode is resized to cover
    gray_bg = np.full((7, 300), 200, np.uint8)
    over = res.render(background=gray_bg)
    assert over.shape == (H, W, 3) and over.dtype == np.uint8
    paths = res.save(tmp_path, background=(255, 0, 0))
    assert sorted(p.name for p in paths) == ["person_alpha.png", "person_composite.png", "person_cutout.png"]
    rgba = read_png(tmp_path / "person_cutout.png")
    alpha8 = np.round(res.alpha * 255).astype(np.uint8)
    assert rgba.shape == (H, W, 4)
    assert np.abs(rgba[:, :, 3].astype(int) - alpha8).max() <= 1
    assert np.abs(read_png(tmp_path / "person_alpha.png").astype(int) - alpha8).max() <= 1
    assert np.array_equal(read_png(tmp_path / "person_composite.png"), res.render(background=(255, 0, 0)))


# --------------------------------------------------------------------- features


def test_features_end_to_end_and_similarity(pipes, photo_path, tmp_path):
    pipe = pipes("features")
    res = pipe(photo_path)
    assert isinstance(res, FeaturesResult)
    assert res.embedding.ndim == 1 and res.embedding.dtype == np.float32
    d = res.embedding.shape[0]
    assert res.patch_features.shape == (d, SMALL[0] // 16, SMALL[1] // 16)
    assert res.patch_features.dtype == np.float32
    img = res.render()
    assert img.shape == (H, W, 3) and img.dtype == np.uint8
    paths = res.save(tmp_path)
    assert sorted(p.name for p in paths) == ["person_embedding.npy", "person_features_pca.png"]
    assert np.array_equal(np.load(tmp_path / "person_embedding.npy"), res.embedding)
    assert np.array_equal(read_png(tmp_path / "person_features_pca.png"), img)
    assert cosine_similarity(res, res) == pytest.approx(1.0, abs=1e-9)
    assert cosine_similarity(res, pipe(photo_path)) == pytest.approx(1.0, abs=1e-6)
    other = pipe(np.full((50, 50, 3), 30, np.uint8))
    assert -1.0 <= cosine_similarity(res, other) < 1.0 - 1e-6


def test_cosine_similarity_errors_are_explained():
    assert cosine_similarity(np.array([1.0, 0.0]), np.array([0.0, 2.0])) == 0.0
    assert cosine_similarity(np.array([1.0, 1.0]), torch.tensor([-3.0, -3.0])) == pytest.approx(-1.0)
    with pytest.raises(OptionError, match="differ in length"):
        cosine_similarity(np.ones(3), np.ones(4))
    with pytest.raises(OptionError, match="all zeros"):
        cosine_similarity(np.zeros(3), np.ones(3))
    with pytest.raises(OptionError, match="NaN"):
        cosine_similarity(np.array([np.nan, 1.0]), np.ones(2))
    with pytest.raises(OptionError, match="1-D embedding"):
        cosine_similarity(np.ones((2, 2)), np.ones(4))


# --------------------------------------------------------------------- big images, bad outputs


def test_downscaled_big_image_maps_back_to_original_size(pipes):
    big = photo(40, 4200)  # long side above the 4096 px intake limit
    seg = pipes("seg")(big)
    assert seg.downscaled and seg.labels.shape == (40, 4200)
    assert any("4096" in n for n in seg.notices)
    normal = pipes("normal")(big)
    assert normal.downscaled and normal.normals.shape == (40, 4200, 3)
    assert normal.render().shape == (40, 4200, 3)
    # known outputs: the labels land where they belong, the focal length is in original pixels
    halves = small(SegPipeline(model=Fake(halves_seg)))(big)
    assert (halves.labels[:, :2095] == 0).all() and (halves.labels[:, 2105:] == 5).all()
    pm = PointmapPipeline(model=Fake(const_pointmap))(big, use_segmentation=False)
    assert pm.pointmap.shape == (40, 4200, 3) and pm.mask.all()
    assert pm.focal_px == pytest.approx(1536 * 4200 / 768)  # the 4096 px copy is letterboxed to 768


@pytest.mark.parametrize("task", ["seg", "normal", "pointmap", "matting", "features"])
def test_nan_in_model_output_does_not_break_render_or_exports(pipes, task, tmp_path):
    kwargs = {}
    if task in ("normal", "pointmap"):
        kwargs["seg"] = small(SegPipeline(model=Poison(pipes("seg").model)))
    if task == "pointmap":  # a known pointmap: the tiny one only runs at the slow native size
        pipe = PointmapPipeline(model=Poison(Fake(const_pointmap)), **kwargs)
    else:
        pipe = small(type(pipes(task))(model=Poison(pipes(task).model), **kwargs))
    res = pipe(photo(), **({"remove_background": True} if task == "normal" else {}))
    assert any("non-finite" in n or "unusable" in n for n in res.notices)
    img = res.render()
    assert img.shape == (H, W, 3) and img.dtype == np.uint8
    paths = res.save(tmp_path)
    assert paths and all(p.is_file() and p.stat().st_size > 0 for p in paths)
    if task == "pointmap":
        assert np.isnan(res.focal_px) and np.isnan(res.scale)
        count, rec = parse_ply(tmp_path / "image_pointcloud.ply")
        assert count == len(res.points()[0]) and np.isfinite(rec["z"]).all()
    if task == "features":
        with pytest.raises(OptionError, match="NaN"):
            cosine_similarity(res, res)
