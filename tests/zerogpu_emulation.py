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

import contextlib
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
        SAPIENS2_NO_GPU_BUDGET="1",  # this CPU's wall time is no GPU's: the clip's budget check is off
    )
    env.pop("SAPIENS2_CHECKPOINTS", None)
    proc = subprocess.run(
        [sys.executable, str(Path(__file__)), name, str(tmp), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    # spaces' worker processes print debug lines to the same stdout, in any order: the answer is
    # the scenario's one JSON line (the last line that is a JSON object).
    lines = [line for line in proc.stdout.strip().splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(
            f"scenario {name} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}"
        )
    # the result is the last JSON line; spaces' debug log (another process) may land on the lines
    # after it, or on its own line right after it, so read the last JSON object printed
    for line in reversed(lines):
        start = line.find("{")
        if start >= 0:
            with contextlib.suppress(ValueError):
                return json.JSONDecoder().raw_decode(line, start)[0]
    raise AssertionError(f"scenario {name} printed no result:\n{proc.stdout}")


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


# ----------------------------------------------------------------------------- the device API

#: What the Space keeps resident on ZeroGPU: the six default 1b files (pose, seg, normal, matting at
#: 2.92 GB each, pointmap at 2.93 GB, pretrain 0.1b for features) plus DETR-ResNet-50, in bf16,
#: about 15.6 GB in all. Every fresh worker moves all of it; the tiny test models stand in for it.
SPACE_RESIDENT_BYTES = 15_600_000_000
#: The node the stand-in schedules on: spaces 0.51.3's RTX PRO 6000 entry (duration factor 1.5).
RTX_NODE = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


class DeviceApi:
    """A stand-in for ZeroGPU's device API (``/schedule``, ``/allow``, ``/release``) with one
    visitor's quota, answering 429 (``QuotaInfos``: seconds left, wait) when a request asks for
    more than is left, as the real API does. spaces' own client code (``client.schedule``, with
    its duration factor and its messages) runs unchanged in front of it.

    ``policy``: ``"requested"`` charges the seconds requested when a call is admitted;
    ``"used"`` charges at release what the call used: its work (the seconds requested less the
    fresh-worker start they include) plus, only when the call forked a fresh worker, that start
    (CUDA and moving ``resident_bytes``, from ``models.cost``'s estimates), times the node's
    factor. The work is the app's own estimate because the tiny models' CPU time here says
    nothing about a GPU's. ``allow`` runs in the worker (a fork), so
    it marks a fresh worker with a file in ``folder``.
    """

    def __init__(self, folder: Path, quota_s: int, policy: str, resident_bytes: int = SPACE_RESIDENT_BYTES):
        if policy not in ("requested", "used"):
            raise ValueError(policy)
        self.folder, self.left, self.policy, self.resident = folder, int(quota_s), policy, resident_bytes
        folder.mkdir(parents=True, exist_ok=True)
        self.log: list[dict[str, Any]] = []
        self._open: dict[str, dict[str, Any]] = {}
        self._count = 0

    def startup_report(self) -> Any:
        import httpx

        return httpx.codes.OK

    def schedule(self, cgroup_path: str = "", task_id: int = 0, token: Any = None, token_version: int = 1,
                 duration_seconds: int | None = None, enable_queue: bool = True, gpu_size: Any = None) -> Any:  # fmt: skip
        import time
        from datetime import timedelta

        from spaces.zero.api import QuotaInfos, ScheduleMetadata, ScheduleResponse

        asked = int(duration_seconds or 0) * (2 if gpu_size == "xlarge" else 1)
        entry = {"call": len(self.log) + 1, "requested_s": asked, "left_before_s": self.left}
        self.log.append(entry)
        if asked > self.left:
            entry.update(approved=False, charged_s=0, left_after_s=self.left)
            meta = ScheduleMetadata(approve_result="quota-exceeded")
            return QuotaInfos(left=self.left, wait=timedelta(minutes=10)), meta
        self._count += 1
        token_out = f"token-{self._count}"
        entry.update(approved=True, token=token_out, t0=time.monotonic())
        if self.policy == "requested":
            self.left -= asked
            entry.update(charged_s=asked, left_after_s=self.left)
        self._open[token_out] = entry
        response = ScheduleResponse(idle=True, nvidiaIndex=0, nvidiaUUID="emulated", allowToken=token_out)
        return response, ScheduleMetadata(approve_result="approved")

    def allow(self, allow_token: str, pid: int) -> Any:
        import httpx

        (self.folder / f"fresh-{allow_token}").write_text(str(pid))  # runs in the fresh worker
        return httpx.codes.OK

    def release(self, allow_token: str, fail: bool = False) -> Any:
        import time

        import httpx

        from sapiens2.models.cost import start_seconds
        from sapiens2.zerogpu.quota import duration_factor

        entry = self._open.pop(allow_token)
        fresh = (self.folder / f"fresh-{allow_token}").exists()
        wall = time.monotonic() - entry.pop("t0")
        entry.update(fresh_worker=fresh, failed=bool(fail), wall_s=round(wall, 2))
        if self.policy == "used":
            factor, start = duration_factor(), start_seconds(self.resident)
            work = max(0.0, entry["requested_s"] / factor - start)
            used = work + (start if fresh else 0.0)
            charged = min(entry["requested_s"], round(used * factor))
            self.left -= charged
            entry.update(charged_s=charged, left_after_s=self.left)
        return httpx.codes.OK


def install_device_api(api: DeviceApi) -> None:
    """spaces' client talks to ``api``; the node is the RTX PRO 6000 (factor 1.5); the worker's
    CUDA init and weight move are skipped (no GPU here), as in :func:`install_fake_backend`."""
    from spaces.zero import client, config
    from spaces.zero import torch as zero_torch

    node = next(c for c in json.loads(_configs_path().read_text()) if c["model"] == RTX_NODE)
    config.get_config = lambda: node
    client.api_client = lambda: api
    zero_torch.init = lambda *_: _cuda_is_cpu_here()
    zero_torch.move = _move_to_originals


def _cuda_is_cpu_here() -> None:
    """In a worker (no GPU here, the weights are CPU originals): the pipelines' "cuda" inputs go
    to the CPU, so that the tiny models really run there."""
    import torch

    def cpu(device: Any) -> Any:
        return "cpu" if device is not None and "cuda" in str(device) else device

    to = torch.Tensor.to

    def tensor_to(self: Any, *args: Any, **kwargs: Any) -> Any:
        args = tuple(cpu(a) if isinstance(a, (str, torch.device)) else a for a in args)
        if "device" in kwargs:
            kwargs["device"] = cpu(kwargs["device"])
        return to(self, *args, **kwargs)

    torch.Tensor.to = tensor_to
    torch.Tensor.cuda = lambda self, *a, **k: self
    for name in ("zeros", "ones", "empty", "full", "arange", "tensor", "as_tensor", "randn", "linspace"):
        original = getattr(torch, name)

        def factory(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            if "device" in kwargs:
                kwargs["device"] = cpu(kwargs["device"])
            return _original(*args, **kwargs)

        setattr(torch, name, factory)
    torch.cuda.synchronize = lambda *_: None
    torch.cuda.empty_cache = lambda: None


def _configs_path() -> Path:
    import spaces

    return Path(spaces.__file__).parent / "zero" / "configs.json"


class _Headers(dict):
    """Request headers as spaces reads them (``.get`` and a ``__dict__``)."""


class _Request:
    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = _Headers(headers)


def as_visitor() -> None:
    """Make this thread's calls come from an anonymous visitor of the page (an IP token, no
    account), so that spaces words a refusal as it does for one: seconds requested and left."""
    import base64

    from gradio.context import LocalContext

    payload = base64.urlsafe_b64encode(json.dumps({"ip": "203.0.113.7"}).encode()).decode().rstrip("=")
    LocalContext.request.set(_Request({"x-ip-token": f"h.{payload}.s", "x-gradio-user": "app"}))


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
    snap = place_hf_cache(source, tmp / "hf", "features", "0.1b")
    blobs = sorted(str(p) for p in (tmp / "hf").glob("models--*/blobs/*"))
    source.unlink()  # only the cache copy remains

    direct_error = ""
    try:  # what the old loader did: ask safetensors for CUDA tensors directly
        with safe_open(str(snap), framework="pt", device="cuda") as fh:
            fh.get_tensor(next(iter(fh.keys())))
    except Exception as err:
        direct_error = f"{type(err).__name__}: {err}"

    pipe = pipeline("features", "0.1b", device="cuda")
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
        for k, shape in zoo_shapes("features", "0.1b").items()
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

    from sapiens2.models.loading import load_model

    model = RESIDENT.get(name)
    if model is None:
        model = load_model("features", checkpoint=CHECKPOINTS[name], device="cuda")
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

    from sapiens2.models.loading import load_model
    from sapiens2.zerogpu.entry import GpuEntry, resident_changed

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
        model = request_thread.submit(load_model, "features", checkpoint=checkpoint_a, device="cuda").result()
    RESIDENT["a"] = model
    out["server_devices"] = sorted({str(p.device) for p in model.parameters()})
    resident_changed()
    out["second"] = _call(entry, "a")
    out["third"] = _call(entry, "a")  # same generation: the idle worker is reused
    out["plain_second"] = plain("a")  # the control reuses its stale worker
    out["missing"] = _call(entry, "b")
    out["first_alive_after"] = _wait_gone(out["first"]["pid"])
    out["workers"] = {str(k): sorted(v) for k, v in worker_pids(entry).items()}
    return out


def scenario_worker_start(tmp: Path) -> dict[str, Any]:
    """A GPU call whose worker cannot start: ``os.fork`` in the server fails with ENOMEM (what
    4 of 7 retries after a quota refusal met on a quiet 24 GB machine). Once: the entry's one
    retry runs the call in a worker; twice: GpuUnavailableError in one sentence."""
    import errno

    from sapiens2.zerogpu import entry as zerogpu_entry
    from sapiens2.zerogpu.entry import GpuEntry, resident_changed

    install_fake_backend()
    zerogpu_entry.START_RETRY_PAUSE_S = 0.0
    real_fork, failing = os.fork, [0]

    def fork() -> int:
        if failing[0] > 0:
            failing[0] -= 1
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        return real_fork()

    os.fork = fork
    entry = GpuEntry(_plain_lookup, duration=30)
    out: dict[str, Any] = {"server_pid": os.getpid()}
    for name, fails in (("once", 1), ("twice", 2)):
        resident_changed()  # a new generation: the call forks a fresh worker
        failing[0] = fails
        out[name] = _call(entry, "a")
        out[f"{name}_forks_left"] = failing[0]
    resident_changed()
    out["after"] = _call(entry, "a")  # the next call starts a worker as usual
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
    from sapiens2 import serving
    from sapiens2.serving.device import Batch, OneTask
    from sapiens2.tasks import registry
    from sapiens2.ui import gpu
    from sapiens2.ui.page_runner import Runner
    from sapiens2.zerogpu import entry as zerogpu

    manager = serving.ModelManager(
        checkpoints={"features": checkpoint},
        factory=lambda task, size, **kw: Probe(task, size, **kw),
        on_change=zerogpu.resident_changed,
    )
    app.build_demo(manager)  # the page and its one GPU entry
    runner = Runner(manager)  # what build_demo gives every tab
    entries = list(zerogpu._entries)
    out: dict[str, Any] = {"server_pid": os.getpid(), "device": manager.device}
    out["one_entry"] = len(entries) == 1 and entries[0] is gpu.run_on_gpu
    device = gpu.gpu_device(manager)
    features = registry.get("features")

    def call() -> Any:
        [raws] = list(device(OneTask(Batch(features, "0.1b", ((8, 8, 3),), {}), 5)))
        return raws

    out["before"] = _attempt(call)

    def request() -> Any:
        job = runner.requests.job(features, [np.zeros((32, 24, 3), np.uint8)], None, {})
        return runner.requests.results(job)[0].raw

    with ThreadPoolExecutor(1) as handler_thread:  # Gradio runs handlers in worker threads
        pid, checksum = handler_thread.submit(request).result()
    params = list(manager.get(features).model.parameters())
    tensors = load_file(str(Path(checkpoint) / "model.safetensors")).values()
    out["request"] = {"pid": pid, "checksum": checksum}
    out["expected"] = float(sum(t.to(params[0].dtype).float().sum() for t in tensors))
    out["server_devices"] = sorted({str(p.device) for p in params})
    out["loads"] = manager.loads
    manager.clear()  # the server drops the model: the next worker is forked without it
    out["after_clear"] = _attempt(call)
    out["loads_after"] = manager.loads
    out["workers"] = {str(k): sorted(v) for k, v in worker_pids(gpu.run_on_gpu).items()}
    return out


#: Network input of the tiny Sapiens2 models in the scenarios that run many forwards. Admissions
#: and charges are priced from the zoo's shapes (the priced size), never from this input, so a
#: small one tests the same flows in a fraction of the time. Pointmap (its scale branch) and the
#: v1 depth graph keep their own input.
SMALL_INPUT = (256, 192)


def small_network_inputs() -> None:
    from sapiens2.tasks.albedo import AlbedoPipeline
    from sapiens2.tasks.features import FeaturesPipeline
    from sapiens2.tasks.matting import MattingPipeline
    from sapiens2.tasks.normal import NormalPipeline
    from sapiens2.tasks.pose import PosePipeline
    from sapiens2.tasks.seg import SegPipeline

    for cls in (AlbedoPipeline, FeaturesPipeline, MattingPipeline, NormalPipeline, PosePipeline, SegPipeline):
        cls.input_hw = SMALL_INPUT


def scenario_quota(tmp: Path, checkpoints_json: str, policy: str, quota: str, *flows: str) -> dict[str, Any]:
    """The app's multi-call flows against the stand-in device API: one visitor with ``quota``
    seconds left, charged by ``policy``, on the RTX PRO 6000 node, with the Space's resident set
    modelled (:data:`SPACE_RESIDENT_BYTES`; the tiny models do the work). ``flows``: ``all``
    ("All tasks", every task at its default) and/or ``video`` (the default pose video of a
    150-frame 720p clip), run in that order on the same quota in a handler thread, as Gradio does.
    Returns per flow the outcome and the device API's log (seconds requested and left per call)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    from video_clips import write_clip

    api = DeviceApi(tmp / "device-api", int(quota), policy)
    install_device_api(api)
    import app

    small_network_inputs()
    from sapiens2 import serving
    from sapiens2.ui.page_runner import Runner
    from sapiens2.ui.video_tab import VideoEndpoints
    from sapiens2.zerogpu import entry as zerogpu

    notes: list[str] = []
    _collect_messages(notes)
    checkpoints = json.loads(Path(checkpoints_json).read_text())
    manager = serving.ModelManager(checkpoints=checkpoints, on_change=zerogpu.resident_changed)
    manager.resident_bytes = lambda: SPACE_RESIDENT_BYTES  # the Space's set, not the tiny models
    # the tiny files stand in for the Space's default files: priced and named as those (a file of
    # no published size is "custom", priced as the costliest backbone), while they do the work
    manager.checkpoint_size = lambda task: task.spec.default_size(True)
    app.build_demo(manager)
    runner = Runner(manager)
    ends = VideoEndpoints(runner)
    photo = np.random.default_rng(0).integers(0, 255, (720, 540, 3), np.uint8)
    clip = tmp / "clip720p.mp4"
    out: dict[str, Any] = {"policy": policy, "quota_s": int(quota)}

    def run(flow: str) -> dict[str, Any]:
        as_visitor()
        if flow == "all":
            jobs = [(task, None, {}) for task in manager.tasks().values()]
            shown, status = runner.run_all(photo, jobs)
            done = sorted(t for t, v in shown.items() if not isinstance(v, Exception))
            skipped = {t: str(v) for t, v in shown.items() if isinstance(v, Exception)}
            return {"done": done, "skipped": skipped, "status": status}
        write_clip(clip, n=150, fps=30.0, size=(1280, 720))
        plan = ends.plan(str(clip), "pose", None, 1, None)
        source, video, files, summary, line = ends.run(
            str(clip), "pose", None, 1, None, 5, True, _no_progress
        )
        return {"plan": plan, "frames": summary["frames"], "video": video, "summary": summary, "line": line}

    with ThreadPoolExecutor(1) as handler_thread:
        for flow in flows:
            start = len(api.log)
            notes.clear()
            try:
                result = handler_thread.submit(run, flow).result()
            except Exception as err:
                result = {"error": type(err).__name__, "message": str(getattr(err, "message", err))}
            result["calls"] = [{k: v for k, v in e.items() if k != "token"} for e in api.log[start:]]
            result["messages"] = list(notes)
            out[flow] = result
    out["left_s"] = api.left
    return out


def scenario_live_admission(tmp: Path, checkpoints_json: str, policy: str, frames: str) -> dict[str, Any]:
    """What a live stream would cost with one GPU admission per frame: ``frames`` frames of a
    640x480 camera (body parts at a 512x384 input, the live view's fastest) each sent through the
    app's GPU entry (``sapiens2.ui.gpu.gpu_device``) as the unit the live view runs (a
    ``OneTask`` with the live frame's reservation), from a visitor's handler thread, against the stand-in device API charging by
    ``policy``; the Space's resident set modelled. Returns each call's wall time and its
    forward's time in the worker, and the device API's log (seconds requested and charged)."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    api = DeviceApi(tmp / "device-api", 10**6, policy)
    install_device_api(api)
    import app
    from sapiens2 import serving
    from sapiens2.inputs.intake import load_image
    from sapiens2.serving.device import Batch, OneTask
    from sapiens2.serving.live import INPUTS, frame_seconds
    from sapiens2.tasks import registry
    from sapiens2.tasks.base import prepare_batch
    from sapiens2.ui import gpu
    from sapiens2.zerogpu import entry as zerogpu

    checkpoints = json.loads(Path(checkpoints_json).read_text())
    manager = serving.ModelManager(checkpoints=checkpoints, on_change=zerogpu.resident_changed)
    manager.resident_bytes = lambda: SPACE_RESIDENT_BYTES
    app.build_demo(manager)
    device = gpu.gpu_device(manager)
    seg = registry.get("seg")
    frame = np.random.default_rng(0).integers(0, 255, (480, 640, 3), np.uint8)
    opts = {"input_hw": INPUTS["512x384"]}

    def stream() -> dict[str, Any]:
        as_visitor()
        size = manager.resolve_size(seg, None)
        manager.prepare(seg, size)
        preps = prepare_batch(manager.get(seg, size), [load_image(frame)], opts)
        seconds = frame_seconds(manager, seg, size, {})
        walls, forwards = [], []
        for _ in range(int(frames)):
            t0 = time.perf_counter()
            [[raw]] = device(OneTask(Batch(seg, size, tuple(preps), opts), seconds))
            walls.append(round(1e3 * (time.perf_counter() - t0), 1))
            forwards.append(round(1e3 * raw.timing.model_s, 1))
        return {"size": size, "seconds": seconds, "wall_ms": walls, "forward_ms": forwards}

    with ThreadPoolExecutor(1) as handler_thread:  # Gradio runs handlers in worker threads
        out = handler_thread.submit(stream).result()
    out["calls"] = [{k: v for k, v in e.items() if k != "token"} for e in api.log]
    out["policy"] = policy
    return out


#: What a clip's run does, by kind: (module path, attribute, kind). The same names exist before
#: and after issue 36's item 4, so the scenario reads both layouts.
CLIP_WORK = [
    ("sapiens2.video.clip_runner", "iter_frames", "decode"),
    ("sapiens2.outputs.webm_writer:VideoWriter", "write", "encode"),
    ("sapiens2.tasks.clip_frames:PoseFrames", "consume", "render"),
    ("sapiens2.tasks.clip_frames:DenseFrames", "consume", "render"),
    ("sapiens2.tasks.clip_frames:DepthFrames", "deferred", "render"),
    ("sapiens2.tasks.pose.pose_pipeline:PosePipeline", "prepare", "prepare"),
    ("sapiens2.tasks.pointmap.pointmap_pipeline:PointmapPipeline", "prepare", "prepare"),
    ("sapiens2.tasks.pose.pose_pipeline:PosePipeline", "finish", "finish"),
    ("sapiens2.tasks.pointmap.pointmap_pipeline:PointmapPipeline", "finish", "finish"),
    ("sapiens2.tasks.pose.pose_pipeline:PosePipeline", "infer", "forward"),
    ("sapiens2.tasks.pointmap.pointmap_pipeline:PointmapPipeline", "infer", "forward"),
    ("sapiens2.tasks.pose.pose_pipeline:PosePipeline", "detect", "detect"),
]


def record_clip_work(log: Path) -> None:
    """Wrap :data:`CLIP_WORK` so that every call appends "pid kind seconds" to ``log`` (in the
    server and in the forked GPU worker alike: a fork keeps the wrappers)."""
    import importlib
    import inspect
    import time

    for where, name, kind in CLIP_WORK:
        module, _, cls = where.partition(":")
        owner = importlib.import_module(module)
        owner = getattr(owner, cls) if cls else owner
        fn = getattr(owner, name)
        if isinstance(fn, staticmethod):
            fn = fn.__func__

        def note(kind: str, seconds: float) -> None:
            with open(log, "a") as fh:
                fh.write(f"{os.getpid()} {kind} {seconds:.6f}\n")

        def each(items: Any, kind: str) -> Any:  # a generator's work happens as it is read
            while True:
                t0 = time.perf_counter()
                try:
                    item = next(items)
                except StopIteration:
                    return
                finally:
                    note(kind, time.perf_counter() - t0)
                yield item

        def timed(*args: Any, _fn: Any = fn, _kind: str = kind, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            value = _fn(*args, **kwargs)
            note(_kind, time.perf_counter() - t0)
            return each(value, _kind) if inspect.isgenerator(value) else value

        setattr(owner, name, timed)


def scenario_clip_schedule(tmp: Path, checkpoints_json: str, frames: str, *tasks: str) -> dict[str, Any]:
    """Each of ``tasks`` (a video task, or ``motion``) on a ``frames``-frame 720p clip through the
    app's GPU entry against the stand-in device API (policy "used", a large quota, the Space's
    resident set modelled): per call the seconds requested and the call's wall time, and per kind
    of work (decode, prepare, forward, detect, finish, render, encode) the seconds spent inside the
    GPU worker and in the server. The tiny models' forwards say nothing about a GPU's seconds."""
    from concurrent.futures import ThreadPoolExecutor

    from video_clips import write_clip

    api = DeviceApi(tmp / "device-api", 100_000, "used")
    install_device_api(api)
    log = tmp / "work.log"
    record_clip_work(log)
    from sapiens2 import serving
    from sapiens2.serving.video import VideoRequests
    from sapiens2.tasks import registry
    from sapiens2.ui.gpu import gpu_device
    from sapiens2.video import TrackingOptions
    from sapiens2.zerogpu import entry as zerogpu

    checkpoints = json.loads(Path(checkpoints_json).read_text())
    manager = serving.ModelManager(checkpoints=checkpoints, on_change=zerogpu.resident_changed)
    manager.resident_bytes = lambda: SPACE_RESIDENT_BYTES
    video = VideoRequests(manager, serving.RequestFolders(tmp / "requests"), device=gpu_device(manager))
    clip = write_clip(tmp / "clip720p.mp4", n=int(frames), fps=30.0, size=(1280, 720))
    out: dict[str, Any] = {"server_pid": os.getpid(), "frames": int(frames)}

    def run(task: str) -> int:
        if task == "motion":
            from sapiens2.serving.motion_requests import MotionRequests

            return MotionRequests(video).run(str(clip), "0.4b").frames
        job = video.job(registry.get(task), str(clip), "0.4b", tracking=TrackingOptions())
        return video.run(job).frames

    with ThreadPoolExecutor(1) as handler_thread:
        for task in tasks:
            start = len(api.log)
            log.write_text("")
            done = handler_thread.submit(run, task).result()
            calls = [{k: e[k] for k in ("requested_s", "wall_s", "fresh_worker")} for e in api.log[start:]]
            work: dict[str, dict[str, float]] = {}
            for line in log.read_text().splitlines():
                pid, kind, seconds = line.split()
                where = "server" if int(pid) == os.getpid() else "gpu_call"
                work.setdefault(kind, {}).setdefault(where, 0.0)
                work[kind][where] = round(work[kind][where] + float(seconds), 3)
            out[task] = {"frames": done, "calls": calls, "work_s": work}
    return out


def _no_progress(*_: Any, **__: Any) -> None:
    return None


def _collect_messages(notes: list[str]) -> None:
    """Keep what the page would show in toasts (gr.Info / gr.Warning) instead of dropping it."""
    import gradio as gr

    gr.Info = lambda message, *a, **k: notes.append(f"info: {message}")  # type: ignore[assignment]
    gr.Warning = lambda message, *a, **k: notes.append(f"warning: {message}")  # type: ignore[assignment]


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


def worker_pids(entry: Any) -> dict[int, set[int]]:
    """Generation -> pids of the workers that ran a GpuEntry's calls and are not ended yet."""
    with entry._lock:
        return {n: set(g.pids) for n, g in entry._generations.items()}


def _last_worker(entry: Any) -> int | None:
    pids = [pid for gen in worker_pids(entry).values() for pid in gen]
    return max(pids) if pids else None


def _wait_gone(pid: int | None, timeout_s: float = 60.0) -> bool:
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
