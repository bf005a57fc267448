"""Pose: heatmap decoding (vs the release codec), crop geometry, flip test, and the pipeline end to end."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from PIL import Image
from tiny_checkpoints import make_tiny_checkpoint

import sapiens2
from sapiens2.data.metadata import COCO17_NAMES, FLIP_INDEX, KEYPOINT_NAMES, NUM_KEYPOINTS
from sapiens2.errors import OptionError
from sapiens2.models.nn.outputs import PoseOutput
from sapiens2.models.zoo import IMAGE_MEAN, IMAGE_STD
from sapiens2.tasks import pipeline, pipeline_class, registry
from sapiens2.tasks.pose import PosePipeline, PoseResult, decode_heatmaps, flip_back, merge_flip, pose_codec
from sapiens2.tasks.pose.pose_codec import heatmap_to_crop
from sapiens2.tasks.pose.pose_crops import apply_affine, box_to_center_scale, inverse_warp_matrix, warp_matrix


def gaussians(
    centers: np.ndarray, hw: tuple[int, int], sigma: float, amp: np.ndarray | float = 1.0
) -> np.ndarray:
    """(N, K, h, w) float32 Gaussians (the UDP training target) at (N, K, 2) sub-pixel centres."""
    h, w = hw
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    cx, cy = centers[..., 0, None, None], centers[..., 1, None, None]
    g = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * sigma**2))
    return (np.asarray(amp)[..., None, None] * g if np.ndim(amp) else amp * g).astype(np.float32)


def release_decode(heatmaps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A plain per-map transcription of the release codec's steps (argmax, DARK-UDP), for reference."""
    n, k, h, w = heatmaps.shape
    kp = np.zeros((n, k, 2), np.float32)
    sc = np.zeros((n, k), np.float32)
    for i in range(n):
        for j in range(k):
            m = heatmaps[i, j].astype(np.float32)
            flat = int(np.argmax(m))
            sc[i, j] = m.reshape(-1)[flat]
            if sc[i, j] <= 0:
                kp[i, j] = -1
                continue
            x, y = flat % w, flat // w
            big = np.zeros((h + 10, w + 10), np.float32)
            big[5:-5, 5:-5] = m
            blur = cv2.GaussianBlur(big, (11, 11), 0)[5:-5, 5:-5]
            blur *= m.max() / blur.max()
            p = np.pad(np.log(np.clip(blur, 1e-3, 50.0)), 1, mode="edge")

            def v(dx: int, dy: int, p: np.ndarray = p, x: int = x, y: int = y) -> float:
                return float(p[y + 1 + dy, x + 1 + dx])

            grad = np.array([0.5 * (v(1, 0) - v(-1, 0)), 0.5 * (v(0, 1) - v(0, -1))])
            dxx = v(1, 0) - 2 * v(0, 0) + v(-1, 0)
            dyy = v(0, 1) - 2 * v(0, 0) + v(0, -1)
            dxy = 0.5 * (v(1, 1) - v(1, 0) - v(0, 1) + 2 * v(0, 0) - v(-1, 0) - v(0, -1) + v(-1, -1))
            hess = np.array([[dxx, dxy], [dxy, dyy]], np.float32) + np.finfo(np.float32).eps * np.eye(2)
            kp[i, j] = np.array([x, y]) - np.linalg.inv(hess) @ grad
    return kp, sc


# ------------------------------------------------------------------ decoding


@pytest.mark.parametrize(("hw", "sigma", "margin"), [((64, 48), 1.5, 4), ((256, 192), 6.0, 12)])
def test_gaussian_peaks_decode_within_0_05_px(hw: tuple[int, int], sigma: float, margin: int) -> None:
    rng = np.random.default_rng(0)
    h, w = hw
    centers = rng.uniform([margin, margin], [w - 1 - margin, h - 1 - margin], size=(3, 40, 2))
    kp, sc = decode_heatmaps(gaussians(centers, hw, sigma))
    assert kp.shape == (3, 40, 2) and sc.shape == (3, 40)
    assert np.abs(kp - centers).max() < 0.05
    assert np.all(sc > 0.5)


def test_equal_to_the_release_codec_including_weak_and_edge_peaks() -> None:
    rng = np.random.default_rng(1)
    centers = rng.uniform([0, 0], [47, 63], size=(2, 30, 2))
    centers[0, :4] = [[0.2, 10.0], [47.0, 30.3], [20.5, 0.0], [5.0, 63.0]]  # on the borders
    amp = rng.uniform(0.05, 1.0, size=(2, 30))
    amp[1, :5] = [5e-4, 2e-3, 8e-3, 60.0, 0.3]  # weak (clamp bites), huge (> 50), normal
    hm = gaussians(centers, (64, 48), 1.5, amp) + rng.normal(0, 0.002, (2, 30, 64, 48)).astype(np.float32)
    kp, sc = decode_heatmaps(hm)
    ref_kp, ref_sc = release_decode(hm)
    assert np.array_equal(sc, ref_sc)
    assert np.abs(kp - ref_kp).max() < 1e-3


def test_weak_maps_take_the_release_s_own_blur() -> None:
    """Maps whose 3x3 around the peak is weak (the clamp at 1e-3 bites: the whole map is blurred,
    in cache-sized chunks): on the CPU that blur is the release's cv2.GaussianBlur itself, so
    the keypoints equal the per-map transcription to float rounding of the Newton step."""
    rng = np.random.default_rng(4)
    centers = rng.uniform([2, 2], [93, 125], size=(2, 40, 2))  # 80 maps of 128x96: several chunks
    amp = rng.uniform(2e-4, 3e-3, size=(2, 40))
    hm = gaussians(centers, (128, 96), 2.0, amp) + rng.normal(0, 2e-4, (2, 40, 128, 96)).astype(np.float32)
    kp, sc = decode_heatmaps(hm)
    ref_kp, ref_sc = release_decode(hm)
    assert np.array_equal(sc, ref_sc)
    assert np.abs(kp - ref_kp).max() < 1e-4


def test_flat_maps_keep_the_peak_cell_and_sharp_maps_the_release_s_point(tiny_pose: Path) -> None:
    """A random model's heatmaps (flat: no located peak) throw some of the release's points far off
    the map; those stay on their argmax cell with a score under the drawings' 0.3 threshold, and
    every other point is the release's. Sharp maps (Gaussians) are the release's, scores intact."""
    model = sapiens2.load_model("pose", checkpoint=tiny_pose, device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        hm = model(torch.rand(2, 3, 256, 192)).heatmaps.float().numpy()
    h, w = hm.shape[2:]
    kp, sc = decode_heatmaps(hm)
    flat = hm.reshape(*hm.shape[:2], -1).argmax(-1)
    cell = np.stack([flat % w, flat // w], -1).astype(np.float32)
    ref = np.stack([release_decode(hm[:, j : j + 1])[0][:, 0] for j in range(hm.shape[1])], 1)
    far = (np.abs(ref - cell).max(-1) > 11) & (sc > 0)  # beyond the blur kernel's width
    assert far.sum() >= 5 and np.abs(ref[far]).max() > 4 * max(h, w)  # the release's far-off points
    assert np.array_equal(kp[far], cell[far]) and (sc[far] <= pose_codec.UNLOCATED_SCORE).all()
    assert np.abs(kp[~far] - ref[~far]).max() < 0.01
    assert (kp >= -12).all() and (kp[..., 0] <= w + 11).all() and (kp[..., 1] <= h + 11).all()

    centers = np.random.default_rng(3).uniform([4, 4], [43, 59], size=(1, 30, 2))
    sharp = gaussians(centers, (64, 48), 2.0)
    kp, sc = decode_heatmaps(sharp)
    ref_kp, ref_sc = release_decode(sharp)
    assert np.array_equal(sc, ref_sc) and (sc > 0.5).all() and np.abs(kp - ref_kp).max() < 1e-3


def test_the_gpu_s_banded_blur_equals_the_cpu_s_cv2_blur() -> None:
    maps = torch.from_numpy(np.random.default_rng(5).normal(size=(7, 40, 30)).astype(np.float32))
    for kernel in (3, 11):
        band, cv = pose_codec._blur(maps, kernel, use_cv2=False), pose_codec._blur(maps, kernel, use_cv2=True)
        assert torch.allclose(band, cv, atol=1e-6), (band - cv).abs().max()


def test_non_finite_heatmaps_are_counted_per_crop_with_and_without_flip() -> None:
    hm = torch.from_numpy(
        np.random.default_rng(6).uniform(0, 1, (4, NUM_KEYPOINTS, 16, 12)).astype(np.float32)
    )
    hm[0, 3, 2, 2], hm[0, 4, 1, 1] = float("nan"), float("-inf")  # -inf alone: max stays finite
    hm[1, 7, 0, 0] = float("inf")
    hm[2, 9, 5, 5], hm[2, 9, 6, 6] = float("inf"), float("-inf")
    want = (~torch.isfinite(hm)).flatten(2).any(-1).sum(1)
    assert pose_codec.decode_crops(hm, False, (64, 48))[2].tolist() == want.tolist() == [2, 1, 1, 0]
    assert pose_codec.decode_crops(hm, True, (64, 48))[2].tolist() == [3, 1]


def test_flat_and_negative_maps_score_at_most_zero_without_nan() -> None:
    hm = np.zeros((2, 3, 16, 12), np.float32)
    hm[0, 1] = -1.0
    hm[0, 2] = np.linspace(-5, -0.1, 16 * 12).reshape(16, 12)
    hm[1, 0, 3, 3] = np.nan
    hm[1, 1] = np.inf
    hm[1, 2, 5, 7] = 0.7  # one valid map next to the broken ones
    kp, sc = decode_heatmaps(hm)
    assert np.isfinite(kp).all() and np.isfinite(sc).all()
    assert (sc[0] <= 0).all() and (sc[1, :2] <= 0).all()
    assert (kp[0] == -1).all() and (kp[1, :2] == -1).all()
    assert sc[1, 2] == pytest.approx(0.7) and np.abs(kp[1, 2] - [7, 5]).max() < 0.5


def test_numpy_and_torch_agree_and_keep_their_types() -> None:
    rng = np.random.default_rng(2)
    hm = gaussians(rng.uniform(3, 40, size=(2, 5, 2)), (64, 48), 1.5)
    kn, sn = decode_heatmaps(hm)
    kt, st = decode_heatmaps(torch.from_numpy(hm))
    assert isinstance(kn, np.ndarray) and kn.dtype == np.float32 and sn.dtype == np.float32
    assert isinstance(kt, torch.Tensor) and kt.dtype == torch.float32 and kt.device.type == "cpu"
    assert np.array_equal(kn, kt.numpy()) and np.array_equal(sn, st.numpy())
    kb, _ = decode_heatmaps(torch.from_numpy(hm).bfloat16())  # a bf16 model output
    assert np.abs(kb.numpy() - kn).max() < 0.1


def test_public_alias_and_bad_arguments() -> None:
    assert sapiens2.pose.decode_heatmaps is decode_heatmaps
    with pytest.raises(OptionError, match=r"shaped \(N, K, h, w\); got \(3, 4, 5\)"):
        decode_heatmaps(np.zeros((3, 4, 5), np.float32))
    with pytest.raises(OptionError, match="blur_kernel must be an odd positive integer"):
        decode_heatmaps(np.zeros((1, 1, 8, 8), np.float32), blur_kernel=10)
    with pytest.raises(OptionError, match="numpy array or a torch tensor, got list"):
        decode_heatmaps([[[[0.0]]]])  # type: ignore[arg-type]


# ------------------------------------------------------------------ geometry


def test_heatmap_to_image_equals_the_release_mapping_and_round_trips() -> None:
    boxes = np.array([[40.0, 30.0, 240.0, 430.0], [300.0, 100.0, 700.0, 250.0]])
    center, scale = box_to_center_scale(boxes)
    hm_pts = np.random.default_rng(3).uniform(0, [191, 255], size=(2, 20, 2))
    crop = heatmap_to_crop(torch.from_numpy(hm_pts), (256, 192), (1024, 768)).numpy()
    ours = apply_affine(crop, inverse_warp_matrix(center, scale))
    # the release: kp * input_size / (heatmap_size - 1), then kp / input_size * scale + centre - scale / 2
    codec = hm_pts / [191, 255] * [768, 1024]
    release = codec / [768, 1024] * scale[:, None] + center[:, None] - 0.5 * scale[:, None]
    assert np.abs(ours - release).max() < 1e-6
    # image -> crop (forward warp) -> image returns within 1e-3 px
    m = warp_matrix(center, scale)
    to_crop = np.einsum("nij,nkj->nki", m[:, :, :2], release) + m[:, None, :, 2]
    assert np.abs(apply_affine(to_crop, inverse_warp_matrix(center, scale)) - release).max() < 1e-3


def _symmetric_positions(w: int, rng: np.random.Generator) -> np.ndarray:
    """(308, 2) heatmap positions of a left/right-symmetric pose: partner = mirror."""
    pos = rng.uniform([2, 2], [w - 3, 60], size=(NUM_KEYPOINTS, 2))
    for k in range(NUM_KEYPOINTS):
        j = int(FLIP_INDEX[k])
        if j == k:
            pos[k, 0] = (w - 1) / 2  # centre-line points (nose, neck ...)
        elif j < k:
            pos[k] = [(w - 1) - pos[j, 0], pos[j, 1]]
    return pos


def test_flip_back_swaps_channels_for_a_symmetric_input() -> None:
    w = 48
    pos = _symmetric_positions(w, np.random.default_rng(4))
    hm = torch.from_numpy(gaussians(pos[None], (64, w), 1.5))
    # the mirror image of a symmetric person looks the same: the model gives the same maps
    back = flip_back(hm, FLIP_INDEX)
    assert torch.allclose(back, hm, atol=1e-6)
    assert torch.allclose(merge_flip(hm, hm, FLIP_INDEX), hm, atol=1e-6)
    # without the channel swap the mirrored maps would put every paired point on the wrong side
    paired = FLIP_INDEX != np.arange(NUM_KEYPOINTS)
    assert not torch.allclose(hm.flip(-1)[:, paired], hm[:, paired], atol=1e-3)


def test_flip_back_restores_an_asymmetric_pose() -> None:
    w = 48
    pos = np.random.default_rng(5).uniform([4, 4], [w - 5, 59], size=(NUM_KEYPOINTS, 2))
    plain = gaussians(pos[None], (64, w), 1.5)
    # in the mirrored crop, what looks like keypoint k sits at the mirror of its partner
    mirrored_pos = np.stack([(w - 1) - pos[FLIP_INDEX, 0], pos[FLIP_INDEX, 1]], -1)
    mirrored = torch.from_numpy(gaussians(mirrored_pos[None], (64, w), 1.5))
    back = flip_back(mirrored, FLIP_INDEX)
    assert torch.allclose(back, torch.from_numpy(plain), atol=1e-6)
    kp, _ = decode_heatmaps(merge_flip(torch.from_numpy(plain), mirrored, FLIP_INDEX))
    assert np.abs(kp[0].numpy() - pos).max() < 0.05


# ------------------------------------------------------------------ pipeline


class DotModel(torch.nn.Module):
    """A stand-in pose model: every heatmap peaks where the crop's brightest blob is."""

    def __init__(self, nan: bool = False) -> None:
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # gives the pipeline a device/dtype
        self.nan = nan
        self.batches: list[int] = []

    def forward(self, x: torch.Tensor) -> PoseOutput:
        self.batches.append(int(x.shape[0]))
        b, _, h, w = x.shape
        v = (x[:, 0] * IMAGE_STD[0] + IMAGE_MEAN[0]) * 255
        v = torch.where(v > 20, v, torch.zeros(()))
        ys, xs = torch.meshgrid(
            torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32), indexing="ij"
        )
        total = v.sum((1, 2)).clamp(min=1e-6)
        cx, cy = (v * xs).sum((1, 2)) / total, (v * ys).sum((1, 2)) / total
        hh, hw = h // 4, w // 4
        centers = torch.stack([cx * (hw - 1) / (w - 1), cy * (hh - 1) / (h - 1)], -1).numpy()
        one = torch.from_numpy(gaussians(centers[:, None], (hh, hw), 1.5))  # (B, 1, hh, hw)
        out = one.expand(b, NUM_KEYPOINTS, hh, hw)  # the same map for every keypoint
        if self.nan:
            out = out.clone()
            out[:, 5] = float("nan")
        return PoseOutput(heatmaps=out)


def _blob_image(h: int, w: int, at: tuple[float, float], sigma: float = 3.0) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    g = 255 * np.exp(-((xx - at[0]) ** 2 + (yy - at[1]) ** 2) / (2 * sigma**2))
    return np.repeat(g[..., None], 3, 2).astype(np.uint8)


def _middle_box(im: np.ndarray) -> np.ndarray:
    """A detector stand-in: one box at fixed fractions of whatever image it is given."""
    h, w = im.shape[:2]
    return np.array([[0.4 * w, 0.25 * h, 0.6 * w, 0.7 * h]])


@pytest.mark.parametrize(
    ("max_side", "flip", "input_hw"),
    [(4096, False, (256, 192)), (4096, True, None), (160, True, (256, 192))],
)
def test_keypoints_land_on_the_photo_point(
    max_side: int, flip: bool, input_hw: tuple[int, int] | None
) -> None:
    at = (131.3, 87.6)
    img = _blob_image(200, 300, at)
    model = DotModel()
    pipe = PosePipeline(model=model, detector=_middle_box)
    pipe.input_hw = input_hw  # None: the zoo's 1024x768 with 256x192 heatmaps
    pipe.max_side = max_side
    res = pipe(img, flip_test=flip)
    assert res.downscaled == (max_side < 300) and model.batches == [2 if flip else 1]
    assert res.keypoints.shape == (1, NUM_KEYPOINTS, 2) and res.keypoints.dtype == np.float32
    err = np.abs(res.keypoints[0] - at).max()
    assert err < (0.6 if res.downscaled else 0.25)
    assert np.allclose(res.boxes[0], [120, 50, 180, 140], atol=1e-3)  # back in original pixels


def test_caller_boxes_are_in_original_pixels_even_when_downscaled() -> None:
    img = _blob_image(100, 400, (300.0, 50.0))
    pipe = PosePipeline(model=DotModel(), detector=None)
    pipe.input_hw, pipe.max_side = (128, 96), 200
    res = pipe(img, boxes=[[260.0, 10.0, 340.0, 90.0]])
    assert res.downscaled and res.detection_source == "caller"
    assert np.allclose(res.boxes, [[260, 10, 340, 90]], atol=1e-3)
    assert np.abs(res.keypoints[0] - [300, 50]).max() < 1.0


def test_non_finite_model_output_is_reported_and_cleaned() -> None:
    pipe = PosePipeline(model=DotModel(nan=True), detector=None)
    pipe.input_hw = (128, 96)
    res = pipe(_blob_image(64, 64, (30.0, 30.0)))
    assert np.isfinite(res.keypoints).all() and np.isfinite(res.scores).all()
    assert res.scores[0, 5] <= 0
    assert any("NaN/inf in 1 heatmap(s)" in n for n in res.notices)
    assert res.detection_source == "whole_image" and any("detection is off" in n for n in res.notices)


def test_bad_options_are_refused() -> None:
    pipe = PosePipeline(model=DotModel(), detector=None)
    with pytest.raises(OptionError, match="flip_test must be True or False"):
        pipe(np.zeros((8, 8, 3), np.uint8), flip_test="yes")  # type: ignore[arg-type]
    with pytest.raises(OptionError, match=r"boxes must be numbers shaped \(P, 4\)"):
        pipe(np.zeros((8, 8, 3), np.uint8), boxes=[["a", "b", "c", "d"]])
    with pytest.raises(OptionError, match=r"boxes must be shaped \(N, 4\).*got shape \(1, 3\)"):
        pipe(np.zeros((8, 8, 3), np.uint8), boxes=[[1.0, 2.0, 3.0]])
    assert (
        pipeline_class("pose") is PosePipeline and pipeline_class("features").__name__ == "FeaturesPipeline"
    )
    with pytest.raises(OptionError, match="Unknown task 'dance'; choose one of: pose, seg"):
        pipeline("dance")


@pytest.fixture(scope="module")
def tiny_pose(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint("pose", tmp_path_factory.mktemp("pose_ckpt") / "pose", seed=3)


THREE_PEOPLE = np.array([[5.0, 10.0, 95.0, 230.0], [110.0, 20.0, 200.0, 235.0], [220.0, 40.0, 315.0, 225.0]])


def _count_forwards(pipe: PosePipeline) -> list[int]:
    sizes: list[int] = []
    pipe.model.register_forward_hook(lambda _m, args, _out: sizes.append(int(args[0].shape[0])))
    return sizes


@pytest.mark.slow
def test_tiny_checkpoint_end_to_end(tiny_pose: Path, tmp_path: Path) -> None:
    pipe = pipeline(
        "pose", checkpoint=tiny_pose, device="cpu", detector=lambda im: (THREE_PEOPLE, [0.9, 0.8, 0.7])
    )
    assert isinstance(pipe, PosePipeline)
    sizes = _count_forwards(pipe)
    rng = np.random.default_rng(0)
    path = tmp_path / "three people.png"
    Image.fromarray((rng.random((240, 320, 3)) * 255).astype(np.uint8)).save(path)
    res = pipe(path)
    assert sizes == [3]  # all people in ONE forward
    assert isinstance(res, PoseResult) and res.name == "three_people" and res.num_people == 3
    assert res.keypoints.shape == (3, NUM_KEYPOINTS, 2) and res.keypoints.dtype == np.float32
    assert res.scores.shape == (3, NUM_KEYPOINTS) and res.scores.dtype == np.float32
    assert np.isfinite(res.keypoints).all() and res.image.shape == (240, 320, 3)
    assert np.allclose(res.boxes, THREE_PEOPLE) and np.allclose(res.box_scores, [0.9, 0.8, 0.7])
    assert res.info.model_s > 0 and res.info.total_s >= res.info.model_s
    shown = res.render(threshold=0.0, show_boxes=True)
    assert shown.shape == (240, 320, 3) and shown.dtype == np.uint8 and not np.array_equal(shown, res.image)

    paths = res.save(tmp_path / "out")
    names = sorted(p.name for p in paths)
    assert names == [
        "three_people_coco17.json",
        "three_people_coco_wholebody.json",
        "three_people_keypoints.csv",
        "three_people_openpose.png",
        "three_people_openpose_body25.json",
        "three_people_openpose_coco18.json",
        "three_people_pose.json",
        "three_people_pose.png",
    ]
    main, formats = registry.get("pose").group_files(paths)  # the tab's two download lists
    assert [p.name for p in main] == [
        "three_people_pose.json",
        "three_people_openpose.png",
        "three_people_pose.png",
    ]
    assert {p.name for p in formats} == set(names) - {p.name for p in main}
    assert all(p.exists() and p.parent == tmp_path / "out" for p in paths)
    full = json.loads((tmp_path / "out" / "three_people_pose.json").read_text())
    assert len(full["people"]) == 3
    for person, kp in zip(full["people"], res.keypoints, strict=True):
        assert [p["name"] for p in person["keypoints"]] == list(KEYPOINT_NAMES)
        assert np.allclose([[p["x"], p["y"]] for p in person["keypoints"]], kp, atol=0.01)
    coco = json.loads((tmp_path / "out" / "three_people_coco17.json").read_text())
    assert len(coco["annotations"]) == 3 and coco["categories"][0]["keypoints"] == list(COCO17_NAMES)
    assert all(len(a["keypoints"]) == 51 for a in coco["annotations"])
    body25 = json.loads((tmp_path / "out" / "three_people_openpose_body25.json").read_text())
    assert [len(p["pose_keypoints_2d"]) for p in body25["people"]] == [75, 75, 75]
    assert (body25["canvas_width"], body25["canvas_height"]) == (320, 240)  # as the COCO-18 file has it
    assert [len(p["face_keypoints_2d"]) + len(p["hand_left_keypoints_2d"]) for p in body25["people"]] == [
        273
    ] * 3
    wholebody = json.loads((tmp_path / "out" / "three_people_coco_wholebody.json").read_text())
    assert [len(p["face_kpts"]) for p in wholebody] == [204] * 3
    assert len((tmp_path / "out" / "three_people_keypoints.csv").read_text().splitlines()) == 1 + 3 * 308
    coco18 = json.loads((tmp_path / "out" / "three_people_openpose_coco18.json").read_text())
    assert [len(p["pose_keypoints_2d"]) for p in coco18["people"]] == [54, 54, 54]
    assert (coco18["canvas_width"], coco18["canvas_height"]) == (320, 240)
    conditioning = np.asarray(Image.open(tmp_path / "out" / "three_people_openpose.png"))
    assert np.array_equal(conditioning, res.openpose(threshold=0.3)) and conditioning.shape == (240, 320, 3)
    png = np.asarray(Image.open(tmp_path / "out" / "three_people_pose.png"))
    assert png.shape == (240, 320, 3)
    assert res.to_dict()["detection"] == {"source": "detector", "num_found": 3}
    # a rendering made with the viewer's options is written as it is, not re-rendered
    res.save(tmp_path / "custom", rendered=shown)
    assert np.array_equal(np.asarray(Image.open(tmp_path / "custom" / "three_people_pose.png")), shown)
    assert not np.array_equal(png, shown)  # the default rendering (no boxes) differs


def test_tiny_checkpoint_flip_test_is_one_batch_of_six(tiny_pose: Path) -> None:
    pipe = PosePipeline(checkpoint=tiny_pose, device="cpu", detector=lambda im: THREE_PEOPLE)
    pipe.input_hw = (256, 192)
    sizes = _count_forwards(pipe)
    img = (np.random.default_rng(1).random((240, 320, 3)) * 255).astype(np.uint8)
    res = pipe(img, flip_test=True)
    assert sizes == [6]
    assert res.flip_test and res.keypoints.shape == (3, NUM_KEYPOINTS, 2) and np.isfinite(res.scores).all()
