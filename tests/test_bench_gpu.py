"""bench/gpu.py stays alive, and the device tests it runs.

``test_device_path_*`` are the suite's CUDA-capable tests: each runs on the CPU and, where torch
sees a GPU, on CUDA (bf16 weights, float32 last layers, flip test on by default, torch.compile).
``bench/gpu.py`` runs them with ``-k device_path``. The last test runs the bench itself in quick
CPU mode and checks every section of its JSON for sane values.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_checkpoints import TASK_NAMES

from sapiens2.models import compile as compiling
from sapiens2.models.loading import load_model
from sapiens2.tasks import pipeline_class

ROOT = Path(__file__).resolve().parents[1]
CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="no CUDA"))]
SMALL = (128, 96)  # network input for the tiny models (pointmap keeps 1024x768: its scale branch)


def _gpu_bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "bench" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _photo() -> np.ndarray:
    img = np.full((60, 80, 3), 50, np.uint8)
    img[10:55, 30:50] = (200, 120, 90)
    return img


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("task", TASK_NAMES)
def test_device_path_pipeline_defaults(tiny_checkpoints, task: str, device: str) -> None:
    """The device's default dtype (bf16 on CUDA), float32 last layers, finite float32 CPU arrays."""
    model = load_model(task, checkpoint=tiny_checkpoints[task], device=device)
    expected = torch.bfloat16 if device == "cuda" else torch.float32
    assert next(model.parameters()).dtype == expected
    for key in model.fp32_keys() if hasattr(model, "fp32_keys") else ():
        assert model.state_dict()[key].dtype == torch.float32, key
    pipe = pipeline_class(task)(model=model, **({"detector": None} if task == "pose" else {}))
    if task != "pointmap":
        pipe.input_hw = SMALL
    result = pipe(_photo(), **({"use_segmentation": False} if task == "pointmap" else {}))
    assert result.info.device.startswith(device)
    arrays = {k: v for k, v in vars(result).items() if isinstance(v, np.ndarray)}
    assert arrays, "no array output to check"
    for name, arr in arrays.items():
        assert arr.dtype in (np.float32, np.uint8, np.bool_), name  # host arrays, ready to save
        assert np.isfinite(arr).all(), name
    if task == "pose":  # flip test is on by default on CUDA only
        assert result.flip_test is (device == "cuda")


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("task", TASK_NAMES)
def test_device_path_bf16_matches_fp32(task: str, device: str) -> None:
    """bf16 weights (float32 last layers) against fp32, same weights and input: the check the bench
    makes at real shapes too."""
    gpu = _gpu_bench()
    model = gpu.random_model(task, "tiny", torch.device(device))
    hw = (1024, 768) if task == "pointmap" else SMALL
    res = gpu.compare_dtypes(model, hw, torch.bfloat16)
    assert res, "no outputs compared"
    for name, r in res.items():
        assert r["finite"] and r["head_fp32"] == (task != "features"), (name, r)
        assert r["out_dtype"] == ("bfloat16" if task == "features" else "float32"), (name, r)
        assert r["cosine"] >= gpu.TARGET_BF16_COSINE, (name, r)
        assert 0 < r["max_rel"] <= gpu.TARGET_BF16_TINY_REL, (name, r)  # 0 would mean bf16 never ran


@pytest.mark.parametrize(
    "device", [pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="no CUDA"))]
)
def test_device_path_torch_compile(tiny_checkpoints, device: str) -> None:
    """Inductor compiles the pose model on a GPU, and the compiled model agrees with eager."""
    model = load_model("pose", checkpoint=tiny_checkpoints["pose"], device=device)
    x = compiling.example_input(model, 2, SMALL)
    with torch.inference_mode():
        eager = model(x).heatmaps.float()
    report = compiling.compile_model(model, [x])
    assert report.applied, report.reason
    with torch.inference_mode():
        compiled = model(x).heatmaps.float()
    assert (compiled - eager).abs().max() <= 0.02 * eager.abs().max()


def test_loaded_copy_keeps_head_layers_float32_and_the_weights() -> None:
    gpu = _gpu_bench()
    model = gpu.random_model("seg", "tiny", torch.device("cpu"))
    low = gpu.loaded_copy(model, torch.bfloat16)
    state, low_state = model.state_dict(), low.state_dict()
    assert sorted(state) == sorted(low_state)
    fp32 = low.fp32_keys()
    assert fp32 and all(low_state[k].dtype == torch.float32 for k in fp32)
    for key, value in state.items():
        want = torch.float32 if key in fp32 else torch.bfloat16
        assert low_state[key].dtype == want
        assert torch.equal(low_state[key], value.to(want)), key


def test_peak_table_scales_a_mig_slice(monkeypatch) -> None:
    gpu = _gpu_bench()
    props = type("P", (), {"multi_processor_count": 60})()
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H200 MIG 3g.71gb")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: props)
    assert gpu.bf16_peak(torch.device("cuda")) == pytest.approx(989.4 * 60 / 132)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Some Future GPU")
    assert gpu.bf16_peak(torch.device("cuda")) is None
    assert gpu.bf16_peak(torch.device("cpu")) is None


def _figures(doc: dict, section: str) -> dict[str, dict]:
    return {f["name"]: f for f in doc[section]["figures"]}


@pytest.mark.subprocess
def test_quick_cpu_run_reports_every_section(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu.py"), "--device", "cpu", "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    gpu = _gpu_bench()
    assert doc["meta"]["quick"] is True and doc["meta"]["device"] == "cpu"
    for name in gpu.SECTIONS:
        assert doc[name]["status"].startswith("ok"), (name, doc[name]["status"])
        assert doc[name]["figures"], name
    assert "| section | figure | value | target | met | note |" in proc.stdout

    # correctness: the CPU device tests ran and passed in the subprocess; CUDA ones were skipped
    tests = doc["correctness"]["pytest"]
    assert tests["returncode"] == 0 and tests["failed"] == 0
    assert (tests["passed"], tests["skipped"]) == ((4, 0) if CUDA else (2, 2))  # quick: pose's only
    pairs = doc["correctness"]["bf16_vs_fp32"]
    assert {f"{t} tiny" for t in TASK_NAMES} <= set(pairs) and "features 0.1b" in pairs
    for key, per_output in pairs.items():
        for r in per_output.values():
            assert 0.99 <= r["cosine"] <= 1.0 + 1e-6, key
            assert r["out_dtype"] == ("bfloat16" if key.startswith("features") else "float32"), key

    # forward: both implementations timed at batch 1 and 8; FLOPs counted; SDPA kernel seen
    rows = doc["forward"]["rows"]
    assert [r["batch"] for r in rows] == [1, 8]
    for r in rows:
        assert r["ours_ms"] > 0 and r["transformers_ms"] > 0 and r["gflop"] > 0
        assert r["peak_pct"] is None  # no bf16 peak for a CPU
    assert rows[1]["gflop"] == pytest.approx(8 * rows[0]["gflop"], rel=0.01)
    assert sum(rows[0]["sdpa"].values()) == 4  # the tiny backbone's four attention layers

    # request: every task on both photos, pose with 1 and 5 people; stages add up
    cases = {c["case"]: c for c in doc["request"]["cases"]}
    assert len(cases) == 2 * (len(TASK_NAMES) + 1)
    for c in cases.values():
        assert c["model_ms"] > 0 and c["whole_ms"] >= c["model_ms"]
        assert c["whole_ms"] == pytest.approx(sum(c["stages_ms"].values()), rel=0.05)
    assert any(" 5p " in k for k in cases)

    # memory: no peak without CUDA (said so), the weights counted per task
    mem = doc["memory"]["rows"]
    assert {r["task"] for r in mem} == set(TASK_NAMES)
    assert all(r["peak_gib"] is None and 0 < r["weights_gib"] < 0.01 for r in mem)
    assert all(f["note"] == gpu.NO_CUDA for f in doc["memory"]["figures"])

    # zerogpu: GPU-only figures say so; the constants are read; the rates are real numbers
    zg = _figures(doc, "zerogpu")
    assert zg["CUDA start-up (fresh process)"]["note"] == gpu.NO_CUDA
    assert zg["pinned -> device copy"]["value"] is None
    assert doc["zerogpu"]["constants"]["CUDA_INIT_S"] > 0
    assert doc["zerogpu"]["cpu_probe_start_s"] > 0
    assert zg["sustained model TFLOP/s"]["value"] > 0
    assert 0 < doc["zerogpu"]["import_torch_s"] < 120

    # compile: not measurable on a CPU, but the helper ran (eager backend) and eager was timed
    comp = doc["compile"]
    assert comp["support"].startswith("used only for a CUDA GPU")
    assert comp["forced_eager_backend"]["applied"] is True
    assert _figures(doc, "compile")["torch.compile gain"]["note"] == gpu.NO_CUDA


def _plan(gpu, device: str, quick: bool = False):
    args = gpu.parse_args(["--device", "cpu"] + (["--quick"] if quick else []))
    plan = gpu.make_plan(args)
    plan.device = torch.device(device)  # only the verdict logic runs below: no CUDA needed
    return plan


def test_forward_verdicts_judge_the_targets_on_a_full_gpu_run() -> None:
    gpu = _gpu_bench()
    row = {
        "size": "1b", "batch": 1, "head_dim": 64, "ours_ms": 12.0, "transformers_ms": 19.0,
        "speedup": 19.0 / 12.0, "tflops": 390.0, "peak_pct": 55.0, "sdpa": {"flash": 16, "math": 24},
    }  # fmt: skip
    sec = gpu.Section("forward")
    gpu.forward_figures(_plan(gpu, "cuda"), sec, row)
    met = {f.name.split(": ")[-1]: f.met for f in sec.figures}
    assert met == {
        "ours": None,
        "% of bf16 peak": False,  # 55 < 60
        "transformers / ours": True,  # 1.58 >= 1.5
        "1b SDPA kernels, head dim 64": False,  # the math fallback ran
    }
    sec = gpu.Section("forward")
    gpu.forward_figures(_plan(gpu, "cpu", quick=True), sec, row)
    assert all(f.met is None or f.name.endswith("head dim 64") for f in sec.figures)  # not judged


@pytest.mark.slow
def test_a_failing_part_is_a_failed_figure_and_a_section_error() -> None:
    gpu = _gpu_bench()

    def runner(plan, sec):
        sec.add("fine", 1.0, "ms")
        gpu.guarded(
            sec, "5b forward", lambda: (_ for _ in ()).throw(torch.OutOfMemoryError("CUDA out of memory"))
        )
        sec.add("after", 2.0, "ms")  # the section went on

    gpu.RUNNERS["probe"] = runner
    try:
        [sec] = gpu.run_sections(_plan(gpu, "cpu", quick=True), ["probe"])
    finally:
        del gpu.RUNNERS["probe"]
    assert sec.status.startswith("error: 1 part(s) failed: 5b forward: error: OutOfMemoryError")
    assert [f.name for f in sec.figures] == ["fine", "5b forward", "after"]
    assert sec.figures[1].met is False and sec.figures[1].value is None
    table = gpu.markdown([sec], gpu.metadata(_plan(gpu, "cpu", quick=True)))
    assert "| probe | 5b forward | — | runs | **NO** |" in table and "**section failed**" in table
