"""sapiens2.zerogpu: duration arithmetic against the quotas, the GPU entry off and on ZeroGPU
(spaces' own emulation, in child processes), and the proof that weights load and pack there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from zerogpu_emulation import run_scenario

from sapiens2 import zerogpu
from sapiens2.errors import CheckpointError, OptionError, ResidencyError
from sapiens2.zerogpu import (
    DAILY_QUOTA_S,
    GpuEntry,
    cache_budget_bytes,
    duration_factor,
    gpu_request,
    model_bytes,
)

# ----------------------------------------------------------------------------- durations


def test_duration_factor_is_the_worst_node_of_the_installed_spaces() -> None:
    import importlib.util

    folder = Path(next(iter(importlib.util.find_spec("spaces").submodule_search_locations)))
    table = json.loads((folder / "zero" / "configs.json").read_text())
    assert duration_factor() == max(c["duration_factor"] for c in table)
    assert duration_factor() == 1.5  # spaces 0.51.3: the RTX Pro 6000 nodes; H200 nodes are 1.0


def test_duration_factor_fallback_without_spaces(monkeypatch) -> None:
    monkeypatch.setattr(zerogpu, "_node_configs", lambda: ())
    assert duration_factor() == zerogpu.FALLBACK_DURATION_FACTOR
    assert zerogpu.xlarge_threshold() == zerogpu.FALLBACK_XLARGE_THRESHOLD


def test_gpu_request_rounds_up_and_charges_the_factor() -> None:
    req = gpu_request(12.2, factor=1.5)
    assert (req.duration_s, req.charged_s) == (13, 20)  # spaces floors to whole seconds: round up
    assert gpu_request(80, factor=1.5).charged_s == 120 and gpu_request(80, factor=1.5).fits_anonymous
    over = gpu_request(81, factor=1.5)
    assert over.charged_s == 122 and not over.fits_anonymous and over.fits_free
    assert not gpu_request(201, factor=1.5).fits_free  # 302 s > a free account's 300 s
    assert gpu_request(0).duration_s == 1
    xl = gpu_request(45, gpu_size="xlarge", factor=1.5)
    assert (xl.duration_s, xl.charged_s) == (45, 90)  # no factor, twice the quota (Hub docs)
    assert DAILY_QUOTA_S["anonymous"] == 120 and DAILY_QUOTA_S["free"] == 300


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "10", None])
def test_gpu_request_rejects_bad_estimates(bad) -> None:
    with pytest.raises(ValueError, match="finite number of seconds"):
        gpu_request(bad)


def test_large_runs_are_announced_on_zerogpu_only(monkeypatch) -> None:
    assert zerogpu.cost_notice(200, "This run") is None  # not on ZeroGPU: nothing to announce
    monkeypatch.setattr(zerogpu, "zero_gpu_enabled", lambda: True)
    monkeypatch.setattr(zerogpu, "duration_factor", lambda: 1.5)
    assert zerogpu.cost_notice(10, "This run") is None  # 15 s charged: not worth a word
    text = zerogpu.cost_notice(60, "Pose 5b")
    assert (
        text.startswith("Pose 5b reserves up to 90 s of ZeroGPU time") and "120 s without an account" in text
    )


# ----------------------------------------------------------------------------- memory


def test_cache_budget_and_model_bytes() -> None:
    lin = torch.nn.Linear(10, 4).to(torch.bfloat16)
    assert model_bytes(lin) == (10 * 4 + 4) * 2
    budget = cache_budget_bytes(pinned_bytes=18_000_000_000, headroom_bytes=8_000_000_000)
    assert budget == 48 * 10**9 - zerogpu.CUDA_CONTEXT_BYTES - 26_000_000_000
    assert cache_budget_bytes(60 * 10**9, 0) == 0  # never negative


# ----------------------------------------------------------------------------- off ZeroGPU


def test_entry_off_zerogpu_is_a_plain_call(monkeypatch) -> None:
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    seen = []

    def work(x: int, *, y: int = 0) -> tuple[int, int, int]:
        seen.append(threading.get_ident())
        return os.getpid(), threading.get_ident(), x + y

    entry = GpuEntry(work, duration=lambda x, y=0: 5)
    assert entry.zero_gpu is False
    assert entry(2, y=3) == (os.getpid(), threading.get_ident(), 5)
    entry.resident_changed()  # nothing to do off ZeroGPU
    zerogpu.resident_changed()
    assert entry.generation == 0 and entry.worker_pids() == {}

    def fail() -> None:
        raise OptionError("bad option")

    with pytest.raises(OptionError, match="bad option"):  # the same error object, not a wrapper
        GpuEntry(fail, 5, zero_gpu=False)()
    assert not zerogpu.in_gpu_worker()


def test_cuda_emulation_is_a_noop_off_zerogpu() -> None:
    with zerogpu.cuda_emulation():
        assert torch.zeros(1).device.type == "cpu"


def test_worker_errors_cross_the_boundary_as_objects() -> None:
    class Local(Exception):  # a local class cannot be pickled
        pass

    assert isinstance(zerogpu._portable(CheckpointError("x")), CheckpointError)
    fallback = zerogpu._portable(Local("kept text"))
    assert type(fallback) is RuntimeError and str(fallback) == "Local: kept text"


def test_only_own_children_are_ended() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        zerogpu._end_workers([os.getppid()])  # not a child of this process: never signalled
        zerogpu._end_workers([child.pid])
        assert child.wait(timeout=10) == -15  # SIGTERM
    finally:
        child.kill()
        child.wait()
    zerogpu._end_workers([child.pid])  # gone: nothing happens


def test_a_worker_refuses_to_load(monkeypatch, tiny_checkpoints) -> None:
    from sapiens2.loading import load_model
    from sapiens2.weights import load_tensors

    monkeypatch.setattr(zerogpu, "_in_worker", True)
    with pytest.raises(ResidencyError, match="Refused to load the weights of facebook/sapiens2-pose"):
        load_model("pose", checkpoint=tiny_checkpoints["pose"])
    with pytest.raises(ResidencyError, match="in a ZeroGPU worker"):
        load_tensors(tiny_checkpoints["pose"] / "model.safetensors")


# ----------------------------------------------------------------------------- under spaces' emulation


def test_real_shape_checkpoint_preloads_and_packs_under_zerogpu(tmp_path: Path) -> None:
    """The issue's proof: a real-shape 0.1b bf16 checkpoint in a Hub cache loads onto ZeroGPU's
    emulated CUDA through the app's path (pipeline -> load_model) and spaces packs it."""
    out = run_scenario("pack", tmp_path)
    assert out["cuda_available"] is True
    assert out["pipeline_device"] == "cuda:0"
    assert out["devices"] == ["cuda:0"] and out["dtypes"] == ["torch.bfloat16"]
    assert out["model_bytes"] == 113_993_472 * 2  # 0.1b: 114.0 M parameters in bf16
    assert out["packed_bytes"] == out["model_bytes"]
    # the weights were memory-mapped from the cache: spaces found the blob mapped and removed it
    assert len(out["blobs_before"]) == 1 and out["blobs_after"] == []
    # why the loader reads on the CPU: safetensors' own CUDA path needs a real CUDA context
    assert "pin_memory" in out["direct_cuda_error"]


def test_gpu_entry_residency_under_zerogpu(tmp_path: Path, tiny_checkpoints) -> None:
    a = tiny_checkpoints["pretrain"] / "model.safetensors"
    b = tmp_path / "b.safetensors"
    b.write_bytes(a.read_bytes())
    out = run_scenario("residency", tmp_path, str(a), str(b))
    server = out["server_pid"]
    # before any load the worker has nothing and refuses to load (ResidencyError crossed over)
    assert out["first"]["error"] == "ResidencyError" and "Refused to load" in out["first"]["message"]
    # a model loaded in a request thread is on emulated CUDA in the server ...
    assert out["server_devices"] == ["cuda:0"]
    # ... and the next call runs in a fresh worker that holds it, with the same weights
    second, third = out["second"], out["third"]
    assert second["pid"] not in (server, out["first"]["pid"])
    assert second["checksum"] == pytest.approx(out["expected"]["a"], rel=1e-4)
    assert third == second  # same generation: the idle worker is reused, as spaces intends
    # the stale worker of generation 0 was ended once idle
    assert out["first_alive_after"] is False
    assert out["workers"] == {"1": [second["pid"]]}
    # a model the server never loaded is refused in the worker, not loaded there
    assert out["missing"]["error"] == "ResidencyError" and out["missing"]["pid"] == second["pid"]
    # control: a plain spaces.GPU function keeps its stale worker, which lacks the new model
    assert out["plain_second"][0] == out["plain_first"][0] and out["plain_second"][1] is False


# ----------------------------------------------------------------------------- pins


def _pin(path: Path, name: str) -> str:
    for line in path.read_text().splitlines():
        if line.split("#")[0].strip().startswith(f"{name}=="):
            return line.split("==", 1)[1].split("#")[0].strip()
    raise AssertionError(f"{name} is not pinned exactly in {path}")


def test_torch_pin_is_on_the_zerogpu_list_and_shared_with_ci() -> None:
    root = Path(__file__).resolve().parent.parent
    pin = _pin(root / "requirements.txt", "torch")
    assert pin in zerogpu.SUPPORTED_TORCH
    assert _pin(root / ".ci" / "constraints.txt", "torch") == pin
    assert torch.__version__.split("+")[0] == pin  # the tests run on the version the Space gets
