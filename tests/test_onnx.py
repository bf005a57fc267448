"""ONNX export and ONNX Runtime (docs/ONNX.md): every task's file, its metadata and full check,
ORT's outputs against torch's (network and pipeline), int8's error, the ``.onnx`` checkpoint
everywhere a checkpoint goes, ``--runtime onnxruntime``'s cache, and the bad inputs.

Every file is exported once per session (the tiny checkpoints; most at a small network input
to keep the suite fast, the pointmap at its fixed 1024x768).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from tiny_checkpoints import V1_ONLY, all_task_names  # noqa: E402

from sapiens2 import CheckpointError, InputImageError, OptionError, export_onnx, load_model  # noqa: E402
from sapiens2.models import onnx_cache  # noqa: E402
from sapiens2.models.onnx_export import export_model, output_names, quantize_file  # noqa: E402
from sapiens2.models.onnx_runtime import OnnxModel  # noqa: E402
from sapiens2.tasks import pipeline_class  # noqa: E402

SMALL = (128, 96)  # network input of the quick files
FIXED = {"pointmap": (1024, 768)}  # its scale branch is sized for the trained input
#: relative tolerance of ORT fp32 against torch fp32 (issue 42)
RTOL = 1e-4
#: ONNX export covers Sapiens2 networks; Sapiens v1 tasks (graphs) are refused (last test)
SAPIENS2_TASKS = tuple(t for t in all_task_names() if t not in V1_ONLY)
INT8 = ("features", "pose", "seg")  # int8 here; every task's int8 error: bench/onnx_speed.py


def hw_of(task: str) -> tuple[int, int]:
    return FIXED.get(task, SMALL)


@pytest.fixture(scope="session")
def onnx_files(
    tiny_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """task -> its tiny fp32 export; "features" goes through the public export_onnx at the zoo's input."""
    root = tmp_path_factory.mktemp("onnx")
    files = {
        "features": export_onnx("features", root / "features.onnx", checkpoint=tiny_checkpoints["features"])
    }
    for task in SAPIENS2_TASKS:
        if task != "features":
            model = load_model(task, checkpoint=tiny_checkpoints[task], device="cpu")
            files[task] = export_model(model, root / f"{task}.onnx", input_hw=hw_of(task))
    return files


@pytest.fixture(scope="session")
def int8_files(onnx_files: dict[str, Path]) -> dict[str, Path]:
    return {t: quantize_file(p, p.with_name(f"{t}_int8.onnx")) for t, p in onnx_files.items() if t in INT8}


def rel_err(ref: torch.Tensor, got: torch.Tensor) -> float:
    return float((ref.double() - got.double()).abs().max() / ref.double().abs().max().clamp_min(1e-12))


@pytest.mark.slow
def test_every_task_passes_the_full_check_with_its_metadata(onnx_files: dict[str, Path]) -> None:
    for task, path in onnx_files.items():
        onnx.checker.check_model(str(path), full_check=True)
        proto = onnx.load(str(path))
        assert max(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")) >= 18
        props = {p.key: p.value for p in proto.metadata_props}
        assert props["sapiens2.task"] == task and props["sapiens2.size"] == "custom"
        h, w = (1024, 768) if task == "features" else hw_of(task)
        assert (props["sapiens2.input_height"], props["sapiens2.input_width"]) == (str(h), str(w))
        assert json.loads(props["sapiens2.mean"]) == pytest.approx([123.675, 116.28, 103.53])
        assert json.loads(props["sapiens2.std"]) == pytest.approx([58.395, 57.12, 57.375])
        assert props["sapiens2.channel_order"] == "RGB" and props["sapiens2.value_range"] == "0-255"
        assert list(json.loads(props["sapiens2.outputs"])) == [n for n, _, _ in output_names(task)]
        assert props["sapiens2.version"] and props["sapiens2.dtype"] == "fp32"
        [inp] = proto.graph.input
        dims = inp.type.tensor_type.shape.dim
        assert inp.name == "pixel_values" and inp.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
        assert dims[0].dim_param and [d.dim_value for d in dims[1:]] == [3, h, w]  # dynamic batch
        assert [o.name for o in proto.graph.output] == [n for n, _, _ in output_names(task)]
    pose = {p.key: p.value for p in onnx.load(str(onnx_files["pose"])).metadata_props}
    seg = {p.key: p.value for p in onnx.load(str(onnx_files["seg"])).metadata_props}
    assert (
        len(json.loads(pose["sapiens2.keypoints"])) == 308 and len(json.loads(seg["sapiens2.classes"])) == 29
    )


@pytest.mark.slow
@pytest.mark.parametrize("task", SAPIENS2_TASKS)
def test_network_outputs_match_torch(task: str, onnx_files: dict, tiny_checkpoints: dict) -> None:
    torch_model = load_model(task, checkpoint=tiny_checkpoints[task], device="cpu")
    ort_model = load_model(task, checkpoint=onnx_files[task])
    assert isinstance(ort_model, OnnxModel) and ort_model.task == task
    hw = (1024, 768) if task == "features" else hw_of(task)
    batch = 1 if hw == (1024, 768) else 3  # not the traced batch (2): the batch axis is dynamic
    x = torch.randn(batch, 3, *hw, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref, got = torch_model(x), ort_model(x)
    assert type(got) is type(ref)
    for _, field, _ in output_names(task):
        assert getattr(got, field).shape == getattr(ref, field).shape
        # albedo's RMSNorm is written out in opset-18 ops (no fused kernel): its float32 rounding
        # reaches 1.4e-4 on some random weights; every other task holds the 1e-4 of the issue
        assert rel_err(getattr(ref, field), getattr(got, field)) < RTOL * (2 if task == "albedo" else 1), (
            field
        )


def _options(task: str) -> dict:
    return {"pointmap": {"use_segmentation": False}, "albedo": {"use_segmentation": False}}.get(task, {})


@pytest.mark.slow
@pytest.mark.parametrize("task", SAPIENS2_TASKS)
def test_pipeline_results_match_torch(task: str, onnx_files: dict, tiny_checkpoints: dict) -> None:
    rng = np.random.default_rng(1)
    photo = (rng.random((120, 90, 3)) * 255).astype(np.uint8)
    parts = {"detector": None} if task == "pose" else {}
    torch_pipe = pipeline_class(task)(checkpoint=tiny_checkpoints[task], device="cpu", **parts)
    torch_pipe.input_hw = (1024, 768) if task == "features" else hw_of(task)
    ort_pipe = pipeline_class(task)(checkpoint=onnx_files[task], **parts)
    assert ort_pipe.network_hw == torch_pipe.network_hw  # taken from the file
    a, b = torch_pipe(photo, **_options(task)), ort_pipe(photo, **_options(task))
    fields = {
        "pose": ("keypoints", "scores"),
        "seg": ("labels",),
        "normal": ("normals",),
        "pointmap": ("pointmap", "mask"),
        "matting": ("alpha", "foreground"),
        "albedo": ("albedo",),
        "features": ("embedding", "patch_features"),
    }[task]
    for name in fields:
        x, y = getattr(a, name), getattr(b, name)
        if name == "keypoints":
            # a random tiny model's heatmaps are nearly flat: where two maxima tie within 1e-5 either
            # runtime may pick the other one. Nearly all agree within the tolerance, none by more
            # than one heatmap cell
            close = np.abs(x - y).max(axis=-1) <= RTOL * np.abs(x).max()
            cell = 4 * max(photo.shape[:2]) / max(ort_pipe.network_hw)
            assert close.mean() >= 0.98 and np.abs(x - y).max() <= cell, (close.mean(), np.abs(x - y).max())
        elif x.dtype.kind in "biu":
            assert np.array_equal(x, y), name  # class ids, masks: identical
        else:
            finite = np.isfinite(x)
            assert np.array_equal(finite, np.isfinite(y))
            scale = max(float(np.abs(x[finite]).max()), 1e-12)
            assert float(np.abs(x[finite] - y[finite]).max()) / scale < RTOL, name


@pytest.mark.slow
def test_int8_is_close_and_smaller(onnx_files: dict, int8_files: dict) -> None:
    """int8 error on the tiny models (the figures in docs/ONNX.md come from bench/onnx_speed.py)."""
    for task in INT8:
        fp32, int8 = OnnxModel(onnx_files[task]), OnnxModel(int8_files[task])
        assert int8.onnx_dtype == "int8" and int8_files[task].stat().st_size < onnx_files[task].stat().st_size
        x = torch.randn(1, 3, *fp32.input_hw, generator=torch.Generator().manual_seed(2))
        ref, got = fp32(x), int8(x)
        for _, field, _ in output_names(task):
            r, g = getattr(ref, field).flatten().double(), getattr(got, field).flatten().double()
            assert float(torch.nn.functional.cosine_similarity(r, g, dim=0)) > 0.99, (task, field)
            assert 0 < rel_err(r, g) < 0.2, (task, field)  # quantised: not equal, not far


def test_the_benchs_attention_rewrite_fuses_every_layer_and_keeps_the_numbers(
    onnx_files: dict, tiny_checkpoints: dict
) -> None:
    """bench/onnx_attention.py --forward: its graph rewrite (MatMul/Softmax/MatMul into ORT's fused
    MultiHeadAttention) matches every layer of a real export and leaves the outputs unchanged."""
    import importlib.util

    import onnxruntime as ort

    spec = importlib.util.spec_from_file_location(
        "bench_onnx_attention", Path(__file__).resolve().parents[1] / "bench" / "onnx_attention.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    path = onnx_files["features"]
    heads = load_model("features", checkpoint=tiny_checkpoints["features"]).config.heads
    x = np.random.default_rng(3).standard_normal((2, 3, *OnnxModel(path).input_hw)).astype(np.float32)
    plain = ort.InferenceSession(str(path)).run(None, {"pixel_values": x})
    proto = onnx.load(str(path))
    layers = sum(n.op_type == "Softmax" for n in proto.graph.node)
    assert layers > 0 and bench.fuse_attention(proto, heads) == layers
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("MultiHeadAttention") == layers and "Softmax" not in ops
    fused = ort.InferenceSession(proto.SerializeToString()).run(None, {"pixel_values": x})
    for a, b in zip(plain, fused, strict=True):
        assert float(np.abs(a - b).max() / np.abs(a).max()) < 1e-5
    wrong = onnx.load(str(path))
    bench.fuse_attention(wrong, heads // 2)  # the fused node is what runs: a wrong head count fails
    with pytest.raises(Exception, match="MultiHeadAttention"):
        ort.InferenceSession(wrong.SerializeToString()).run(None, {"pixel_values": x})


def test_cli_export_and_run(
    onnx_files: dict, int8_files: dict, tiny_checkpoints: dict, tmp_path: Path, capsys, monkeypatch
) -> None:
    """The command's arguments reach export_onnx (the export itself: the onnx_files fixture)."""
    from sapiens2.cli import main
    from sapiens2.models import onnx_export

    seen = {}

    def stand_in(task, out, **kwargs):
        seen.update(task=task, out=out, **kwargs)
        return Path(shutil.copy(int8_files[task], out))

    monkeypatch.setattr(onnx_export, "export_onnx", stand_in)
    out = tmp_path / "f.onnx"
    ckpt = str(tiny_checkpoints["features"])
    assert (
        main(["export", "features", "--format", "onnx", "--checkpoint", ckpt, "--int8", "--out", str(out)])
        == 0
    )
    assert seen == {
        "task": "features",
        "out": str(out),
        "size": None,
        "checkpoint": Path(ckpt),
        "int8": True,
        "fp16": False,
    }
    monkeypatch.undo()
    photo = tmp_path / "p.png"
    from PIL import Image

    Image.fromarray(np.full((64, 48, 3), 128, np.uint8)).save(photo)
    assert (
        main(
            [
                "features",
                str(photo),
                "--checkpoint",
                str(onnx_files["features"]),
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 0
    )
    assert list((tmp_path / "o").rglob("*_embedding.npy"))
    assert main(["export", "features", "--size", "9b", "--out", str(out)]) == 1
    assert main(["export", "features", "--size", "0.1b", "--out", str(tmp_path / "x.txt")]) == 1
    err = capsys.readouterr().err
    assert "9b" in err and "must end in .onnx" in err


def test_runtime_onnxruntime_exports_once_into_the_cache(
    onnx_files: dict, tiny_checkpoints: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(onnx_cache.CACHE_ENV, str(tmp_path / "cache"))
    calls = []
    from sapiens2.models import onnx_export  # cached_onnx imports its export_onnx when it runs

    def counting(task, out, **kwargs):  # the export itself is the fixture's; this counts the calls
        calls.append((task, kwargs))
        return Path(shutil.copy(onnx_files[task], out))

    monkeypatch.setattr(onnx_export, "export_onnx", counting)
    pipe = pipeline_class("matting")(checkpoint=tiny_checkpoints["matting"], runtime="onnxruntime")
    assert isinstance(pipe.model, OnnxModel) and len(calls) == 1
    again = pipeline_class("matting")(checkpoint=tiny_checkpoints["matting"], runtime="onnxruntime").model
    assert again.checkpoint_path == pipe.model.checkpoint_path and len(calls) == 1  # the cached file
    assert Path(again.checkpoint_path).parent.parent == tmp_path / "cache"
    from sapiens2.cli import build_parser
    from sapiens2.cli.batch import build_job

    argv = ["batch", "matting", str(tmp_path), "--out", str(tmp_path / "out"), "--runtime", "onnxruntime"]
    job, _, _ = build_job(
        build_parser().parse_args([*argv, "--checkpoint", f"matting={tiny_checkpoints['matting']}"])
    )
    assert job.plans[0].model.checkpoint == again.checkpoint_path and len(calls) == 1  # batch: the same file
    with pytest.raises(OptionError, match="runtime"):
        pipeline_class("matting")(checkpoint=tiny_checkpoints["matting"], runtime="tensorflow")


def test_bad_files_and_inputs_get_one_clear_message(
    onnx_files: dict, tiny_checkpoints: dict, tmp_path: Path
) -> None:
    for task in V1_ONLY:  # a v1 graph has no module to trace: one sentence, no file written
        with pytest.raises(OptionError, match="Sapiens v1"):
            export_onnx(task, tmp_path / f"{task}.onnx", checkpoint=tiny_checkpoints[task])
        assert not (tmp_path / f"{task}.onnx").exists()
    with pytest.raises(CheckpointError, match="not seg"):
        load_model("seg", checkpoint=onnx_files["pose"])
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a protobuf at all")
    with pytest.raises(CheckpointError, match="damaged or not ONNX"):
        load_model("pose", checkpoint=junk)
    with pytest.raises(CheckpointError, match="No ONNX file"):
        load_model("pose", checkpoint=tmp_path / "missing.onnx")
    bare = tmp_path / "bare.onnx"
    proto = onnx.load(str(onnx_files["seg"]))
    del proto.metadata_props[:]
    onnx.save(proto, str(bare))
    with pytest.raises(CheckpointError, match="without Sapiens2 metadata"):
        load_model("seg", checkpoint=bare)
    model = load_model("seg", checkpoint=onnx_files["seg"])
    with pytest.raises(InputImageError, match="exported for 128x96"):
        model(torch.zeros(1, 3, 64, 48))
    with pytest.raises(InputImageError):
        model(torch.zeros(3, 64, 48))
    with pytest.raises(OptionError, match="int8 or fp16"):
        export_onnx("seg", tmp_path / "x.onnx", size="0.4b", int8=True, fp16=True)
    with pytest.raises(OptionError, match="ONNX file already"):
        export_onnx("seg", tmp_path / "x.onnx", checkpoint=onnx_files["seg"])
    with pytest.raises(OptionError, match="does not exist"):
        export_onnx("seg", tmp_path / "nowhere" / "x.onnx", size="0.4b")
    with pytest.raises(OptionError, match="not an fp32"):
        quantize_file(bare, tmp_path / "q.onnx")
