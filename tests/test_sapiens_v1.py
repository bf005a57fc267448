"""Sapiens v1 files (TorchScript, ExportedProgram) behind the pipelines, and v1's own rules,
checked against the numbers SAPIENS_V1_SPEC.md gives."""

from __future__ import annotations

import inspect
import zipfile
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from v1_models import save_v1

import sapiens2
from sapiens2.errors import CheckpointError
from sapiens2.inputs.network import network_batch
from sapiens2.models import v1_files, zoo
from sapiens2.models.loading import describe_checkpoint, load_model
from sapiens2.models.v1_model import MISSING_LOGIT


@pytest.fixture(scope="session")
def v1_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("v1")
    for kind in ("seg", "pose17", "normal", "features"):
        save_v1(kind, folder)
    save_v1("pose", folder, "bfloat16", batch=2)  # 308 heatmaps; a fixed batch of 2, as an export may have
    return folder


@pytest.mark.slow
def test_format_is_read_from_the_bytes_not_the_name(v1_dir: Path, tmp_path: Path, tiny_checkpoints) -> None:
    ts, ep = v1_dir / "sapiens_tiny_seg_torchscript.pt2", v1_dir / "sapiens_tiny_pose_bfloat16.pt2"
    swapped_ts, swapped_ep = tmp_path / "x_bfloat16.pt2", tmp_path / "y_torchscript.safetensors"
    swapped_ts.write_bytes(ts.read_bytes())
    swapped_ep.write_bytes(ep.read_bytes())
    assert v1_files.file_format(swapped_ts) == v1_files.TORCHSCRIPT
    assert v1_files.file_format(swapped_ep) == v1_files.EXPORTED
    safetensors = next(Path(tiny_checkpoints["seg"]).glob("*.safetensors"))
    assert v1_files.file_format(safetensors) == v1_files.SAFETENSORS
    pickled = tmp_path / "plain.pt2"
    torch.save({"w": torch.zeros(2)}, pickled)
    assert zipfile.is_zipfile(pickled)
    with pytest.raises(CheckpointError, match="pickled torch.save checkpoint is not read"):
        v1_files.file_format(pickled)
    junk = tmp_path / "junk.pt2"
    junk.write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="not a checkpoint this package reads"):
        v1_files.file_format(junk)
    with pytest.raises(CheckpointError, match="pickled torch.save checkpoint is not read"):
        load_model("seg", checkpoint=pickled, device="cpu")


def test_normalisation_is_v1s_mean_and_std_on_rgb(v1_dir: Path) -> None:
    model = load_model("seg", checkpoint=v1_dir / "sapiens_tiny_seg_torchscript.pt2", device="cpu")
    pixel = np.array([[[255, 0, 128]]], np.uint8)  # RGB
    x = model.v1_input(network_batch([pixel], "cpu"))[0, :, 0, 0]
    want = [(255 - 123.5) / 58.5, (0 - 116.5) / 57.0, (128 - 103.5) / 57.5]  # spec 3.1, 0-255 scale
    assert x.tolist() == pytest.approx(want, abs=1e-5)


@pytest.mark.slow
def test_torchscript_and_exported_program_give_typed_outputs(v1_dir: Path) -> None:
    from v1_models import SHAPES, TinyV1

    ts = load_model("seg", checkpoint=v1_dir / "sapiens_tiny_seg_torchscript.pt2", device="cpu")
    ep = load_model("pose", checkpoint=v1_dir / "sapiens_tiny_pose_bfloat16.pt2", device="cpu")
    assert (ts.format, ep.format, ep.batch) == ("torchscript", "bfloat16", 2)
    # float32 on a CPU (bf16 is emulated there), bf16 when asked (the default on CUDA)
    assert next(ts.parameters()).dtype == next(ep.parameters()).dtype == torch.float32
    bf16 = load_model(
        "pose", checkpoint=v1_dir / "sapiens_tiny_pose_bfloat16.pt2", device="cpu", dtype="bf16"
    )
    assert next(bf16.parameters()).dtype == torch.bfloat16
    x = torch.randn(3, 3, 1024, 768)
    a = ts(x).logits
    assert a.shape == (3, 29, 512, 384)  # 28 classes + Eyeglass, at half resolution
    assert (a[:, 2] == MISSING_LOGIT).all() and (a[:, 3:] == ts.graph(ts.v1_input(x))[:, 2:]).all()
    heatmaps = ep(x).heatmaps  # 3 inputs through a graph exported for 2: padded batches
    with torch.no_grad():
        want = TinyV1(*SHAPES["pose"]).eval()(ep.v1_input(x))
    assert heatmaps.shape == (3, 308, 256, 192) and torch.allclose(heatmaps, want, atol=1e-5)
    features = load_model(
        "features", checkpoint=v1_dir / "sapiens_tiny_features_torchscript.pt2", device="cpu"
    )
    out = features(torch.zeros(1, 3, 1024, 1024))
    assert out.patch_features.shape == (1, 8, 64, 64)
    assert torch.allclose(out.cls_embedding, out.patch_features.mean((2, 3)))
    wrong = load_model("normal", checkpoint=v1_dir / "sapiens_tiny_seg_torchscript.pt2", device="cpu")
    with pytest.raises(CheckpointError, match="a Sapiens v1 normal model gives 3 channels"):
        wrong(torch.zeros(1, 3, 1024, 768))


def test_seg_stretches_bilinearly_and_never_says_eyeglass(v1_dir: Path) -> None:
    pipe = sapiens2.pipeline("seg", checkpoint=v1_dir / "sapiens_tiny_seg_torchscript.pt2", device="cpu")
    photo = np.random.default_rng(0).integers(0, 256, (300, 200, 3), dtype=np.uint8)
    prep = pipe.prepare(pipe._prepare(photo))
    want = cv2.resize(photo, (768, 1024), interpolation=cv2.INTER_LINEAR)  # spec 3.1 step 2
    assert np.array_equal(prep.pixels, want)
    result = pipe(photo)
    assert result.labels.shape == (300, 200) and 2 not in np.unique(result.labels)
    assert "Eyeglass" not in result.legend_html()


def test_v1_sizes_resolve_to_the_trusted_repos_by_listing(monkeypatch, tmp_path: Path) -> None:
    import huggingface_hub

    seg = zoo.get_task("seg")
    assert seg.repo_id("v1-1b") == "facebook/sapiens-seg-1b-torchscript"
    assert seg.repo_id("v1-1b-bf16") == "facebook/sapiens-seg-1b-bfloat16"
    got = tmp_path / "sapiens_1b_goliath_best_goliath_mIoU_7994_epoch_151_bfloat16.pt2"
    got.write_bytes(b"x")
    listed: list[str] = []

    class Api:
        def list_repo_files(self, repo_id: str) -> list[str]:
            listed.append(repo_id)
            return [".gitattributes", "README.md", got.name]

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda repo, name: str(tmp_path / name))
    monkeypatch.delenv("SAPIENS2_CHECKPOINTS", raising=False)
    assert v1_files.find_v1_file("seg", "v1-1b-bf16") == got
    assert listed == ["facebook/sapiens-seg-1b-bfloat16"]
    with pytest.raises(CheckpointError, match="not a Sapiens v1 repo"):
        v1_files.hub_file("someone/sapiens-seg-1b-torchscript", "torchscript")


def test_describe_reads_name_and_bytes_only(v1_dir: Path, tmp_path: Path) -> None:
    named = tmp_path / "sapiens_0.3b_goliath_best_goliath_mIoU_7673_epoch_194_torchscript.pt2"
    named.write_bytes((v1_dir / "sapiens_tiny_seg_torchscript.pt2").read_bytes())
    info = describe_checkpoint(named)
    assert (info["size"], info["format"], info["task"]) == ("v1-0.3b", "torchscript", None)
    # the tiny graph's width is no published size: the file decides, a size checks nothing
    assert load_model("seg", "v1-0.6b", checkpoint=named, device="cpu").size is None
    assert load_model("seg", checkpoint=named, device="cpu").size is None


def test_no_endpoint_takes_a_checkpoint_or_path(tiny_checkpoints) -> None:
    """Graph files come only from the operator (CLI, env) or the trusted repos: a visitor's API
    call names a size, never a file to load."""
    from sapiens2 import serving
    from sapiens2.tasks import registry
    from sapiens2.ui.endpoints import task_endpoint
    from sapiens2.ui.page_runner import Runner

    manager = serving.ModelManager(device="cpu")
    for task in registry.all_tasks().values():
        names = list(inspect.signature(task_endpoint(Runner(manager), task, gpu=False)).parameters)
        assert not [n for n in names if "checkpoint" in n or "path" in n or "file" in n], (task.name, names)


def test_keypoint_sets_flip_and_lift() -> None:
    from sapiens2.data.keypoint_sets import COCO17, GOLIATH308, WHOLEBODY133, keypoint_set

    # COCO order (spec 5): left/right pairs swap, the nose stays
    assert COCO17.flip_index.tolist() == [0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15]
    wb = WHOLEBODY133.flip_index
    assert wb[17:23].tolist() == [20, 21, 22, 17, 18, 19]  # feet
    assert wb[91] == 112 and wb[23] == 23 + 16 and wb[23 + 27] == 23 + 27  # hand roots, jaw, nose bridge
    assert keypoint_set(308) is GOLIATH308
    with pytest.raises(sapiens2.errors.OptionError, match="returned 70 heatmaps"):
        keypoint_set(70)
    kp = np.arange(17 * 2, dtype=np.float32).reshape(1, 17, 2)
    lifted, scores = COCO17.lift(kp, np.ones((1, 17), np.float32))
    assert lifted.shape == (1, 308, 2) and scores.sum() == 17
    assert lifted[0, 62].tolist() == kp[0, 9].tolist()  # COCO left wrist -> 308 left_wrist (62)


def test_decoding_maps_heatmap_peaks_as_the_spec_says() -> None:
    """Spec 4.1: x = x_hm / 191 x s_w + c_x - s_w / 2 (and y with 255, s_h); the box x1.25,
    widened to the network's 3:4 (docs/SAPIENS_V1.md: the demo's photo-aspect crop is a quirk)."""
    from sapiens2.tasks.pose.pose_codec import decode_crops
    from sapiens2.tasks.pose.pose_crops import apply_affine, crop_geometry

    ys, xs = np.mgrid[0:256, 0:192]
    peak = np.exp(-((xs - 95) ** 2 + (ys - 127) ** 2) / (2 * 6.0**2)).astype(np.float32)
    maps = torch.from_numpy(np.broadcast_to(peak, (1, 17, 256, 192)).copy())
    crop_kp, scores, _ = decode_crops(maps, False, (1024, 768))
    box = np.array([[100.0, 50.0, 300.0, 650.0]])
    geo = crop_geometry(box)
    assert geo.scales[0].tolist() == pytest.approx([562.5, 750.0])  # 1.25 x (200, 600), then 3:4
    x, y = apply_affine(crop_kp, geo.inverse)[0, 0]
    assert x == pytest.approx(95 / 191 * 562.5 + 200 - 562.5 / 2, abs=1e-3)
    assert y == pytest.approx(127 / 255 * 750 + 350 - 750 / 2, abs=1e-3)
    assert scores[0, 0] == pytest.approx(1.0, abs=1e-6)


def test_a_17_keypoint_model_runs_pose_and_says_what_it_cannot_give(v1_dir: Path, tmp_path: Path) -> None:
    import json

    pipe = sapiens2.pipeline("pose", checkpoint=v1_dir / "sapiens_tiny_pose17_torchscript.pt2",
                             device="cpu", detector=None)  # fmt: skip
    photo = np.random.default_rng(1).integers(0, 256, (240, 180, 3), dtype=np.uint8)
    result = pipe(photo, flip_test=True)
    assert result.keypoint_set == "coco17" and result.native[0].shape == (1, 17, 2)
    assert result.keypoints.shape == (1, 308, 2) and np.count_nonzero(result.scores[0]) <= 17
    assert any("BODY_25" in n and "133- or 308" in n for n in result.notices)
    files = {p.name.split("_", 1)[1]: p for p in result.save(tmp_path)}
    body25 = json.loads(files["openpose_body25.json"].read_text())["people"][0]["pose_keypoints_2d"]
    assert body25[19 * 3 :] == [0] * 18  # the six foot points: not given by a 17-point model
    rows = files["keypoints.csv"].read_text().splitlines()
    assert len(rows) == 1 + 17 and rows[1].split(",")[3] == "nose"
    assert json.loads(files["pose.json"].read_text())["keypoint_set"] == "coco17"
    assert result.render().shape == photo.shape


def test_depth_is_a_task_with_relative_depth_files(v1_dir: Path, tmp_path: Path) -> None:
    from v1_models import save_v1

    from sapiens2.tasks import registry

    task = registry.get("depth")
    assert task.spec.repo_id("v1-2b") == "facebook/sapiens-depth-2b-torchscript"
    assert all(zoo.is_v1(s) for s in task.spec.sizes)
    seg = sapiens2.pipeline("seg", checkpoint=v1_dir / "sapiens_tiny_seg_torchscript.pt2", device="cpu")
    pipe = sapiens2.pipeline("depth", checkpoint=save_v1("depth", tmp_path), device="cpu", seg=seg)
    photo = np.random.default_rng(2).integers(0, 256, (200, 150, 3), dtype=np.uint8)
    result = pipe(photo, use_segmentation=False)  # the tiny graph's depth: every sign, no person
    assert result.depth.shape == (200, 150) and result.depth.dtype == np.float32
    assert any("relative, not metric" in n for n in result.notices)
    files = {p.name.removeprefix("image"): p for p in result.save(tmp_path)}
    assert np.array_equal(np.load(files["_depth.npy"]), result.depth)  # raw, before masking
    png16 = cv2.imread(str(files["_depth16.png"]), cv2.IMREAD_UNCHANGED)
    assert png16.dtype == np.uint16 and np.array_equal(png16 > 0, result.mask)
    if result.mask.sum() > 1:
        lo, hi = result.range()
        assert png16[result.mask].min() == 1 and png16[result.mask].max() == 65535 and hi > lo
    assert result.render().shape == photo.shape
    with_seg = pipe(photo)  # the borrowed v1 seg gives the foreground (its class > 0)
    assert with_seg.mask.sum() <= result.mask.sum()


def test_results_are_marked_and_the_about_names_both_licences(v1_dir: Path) -> None:
    from sapiens2.serving.present import what_ran
    from sapiens2.tasks import registry
    from sapiens2.ui.layout import about_markdown

    assert zoo.V1_RULES.mark("v1-1b-bf16") == "Sapiens v1 · 1b · CC-BY-NC-4.0"
    assert zoo.SAPIENS2_RULES.mark("1b") == ""  # Sapiens2 results read as before
    pipe = sapiens2.pipeline(
        "normal", checkpoint=v1_dir / "sapiens_tiny_normal_torchscript.pt2", device="cpu"
    )
    result = pipe(np.zeros((64, 48, 3), np.uint8))
    assert result.normals.shape == (64, 48, 3)
    assert result.info.mark == "Sapiens v1 · custom · CC-BY-NC-4.0"
    line = what_ran("Normals", replace(result.info, size="v1-1b"))
    assert line == "Normals (v1-1b model on the CPU) · Sapiens v1 · custom · CC-BY-NC-4.0"
    about = about_markdown(registry.all_tasks())
    assert "CC-BY-NC-4.0" in about and zoo.WEIGHTS_LICENSE in about and "Depth (v1)" in about
    assert "| 0.4b |" in about and "v1-0.3b |" not in about  # the backbone table stays Sapiens2's


def test_a_server_runs_v1_files_given_by_the_operator(v1_dir: Path, tmp_path: Path) -> None:
    """The operator's --checkpoint (here a depth and a seg v1 file) through the model cache and
    the request runner: the result is marked, depth borrows the v1 seg for its foreground."""
    from v1_models import save_v1

    from sapiens2 import serving
    from sapiens2.tasks import registry

    checkpoints = {"depth": save_v1("depth", tmp_path), "seg": v1_dir / "sapiens_tiny_seg_torchscript.pt2"}
    runner = serving.RequestRunner(serving.ModelManager(device="cpu", checkpoints=checkpoints),
                                   serving.RequestFolders(tmp_path / "requests"))  # fmt: skip
    photo = np.random.default_rng(3).integers(0, 256, (120, 90, 3), dtype=np.uint8)
    shown = runner.run(registry.get("depth"), photo)
    assert "Sapiens v1 · custom · CC-BY-NC-4.0" in shown.what
    assert {p.name.removeprefix("image") for p in shown.files} >= {"_depth.npy", "_depth16.png"}
    assert shown.views[0]["relative"] is True


def test_out_of_memory_advice_stays_within_the_generation() -> None:
    from sapiens2.serving.memory_errors import out_of_memory

    assert "(v1-0.3b, v1-0.6b)" in str(out_of_memory(zoo.get_task("normal"), "v1-1b"))
    assert "(0.4b, 0.8b)" in str(out_of_memory(zoo.get_task("normal"), "1b"))


def test_the_28_classes_land_on_the_29_class_names_and_palette(v1_dir: Path) -> None:
    """Spec 4.2's table (v1 id, name, RGB): v1 id k >= 2 is the 29-class id k + 1, same name and
    colour; id 2 (Eyeglass) is never chosen."""
    from sapiens2.data.metadata import SEG_CLASS_NAMES, SEG_PALETTE

    spec = {0: ("Background", (50, 50, 50)), 1: ("Apparel", (255, 218, 0)), 2: ("Face_Neck", (128, 200, 255)),
            13: ("Right_Foot", (204, 131, 0)), 22: ("Upper_Clothing", (0, 128, 72)), 27: ("Tongue", (82, 21, 114))}  # fmt: skip
    for v1_id, (name, rgb) in spec.items():
        ours = v1_id if v1_id < 2 else v1_id + 1
        assert SEG_CLASS_NAMES[ours] == name and tuple(SEG_PALETTE[ours]) == rgb
    assert SEG_CLASS_NAMES[2] == "Eyeglass" and zoo.V1_RULES.seg_missing == (2,)
    model = load_model("seg", checkpoint=v1_dir / "sapiens_tiny_seg_torchscript.pt2", device="cpu")
    logits = torch.zeros(1, 28, 4, 4)
    logits[0, 27] = 1.0  # v1's Tongue everywhere
    assert (model._typed(logits).logits.argmax(1) == 28).all()
