"""Pose and features against the release's inference rules (SPEC 4 and 4.1), and their stages.

The release's steps are written out here independently, with cv2 as the release calls it
(``vis_pose.py``, ``PoseTopdownAffine``, mmpose's ``bbox_xyxy2cs`` / ``get_udp_warp_matrix`` in
their float32 arithmetic), and compared with what the pipeline feeds the network and returns.
Photos: 600x471 (landscape), 471x600 (portrait) and 4000x3000 (12 MP, over 4x the network input
along each side), all below the working-copy limit so the network sees their own pixels.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch

from sapiens2.data.metadata import FLIP_INDEX, NUM_KEYPOINTS
from sapiens2.inputs.intake import load_image
from sapiens2.models.detector import detect_people
from sapiens2.models.zoo import IMAGE_MEAN, IMAGE_STD
from sapiens2.tasks.features import FeaturesPipeline
from sapiens2.tasks.pose import TASK, PosePipeline, PosePrep, PoseRaw
from sapiens2.tasks.pose.pose_codec import decode_heatmaps
from sapiens2.tasks.pose.pose_crops import crop_people

ASSETS = Path(__file__).resolve().parents[1] / "assets"
IN_H, IN_W = 1024, 768


# ----------------------------------------------------------------------------- the release, written out


def release_center_scale(box: Any) -> tuple[np.ndarray, np.ndarray]:
    """bbox_xyxy2cs(padding=1.25) then _fix_aspect_ratio(w/h = 768/1024), float32 as the release."""
    x1, y1, x2, y2 = np.asarray(box, np.float32)
    center = np.array([x1 + x2, y1 + y2], np.float32) * np.float32(0.5)
    w, h = np.array([x2 - x1, y2 - y1], np.float32) * np.float32(1.25)
    aspect = np.float32(IN_W / IN_H)
    scale = np.array([w, w / aspect] if w > h * aspect else [h * aspect, h], np.float32)
    return center, scale


def release_crop(img: np.ndarray, box: Any) -> np.ndarray:
    """PoseTopdownAffine: UDP warp matrix, INTER_AREA when shrinking else INTER_CUBIC, zero border."""
    (cx, cy), (sw, sh) = release_center_scale(box)
    kx, ky = np.float32(IN_W - 1) / sw, np.float32(IN_H - 1) / sh
    m = np.array(
        [[kx, 0, kx * (-cx + np.float32(0.5) * sw)], [0, ky, ky * (-cy + np.float32(0.5) * sh)]], np.float32
    )
    shrink = min(np.linalg.norm(m[0, :2]), np.linalg.norm(m[1, :2])) < 1.0
    return cv2.warpAffine(img, m, (IN_W, IN_H), flags=cv2.INTER_AREA if shrink else cv2.INTER_CUBIC)


def release_to_image(kp_hm: np.ndarray, box: Any, hm_hw: tuple[int, int]) -> np.ndarray:
    """codec: kp / (heatmap - 1) * input; vis_pose: kp / input * scale + centre - scale / 2."""
    center, scale = release_center_scale(box)
    kp = kp_hm / [hm_hw[1] - 1, hm_hw[0] - 1] * [IN_W, IN_H]
    return kp / [IN_W, IN_H] * scale + center - 0.5 * scale


def release_flip(plain: torch.Tensor, flipped: torch.Tensor) -> torch.Tensor:
    """vis_pose.py: pred_flipped.flip(-1)[:, flip_indices], averaged with pred."""
    return (plain + flipped.flip(-1)[:, list(FLIP_INDEX)]) / 2.0


def grey(x: torch.Tensor) -> np.ndarray:
    """A normalised (3, H, W) network input back to (H, W, 3) grey levels."""
    mean = np.array(IMAGE_MEAN)[:, None, None] * 255
    std = np.array(IMAGE_STD)[:, None, None] * 255
    return (x.double().numpy() * std + mean).transpose(1, 2, 0)


# ----------------------------------------------------------------------------- photos and spies


@pytest.fixture(scope="module")
def photos() -> dict[str, np.ndarray]:
    group = load_image(ASSETS / "nasa-apollo11-crew-seated-group.png").rgb  # 600x471
    assert group.shape == (471, 600, 3)
    big = cv2.resize(load_image(ASSETS / "pexels-cc0-soccer-three-players-motion.jpg").rgb, (4000, 3000))
    return {"600x471": group, "471x600": np.ascontiguousarray(group.transpose(1, 0, 2)), "4000x3000": big}


def people(w: int, h: int, n: int) -> np.ndarray:
    """n standing people side by side in the lower two thirds (fractions of the photo)."""
    x = np.linspace(0.05, 0.95, n + 1)
    return np.array([[x[i] * w, 0.3 * h, x[i + 1] * w - 5, 0.97 * h] for i in range(n)], np.float32)


class Spy:
    """Records the pose model's inputs and heatmaps while the ``with`` block runs."""

    def __init__(self, pipe: PosePipeline) -> None:
        self.model = pipe.model
        self.inputs: list[torch.Tensor] = []
        self.heatmaps: list[torch.Tensor] = []

    def __enter__(self) -> Spy:
        self.hooks = [
            self.model.register_forward_pre_hook(
                lambda _m, args: self.inputs.append(args[0].detach().clone())
            ),
            self.model.register_forward_hook(
                lambda _m, _a, out: self.heatmaps.append(out.heatmaps.detach().float())
            ),
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for hook in self.hooks:
            hook.remove()


@pytest.fixture(scope="module")
def pose_pipe(tiny_checkpoints: dict[str, Path]) -> PosePipeline:
    return PosePipeline(checkpoint=tiny_checkpoints["pose"], device="cpu", detector=None)


# ----------------------------------------------------------------------------- fallback box and crops


def same_point(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal within 1e-3 px or a few float32 steps: keypoints are float32, and at 3000 px one
    float32 step is 2.4e-4 px, so the release's float64 arithmetic differs by a few steps there."""
    tol = np.maximum(1e-3, 8 * np.spacing(np.abs(want).astype(np.float32)))
    return bool((np.abs(got - want) <= tol).all())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["600x471", "471x600", "4000x3000"])
def test_whole_image_box_crop_and_keypoints_equal_the_release(
    pose_pipe: PosePipeline, photos: dict[str, np.ndarray], name: str
) -> None:
    img = photos[name]
    h, w = img.shape[:2]
    box = [0, 0, w - 1, h - 1]  # vis_pose.py's fallback
    assert detect_people(img, detector=None).boxes.tolist() == [box]
    with Spy(pose_pipe) as spy:
        res = pose_pipe(img, flip_test=False)
    [x], [hm] = spy.inputs, spy.heatmaps
    assert x.shape == (1, 3, IN_H, IN_W)
    assert np.abs(grey(x[0]) - release_crop(img, box)).max() < 1e-3  # the same pixels, exactly
    kp_hm, _ = decode_heatmaps(hm.numpy())
    want = release_to_image(kp_hm[0].astype(np.float64), box, tuple(hm.shape[-2:]))
    found = res.scores[0] > 0
    assert found.any() and same_point(res.keypoints[0][found], want[found])
    assert res.boxes.tolist() == [box] and res.detection_source == "whole_image"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["600x471", "471x600", "4000x3000"])
def test_caller_boxes_crop_exactly_as_the_release(
    pose_pipe: PosePipeline, photos: dict[str, np.ndarray], name: str
) -> None:
    """Known boxes: a large photo's crops are made in prepare (smaller than the photo), a small
    photo travels whole and is cropped in infer; the same pixels either way."""
    img = photos[name]
    boxes = people(img.shape[1], img.shape[0], 3)
    boxes[1] = [0.4 * img.shape[1], 0.1 * img.shape[0], 0.45 * img.shape[1], 0.2 * img.shape[0]]  # enlarged
    prep = pose_pipe.prepare(load_image(img), boxes=boxes)
    assert (prep.crops is not None) == (name == "4000x3000") and (prep.image is None) == (name == "4000x3000")
    with Spy(pose_pipe) as spy:
        pose_pipe.infer([prep], flip_test=False)
    [x] = spy.inputs
    for i, box in enumerate(boxes):
        assert np.abs(grey(x[i]) - release_crop(img, box)).max() < 1e-3, i


@pytest.mark.parametrize("name", ["600x471", "471x600", "4000x3000"])
def test_torch_crops_within_one_grey_level_of_the_release(photos: dict[str, np.ndarray], name: str) -> None:
    """The GPU crop path (grid_sample): tolerance 1 grey level, p99 exact."""
    img = photos[name]
    boxes = np.concatenate(
        [people(img.shape[1], img.shape[0], 2), [[0, 0, img.shape[1] - 1, img.shape[0] - 1]]]
    )
    x, _ = crop_people(img, boxes, backend="torch")
    for i, box in enumerate(boxes):
        d = np.abs(grey(x[i]) - release_crop(img, box))
        assert d.max() < 1.01 and np.percentile(d, 99) < 1e-3, (i, d.max())


@pytest.mark.slow
def test_flip_test_runs_mirrors_in_the_same_batch_and_averages_as_the_release(
    pose_pipe: PosePipeline, photos: dict[str, np.ndarray]
) -> None:
    img = photos["600x471"]
    boxes = people(600, 471, 2)
    with Spy(pose_pipe) as spy:
        res = pose_pipe(img, boxes=boxes, flip_test=True)
    [x], [hm] = spy.inputs, spy.heatmaps
    assert x.shape[0] == 4 and torch.equal(x[2:], x[:2].flip(-1))
    kp_hm, _ = decode_heatmaps(release_flip(hm[:2], hm[2:]).numpy())
    for i, box in enumerate(boxes):
        want = release_to_image(kp_hm[i].astype(np.float64), box, tuple(hm.shape[-2:]))
        found = res.scores[i] > 0
        assert same_point(res.keypoints[i][found], want[found])
    assert res.flip_test


# ----------------------------------------------------------------------------- flip test default


def test_flip_default_is_on_for_a_gpu_off_for_a_cpu_in_ui_api_and_pipeline(pose_pipe: PosePipeline) -> None:
    from sapiens2.serving import ModelManager
    from sapiens2.ui.endpoints import task_endpoint
    from sapiens2.ui.page_runner import Runner
    from sapiens2.ui.widgets import option_widget

    flip = next(o for o in TASK.options if o.name == "flip_test")
    assert TASK.split({}, gpu=True)[0]["flip_test"] is True
    assert TASK.split({}, gpu=False)[0]["flip_test"] is False
    on, off = option_widget(flip, gpu=True), option_widget(flip, gpu=False)
    assert on.value is True and on.label.endswith("(on by default on this GPU)")
    assert off.value is False and off.label.endswith("(off by default on this CPU)")
    run = Runner(ModelManager(device="cpu"))  # the endpoint's size doc reads the runner's manager
    for gpu in (True, False):
        doc = task_endpoint(run, TASK, gpu).__doc__
        assert (
            "flip_test: also run the mirrored crops and average; default True on a GPU, False on a CPU."
            in doc
        )
    on_cpu = PosePipeline(model=pose_pipe.model, detector=None)
    on_cpu.input_hw = (128, 96)
    with Spy(on_cpu) as spy:
        assert on_cpu._flip_test(None) is False and on_cpu(np.zeros((40, 30, 3), np.uint8)).flip_test is False
    assert spy.inputs[0].shape[0] == 1  # no mirrored crop
    on_gpu = PosePipeline(model=pose_pipe.model, detector=None)
    on_gpu.device = torch.device("cuda")  # the rule only; nothing runs
    assert on_gpu._flip_test(None) is True and on_gpu._flip_test(False) is False


# ----------------------------------------------------------------------------- stages


def test_pose_stages_equal_the_call(pose_pipe: PosePipeline, photos: dict[str, np.ndarray]) -> None:
    img = photos["471x600"]
    pipe = PosePipeline(
        model=pose_pipe.model, detector=lambda im: (people(im.shape[1], im.shape[0], 2), [0.9, 0.8])
    )
    pipe.input_hw = (256, 192)  # the stages, not the pixels, are under test here: keep it fast
    for opts in (
        {"flip_test": False},
        {"flip_test": True},
        {"boxes": people(471, 600, 3), "flip_test": False},
    ):
        whole = pipe(img, **opts)
        intake = load_image(img)
        infer_opts = {k: v for k, v in opts.items() if k != "boxes"}
        [raw] = pipe.infer([pipe.prepare(intake, **opts)], **infer_opts)
        staged = pipe.finish(raw, intake, **opts)
        assert np.array_equal(staged.keypoints, whole.keypoints) and np.array_equal(
            staged.scores, whole.scores
        )
        assert np.array_equal(staged.boxes, whole.boxes) and staged.detection_source == whole.detection_source
        assert staged.notices == whole.notices and staged.flip_test == whole.flip_test
    # two photos in one device call: one forward, each photo's people as when run alone
    a, b = load_image(img), load_image(photos["600x471"])
    with Spy(pipe) as spy:
        raws = pipe.infer([pipe.prepare(a), pipe.prepare(b, boxes=people(600, 471, 1))], flip_test=False)
    assert len(spy.inputs) == 1 and spy.inputs[0].shape[0] == 3
    assert np.allclose(pipe.finish(raws[0], a).keypoints, pipe(img, flip_test=False).keypoints, atol=1e-4)


def test_features_stages_equal_the_call(
    tiny_checkpoints: dict[str, Path], photos: dict[str, np.ndarray]
) -> None:
    pipe = FeaturesPipeline(checkpoint=tiny_checkpoints["features"], device="cpu")
    pipe.input_hw = (256, 192)
    img = photos["600x471"]
    whole = pipe(img)
    intake = load_image(img)
    [raw] = pipe.infer([pipe.prepare(intake)])
    staged = pipe.finish(raw, intake)
    assert np.array_equal(staged.embedding, whole.embedding)
    assert np.array_equal(staged.patch_features, whole.patch_features)
    assert staged.patch_features.shape[1:] == (16, 12) and staged.patch_features.dtype == np.float32
    prep = pipe.prepare(load_image(photos["4000x3000"]))
    assert prep.pixels.shape == (256, 192, 3) and prep.pixels.dtype == np.uint8
    raw_bytes = len(pickle.dumps(pipe.infer([prep])[0]))
    dim = staged.embedding.shape[0]
    assert raw_bytes <= 4 * dim * (1 + 16 * 12) + 4096  # the network's output and nothing else


# ----------------------------------------------------------------------------- what crosses the boundary


@pytest.mark.slow
def test_a_12mp_photo_with_five_people_crosses_in_small_pieces(
    pose_pipe: PosePipeline, photos: dict[str, np.ndarray]
) -> None:
    """ZeroGPU pickles preps in and raws out. Bounds: a raw <= 32 KB (5 x 308 points); a prep <=
    the five uint8 crops + 4 KB (a third of the photo's 36 MB); without boxes, the photo + 4 KB."""
    img = photos["4000x3000"]
    boxes = people(4000, 3000, 5)
    intake = load_image(img)
    prep = pose_pipe.prepare(intake, boxes=boxes)
    assert isinstance(prep, PosePrep) and len(pickle.dumps(prep)) <= 5 * IN_H * IN_W * 3 + 4096
    [raw] = pose_pipe.infer([prep], flip_test=False)
    assert isinstance(raw, PoseRaw) and raw.keypoints.shape == (5, NUM_KEYPOINTS, 2)
    assert len(pickle.dumps(raw)) <= 32 * 1024
    assert len(pickle.dumps(pose_pipe.prepare(intake))) <= img.nbytes + 4096
