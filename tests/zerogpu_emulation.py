"""Scenarios run under spaces' own ZeroGPU emulation on a CPU-only torch, each in a child process.

``spaces`` patches torch for the whole process when ``SPACES_ZERO_GPU`` is set, so nothing here
runs inside pytest: ``run_scenario(name, tmp, *args)`` starts ``python tests/zerogpu_emulation.py
NAME TMP ARGS...`` with the environment below and returns the JSON object the scenario prints last.

Two shims stand in for what this machine lacks, and nothing else of spaces is replaced:

- ``install_cpu_shim``: a CPU build of torch lacks three things spaces reads at import:
  ``torch.version.cuda`` (None; spaces' static.py calls ``.startswith`` on it),
  ``torch._C._cuda_init`` (absent; spaces saves it to restore later) and a picklable
  ``torch.cuda._is_in_bad_fork`` (a lambda on CPU builds; spaces runs it in a forked pool).
- ``install_fake_backend``: the ZeroGPU backend (an HTTP service) and a real GPU: the scheduler
  client's ``schedule``/``release``/``allow`` answer locally (one device, always idle, so spaces
  reuses a worker exactly as on ZeroGPU), the worker's CUDA init is skipped, and the worker's
  ``move`` hands each emulated CUDA tensor its CPU original instead of copying it to a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def run_scenario(name: str, tmp: Path, *args: str, timeout: float = 300) -> dict[str, Any]:
    """Run scenario ``name`` in a child process under the emulation; its last stdout line is JSON."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPACES_", "ZEROGPU_"))}
    env.update(
        SPACES_ZERO_GPU="true",
        SPACES_ZERO_DEVICE_API_URL="http://127.0.0.1:9",  # required by spaces; never contacted
        ZEROGPU_OFFLOAD_DIR=str(tmp / "zerogpu-tensors"),
        ZEROGPU_MMAP_AUTOPRUNE_PATTERN=str(tmp / "hf" / "models--*" / "blobs" / "*"),
        HF_HUB_CACHE=str(tmp / "hf"),
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]),
        OMP_NUM_THREADS="1",
    )
    env.pop("SAPIENS2_CHECKPOINTS", None)
    proc = subprocess.run(
        [sys.executable, str(Path(__file__)), name, str(tmp), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise AssertionError(
            f"scenario {name} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}"
        )
    return json.loads(lines[-1])


def install_cpu_shim() -> None:
    import torch

    torch.version.cuda = "12.8"
    if not hasattr(torch._C, "_cuda_init"):
        torch._C._cuda_init = _no_cuda_init
    torch.cuda._is_in_bad_fork = _not_in_bad_fork


def _no_cuda_init() -> None:
    raise RuntimeError("CPU build: no CUDA")


def _not_in_bad_fork() -> bool:
    return False


def install_fake_backend() -> None:
    from spaces.zero import client
    from spaces.zero import torch as zero_torch
    from spaces.zero.api import ScheduleResponse

    def schedule(**_: Any) -> ScheduleResponse:
        return ScheduleResponse(idle=True, nvidiaIndex=0, nvidiaUUID="emulated", allowToken="token")

    client.schedule = schedule
    client.release = lambda *_, **__: None
    client.allow = lambda *_: None
    zero_torch.init = lambda *_: None
    zero_torch.move = _move_to_originals


def _move_to_originals(callback: Any = None) -> None:
    """The worker's move, minus the GPU: every emulated CUDA tensor gets its CPU original."""
    from spaces.zero.torch.patching import cuda_aliases

    for fake, original in list(cuda_aliases.items()):
        if original is not None:
            fake.data = original


# ----------------------------------------------------------------------------- scenarios


def scenario_pack(tmp: Path) -> dict[str, Any]:
    """Preload a real-shape 0.1b bf16 checkpoint from a fake Hub cache onto emulated CUDA through
    the app's loading path, then pack it as spaces does at launch."""
    import torch
    from safetensors import safe_open
    from spaces.zero.torch import patching
    from tiny_checkpoints import place_hf_cache

    from sapiens2.tasks import pipeline

    source = _write_real_shape_checkpoint(tmp / "release" / "pretrain-0.1b.safetensors")
    snap = place_hf_cache(source, tmp / "hf", "pretrain", "0.1b")
    blobs = sorted(str(p) for p in (tmp / "hf").glob("models--*/blobs/*"))
    source.unlink()  # only the cache copy remains

    direct_error = ""
    try:  # what the old loader did: ask safetensors for CUDA tensors directly
        with safe_open(str(snap), framework="pt", device="cuda") as fh:
            fh.get_tensor(next(iter(fh.keys())))
    except Exception as err:
        direct_error = f"{type(err).__name__}: {err}"

    pipe = pipeline("pretrain", "0.1b", device="cuda")
    params = list(pipe.model.parameters())
    return {
        "cuda_available": torch.cuda.is_available(),
        "pipeline_device": str(pipe.device),
        "devices": sorted({str(p.device) for p in params}),
        "dtypes": sorted({str(p.dtype) for p in params}),
        "model_bytes": sum(p.numel() * p.element_size() for p in params),
        "blobs_before": blobs,
        "packed_bytes": patching.pack(),
        "blobs_after": sorted(str(p) for p in (tmp / "hf").glob("models--*/blobs/*")),
        "direct_cuda_error": direct_error,
    }


def _write_real_shape_checkpoint(path: Path) -> Path:
    """Random bf16 tensors with the release's 0.1b pretrain key names and shapes (about 228 MB)."""
    import torch
    from safetensors.torch import save_file
    from tiny_checkpoints import zoo_shapes

    gen = torch.Generator().manual_seed(0)
    tensors = {
        k: torch.randn(shape, generator=gen).to(torch.bfloat16)
        for k, shape in zoo_shapes("pretrain", "0.1b").items()
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path))
    return path


RESIDENT: dict[str, Any] = {}  # the server's models in the residency scenario (copied into each fork)
CHECKPOINTS: dict[str, str] = {}


def checksum(name: str) -> tuple[int, float]:
    """The GPU function of the residency scenario: the worker's pid and a checksum of the model it
    holds; a model it does not hold is loaded, which must be refused in a worker."""
    import torch

    from sapiens2.loading import load_model

    model = RESIDENT.get(name)
    if model is None:
        model = load_model("pretrain", checkpoint=CHECKPOINTS[name], device="cuda")
    with torch.no_grad():
        return os.getpid(), float(sum(p.float().sum() for p in model.parameters()))


def scenario_residency(tmp: Path, checkpoint_a: str, checkpoint_b: str) -> dict[str, Any]:
    """GpuEntry against spaces' real wrappers: a load in the server (in a request thread, as Gradio
    does) makes the next call run in a fresh worker that holds the model; the stale idle worker
    ends; a worker never loads. A plain spaces.GPU function is the control."""
    from concurrent.futures import ThreadPoolExecutor

    import spaces
    import torch
    from safetensors.torch import load_file

    from sapiens2.loading import load_model
    from sapiens2.zerogpu import GpuEntry, resident_changed

    install_fake_backend()
    CHECKPOINTS.update(a=checkpoint_a, b=checkpoint_b)
    expected = {  # the models load in bf16 on (emulated) CUDA
        k: float(sum(t.to(torch.bfloat16).float().sum() for t in load_file(v).values()))
        for k, v in CHECKPOINTS.items()
    }
    entry = GpuEntry(checksum, duration=30)
    plain = spaces.GPU(duration=30)(_plain_lookup)
    out: dict[str, Any] = {"expected": expected, "server_pid": os.getpid()}

    out["first"] = _call(entry, "a")  # nothing resident yet: the worker must refuse to load
    out["plain_first"] = plain("a")
    with ThreadPoolExecutor(1) as request_thread:  # Gradio loads in a worker thread, not the main one
        model = request_thread.submit(load_model, "pretrain", checkpoint=checkpoint_a, device="cuda").result()
    RESIDENT["a"] = model
    out["server_devices"] = sorted({str(p.device) for p in model.parameters()})
    resident_changed()
    out["second"] = _call(entry, "a")
    out["third"] = _call(entry, "a")  # same generation: the idle worker is reused
    out["plain_second"] = plain("a")  # the control reuses its stale worker
    out["missing"] = _call(entry, "b")
    out["first_alive_after"] = _wait_gone(out["first"]["pid"])
    out["workers"] = {str(k): sorted(v) for k, v in entry.worker_pids().items()}
    return out


class Probe:
    """A real pipeline, loaded by the app's model cache, whose device step reports what the
    worker holds (its pid and a checksum of the model's weights) instead of running the model:
    a worker here has CPU originals behind emulated CUDA tensors, not a GPU."""

    def __init__(self, task: str, size: str | None, **kwargs: Any) -> None:
        from sapiens2.tasks import registry

        self.model = registry.get(task).pipeline(size, **kwargs).model

    def prepare(self, intake: Any, **opts: Any) -> tuple[int, ...]:
        return tuple(intake.rgb.shape)

    def infer(self, preps: list[Any], **opts: Any) -> list[tuple[int, float]]:
        import torch

        with torch.no_grad():
            total = float(sum(p.float().sum() for p in self.model.parameters()))
        return [(os.getpid(), total) for _ in preps]

    def finish(self, raw: Any, intake: Any, **opts: Any) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(raw=raw, info=SimpleNamespace(total_s=0.0))


def scenario_app(tmp: Path, checkpoint: str) -> dict[str, Any]:
    """The app's own path under ZeroGPU: app.build_demo's GPU entry, the model cache reporting
    to it, a request run by the app's Runner in a handler thread. The GPU function refuses to
    load before the server loaded the model and after the server dropped it."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    from safetensors.torch import load_file

    install_fake_backend()
    import app
    from sapiens2 import serving, zerogpu
    from sapiens2.ui import gpu
    from sapiens2.ui.handlers import Runner

    manager = serving.ModelManager(
        checkpoints={"pretrain": checkpoint},
        factory=lambda task, size, **kw: Probe(task, size, **kw),
        on_change=zerogpu.resident_changed,
    )
    app.build_demo(manager)  # the page and its one GPU entry
    runner = Runner(manager)  # what build_demo gives every tab
    entries = list(zerogpu._entries)
    out: dict[str, Any] = {"server_pid": os.getpid(), "device": manager.device}
    out["one_entry"] = len(entries) == 1 and entries[0] is gpu.run_on_gpu
    call = gpu.device_call(manager)
    out["before"] = _attempt(lambda: call("pretrain", "0.1b", [(8, 8, 3)], {}, 5))

    def request() -> Any:
        job = runner.requests.job("features", [np.zeros((32, 24, 3), np.uint8)], None, {})
        return runner.requests.results(job)[0].raw

    with ThreadPoolExecutor(1) as handler_thread:  # Gradio runs handlers in worker threads
        pid, checksum = handler_thread.submit(request).result()
    params = list(manager.get("pretrain").model.parameters())
    tensors = load_file(str(Path(checkpoint) / "model.safetensors")).values()
    out["request"] = {"pid": pid, "checksum": checksum}
    out["expected"] = float(sum(t.to(params[0].dtype).float().sum() for t in tensors))
    out["server_devices"] = sorted({str(p.device) for p in params})
    out["loads"] = manager.loads
    manager.clear()  # the server drops the model: the next worker is forked without it
    out["after_clear"] = _attempt(lambda: call("pretrain", "0.1b", [(8, 8, 3)], {}, 5))
    out["loads_after"] = manager.loads
    out["workers"] = {str(k): sorted(v) for k, v in gpu.run_on_gpu.worker_pids().items()}
    return out


def _attempt(fn: Any) -> dict[str, Any]:
    from sapiens2.ui import gpu

    try:
        return {"value": fn()}
    except Exception as err:
        return {"error": type(err).__name__, "message": str(err), "pid": _last_worker(gpu.run_on_gpu)}


def _plain_lookup(name: str) -> tuple[int, bool]:
    return os.getpid(), name in RESIDENT


def _call(entry: Any, name: str) -> dict[str, Any]:
    try:
        pid, value = entry(name)
        return {"pid": pid, "checksum": value}
    except Exception as err:
        return {"error": type(err).__name__, "message": str(err), "pid": _last_worker(entry)}


def _last_worker(entry: Any) -> int | None:
    pids = [pid for gen in entry.worker_pids().values() for pid in gen]
    return max(pids) if pids else None


def _wait_gone(pid: int | None, timeout_s: float = 20.0) -> bool:
    """True if ``pid`` is still running after ``timeout_s`` (spaces' sentinel thread reaps it)."""
    import time

    if pid is None:
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists():
            return False
        time.sleep(0.05)
    return True


if __name__ == "__main__":
    install_cpu_shim()
    import spaces  # noqa: F401  (patches torch: must come before anything touches CUDA)

    scenario, tmp_dir, *rest = sys.argv[1:]
    result = globals()[f"scenario_{scenario}"](Path(tmp_dir), *rest)
    sys.stdout.flush()
    print(json.dumps(result))
