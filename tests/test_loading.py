"""load_model / describe_checkpoint: resolution order, dtypes, and every error message."""

from __future__ import annotations

import os
from pathlib import Path

import huggingface_hub.constants as hf_constants
import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_checkpoints import place_hf_cache, place_release_layout, write_header_only, zoo_shapes

import sapiens2
from sapiens2.errors import CheckpointError, OptionError, WeightsUnavailableError
from sapiens2.models.loading import resolve_checkpoint
from sapiens2.models.nn.outputs import FeaturesOutput, PoseOutput


@pytest.fixture
def offline_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty, offline Hugging Face cache; no local checkpoint root."""
    cache = tmp_path / "hf_cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("SAPIENS2_CHECKPOINTS", raising=False)
    return cache


def test_explicit_folder_and_file(tiny_checkpoints) -> None:
    folder = tiny_checkpoints["pose"]
    for ckpt in (folder, folder / "model.safetensors", str(folder)):
        model = sapiens2.load_model("pose", checkpoint=ckpt, device="cpu")
        assert model.task == "pose" and model.size is None and not model.training
        assert model.checkpoint_path == str(folder / "model.safetensors")
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in model.parameters())
    with torch.inference_mode():
        out = model(torch.zeros(1, 3, 64, 48))
    assert isinstance(out, PoseOutput) and out.heatmaps.shape == (1, 308, 16, 12)


def test_pretrain_is_backbone_only(tiny_checkpoints) -> None:
    model = sapiens2.load_model("features", checkpoint=tiny_checkpoints["features"], device="cpu")
    with torch.inference_mode():
        out = model(torch.zeros(2, 3, 32, 64))
    assert isinstance(out, FeaturesOutput)
    assert out.cls_embedding.shape == (2, 64) and out.patch_features.shape == (2, 64, 2, 4)


def test_dtype_option(tiny_checkpoints) -> None:
    model = sapiens2.load_model("seg", checkpoint=tiny_checkpoints["seg"], device="cpu", dtype="bf16")
    assert {p.dtype for p in model.backbone.parameters()} == {torch.bfloat16}
    final = {n for n, p in model.named_parameters() if p.dtype == torch.float32}
    assert final == {"decode_head.conv_seg.weight", "decode_head.conv_seg.bias"}  # the last projection
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        logits = model(x).logits  # an fp32 input is cast to the model's dtype
    assert logits.dtype == torch.float32 and logits.shape == (1, 29, 32, 32)
    fp32 = sapiens2.load_model("seg", checkpoint=tiny_checkpoints["seg"], device="cpu")
    with torch.inference_mode():
        ref = fp32(x).logits
    assert (logits.float() - ref).abs().max() <= 0.05 * ref.abs().max()
    with pytest.raises(OptionError, match="Unknown dtype 'int8'; choose one of: fp32"):
        sapiens2.load_model("seg", checkpoint=tiny_checkpoints["seg"], dtype="int8")
    with pytest.raises(OptionError, match="rope_dtype must be None"):
        sapiens2.load_model("seg", checkpoint=tiny_checkpoints["seg"], rope_dtype=torch.float16)


def test_hub_cache_layout_offline(tiny_checkpoints, offline_hub: Path) -> None:
    """The real hf_hub_download finds the release file name in the cache, offline."""
    snap = place_hf_cache(tiny_checkpoints["pose"], offline_hub, "pose", "0.4b")
    assert snap.name == "sapiens2_0.4b_pose.safetensors"
    found = resolve_checkpoint("pose", "0.4b")
    assert found.resolve() == snap.resolve()
    assert "models--facebook--sapiens2-pose-0.4b" in str(found)
    model = sapiens2.load_model("pose", checkpoint=found, device="cpu")
    assert model.task == "pose"
    # by repo id with a size: the file is found, and the tiny model is (rightly) not a 0.4b
    with pytest.raises(
        CheckpointError, match=r"models--facebook--sapiens2-pose-0\.4b.*a custom size.*not size 0\.4b"
    ):
        sapiens2.load_model("pose", "0.4b", device="cpu")


def test_hub_cache_falls_back_to_model_safetensors(tiny_checkpoints, offline_hub: Path) -> None:
    snap = place_hf_cache(
        tiny_checkpoints["normal"], offline_hub, "normal", "1b", filename="model.safetensors"
    )
    assert resolve_checkpoint("normal", "1b").resolve() == snap.resolve()


def test_release_layout_root(tiny_checkpoints, offline_hub: Path, tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "ckpts"
    dest = place_release_layout(tiny_checkpoints["seg"], root, "seg", "0.8b")
    assert dest == root / "seg" / "sapiens2_0.8b_seg.safetensors"
    monkeypatch.setenv("SAPIENS2_CHECKPOINTS", str(root))
    assert resolve_checkpoint("seg", "0.8b") == dest
    assert sapiens2.load_model("seg", checkpoint=resolve_checkpoint("seg", "0.8b")).task == "seg"
    # the local root wins over the Hub cache
    place_hf_cache(tiny_checkpoints["seg"], offline_hub, "seg", "0.8b")
    assert resolve_checkpoint("seg", "0.8b") == dest


def test_missing_weights_offline_names_repo_file_and_fixes(offline_hub: Path) -> None:
    with pytest.raises(WeightsUnavailableError) as err:
        sapiens2.load_model("pose", device="cpu")  # no size, no checkpoint: the CPU default size
    msg = str(err.value)
    assert "facebook/sapiens2-pose-0.4b" in msg
    assert "sapiens2_0.4b_pose.safetensors" in msg
    assert "go online" in msg and "SAPIENS2_CHECKPOINTS" in msg
    assert "pose/sapiens2_0.4b_pose.safetensors" in msg


def test_missing_weights_mentions_unused_root(offline_hub: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SAPIENS2_CHECKPOINTS", str(tmp_path))
    with pytest.raises(WeightsUnavailableError, match=r"SAPIENS2_CHECKPOINTS=.* is set but .*matting"):
        sapiens2.load_model("matting", "1b", device="cpu")


def test_missing_explicit_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(WeightsUnavailableError, match=r"Checkpoint .*nothing\.safetensors does not exist"):
        sapiens2.load_model("pose", checkpoint=tmp_path / "nothing.safetensors")
    with pytest.raises(WeightsUnavailableError, match="No .safetensors file in the folder"):
        sapiens2.load_model("pose", checkpoint=tmp_path)


def test_unknown_task_and_size() -> None:
    with pytest.raises(OptionError, match="Unknown task 'height'; choose one of: pose"):
        sapiens2.load_model("height")
    with pytest.raises(OptionError, match="Size '0.1b' does not exist for pose; choose one of: 0.4b"):
        sapiens2.load_model("pose", "0.1b")


def test_checkpoint_of_another_task(tiny_checkpoints) -> None:
    with pytest.raises(
        CheckpointError, match=r"is a Sapiens2 pose checkpoint, a custom size .*not a seg checkpoint"
    ):
        sapiens2.load_model("seg", checkpoint=tiny_checkpoints["pose"])
    with pytest.raises(CheckpointError, match="is a Sapiens2 features checkpoint"):
        sapiens2.load_model("normal", checkpoint=tiny_checkpoints["features"])


def test_checkpoint_of_another_size(tmp_path: Path) -> None:
    """Real-size headers (no tensor data): the size check happens before any tensor is read."""
    path = write_header_only(tmp_path / "pose04.safetensors", zoo_shapes("pose", "0.4b"))
    with pytest.raises(
        CheckpointError,
        match=r"is a Sapiens2 pose checkpoint, size 0\.4b \(hidden 1024, 24 layers, 16 heads\), not size 1b",
    ):
        sapiens2.load_model("pose", "1b", checkpoint=path)
    with pytest.raises(CheckpointError, match=r"size 0\.4b .*not a seg checkpoint"):
        sapiens2.load_model("seg", checkpoint=path)


def test_missing_and_unexpected_keys_are_listed(tiny_checkpoints, tmp_path: Path) -> None:
    tensors = load_file(str(tiny_checkpoints["pose"] / "model.safetensors"))
    del tensors["backbone.blocks.2.attn.proj.bias"]
    tensors["decode_head.extra.weight"] = torch.zeros(3)
    tensors["backbone.blocks.1.ffn.w3.weight"] = torch.zeros(64, 5)
    save_file(tensors, str(tmp_path / "bad.safetensors"))
    with pytest.raises(CheckpointError) as err:
        sapiens2.load_model("pose", checkpoint=tmp_path / "bad.safetensors")
    msg = str(err.value)
    assert "missing keys: backbone.blocks.2.attn.proj.bias" in msg
    assert "unexpected keys: decode_head.extra.weight" in msg
    assert "wrong shapes: backbone.blocks.1.ffn.w3.weight (64, 5) (expected (64, 128))" in msg


def test_stored_rope_periods_are_accepted(tiny_checkpoints, tmp_path: Path) -> None:
    """Release files may carry the RoPE periods buffer; it is recomputed, not an unexpected key."""
    tensors = load_file(str(tiny_checkpoints["pose"] / "model.safetensors"))
    tensors["backbone.rope_embed.periods"] = torch.ones(4, dtype=torch.bfloat16)
    save_file(tensors, str(tmp_path / "periods.safetensors"))
    model = sapiens2.load_model("pose", checkpoint=tmp_path / "periods.safetensors")
    assert "backbone.rope_embed.periods" not in model.state_dict()


def test_many_missing_keys_are_summarised(tiny_checkpoints, tmp_path: Path) -> None:
    tensors = load_file(str(tiny_checkpoints["features"] / "model.safetensors"))
    for k in [k for k in tensors if k.startswith("blocks.3.")]:
        del tensors[k]
    tensors["blocks.3.ln1.weight"] = torch.ones(64)  # keeps layer 3 in the layout
    save_file(tensors, str(tmp_path / "cut.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing keys: blocks\.3\..*and \d+ more"):
        sapiens2.load_model("features", checkpoint=tmp_path / "cut.safetensors")


def test_unreadable_layout_names_the_file(tiny_checkpoints, tmp_path: Path) -> None:
    tensors = load_file(str(tiny_checkpoints["pose"] / "model.safetensors"))
    del tensors["backbone.blocks.0.attn.q_norm.weight"]
    save_file(tensors, str(tmp_path / "noqk.safetensors"))
    with pytest.raises(CheckpointError, match=r"noqk\.safetensors: .*no QK-norm weights"):
        sapiens2.load_model("pose", checkpoint=tmp_path / "noqk.safetensors")


def test_corrupt_and_foreign_files(tmp_path: Path) -> None:
    bad = tmp_path / "corrupt.safetensors"
    bad.write_bytes(os.urandom(64))
    with pytest.raises(CheckpointError, match="is not a valid safetensors file.*download it again"):
        sapiens2.load_model("pose", checkpoint=bad)
    with pytest.raises(CheckpointError, match="is not a valid safetensors file"):
        sapiens2.describe_checkpoint(bad)
    foreign = tmp_path / "foreign.safetensors"
    save_file({"encoder.weight": torch.zeros(2, 2)}, str(foreign))
    with pytest.raises(CheckpointError, match=r"not a Sapiens2 checkpoint.*found encoder\.weight"):
        sapiens2.load_model("pose", checkpoint=foreign)


def test_truncated_tensor_data(tiny_checkpoints, tmp_path: Path) -> None:
    data = (tiny_checkpoints["features"] / "model.safetensors").read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="download it again"):
        sapiens2.load_model("features", checkpoint=cut)


def test_describe_checkpoint(tiny_checkpoints) -> None:
    info = sapiens2.describe_checkpoint(tiny_checkpoints["seg"])
    assert info["task"] == "seg" and info["size"] is None
    assert info["kv_heads"] == [4, 2, 2, 4]
    assert info["head"] == {"kind": "deconv", "outputs": 29, "upsample": [16, 8, 4, 4], "conv": [4, 4]}


# ----------------------------------------------------------------------------- device, progress, disk


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_failure_does_not_blame_the_file(tiny_checkpoints) -> None:
    from sapiens2.errors import DeviceError

    with pytest.raises(DeviceError) as err:
        sapiens2.load_model("pose", checkpoint=tiny_checkpoints["pose"], device="cuda")
    msg = str(err.value)
    assert "read fine, but moving them to cuda failed" in msg and "The file is not the problem" in msg
    assert "download it again" not in msg


def test_load_reads_on_cpu_and_reports_progress(tiny_checkpoints, monkeypatch) -> None:
    """One tqdm bar per load, counting the checkpoint's bytes (what gr.Progress(track_tqdm=True)
    and the CLI show); safetensors is opened on the CPU (CUDA targets: tests/test_zerogpu.py)."""
    import sapiens2.models.loading as loading

    bars: list[dict] = []

    class Bar:
        def __init__(self, **kwargs) -> None:
            self.info = {**kwargs, "done": 0}
            bars.append(self.info)

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self.info["closed"] = True

        def update(self, n: int) -> None:
            self.info["done"] += n

    opened: list[str] = []
    real_open = loading.safe_open
    monkeypatch.setattr(loading, "tqdm", Bar)
    monkeypatch.setattr(
        loading,
        "safe_open",
        lambda path, framework, device: opened.append(device) or real_open(path, framework, device=device),
    )
    path = tiny_checkpoints["seg"] / "model.safetensors"
    model = sapiens2.load_model("seg", checkpoint=path, dtype="bf16")
    total = sum(t.numel() * t.element_size() for t in load_file(str(path)).values())
    assert opened == ["cpu"]
    assert len(bars) == 1 and bars[0]["total"] == total == bars[0]["done"] and bars[0]["closed"]
    assert bars[0]["unit"] == "B" and bars[0]["desc"] == "Loading model.safetensors"
    assert {p.dtype for p in model.backbone.parameters()} == {torch.bfloat16}


def _fake_download(error: BaseException):
    def download(*args, **kwargs):
        raise error

    return download


@pytest.mark.parametrize(
    "error",
    [
        OSError(28, "No space left on device"),
        RuntimeError("Data processing error: I/O error: No space left on device (os error 28)"),
    ],
)
def test_disk_full_download_says_so(offline_hub: Path, monkeypatch, error) -> None:
    import huggingface_hub

    from sapiens2.errors import DiskFullError

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", _fake_download(error))
    with pytest.raises(DiskFullError) as err:
        sapiens2.load_model("pose", "0.4b", device="cpu")
    msg = str(err.value)
    assert msg.startswith(
        "The disk is full: Downloading sapiens2_0.4b_pose.safetensors from facebook/sapiens2-pose-0.4b"
    )
    assert str(offline_hub) in msg and "GB are free there" in msg and "HF_HUB_CACHE" in msg
    assert "go online" not in msg
    assert isinstance(err.value, WeightsUnavailableError)  # the app's existing title still applies


def test_disk_full_error_helper_for_other_writes(tmp_path: Path) -> None:
    from sapiens2.models.weights import disk_full_error

    wrapped = RuntimeError("export failed")
    wrapped.__cause__ = OSError(28, "No space left on device")
    err = disk_full_error(wrapped, tmp_path / "not-yet-made", "Writing result.png")
    assert err is not None and "Writing result.png into" in str(err)
    assert disk_full_error(OSError(13, "Permission denied"), tmp_path, "Writing x") is None


def test_downloads_are_announced_and_cache_hits_marked_used(
    tiny_checkpoints, offline_hub: Path, monkeypatch
) -> None:
    import huggingface_hub

    from sapiens2.models import weights

    monkeypatch.setattr(weights, "_DOWNLOAD_LISTENERS", [])
    heard: list[Path] = []
    weights.on_download(heard.append)
    weights.on_download(heard.append)  # registered once
    snap = place_hf_cache(tiny_checkpoints["seg"], offline_hub, "seg", "0.8b")
    os.utime(snap, (1_000_000, 1_000_000))
    assert resolve_checkpoint("seg", "0.8b").resolve() == snap.resolve()
    assert heard == []  # a cache hit is not a download
    assert snap.stat().st_atime > 1_000_000 + 3600  # marked used now, mtime kept
    assert snap.stat().st_mtime == 1_000_000

    real_download = huggingface_hub.hf_hub_download
    later = place_hf_cache(tiny_checkpoints["seg"], offline_hub / "elsewhere", "seg", "1b")

    def download(repo_id, filename, **kwargs):  # as if fetched now: absent from the cache before
        if repo_id == "facebook/sapiens2-seg-1b" and filename == "sapiens2_1b_seg.safetensors":
            return str(later)
        return real_download(repo_id, filename, **kwargs)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    assert resolve_checkpoint("seg", "1b") == later
    assert heard == [later]
