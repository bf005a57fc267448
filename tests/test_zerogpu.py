"""sapiens2.zerogpu: duration arithmetic against the quotas (``quota``), the GPU entry off and on
ZeroGPU (``entry``; spaces' own emulation, in child processes), and the proof that weights load and
pack there."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from registry_helpers import task as T
from zerogpu_emulation import run_scenario, worker_pids

import sapiens2.zerogpu
from sapiens2.errors import CheckpointError, GpuUnavailableError, OptionError, ResidencyError
from sapiens2.models import cost
from sapiens2.models.checkpoints import CHECKPOINTS_ENV
from sapiens2.serving.device import Batch, OneTask
from sapiens2.zerogpu import entry as zerogpu
from sapiens2.zerogpu import internals, quota
from sapiens2.zerogpu.entry import GpuEntry
from sapiens2.zerogpu.quota import (
    DAILY_QUOTA_S,
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
    monkeypatch.setattr(quota, "node_configs", lambda: ())
    assert duration_factor() == quota.FALLBACK_DURATION_FACTOR


def test_gpu_request_rounds_up_and_charges_the_factor() -> None:
    req = gpu_request(12.2, factor=1.5)
    assert (req.duration_s, req.charged_s) == (13, 20)  # spaces floors to whole seconds: round up
    assert gpu_request(80, factor=1.5).charged_s == 120 and gpu_request(80, factor=1.5).fits("anonymous")
    over = gpu_request(81, factor=1.5)
    assert over.charged_s == 122 and not over.fits("anonymous") and over.fits("free")
    assert not gpu_request(201, factor=1.5).fits("free")  # 302 s > a free account's 300 s
    assert gpu_request(0).duration_s == 1
    xl = gpu_request(45, gpu_size="xlarge", factor=1.5)
    assert (xl.duration_s, xl.charged_s) == (45, 90)  # no factor, twice the quota (Hub docs)
    assert DAILY_QUOTA_S["anonymous"] == 120 and DAILY_QUOTA_S["free"] == 300


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "10", None])
def test_gpu_request_rejects_bad_estimates(bad) -> None:
    with pytest.raises(ValueError, match="finite number of seconds"):
        gpu_request(bad)


def test_large_runs_are_announced_on_zerogpu_only(monkeypatch) -> None:
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    assert quota.cost_notice(200, "This run") is None  # not on ZeroGPU: nothing to announce
    monkeypatch.setattr(sapiens2.zerogpu, "zero_gpu_enabled", lambda: True)
    monkeypatch.setattr(quota, "duration_factor", lambda: 1.5)
    assert quota.cost_notice(10, "This run") is None  # 15 s charged: not worth a word
    text = quota.cost_notice(60, "Pose 5b")
    assert (
        text.startswith("Pose 5b reserves up to 90 s of ZeroGPU time") and "120 s without an account" in text
    )


def _packed_at_launch() -> int:
    """bf16 bytes of what the Space preloads (each task's default size on a GPU, borrowed models
    included once; not a Sapiens v1 default: depth loads on first use) plus DETR, counted as
    ``models.cost`` counts weights."""
    from sapiens2.models.zoo import ARCHS, is_v1
    from sapiens2.tasks import registry

    sizes = [t.spec.default_size(True) for t in registry.all_tasks().values()]
    sizes = [s for s in sizes if not is_v1(s)]
    return int(sum(2e9 * ARCHS[size].params_b for size in sizes)) + 170_000_000


def _heaviest(task) -> dict:
    """The options that make a task's call longest: numbers at their maximum, switches on."""
    heavy = {o.name: o.high for o in task.options if o.kind in ("int", "float")}
    heavy.update({o.name: True for o in task.options if o.kind == "bool"})
    return heavy


def _call_estimates(pixels: int):
    """(task, size, options, images, unclamped seconds of one GPU call) for every task and size,
    default and heaviest options, on photos of ``pixels``, with the Space's launch set resident
    besides the request's own models (those of another size than the default)."""
    from sapiens2.serving.request_runner import Job
    from sapiens2.tasks import registry

    for task in registry.all_tasks().values():
        counts = (1, 2) if task.compare is not None else (1,)  # similarity: both photos in one call
        for size, images in itertools.product(task.spec.sizes, counts):
            for options in ({}, _heaviest(task)):
                opts, _ = task.split(options, gpu=True)
                job = Job(task, size, [None] * images, opts, {})
                own = 0 if size == task.spec.default_size(True) else cost.weight_bytes(job.batch_sizes)
                seconds = cost.start_seconds(_packed_at_launch() + own)
                seconds += images * cost.photo_seconds(size, task.work(opts))  # any photo: same input
                yield task.name, size, options, images, seconds


def test_every_call_fits_a_visitor_without_an_account_before_any_cap() -> None:
    """All tasks = one call per task, so every call (each task, size and option set, on the largest
    photo, with the Space's resident set) must be startable with 120 s of quota after the factor.
    The estimate itself is checked, not the capped request."""
    from PIL import Image

    from sapiens2.models.cost import MAX_CALL_S, clamp

    checked = 0
    for task, size, options, images, seconds in _call_estimates(int(Image.MAX_IMAGE_PIXELS)):
        request = gpu_request(seconds, factor=duration_factor())
        assert request.fits("anonymous"), (task, size, options, images, seconds, request)
        assert clamp(seconds) >= seconds  # the cap never cuts an estimate short
        checked += 1
    assert checked >= 2 * 23  # 23 (task, size) pairs in the zoo
    # the cap itself is the largest request an anonymous visitor can start on the slowest node
    assert gpu_request(MAX_CALL_S).fits("anonymous") and not gpu_request(MAX_CALL_S + 1).fits("anonymous")
    assert clamp(10_000) == MAX_CALL_S


def test_every_5b_run_is_announced_on_the_space_and_default_runs_are_not(monkeypatch) -> None:
    from sapiens2.models.cost import clamp
    from sapiens2.tasks import registry

    monkeypatch.setattr(sapiens2.zerogpu, "zero_gpu_enabled", lambda: True)
    for task, size, options, images, seconds in _call_estimates(12_000_000):  # a phone photo
        if options or images > 1:
            continue
        notice = quota.cost_notice(clamp(seconds), f"This {task} {size} run")
        if size == "5b":
            assert notice is not None and "reserves up to" in notice, (task, seconds)
        elif size == registry.get(task).spec.default_size(True):
            assert notice is None, (task, size, seconds)


# ----------------------------------------------------------------------------- memory


def test_cache_budget_and_model_bytes() -> None:
    lin = torch.nn.Linear(10, 4).to(torch.bfloat16)
    assert model_bytes(lin) == (10 * 4 + 4) * 2
    budget = cache_budget_bytes(pinned_bytes=18_000_000_000, headroom_bytes=8_000_000_000)
    assert budget == 48 * 10**9 - quota.CUDA_CONTEXT_BYTES - 26_000_000_000
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
    assert entry.generation == 0 and worker_pids(entry) == {}

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


@pytest.mark.subprocess
def test_only_own_children_are_ended() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        internals.end_workers([os.getppid()])  # not a child of this process: never signalled
        internals.end_workers([child.pid])
        assert child.wait(timeout=10) == -15  # SIGTERM
    finally:
        child.kill()
        child.wait()
    internals.end_workers([child.pid])  # gone: nothing happens


def test_a_worker_refuses_to_load(monkeypatch, tiny_checkpoints) -> None:
    from sapiens2.models.loading import load_model
    from sapiens2.models.weights import load_tensors

    monkeypatch.setattr(zerogpu, "_in_worker", True)
    with pytest.raises(ResidencyError, match="Refused to load the weights of facebook/sapiens2-pose"):
        load_model("pose", checkpoint=tiny_checkpoints["pose"])
    with pytest.raises(ResidencyError, match="in a ZeroGPU worker"):
        load_tensors(tiny_checkpoints["pose"] / "model.safetensors")


class _Stub:
    """A stand-in pipeline with a model of ``n`` bf16 parameters."""

    def __init__(self, n: int = 8) -> None:
        self.model = torch.nn.Linear(n, 1, bias=False).to(torch.bfloat16)


@pytest.mark.slow
def test_the_cache_reports_every_change_of_what_is_resident(monkeypatch) -> None:
    """on_change after each load (with its evictions), trim, clear and detector load, under the
    cache's lock; never for a cache hit. With zerogpu.resident_changed it moves the GPU entry's
    generation (the next call forks a worker holding the new set)."""
    from sapiens2.serving import ModelManager
    from sapiens2.tasks import registry

    calls: list[bool] = []
    manager = ModelManager(device="cpu", max_models=1, factory=lambda task, size, **kw: _Stub())
    manager.on_change = lambda: calls.append(manager._guard.locked())
    manager.get(T("seg"), "0.4b")
    manager.get(T("seg"), "0.4b")  # a hit: nothing changed
    assert calls == [True]
    manager.get(T("seg"), "1b")  # load + eviction of 0.4b: one report, after both
    assert calls == [True, True] and manager.loaded() == [("seg", "1b")]
    assert manager.trim(keep=0) == [("seg", "1b")] and len(calls) == 3
    manager.trim(keep=0)  # nothing dropped: nothing to report
    manager.clear()
    assert calls == [True] * 4
    warmed = iter([True, False])  # the detector loads once, then is already there
    pose = dataclasses.replace(registry.get("pose"), warm=lambda device: next(warmed))
    manager.prepare(pose)  # pose model load + detector load: two reports
    manager.prepare(pose)  # both resident: none
    assert calls == [True] * 6


@pytest.mark.slow
def test_app_managers_report_changes_to_the_gpu_entry(monkeypatch, tiny_checkpoints) -> None:
    """The app's managers (built by build_demo and by the command line) call
    zerogpu.resident_changed; on ZeroGPU the command line's also gets the byte budget and preloads."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import app
    from sapiens2.tasks import registry

    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv(CHECKPOINTS_ENV, raising=False)
    specs = [f"{task}={path}" for task, path in tiny_checkpoints.items()]
    args = app.parse_args([x for spec in specs for x in ("--checkpoint", spec)] + ["--device", "cpu"])
    plain = app.manager_from_args(args)
    assert plain.on_change is zerogpu.resident_changed
    assert CHECKPOINTS_ENV not in os.environ  # the checkpoints are passed down, never exported
    assert "albedo" in plain.tasks() and "albedo" not in registry.all_tasks()  # shown by its checkpoint
    monkeypatch.setattr(app, "ZERO_GPU", True)
    manager = app.manager_from_args(args)
    assert manager.on_change is zerogpu.resident_changed
    assert manager.max_bytes == cache_budget_bytes(0, quota.ACTIVATION_HEADROOM_BYTES)
    assert manager.loads == len(tiny_checkpoints)  # every task preloaded (and pinned) before launch
    assert manager.trim(keep=0) == []
    from sapiens2.ui import gpu

    assert isinstance(gpu.run_on_gpu, GpuEntry)  # the one GPU entry every task's device call uses
    calls: list[OneTask] = []
    monkeypatch.setattr(gpu.run_on_gpu, "fn", lambda cache, unit: calls.append(unit) or iter([[]]))
    for task in ("seg", "features"):
        list(gpu.gpu_device(manager)(OneTask(Batch(T(task), "1b", (), {}), 5)))
    assert [(u.what, u.batch.size, u.seconds) for u in calls] == [("seg", "1b", 5), ("features", "1b", 5)]


# ----------------------------------------------------------------------------- under spaces' emulation


@pytest.mark.subprocess
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


@pytest.mark.subprocess
def test_gpu_entry_residency_under_zerogpu(tmp_path: Path, tiny_checkpoints) -> None:
    a = tiny_checkpoints["features"] / "model.safetensors"
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


@pytest.mark.subprocess
def test_through_the_app_a_gpu_call_never_loads_under_zerogpu(tmp_path: Path, tiny_checkpoints) -> None:
    """app.build_demo's one GPU entry, its model cache and Runner under spaces' emulation: before
    the server loaded the model, and after it dropped it, the worker refuses (ResidencyError from
    the worker, not a load); a request loads in its handler thread on emulated CUDA, and its GPU
    call runs in a fresh worker holding the same weights."""
    out = run_scenario("app", tmp_path, str(tiny_checkpoints["features"]))
    server = out["server_pid"]
    assert out["one_entry"] and out["device"] == "cuda"
    before = out["before"]
    assert before["error"] == "ResidencyError" and "not resident" in before["message"]
    assert before["pid"] not in (None, server)  # refused in a worker
    assert out["server_devices"] == ["cuda:0"] and out["loads"] == 1
    request = out["request"]
    assert request["pid"] not in (server, before["pid"])  # a fresh worker after the load
    assert request["checksum"] == pytest.approx(out["expected"], rel=1e-4)
    after = out["after_clear"]
    assert after["error"] == "ResidencyError" and after["pid"] not in (server, request["pid"])
    assert out["loads_after"] == 1  # nobody loaded it again
    assert list(out["workers"].values()) == [[after["pid"]]]  # older workers were ended


# ----------------------------------------------------------------------------- pins


def _pin(path: Path, name: str) -> str:
    for line in path.read_text().splitlines():
        if line.split("#")[0].strip().startswith(f"{name}=="):
            return line.split("==", 1)[1].split("#")[0].strip()
    raise AssertionError(f"{name} is not pinned exactly in {path}")


def test_torch_pin_is_on_the_zerogpu_list_and_shared_with_ci() -> None:
    root = Path(__file__).resolve().parent.parent
    pin = _pin(root / "requirements.txt", "torch")
    assert pin in quota.SUPPORTED_TORCH
    assert _pin(root / ".ci" / "constraints.txt", "torch") == pin
    assert torch.__version__.split("+")[0] == pin  # the tests run on the version the Space gets


def _front_matter() -> dict:
    """The Space's configuration: the YAML block at the top of README.md."""
    import yaml

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert text.startswith("---\n"), "README.md must start with the Space's YAML front matter"
    return yaml.safe_load(text.split("---\n", 2)[1])


def test_space_front_matter_matches_the_code_and_zerogpus_lists() -> None:
    """README front matter: preload_from_hub equals sapiens2.models.hub_cache.preload_from_hub() (the
    defaults the app preloads), python_version is on ZeroGPU's list, the gradio version meets
    requirements.txt, and the mcp-server tag comes with gradio[mcp]."""
    from packaging.requirements import Requirement

    from sapiens2.models import hub_cache

    meta = _front_matter()
    assert meta.get("preload_from_hub") == hub_cache.preload_from_hub()
    assert str(meta.get("python_version")) in quota.SUPPORTED_PYTHON
    lines = (Path(__file__).resolve().parents[1] / "requirements.txt").read_text().splitlines()
    reqs = [Requirement(x.split("#")[0]) for x in lines if x.split("#")[0].strip()]
    gradio = next(r for r in reqs if r.name == "gradio")
    assert gradio.specifier.contains(str(meta["sdk_version"]))
    if "mcp-server" in meta.get("tags", []):
        assert "mcp" in gradio.extras


# ----------------------------------------------------------------------------- one reservation


def test_one_reservation_function_and_its_estimates() -> None:
    """Every GPU call asks models.cost.reservation: start (CUDA + moving the resident set)
    plus work, rounded up and capped; the three estimates are module constants there."""
    start = cost.CUDA_INIT_S + 15_600_000_000 / cost.MOVE_BYTES_PER_S
    assert cost.reservation(10.2, 15_600_000_000) == math.ceil(start + 10.2)
    assert cost.reservation(0, 0) == cost.MIN_CALL_S
    assert cost.reservation(1e6, 0) == cost.MAX_CALL_S == 80
    arch_tflops = 4.715  # 1b at 1024x768 (zoo.ARCHS)
    assert cost.forward_seconds("1b", 2) == pytest.approx(0.5 + 2 * arch_tflops / cost.SUSTAINED_TFLOPS)
    root = Path(__file__).resolve().parents[1] / "sapiens2"
    copies = [p for p in root.rglob("*.py") if "start_seconds(" in p.read_text() and p.name != "cost.py"]
    assert [p.name for p in copies] in ([], ["video.py"])  # video.py: the budget left after the start only


def test_zoo_names_the_1b_4k_pretrain_file_as_the_release_does() -> None:
    from sapiens2.models.zoo import get_task

    assert get_task("features").filename("1b-4k") == "sapiens2_1b_4k_pretrain.safetensors"
    assert get_task("features").repo_id("1b-4k") == "facebook/sapiens2-pretrain-1b-4k"
    assert get_task("features").local_path("0.4b") == "pretrain/sapiens2_0.4b_pretrain.safetensors"
    assert get_task("pose").filename("0.4b") == "sapiens2_0.4b_pose.safetensors"


def test_spaces_refusals_become_package_errors_with_the_seconds() -> None:
    import gradio as gr

    err = gr.Error("You have exceeded your ZeroGPU quota (72s requested vs. 40s left). Try again in 0:10:00. ",
                   title="ZeroGPU quota exceeded")  # fmt: skip
    with pytest.raises(GpuUnavailableError) as caught:
        zerogpu._spaces_call(lambda: (_ for _ in ()).throw(err))
    got = caught.value
    assert (got.requested_s, got.left_s, got.wait, got.quota) == (72, 40, "0:10:00", True)
    assert "72 s requested vs. 40 s left" in str(got) and "Log in" in str(got) and "in 0:10:00" in str(got)
    aborted = quota.gpu_unavailable("ZeroGPU worker error", "GPU task aborted")
    assert not aborted.quota and "GPU task aborted" in str(aborted)
    with pytest.raises(ValueError):  # anything else passes through unchanged
        zerogpu._spaces_call(lambda: (_ for _ in ()).throw(ValueError("x")))


# ----------------------------------------------------------------------------- quota scenarios


@pytest.fixture(scope="module")
def quota_checkpoints(space_checkpoints, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("quota") / "checkpoints.json"
    path.write_text(json.dumps({t: str(p) for t, p in space_checkpoints.items()}))
    return path


def _left_after(calls: list[dict]) -> list[int]:
    return [c["left_after_s"] for c in calls]


@pytest.mark.subprocess
def test_all_tasks_completes_on_a_fresh_anonymous_quota(tmp_path: Path, quota_checkpoints: Path) -> None:
    """One admission for every task, charged the seconds requested, on a fresh 120 s quota."""
    out = run_scenario("quota", tmp_path, str(quota_checkpoints), "requested", "120", "all", timeout=900)
    run = out["all"]
    assert "error" not in run and run["skipped"] == {}, run
    assert len(run["done"]) == len(registry_names())
    assert len(run["calls"]) == 1 and run["calls"][0]["approved"] and run["calls"][0]["requested_s"] <= 120


@pytest.mark.subprocess
def test_all_tasks_with_40_s_left_completes_in_one_admission(tmp_path: Path, quota_checkpoints: Path) -> None:
    """The issue's 40 s case: the one admission (every task) is charged less than 40 s, so
    nothing is refused any more (the before/after logs are in docs/ZEROGPU.md)."""
    out = run_scenario("quota", tmp_path, str(quota_checkpoints), "requested", "40", "all", timeout=900)
    run = out["all"]
    assert len(run["calls"]) == 1, json.dumps(run)
    [call] = run["calls"]
    assert call["approved"] and call["requested_s"] <= 40 and run["skipped"] == {}
    assert len(run["done"]) == len(registry_names())


@pytest.mark.subprocess
def test_all_tasks_short_of_quota_keeps_what_ran_and_says_why(
    tmp_path: Path, quota_checkpoints: Path
) -> None:
    """With 30 s left the one admission is refused: the first tasks that fit the seconds left run
    in one more admission, and the others get ONE line: which, why (spaces' seconds), what helps."""
    out = run_scenario("quota", tmp_path, str(quota_checkpoints), "requested", "30", "all", timeout=900)
    run = out["all"]
    first, second = run["calls"]
    assert not first["approved"] and first["requested_s"] > 30  # the whole set does not fit
    assert second["approved"] and second["requested_s"] <= 30  # the tasks that fit run
    assert run["done"] and run["skipped"], run
    message = next(iter(run["skipped"].values()))
    assert len(set(run["skipped"].values())) == 1  # one line for all of them
    assert f"{first['requested_s']} s requested vs. 30 s left" in message and "Not run:" in message
    assert "Log in" in message and "smaller size" in message
    assert "(skipped: " in run["status"].splitlines()[0]


def registry_names() -> list[str]:
    from sapiens2.tasks import registry

    return list(registry.all_tasks())


@pytest.mark.subprocess
@pytest.mark.parametrize("policy", ["requested", "used"])
def test_default_pose_video_of_a_150_frame_720p_clip_fits_a_fresh_quota(
    tmp_path: Path, quota_checkpoints: Path, policy: str
) -> None:
    out = run_scenario("quota", tmp_path, str(quota_checkpoints), policy, "120", "video", timeout=900)
    run = out["video"]
    assert "error" not in run, run
    [call] = run["calls"]  # the whole clip: one admission
    assert call["approved"] and call["requested_s"] <= 120
    assert "one GPU call" in run["plan"] and f"requests {round(call['requested_s'] / 1.5)} s" in run["plan"]
    planned = int(run["plan"].split(" frames in one GPU call")[0].split()[-1])
    assert run["frames"] == planned and planned >= 75  # reduced plans say so on the page first
    assert ("Reduced to" in run["plan"]) == (planned < 150)


@pytest.mark.subprocess
def test_video_with_40_s_left_returns_the_frames_that_fit(tmp_path: Path, quota_checkpoints: Path) -> None:
    out = run_scenario("quota", tmp_path, str(quota_checkpoints), "requested", "40", "video", timeout=900)
    run = out["video"]
    assert "error" not in run, run
    refused, ran = run["calls"]
    assert not refused["approved"] and ran["approved"] and ran["requested_s"] <= 40
    assert 0 < run["frames"] < 150
    notice = run["summary"]["notices"][0]
    assert f"{refused['requested_s']} s requested vs. 40 s left" in notice and "Only" in notice
    assert Path(run["video"]).stat().st_size > 0


@pytest.mark.slow
def test_all_tasks_keeps_the_tasks_done_when_the_gpu_fails_partway(tiny_checkpoints, tmp_path: Path) -> None:
    """The one admission streams each task's raws: when the worker is aborted after two tasks,
    both are presented and the others get one error saying which and why."""
    import numpy as np

    from sapiens2 import serving

    manager = serving.ModelManager(device="cpu", checkpoints=tiny_checkpoints)

    def aborted_after_two(unit):
        for i, value in unit.run(manager):
            if i == 2:
                raise quota.gpu_unavailable("ZeroGPU worker error", "GPU task aborted")
            yield i, value

    requests = serving.RequestRunner(manager, serving.RequestFolders(tmp_path), device=aborted_after_two)
    photo = np.zeros((48, 32, 3), np.uint8)
    shown = requests.run_all(photo, {T(t): (None, {}) for t in ("seg", "normal", "matting", "features")})
    assert all(isinstance(shown[t], serving.Presented) for t in ("seg", "normal"))
    rest = [shown["matting"], shown["features"]]
    assert all(isinstance(e, GpuUnavailableError) for e in rest) and rest[0] is rest[1]
    assert str(rest[0]).startswith("Not run: Matting, Features.") and "GPU task aborted" in str(rest[0])


# ----------------------------------------------------------------------------- a worker that cannot start


def _fake_spaces(monkeypatch, fails: int, *, stream: bool = False) -> list[int]:
    """GpuEntry on ZeroGPU with spaces' call replaced: its first ``fails`` worker starts raise
    OSError(ENOMEM) as os.fork() did; the starts are counted in the returned list."""
    import errno

    monkeypatch.setattr(zerogpu, "START_RETRY_PAUSE_S", 0.0)
    starts: list[int] = []

    def start() -> None:
        starts.append(1)
        if len(starts) <= fails:
            raise OSError(errno.ENOMEM, "Cannot allocate memory")

    def run(fn, args):  # the worker's side, in this process (not marked as a worker: it may load)
        try:
            return zerogpu._Outcome(os.getpid(), value=fn(*args))
        except Exception as err:
            return zerogpu._Outcome(os.getpid(), error=err)

    def decorate(self: GpuEntry, number: int) -> zerogpu._Generation:
        def call(*args):
            if not stream:
                start()
                return run(self.fn, args)

            def values():
                start()
                yield from (zerogpu._Outcome(os.getpid(), value=v) for v in self.fn(*args))

            return values()

        return zerogpu._Generation(number, call, call)

    monkeypatch.setattr(GpuEntry, "_decorate", decorate)
    return starts


@pytest.mark.slow
def test_a_worker_that_cannot_start_is_retried_once_then_the_gpu_is_unavailable(monkeypatch) -> None:
    starts = _fake_spaces(monkeypatch, fails=1)
    assert GpuEntry(lambda x: x + 1, 5, zero_gpu=True)(2) == 3 and len(starts) == 2  # the one retry ran it
    starts = _fake_spaces(monkeypatch, fails=2)
    with pytest.raises(GpuUnavailableError, match=r"^The GPU is unavailable right now") as caught:
        GpuEntry(lambda x: x + 1, 5, zero_gpu=True)(2)
    assert len(starts) == 2 and "OSError" not in str(caught.value) and str(caught.value).count(". ") == 0

    def worker_side() -> None:  # an OSError of the call itself (it ran): no retry, the error as it is
        raise OSError(12, "the call's own")

    starts = _fake_spaces(monkeypatch, fails=0)
    with pytest.raises(OSError, match="the call's own"):
        GpuEntry(worker_side, 5, zero_gpu=True)()
    assert len(starts) == 1


@pytest.mark.slow
def test_a_stream_whose_worker_cannot_start_keeps_the_tasks_done(
    monkeypatch, tiny_checkpoints, tmp_path
) -> None:
    """Run all through a streaming entry: a start that fails once is retried and every task runs;
    one that fails twice reads as the GPU being unavailable, in the one plain sentence per task."""
    import numpy as np

    from sapiens2 import serving

    manager = serving.ModelManager(device="cpu", checkpoints=tiny_checkpoints)
    tasks = {T(t): (None, {}) for t in ("seg", "normal")}
    for fails, ran in ((1, True), (2, False)):
        photo = np.full((48, 32, 3), fails, np.uint8)  # another photo: not an answer from the cache
        starts = _fake_spaces(monkeypatch, fails=fails, stream=True)
        entry = GpuEntry(lambda unit: unit.run(manager), 5, zero_gpu=True, generator=True)
        requests = serving.RequestRunner(manager, serving.RequestFolders(tmp_path), device=entry)
        shown = requests.run_all(photo, tasks)
        assert len(starts) == 2, shown
        if ran:
            assert all(isinstance(shown[t], serving.Presented) for t in ("seg", "normal"))
        else:
            assert all(isinstance(shown[t], GpuUnavailableError) for t in ("seg", "normal"))
            assert "The GPU is unavailable right now" in str(shown["seg"])


@pytest.mark.subprocess
def test_a_failed_worker_start_under_the_emulation(tmp_path: Path) -> None:
    """spaces' own wrappers, os.fork failing with ENOMEM in the server: once is retried and runs
    in a worker, twice is the GPU being unavailable, and the next call starts a worker as usual."""
    run = run_scenario("worker_start", tmp_path)
    server = run["server_pid"]
    assert run["once"]["pid"] not in (None, server) and run["once_forks_left"] == 0
    assert run["twice"]["error"] == "GpuUnavailableError" and run["twice_forks_left"] == 0
    assert run["twice"]["message"].startswith("The GPU is unavailable right now")
    assert run["after"]["pid"] not in (None, server)
