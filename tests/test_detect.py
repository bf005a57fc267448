"""Person detector: parity with transformers' DETR, key namings, NMS, thresholds, cap, fallbacks."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from forking import expect_child_success
from safetensors.torch import load_file, save_file
from tiny_checkpoints import make_tiny_detr

from sapiens2.errors import CheckpointError, InputImageError, OptionError, WeightsUnavailableError
from sapiens2.models import detector as detect
from sapiens2.models.detector import Detections, PersonDetector, detect_people, nms, resize_shape

SMALL = {"shortest_edge": 160, "longest_edge": 240}  # a small network input keeps most tests fast


def _image(h: int = 37, w: int = 53) -> np.ndarray:
    """A small structured RGB image (random noise would make every DETR query look alike)."""
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([xx * 4, yy * 6, (xx * yy) % 255], -1).astype(np.uint8)
    img[5:20, 10:30] = (250, 20, 20)
    img[20:35, 35:50] = (10, 200, 30)
    return img


@pytest.fixture(scope="module")
def hf_detr(tmp_path_factory: pytest.TempPathFactory):
    """A tiny random transformers DETR (transformers-ResNet backbone) saved with save_pretrained."""
    folder = tmp_path_factory.mktemp("detr_no_timm")
    return make_tiny_detr(folder), folder


def _small(det: PersonDetector) -> PersonDetector:
    det.shortest_edge, det.longest_edge = SMALL["shortest_edge"], SMALL["longest_edge"]
    return det


@pytest.fixture(scope="module")
def tiny_det(hf_detr) -> PersonDetector:
    return _small(PersonDetector.load(hf_detr[1], device="cpu"))


def _reference(model, image: np.ndarray):
    """transformers' own processor (at SMALL) + model + post-processing, person class only."""
    from transformers.models.detr.image_processing_pil_detr import DetrImageProcessorPil

    proc = DetrImageProcessorPil(size=SMALL)
    inputs = proc(images=image, return_tensors="pt")
    with torch.no_grad():
        out = model(pixel_values=inputs["pixel_values"])
    res = proc.post_process_object_detection(out, threshold=0.0, target_sizes=[image.shape[:2]])[0]
    person = res["labels"] == 1
    return inputs["pixel_values"], out, res["boxes"][person], res["scores"][person]


# ----------------------------------------------------------------------------- parity


def test_preprocessing_matches_detr_image_processor() -> None:
    from transformers.models.detr.image_processing_pil_detr import DetrImageProcessorPil

    proc = DetrImageProcessorPil()  # the checkpoint's defaults: 800/1333, bilinear, /255, ImageNet mean/std
    for image in (_image(), _image(90, 40)):
        expected = proc(images=image, return_tensors="pt")["pixel_values"]
        assert min(expected.shape[2:]) == 800 or max(expected.shape[2:]) == 1333
        assert torch.allclose(detect.preprocess(image), expected, atol=1e-5)


def test_parity_with_transformers_through_our_loader(hf_detr) -> None:
    model, folder = hf_detr
    det = _small(PersonDetector.load(folder, device="cpu"))
    assert det.model.arch.encoder_heads == 2 and det.model.arch.decoder_heads == 4  # from config.json
    image = _image()
    pixels, out, ref_boxes, ref_scores = _reference(model, image)

    assert torch.allclose(detect.preprocess(image, shortest=160, longest=240), pixels, atol=1e-6)
    with torch.no_grad():
        logits, boxes = det.model(pixels)
    assert torch.allclose(logits, out.logits, atol=1e-4)
    assert torch.allclose(boxes, out.pred_boxes, atol=1e-4)

    raw_boxes, raw_scores = det.raw(image)
    assert len(raw_boxes) >= 2  # the fixture yields several person queries, so the comparison means something
    assert torch.allclose(raw_boxes, ref_boxes, atol=1e-4) and torch.allclose(
        raw_scores, ref_scores, atol=1e-4
    )

    found = det(image, score_threshold=0.0, iou_threshold=1.0, max_people=100)
    order = torch.sort(ref_scores, descending=True, stable=True).indices
    h, w = image.shape[:2]
    expect = ref_boxes[order].clone()
    expect[:, 0::2] = expect[:, 0::2].clamp(0, w)
    expect[:, 1::2] = expect[:, 1::2].clamp(0, h)
    valid = (expect[:, 2] > expect[:, 0]) & (expect[:, 3] > expect[:, 1])
    assert found.source == "detector" and found.boxes.dtype == np.float32
    np.testing.assert_allclose(found.boxes, expect[valid].numpy(), atol=1e-4)
    np.testing.assert_allclose(found.scores, ref_scores[order][valid].numpy(), atol=1e-4)


def _to_hub_main_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename a no_timm DETR file to the main revision's names, written out here on purpose.

    The main revision of facebook/detr-resnet-50 wraps a timm ResNet-50, whose module names are
    torchvision's; transformers' conversion script put them under model.backbone.conv_encoder.model.
    (its load warning for that file lists e.g. model.backbone.conv_encoder.model.layer1.0.downsample.1.
    num_batches_tracked, which the file also carries).
    """
    import re

    out = {}
    for key, value in tensors.items():
        new = key.replace("embedder.embedder.convolution", "conv1").replace(
            "embedder.embedder.normalization", "bn1"
        )
        m = re.search(
            r"encoder\.stages\.(\d+)\.layers\.(\d+)\.(layer\.(\d+)|shortcut)\.(convolution|normalization)",
            new,
        )
        if m and "conv_encoder" in new:
            stage, block = int(m.group(1)) + 1, m.group(2)
            if m.group(3) == "shortcut":
                part = "downsample.0" if m.group(5) == "convolution" else "downsample.1"
            else:
                part = ("conv" if m.group(5) == "convolution" else "bn") + str(int(m.group(4)) + 1)
            new = new[: m.start()] + f"layer{stage}.{block}.{part}" + new[m.end() :]
        out[new] = value
        if new.endswith("downsample.1.running_var"):
            out[new.replace("running_var", "num_batches_tracked")] = torch.tensor(0)
    return out


def test_hub_main_revision_naming_loads(hf_detr, tmp_path: Path) -> None:
    model, folder = hf_detr
    hub = _to_hub_main_names(load_file(str(folder / "model.safetensors")))
    for name in (  # literal names of the main revision's file
        "model.backbone.conv_encoder.model.conv1.weight",
        "model.backbone.conv_encoder.model.bn1.running_var",
        "model.backbone.conv_encoder.model.layer1.0.conv3.weight",
        "model.backbone.conv_encoder.model.layer2.1.bn2.bias",
        "model.backbone.conv_encoder.model.layer4.0.downsample.0.weight",
        "model.backbone.conv_encoder.model.layer4.0.downsample.1.num_batches_tracked",
        "model.encoder.layers.0.self_attn.out_proj.weight",
        "model.decoder.layers.1.encoder_attn.k_proj.bias",
        "class_labels_classifier.weight",
        "bbox_predictor.layers.2.bias",
    ):
        assert name in hub
    save_file(hub, str(tmp_path / "detr-resnet-50.safetensors"))
    (tmp_path / "config.json").write_bytes((folder / "config.json").read_bytes())
    det = _small(PersonDetector.load(tmp_path / "detr-resnet-50.safetensors", device="cpu"))
    image = _image()
    pixels, out, _, _ = _reference(model, image)
    with torch.no_grad():
        logits, boxes = det.model(pixels)
    assert torch.allclose(logits, out.logits, atol=1e-4) and torch.allclose(boxes, out.pred_boxes, atol=1e-4)


def test_resize_rule_matches_transformers() -> None:
    from transformers.image_transforms import get_size_with_aspect_ratio

    rng = np.random.default_rng(0)
    sizes = [(800, 1066), (1066, 800), (800, 800), (480, 640), (37, 53), (3000, 200), (200, 3000), (1, 1)]
    sizes += [tuple(int(v) for v in rng.integers(1, 4000, 2)) for _ in range(300)]
    for h, w in sizes:
        assert resize_shape(h, w) == tuple(get_size_with_aspect_ratio((h, w), 800, 1333)), (h, w)


# ----------------------------------------------------------------------------- NMS


def _nms_reference(boxes: np.ndarray, scores: np.ndarray, thr: float) -> list[int]:
    def iou(a, b) -> float:
        iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
        ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
        union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - iw * ih
        return iw * ih / union if union > 0 else 0.0

    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    keep: list[int] = []
    for i in order:
        if all(iou(boxes[i], boxes[k]) <= thr for k in keep):
            keep.append(i)
    return keep


@pytest.mark.parametrize("seed", range(6))
def test_nms_matches_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 80))
    xy = rng.uniform(0, 100, (n, 2))  # crowded canvas: plenty of overlaps
    wh = rng.uniform(2, 60, (n, 2))
    boxes = np.concatenate([xy, xy + wh], 1).astype(np.float64)
    scores = rng.uniform(0, 1, n).round(2)  # rounding creates ties, which must break by index
    for thr in (0.0, 0.1, 0.3, 0.5, 0.9, 1.0):
        got = nms(torch.from_numpy(boxes), torch.from_numpy(scores), thr).tolist()
        assert got == _nms_reference(boxes, scores, thr), (seed, thr)


def test_nms_edge_cases() -> None:
    assert nms(torch.zeros(0, 4), torch.zeros(0), 0.3).tolist() == []
    same = torch.tensor([[0.0, 0, 10, 10]] * 3)
    assert nms(same, torch.tensor([0.2, 0.9, 0.5]), 0.3).tolist() == [1]
    with pytest.raises(OptionError, match=r"boxes \(N, 4\)"):
        nms(torch.zeros(3, 3), torch.zeros(3), 0.3)


# ----------------------------------------------------------------------------- threshold and cap


def _fixed(boxes, scores):
    return lambda image: (np.asarray(boxes, np.float32), np.asarray(scores, np.float32))


def test_threshold_sort_and_clip() -> None:
    image = np.zeros((100, 200, 3), np.uint8)
    boxes = [[0, 0, 10, 10], [50, 50, 90, 90], [120, 10, 250, 60], [0, 0, 10, 10.5]]
    found = detect_people(image, detector=_fixed(boxes, [0.3, 0.8, 0.5, 0.29]), score_threshold=0.3)
    # 0.3 is not above 0.3; the box past the right edge is clipped to the 200 px width
    np.testing.assert_array_equal(found.scores, np.float32([0.8, 0.5]))
    np.testing.assert_array_equal(found.boxes, np.float32([[50, 50, 90, 90], [120, 10, 200, 60]]))
    assert found.source == "detector" and found.num_found == 2 and found.notices == []


def test_nms_applied_to_detector_output() -> None:
    image = np.zeros((100, 100, 3), np.uint8)
    boxes = [[10, 10, 50, 50], [12, 12, 52, 52], [60, 60, 90, 90]]
    kept = detect_people(image, detector=_fixed(boxes, [0.9, 0.8, 0.7]), iou_threshold=0.3)
    assert kept.scores.tolist() == pytest.approx([0.9, 0.7])
    loose = detect_people(image, detector=_fixed(boxes, [0.9, 0.8, 0.7]), iou_threshold=0.95)
    assert len(loose) == 3


def test_cap_keeps_best_and_says_so() -> None:
    image = np.zeros((100, 400, 3), np.uint8)
    boxes = [[i * 50, 0, i * 50 + 40, 90] for i in range(5)]
    scores = [0.4, 0.9, 0.6, 0.8, 0.5]
    found = detect_people(image, detector=_fixed(boxes, scores), max_people=3)
    assert found.num_found == 5 and len(found) == 3
    np.testing.assert_allclose(found.scores, [0.9, 0.8, 0.6])
    assert found.boxes[0, 0] == 50 and found.boxes[1, 0] == 150
    assert any("Found 5 people, kept 3" in n for n in found.notices)


def test_real_detector_threshold_and_cap(tiny_det: PersonDetector) -> None:
    det = tiny_det
    image = _image()
    everything = det(image, score_threshold=0.0, iou_threshold=1.0, max_people=100)
    assert len(everything) >= 2
    capped = det(image, score_threshold=0.0, iou_threshold=1.0, max_people=1)
    assert len(capped) == 1 and capped.num_found == len(everything)
    assert capped.scores[0] == everything.scores[0] and "kept 1" in capped.notices[0]
    mid = float(everything.scores[len(everything) // 2])
    assert (det(image, score_threshold=mid, iou_threshold=1.0).scores > mid).all()


# ----------------------------------------------------------------------------- fallbacks


def test_no_person_gives_whole_image(tiny_det: PersonDetector) -> None:
    det = tiny_det
    image = _image()
    assert len(det(image, score_threshold=1.0)) == 0  # the detector itself reports nothing
    found = detect_people(image, detector=det, score_threshold=1.0)
    assert found.source == "whole_image" and found.num_found == 0
    np.testing.assert_array_equal(
        found.boxes, np.float32([[0, 0, 52, 36]])
    )  # the release: [0, 0, w - 1, h - 1]
    assert "No person found" in found.notices[0] and "whole image" in found.notices[0]


def test_detector_none_gives_whole_image() -> None:
    found = detect_people(np.zeros((30, 40, 3), np.uint8), detector=None)
    assert found.source == "whole_image" and found.boxes.tolist() == [[0, 0, 39, 29]]
    assert "detection is off" in found.notices[0]


def test_caller_boxes_skip_the_detector() -> None:
    def must_not_run(image):
        raise AssertionError("the detector ran although boxes were given")

    found = detect_people(
        np.zeros((50, 60, 3), np.uint8), boxes=[[-5, 10, 30, 70], [20, 5, 40, 25]], detector=must_not_run
    )
    assert found.source == "caller" and found.num_found == 2 and found.notices == []
    np.testing.assert_array_equal(found.boxes, np.float32([[0, 10, 30, 50], [20, 5, 40, 25]]))
    single = detect_people(np.zeros((50, 60, 3), np.uint8), boxes=(1, 2, 3, 4), detector=must_not_run)
    assert single.boxes.shape == (1, 4)


@pytest.fixture
def offline_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No Hub access and an empty cache, as on a machine that never downloaded the detector."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty_hub_cache"))
    monkeypatch.delenv("SAPIENS2_CHECKPOINTS", raising=False)
    monkeypatch.setattr(detect, "_AUTO", {})


def test_unavailable_weights_then_local_root(
    offline_hub, hf_detr, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    image = _image()
    with pytest.raises(detect.WeightsUnavailableError, match="facebook/detr-resnet-50"):
        PersonDetector.load()
    found = detect_people(image)
    assert found.source == "whole_image" and found.boxes.tolist() == [[0, 0, 52, 36]]
    assert (
        "facebook/detr-resnet-50" in found.notices[0]
        and "$SAPIENS2_CHECKPOINTS/detector/" in found.notices[0]
    )
    assert detect._AUTO == {}  # the failure was not cached

    # the same process picks the weights up once they appear under the local root
    root = tmp_path / "ckpts"
    (root / "detector").mkdir(parents=True)
    hub = _to_hub_main_names(load_file(str(hf_detr[1] / "model.safetensors")))
    save_file(hub, str(root / "detector" / "detr-resnet-50.safetensors"))
    (root / "detector" / "config.json").write_bytes((hf_detr[1] / "config.json").read_bytes())
    monkeypatch.setenv("SAPIENS2_CHECKPOINTS", str(root))
    found = detect_people(image, score_threshold=0.0, iou_threshold=1.0)
    assert found.source == "detector" and len(found) >= 2 and len(detect._AUTO) == 1


def test_auto_detector_loads_once_across_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    sentinel = object()

    def slow_load(**kwargs):
        calls.append(1)
        threading.Event().wait(0.05)
        return sentinel

    monkeypatch.setattr(detect, "_AUTO", {})
    monkeypatch.setattr(PersonDetector, "load", staticmethod(slow_load))
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(detect._auto_detector())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and got == [sentinel] * 4


def test_auto_detector_is_cached_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[torch.device] = []

    def fake_load(*, device):
        loaded.append(device)
        return object()

    monkeypatch.setattr(detect, "_AUTO", {})
    monkeypatch.setattr(PersonDetector, "load", staticmethod(fake_load))
    cpu = detect._auto_detector("cpu")
    assert detect._auto_detector(torch.device("cpu")) is cpu
    meta = detect._auto_detector("meta")
    assert meta is not cpu
    # "cuda" (the serving manager's device) and "cuda:0" (a loaded model's) share one detector
    assert detect._auto_detector("cuda") is detect._auto_detector(torch.device("cuda", 0))
    assert sorted(detect._AUTO) == ["cpu", "cuda:0", "meta"]
    assert [str(d) for d in loaded] == ["cpu", "meta", "cuda:0"]


def test_auto_detector_on_a_device_without_weights_falls_back(offline_hub) -> None:
    found = detect_people(_image(), detector="auto", device="cpu")
    assert found.source == "whole_image" and "facebook/detr-resnet-50" in found.notices[0]
    assert detect._AUTO == {}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_gets_a_fresh_detector_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    # ZeroGPU forks its GPU worker, possibly while a request thread is loading the detector.
    sentinel = object()
    monkeypatch.setattr(detect, "_AUTO", {"cpu": sentinel})
    with detect._AUTO_LOCK:  # as if another thread were loading at fork time
        pid = os.fork()
        if pid == 0:
            os._exit(0 if detect._auto_detector("cpu") is sentinel else 1)
    expect_child_success(pid, "the detector's lock")


def test_very_elongated_images_are_detected_without_error(tiny_det: PersonDetector) -> None:
    assert resize_shape(2, 10000) == (1, 1333) and resize_shape(10000, 2) == (1333, 1)
    for h, w in [(2, 10000), (10000, 2)]:
        found = tiny_det(np.full((h, w, 3), 128, np.uint8), score_threshold=0.0)
        assert len(found) >= 1 and found.boxes[:, 2].max() <= w and found.boxes[:, 3].max() <= h


def test_injected_detector_may_return_detections_or_plain_boxes() -> None:
    image = np.zeros((100, 100, 3), np.uint8)
    three = np.float32([[0, 0, 30, 90], [35, 0, 65, 90], [70, 0, 100, 90]])
    plain = detect_people(image, detector=lambda im: three)
    assert len(plain) == 3 and plain.source == "detector"
    made = Detections(three, np.float32([0.5, 0.9, 0.7]), "detector", 3, ["from a test"])
    typed = detect_people(image, detector=lambda im: made)
    np.testing.assert_allclose(typed.scores, [0.9, 0.7, 0.5])
    assert typed.notices == ["from a test"]
    empty = detect_people(image, detector=lambda im: np.zeros((0, 4), np.float32))
    assert empty.source == "whole_image"


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"score_threshold": -0.1}, r"score_threshold must be a number in \[0, 1\]"),
        ({"score_threshold": 1.5}, r"score_threshold must be a number in \[0, 1\]"),
        ({"iou_threshold": 2}, r"iou_threshold must be a number in \[0, 1\]"),
        ({"iou_threshold": "0.3"}, r"iou_threshold must be a number in \[0, 1\]"),
        ({"max_people": 0}, r"max_people must be a whole number >= 1"),
        ({"max_people": 2.5}, r"max_people must be a whole number >= 1"),
        ({"detector": " "}, r"detector must be 'auto', None, a DETR checkpoint path, a PersonDetector or a"),
        ({"detector": 3}, r"detector must be 'auto', None, a DETR checkpoint path, a PersonDetector or a"),
        ({"boxes": [[1, 2, 3]]}, r"boxes must be shaped \(N, 4\)"),
        ({"boxes": []}, r"boxes is empty"),
        ({"boxes": [[0, 0, np.nan, 5]]}, r"NaN or infinite"),
        ({"boxes": [[10, 10, 5, 20]]}, r"Box 0 is empty inside the 40x30 image"),
        ({"boxes": [[50, 0, 60, 10]]}, r"Box 0 is empty inside the 40x30 image"),
        ({"boxes": "abc"}, r"boxes must be numbers shaped \(N, 4\)"),
    ],
)
def test_option_errors(kwargs: dict, message: str) -> None:
    kwargs.setdefault("detector", None)
    with pytest.raises(OptionError, match=message):
        detect_people(np.zeros((30, 40, 3), np.uint8), **kwargs)


def test_a_detector_named_by_its_checkpoint_loads_once_per_device(hf_detr, tmp_path: Path) -> None:
    found = detect_people(_image(), detector=hf_detr[1], score_threshold=0.0, device="cpu")
    again = detect_people(_image(), detector=str(hf_detr[1]), score_threshold=0.0, device="cpu")
    assert found.source == "detector" and np.array_equal(found.boxes, again.boxes)
    assert detect.detector_from(hf_detr[1], "cpu") is detect.detector_from(str(hf_detr[1]), "cpu")
    with pytest.raises(WeightsUnavailableError, match="does not exist"):
        detect_people(_image(), detector=tmp_path / "yolo")


def test_a_detector_input_made_apart_finds_the_same_people(tiny_det: PersonDetector) -> None:
    """The CPU makes the detector's input (uint8 at DETR's size), the device finds the people in
    it: the same boxes, scores and notices as from the image, in the image's pixels."""
    small, image = _image(90, 130), _image(300, 420)
    inp = tiny_det.input_for(image)  # DETR shrinks it: the resized copy is made here
    assert inp.pixels.dtype == np.uint8 and inp.image_hw == (300, 420)
    assert inp.pixels.shape[:2] == resize_shape(300, 420, 160, 240)
    assert tiny_det.input_for(small).pixels is small  # DETR would enlarge it: it goes as it is
    got = detect_people(tiny_det.input_for(small), detector=tiny_det, score_threshold=0.0)
    assert np.array_equal(got.boxes, detect_people(small, detector=tiny_det, score_threshold=0.0).boxes)
    for kw in (
        {"score_threshold": 0.0},
        {"score_threshold": 0.0, "max_people": 2},
        {"score_threshold": 0.99},
    ):
        want = detect_people(image, detector=tiny_det, **kw)
        got = detect_people(inp, detector=tiny_det, **kw)
        assert np.array_equal(got.boxes, want.boxes) and np.array_equal(got.scores, want.scores)
        assert (got.source, got.num_found, got.notices) == (want.source, want.num_found, want.notices)
    assert detect_people(image, detector=tiny_det, score_threshold=0.99).source == "whole_image"
    with pytest.raises(OptionError, match="resized for edges"):
        tiny_det.raw_input(detect.detector_input(image))  # made for the default 800/1333 rule
    with pytest.raises(OptionError, match="needs the image itself"):
        detect_people(inp, detector=lambda rgb: [[0, 0, 5, 5]])
    assert detect_people(inp, detector=None).boxes.tolist() == [[0, 0, 419, 299]]


def test_injected_detector_bad_output() -> None:
    image = np.zeros((30, 40, 3), np.uint8)
    with pytest.raises(OptionError, match="returned 2 boxes but 3 scores"):
        detect_people(image, detector=lambda im: (np.zeros((2, 4)), np.ones(3)))
    with pytest.raises(OptionError, match=r"Boxes from the injected detector must be shaped \(N, 4\)"):
        detect_people(image, detector=lambda im: np.zeros((2, 5)))


@pytest.mark.parametrize(
    ("image", "message"),
    [
        ([[0, 0, 0]], "must be a numpy array"),
        (np.zeros((10, 10), np.uint8), r"must be \(H, W, 3\) uint8 RGB"),
        (np.zeros((10, 10, 4), np.uint8), r"must be \(H, W, 3\) uint8 RGB"),
        (np.zeros((10, 10, 3), np.float32), r"must be \(H, W, 3\) uint8 RGB"),
        (np.zeros((0, 10, 3), np.uint8), "is empty"),
    ],
)
def test_image_errors(image, message: str) -> None:
    with pytest.raises(InputImageError, match=message):
        detect_people(image, detector=None)


def test_checkpoint_errors(hf_detr, tmp_path: Path) -> None:
    save_file({"foo": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(CheckpointError, match="not a DETR checkpoint"):
        PersonDetector.load(tmp_path / "other.safetensors", device="cpu")

    tensors = load_file(str(hf_detr[1] / "model.safetensors"))
    tensors["model.extra.weight"] = torch.zeros(1)
    del tensors["model.decoder.layernorm.bias"]
    save_file(tensors, str(tmp_path / "odd.safetensors"))
    with pytest.raises(
        CheckpointError, match=r"missing \(1\): decoder.layernorm.bias; unexpected \(1\): extra.weight"
    ):
        PersonDetector.load(tmp_path / "odd.safetensors", device="cpu")

    folder = tmp_path / "nolabel"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes((hf_detr[1] / "model.safetensors").read_bytes())
    config = (hf_detr[1] / "config.json").read_text().replace('"person"', '"pedestrian"')
    (folder / "config.json").write_text(config)
    with pytest.raises(CheckpointError, match="no 'person' class"):
        PersonDetector.load(folder, device="cpu")

    config = (hf_detr[1] / "config.json").read_text().replace('"dilation": false', '"dilation": true')
    (folder / "config.json").write_text(config)
    with pytest.raises(CheckpointError, match=r"asks for a dilated last stage \(DC5\)"):
        PersonDetector.load(folder, device="cpu")
