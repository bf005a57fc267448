"""Sapiens v1 files (TorchScript, ExportedProgram) behind the pipelines, and v1's own rules,
checked against the numbers SAPIENS_V1_SPEC.md gives."""

from __future__ import annotations

import inspect
import zipfile
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
    save_v1("seg", folder, "bfloat16", batch=2)  # a fixed batch of 2, as an export may have
    return folder


def test_format_is_read_from_the_bytes_not_the_name(v1_dir: Path, tmp_path: Path, tiny_checkpoints) -> None:
    ts, ep = v1_dir / "sapiens_tiny_seg_torchscript.pt2", v1_dir / "sapiens_tiny_seg_bfloat16.pt2"
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
        load_model("seg", checkpoint=junk, device="cpu")


def test_normalisation_is_v1s_mean_and_std_on_rgb(v1_dir: Path) -> None:
    model = load_model("seg", checkpoint=v1_dir / "sapiens_tiny_seg_torchscript.pt2", device="cpu")
    pixel = np.array([[[255, 0, 128]]], np.uint8)  # RGB
    x = model.v1_input(network_batch([pixel], "cpu"))[0, :, 0, 0]
    want = [(255 - 123.5) / 58.5, (0 - 116.5) / 57.0, (128 - 103.5) / 57.5]  # spec 3.1, 0-255 scale
    assert x.tolist() == pytest.approx(want, abs=1e-5)


def test_torchscript_and_exported_program_give_typed_outputs(v1_dir: Path) -> None:
    ts = load_model("seg", checkpoint=v1_dir / "sapiens_tiny_seg_torchscript.pt2", device="cpu")
    ep = load_model("seg", checkpoint=v1_dir / "sapiens_tiny_seg_bfloat16.pt2", device="cpu")
    assert (ts.format, ep.format, ep.batch) == ("torchscript", "bfloat16", 2)
    assert next(ts.parameters()).dtype == torch.float32 and next(ep.parameters()).dtype == torch.bfloat16
    x = torch.randn(3, 3, 1024, 768)  # 3 inputs through a graph exported for 2: padded batches
    a, b = ts(x).logits, ep(x.bfloat16()).logits
    assert a.shape == b.shape == (3, 29, 512, 384)  # 28 classes + Eyeglass, at half resolution
    assert (a[:, 2] == MISSING_LOGIT).all() and (a[:, 3:] == ts.graph(ts.v1_input(x))[:, 2:]).all()
    assert torch.allclose(a[:, [0, 1, *range(3, 29)]], b[:, [0, 1, *range(3, 29)]], atol=0.1, rtol=0.05)
    features = load_model(
        "features", checkpoint=v1_dir / "sapiens_tiny_features_torchscript.pt2", device="cpu"
    )
    out = features(torch.zeros(1, 3, 1024, 1024))
    assert out.patch_features.shape == (1, 8, 64, 64)
    assert torch.allclose(out.cls_embedding, out.patch_features.mean((2, 3)))


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
    from sapiens2.ui.handlers import Runner, task_endpoint

    manager = serving.ModelManager(device="cpu")
    for task in registry.all_tasks().values():
        names = list(inspect.signature(task_endpoint(Runner(manager), task, gpu=False)).parameters)
        assert not [n for n in names if "checkpoint" in n or "path" in n or "file" in n], (task.name, names)
