"""The fast paths, checked on a CPU: low-precision models through every pipeline, uint8 uploads,
stage timing, CPU threads, and the optional compile helpers (guarded, never raising, and when
forced on a CPU giving the eager results)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from sapiens2.inputs import network as network_input
from sapiens2.models import compile as compiling
from sapiens2.models.loading import load_model
from sapiens2.runtime import cpus
from sapiens2.runtime import threads as cpu_threads
from sapiens2.tasks import pipeline_class
from sapiens2.tasks.pose import pose_crops
from sapiens2.tasks.pose.pose_codec import decode_heatmaps

SMALL = (128, 96)  # network input for the tiny models (pointmap keeps 1024x768: its scale branch)
H, W = 50, 70


def photo(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    img = np.full((H, W, 3), 40, np.uint8)
    img[10:45, 25:45] = rng.integers(0, 255, (3,), dtype=np.uint8)
    return img


def make_pipe(task: str, checkpoint: Path, dtype: torch.dtype = torch.float32):
    model = load_model(task, checkpoint=checkpoint, device="cpu", dtype=dtype)
    kwargs = {"detector": None} if task == "pose" else {}
    pipe = pipeline_class(task)(model=model, **kwargs)
    if task != "pointmap":
        pipe.input_hw = SMALL
    return pipe


def run(pipe, task: str, image):
    if task == "pointmap":
        return pipe(image, use_segmentation=False)
    return pipe(image)


# (task, result field, shape for an H x W photo); pose: one whole-image person
EXPECTED = {
    "pose": [("keypoints", (1, 308, 2)), ("scores", (1, 308))],
    "seg": [],  # labels are uint8 ids, checked below
    "normal": [("normals", (H, W, 3))],
    "pointmap": [("pointmap", (H, W, 3)), ("depth", (H, W))],
    "matting": [("foreground", (H, W, 3)), ("alpha", (H, W))],
    "features": [("embedding", (64,)), ("patch_features", (64, SMALL[0] // 16, SMALL[1] // 16))],
}


@pytest.mark.slow
@pytest.mark.parametrize("task", list(EXPECTED))
def test_bf16_model_gives_float32_cpu_arrays(tiny_checkpoints, task: str) -> None:
    pipe = make_pipe(task, tiny_checkpoints[task], torch.bfloat16)
    assert pipe.dtype == torch.bfloat16
    result = run(pipe, task, photo())
    assert result.info.dtype == "bfloat16"
    for name, shape in EXPECTED[task]:
        arr = getattr(result, name)
        assert isinstance(arr, np.ndarray), name
        assert arr.dtype == np.float32, (name, arr.dtype)
        assert arr.shape == shape, (name, arr.shape)
        assert np.isfinite(arr).all(), name
    if task == "seg":
        assert result.labels.dtype == np.uint8 and result.labels.shape == (H, W)
        assert abs(sum(result.shares.values()) - 1.0) < 1e-6


@pytest.mark.parametrize("task", ["seg", "normal", "matting"])
def test_bf16_close_to_fp32(tiny_checkpoints, task: str) -> None:
    """Same weights, bf16 vs fp32: the pipeline outputs agree to bf16 accuracy."""
    img = photo(1)
    a = run(make_pipe(task, tiny_checkpoints[task]), task, img)
    b = run(make_pipe(task, tiny_checkpoints[task], torch.bfloat16), task, img)
    if task == "seg":
        assert (a.labels == b.labels).mean() > 0.9
    elif task == "normal":
        cos = (a.normals * b.normals).sum(-1)
        assert np.median(cos) > 0.99
    else:
        diff = np.abs(a.alpha - b.alpha)  # bf16 keeps ~3 digits: a few pixels drift further
        assert np.quantile(diff, 0.99) < 0.02 and diff.mean() < 0.005


class _Uploads:
    """Records what pixel data reaches the model device through network_input.to_device / normalize."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.to_device: list[tuple[torch.dtype, object]] = []
        self.normalize: list[torch.dtype] = []
        orig_to, orig_norm = network_input.to_device, network_input.normalize

        def to_device(img, device=None):
            dtype = torch.from_numpy(np.asarray(img[:1])).dtype if isinstance(img, np.ndarray) else img.dtype
            self.to_device.append((dtype, device))
            return orig_to(img, device)

        def normalize(img, dtype=torch.float32):
            self.normalize.append(img.dtype)
            return orig_norm(img, dtype)

        monkeypatch.setattr(network_input, "to_device", to_device)
        monkeypatch.setattr(network_input, "normalize", normalize)


@pytest.mark.parametrize("task", ["seg", "normal", "matting", "features"])
def test_resize_tasks_upload_uint8(tiny_checkpoints, task: str, monkeypatch) -> None:
    pipe = make_pipe(task, tiny_checkpoints[task])
    spy = _Uploads(monkeypatch)
    run(pipe, task, photo())
    uploads = [dtype for dtype, device in spy.to_device if device is not None]
    assert uploads, "the photo never went through network_input.to_device"
    assert all(d == torch.uint8 for d in uploads), uploads


def test_pose_uploads_uint8_crops(tiny_checkpoints, monkeypatch) -> None:
    pipe = make_pipe("pose", tiny_checkpoints["pose"])
    spy = _Uploads(monkeypatch)
    pipe(photo(), boxes=[[5, 5, 40, 45], [30, 2, 68, 48]])
    assert spy.normalize == [torch.uint8]  # crops normalised on the device from uint8


def test_torch_crop_backend_uploads_image_once_as_uint8(monkeypatch) -> None:
    """The GPU crop path (grid_sample on the device) uploads the uint8 photo once for all people."""
    spy = _Uploads(monkeypatch)
    x, _ = pose_crops.crop_people(
        photo(), np.array([[5, 5, 40, 45], [30, 2, 68, 48.0]]), backend="torch", out_hw=SMALL
    )
    assert x.shape == (2, 3, *SMALL) and x.dtype == torch.float32
    uploads = [(dtype, device) for dtype, device in spy.to_device if device is not None]
    assert uploads == [(torch.uint8, torch.device("cpu"))]


def test_stage_timestamps(tiny_checkpoints) -> None:
    """RunInfo.forward_started splits a request into before / model / after (bench/request.py)."""
    import time

    pipe = make_pipe("seg", tiny_checkpoints["seg"])
    t0 = time.perf_counter()
    result = pipe(photo())
    t1 = time.perf_counter()
    info = result.info
    assert info.forward_started is not None and t0 < info.forward_started < t1
    assert 0 < info.model_s <= t1 - info.forward_started
    assert info.model_s <= info.total_s <= t1 - t0


def test_bench_request_stages(tiny_checkpoints, tmp_path) -> None:
    """bench/request.py's per-stage split on a tiny model: every stage timed, nothing negative."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import request

    path = request.make_photo(80, 60, tmp_path)
    pipe = make_pipe("pose", tiny_checkpoints["pose"])
    case = request.Case("pose", "tiny", path, (80, 60), people=2)
    stages = request.one_request(pipe, case, tmp_path)
    assert set(stages) == set(request.STAGES)
    assert all(v >= 0 for v in stages.values()), stages
    assert stages["model"] > 0
    assert sorted(p.name for p in tmp_path.glob("*_pose.json")) == ["photo_80x60_pose.json"]


# ----------------------------------------------------------------------------- pose decoding


def test_pose_decoding_bf16_heatmaps_match_fp32() -> None:
    gen = torch.Generator().manual_seed(0)
    n, k, h, w = 2, 17, 64, 48
    ys, xs = torch.meshgrid(
        torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32), indexing="ij"
    )
    cx = torch.rand(n, k, 1, 1, generator=gen) * (w - 8) + 4
    cy = torch.rand(n, k, 1, 1, generator=gen) * (h - 8) + 4
    hm = torch.exp(-((xs - cx) ** 2 + (ys - cy) ** 2) / (2 * 2.0**2))
    kp32, sc32 = decode_heatmaps(hm)
    kp16, sc16 = decode_heatmaps(hm.to(torch.bfloat16))
    assert kp16.dtype == torch.float32 and sc16.dtype == torch.float32
    assert torch.allclose(kp16, kp32, atol=0.05), (kp16 - kp32).abs().max()
    assert torch.allclose(sc16, sc32, rtol=1e-2)
    assert torch.allclose(kp32[..., 0], cx.reshape(n, k), atol=0.05)  # DARK recovers the centre


# ----------------------------------------------------------------------------- CPU threads


@pytest.fixture
def fresh_threads(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setattr(cpu_threads, "_threads_done", False)
    for name in cpu_threads._THREAD_ENV:
        monkeypatch.delenv(name, raising=False)
    yield
    torch.set_num_threads(before)


def test_threads_capped_at_available_cpus(fresh_threads, monkeypatch) -> None:
    torch.set_num_threads(2)
    monkeypatch.setattr(cpu_threads, "available_cpus", lambda: 1)
    assert cpu_threads.configure_cpu_threads() == 1
    torch.set_num_threads(2)
    assert cpu_threads.configure_cpu_threads() == 2  # once per process: a later choice is kept


def test_threads_never_raised_and_env_respected(fresh_threads, monkeypatch) -> None:
    torch.set_num_threads(1)
    monkeypatch.setattr(cpu_threads, "available_cpus", lambda: 8)
    assert cpu_threads.configure_cpu_threads() == 1
    monkeypatch.setattr(cpu_threads, "_threads_done", False)
    monkeypatch.setattr(cpu_threads, "available_cpus", lambda: 1)
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    torch.set_num_threads(2)
    assert cpu_threads.configure_cpu_threads() == 2


def test_cgroup_quota(tmp_path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cpus._cgroup_cpu_limit(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cpus._cgroup_cpu_limit(tmp_path) is None
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("200000")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert cpus._cgroup_cpu_limit(tmp_path) == 2.0
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1")
    assert cpus._cgroup_cpu_limit(tmp_path) is None
    assert cpus._cgroup_cpu_limit(tmp_path / "missing") is None
    assert cpus.available_cpus() >= 1


# ----------------------------------------------------------------------------- compile helpers


def test_torch_compile_is_a_reported_no_op_on_cpu(tiny_checkpoints, monkeypatch) -> None:
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    model = load_model("seg", checkpoint=tiny_checkpoints["seg"], device="cpu")
    report = compiling.compile_model(model)
    assert not report.applied and report.seconds == 0.0
    assert report.reason == "used only for a CUDA GPU; this model is on cpu"
    assert report.line() == "torch.compile: off (used only for a CUDA GPU; this model is on cpu)"
    assert model._compiled_call_impl is None
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    assert compiling.torch_compile_support("cuda").startswith("ZeroGPU does not support torch.compile")


@pytest.mark.slow
def test_forced_compile_traces_and_matches_eager(tiny_checkpoints) -> None:
    """Dynamo can trace the model (what torch.compile on a GPU needs); the eager backend keeps
    the arithmetic, so outputs equal the eager model's, for two batch sizes."""
    model = load_model("pose", checkpoint=tiny_checkpoints["pose"], device="cpu")
    xs = [compiling.example_input(model, b, SMALL) for b in (1, 3)]
    with torch.inference_mode():
        want = [model(x).heatmaps for x in xs]
    report = compiling.compile_model(model, xs, backend="eager", force=True)
    assert report.applied and report.seconds > 0, report
    with torch.inference_mode():
        got = [model(x).heatmaps for x in xs]
    for a, b in zip(want, got, strict=True):
        torch.testing.assert_close(a, b)


def test_failed_compile_is_undone_and_reported(tiny_checkpoints) -> None:
    model = load_model("seg", checkpoint=tiny_checkpoints["seg"], device="cpu")
    report = compiling.compile_model(model, [torch.zeros(1, 3, 100, 100)], backend="eager", force=True)
    assert not report.applied
    assert report.reason.startswith("failed, eager kept: ") and "multiples of 16" in report.reason
    assert model._compiled_call_impl is None
