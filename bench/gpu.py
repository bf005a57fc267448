"""GPU readiness: one command that checks and measures the CUDA path, each figure next to its target.

Sections (``--sections``, default all), each a list of figures with value, target and verdict:

* ``correctness``: the suite's device tests (``tests/test_bench_gpu.py -k device_path``, run by
  pytest in a subprocess: their CUDA variants run only where CUDA is), then bf16 against fp32
  outputs of every task, on the tests' tiny checkpoints and on real-shape random models.
* ``forward``: our backbone against transformers' ``Sapiens2Model`` on the same weights (written
  by transformers, read by our loader), per size and batch: ms, TFLOP/s (counted by
  ``torch.utils.flop_counter``), % of the GPU's bf16 peak, and which SDPA kernels ran (profiler).
* ``request``: each task's whole request over its model time (``bench/request.py``'s stages), on a
  1080p and a 12 MP photo; pose with 1 and 5 people.
* ``memory``: peak GPU memory of a 1080p request per task and size, and the weights.
* ``zerogpu``: CUDA start-up in a fresh process, pinned host -> device copy rate, sustained bf16
  TFLOP/s (matrix products and a 1b forward), against ``sapiens2.models.cost``'s constants.
* ``compile``: ``torch.compile`` (``sapiens2.models.compile.compile_model``) speed-up and warm-up seconds.

    python bench/gpu.py --json gpu.json                    # on a CUDA machine (10-20 min)
    python bench/gpu.py --device cpu --quick --json q.json # the same code paths on tiny models

``--quick`` runs tiny models, small photos and single runs: it keeps the script alive in CI
(``tests/test_bench_gpu.py``), its numbers mean nothing. On a CPU a figure that only a GPU can
give is reported as ``skipped: no CUDA``; the code around it still runs where it can.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "tests"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from sapiens2.models import compile as compiling  # noqa: E402
from sapiens2.models import cost  # noqa: E402
from sapiens2.models.nn.backbone import fuse_qkv_in_state  # noqa: E402
from sapiens2.models.nn.model import build_from_shapes  # noqa: E402
from sapiens2.models.zoo import ARCHS, TASKS  # noqa: E402
from sapiens2.runtime import threads  # noqa: E402
from sapiens2.tasks import registry  # noqa: E402


def _load_bench(name: str) -> Any:
    """A sibling bench script as a module (they are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


request_bench = _load_bench("request")
forward_bench = _load_bench("forward")

SECTIONS = ("correctness", "forward", "request", "memory", "zerogpu", "compile")
NO_CUDA = "skipped: no CUDA"

# ----------------------------------------------------------------------------- targets
# From issue 25 and docs/PERFORMANCE.md; the table prints each next to its figure.
TARGET_PEAK_PCT_1B = 60.0  # 1b bf16 forward, batch 1, 1024x768: % of the GPU's dense bf16 peak
TARGET_VS_TRANSFORMERS = 1.5  # our forward at least 1.5x faster than transformers' (eager, SDPA)
TARGET_REQUEST_OVER_MODEL = 2.0  # a whole request at most 2x its model time
TARGET_FIVE_OVER_ONE = 2.5  # pose: five people at most 2.5x one person (whole request)
TARGET_5B_PEAK_GIB = 16.0  # the 5b models in bf16 fit a 16 GB GPU
TARGET_BF16_COSINE = 0.99  # bf16 output vs fp32 output, per output tensor
TARGET_BF16_TINY_REL = 0.1  # and max |bf16 - fp32| / max |fp32| on the tiny models

#: Dense bf16 tensor-core peak (TFLOP/s) and full SM count, by device-name fragment (first match).
#: A MIG slice (ZeroGPU's "H200 MIG 3g.71gb") gets the share of its SMs.
BF16_PEAKS: tuple[tuple[str, float, int], ...] = (
    ("H200", 989.4, 132),
    ("H100 PCIe", 756.5, 114),
    ("H100", 989.4, 132),
    ("A100", 312.0, 108),
    ("L40S", 362.1, 142),
    ("L4", 121.0, 58),
)


@dataclasses.dataclass
class Figure:
    """One measured figure. ``met``: True/False against ``target``; None when there is no target
    or it does not apply (CPU, quick mode); ``value`` None with a ``note`` when not measured."""

    name: str
    value: float | int | str | None
    unit: str = ""
    target: str = ""
    met: bool | None = None
    note: str = ""


class Section:
    def __init__(self, name: str) -> None:
        self.name = name
        self.status = "ok"
        self.figures: list[Figure] = []
        self.data: dict[str, Any] = {}

    def add(self, *args: Any, **kwargs: Any) -> Figure:
        fig = Figure(*args, **kwargs)
        self.figures.append(fig)
        return fig

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "figures": [dataclasses.asdict(f) for f in self.figures],
            **self.data,
        }


# ----------------------------------------------------------------------------- the plan


@dataclasses.dataclass
class Plan:
    """What each section runs: the full GPU plan, or tiny stand-ins for ``--quick``."""

    device: torch.device
    dtype: torch.dtype
    quick: bool
    sizes: list[str]  # forward and memory
    request_size: str
    real_sizes: list[str]  # real-shape bf16 vs fp32
    hw: tuple[int, int]  # forward input
    batches: list[int]
    photos: list[tuple[int, int]]
    people: list[int]
    runs: int
    request_runs: int
    copy_mib: int
    matmul_n: int
    sustain_s: float
    peak_tflops: float | None

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


def make_plan(args: argparse.Namespace) -> Plan:
    device = torch.device(args.device)
    quick = args.quick
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return Plan(
        device=device,
        dtype=dtype,
        quick=quick,
        sizes=["tiny"] if quick else args.sizes.split(","),
        request_size="tiny" if quick else args.request_size,
        real_sizes=["0.1b"] if quick else args.real_sizes.split(","),
        hw=(128, 96) if quick else tuple(args.hw),
        batches=[1, 8],
        photos=[(480, 270), (800, 600)] if quick else [(1920, 1080), (4000, 3000)],
        people=[1, 5],
        runs=1 if quick else args.runs,
        request_runs=1 if quick else args.request_runs,
        copy_mib=64 if quick else 1024,
        matmul_n=512 if quick else 8192,
        sustain_s=0.5 if quick else 10.0,
        peak_tflops=args.peak_tflops or bf16_peak(device),
    )


def bf16_peak(device: torch.device) -> float | None:
    """This GPU's dense bf16 peak TFLOP/s (scaled to a MIG slice's SMs), None when unknown."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    for fragment, tflops, full_sms in BF16_PEAKS:
        if fragment in name:
            return tflops * min(1.0, sms / full_sms)
    return None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn: Callable[[], Any], device: torch.device, runs: int) -> float:
    """Median wall milliseconds of ``fn()`` over ``runs`` calls after one warm-up call."""
    with torch.inference_mode():
        fn()
        times = []
        for _ in range(runs):
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def tasks_to_run(plan: Plan) -> list[str]:
    """Every registered task (zoo names), less those the plan cannot build (no tiny checkpoint)."""
    from tiny_checkpoints import TINY_TASKS

    names = list(registry.all_tasks())
    return [t for t in names if t in TINY_TASKS] if plan.quick else names


def cleanup(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def guarded(sec: Section, label: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``; an exception becomes a failed figure (and the section's error) instead of
    ending the section, so one task that cannot run leaves the others measured."""
    try:
        return fn(*args)
    except Exception as err:  # a bench run must report every figure it can
        why = f"error: {type(err).__name__}: {err}"[:300]
        sec.data.setdefault("errors", []).append(f"{label}: {why}")
        sec.add(label, None, "", "runs", False, why)
        return None


# ----------------------------------------------------------------------------- models


def random_model(task: str, size: str, device: torch.device) -> torch.nn.Module:
    """fp32 random model of ``task`` at ``size``: the tests' tiny one, or the published shape."""
    if size == "tiny":
        return request_bench.tiny_model(task, device, torch.float32)
    return request_bench.shape_model(task, size, device, torch.float32)


def loaded_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """``model``'s weights as ``load_model`` would load them in ``dtype``: everything cast except
    the heads' float32 layers (``fp32_keys``), q/k/v fused, on the same device. In memory, so a
    5b model needs no 20 GB file."""
    state = model.state_dict()
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    copy, _ = build_from_shapes(shapes, device="meta", rope_dtype=getattr(model, "rope_dtype", None))
    fp32 = copy.fp32_keys() if hasattr(copy, "fp32_keys") else set()
    cast = {k: v.to(torch.float32 if k in fp32 else dtype) for k, v in state.items()}
    del state
    fuse_qkv_in_state(copy, cast)
    copy.load_state_dict(cast, strict=True, assign=True)
    return copy.eval()


def output_tensors(out: Any) -> dict[str, torch.Tensor]:
    return {f.name: getattr(out, f.name) for f in dataclasses.fields(out)}


def compare_dtypes(model: torch.nn.Module, hw: tuple[int, int], dtype: torch.dtype) -> dict[str, dict]:
    """Per output tensor of ``model`` (fp32): cosine similarity and max relative difference
    between the fp32 model and its ``dtype`` copy on the same normalised-looking input."""
    device = next(model.parameters()).device
    low = loaded_copy(model, dtype)
    x = torch.randn((1, 3, *hw), generator=torch.Generator().manual_seed(0)).to(device)
    with torch.inference_mode():
        ref, out = output_tensors(model(x)), output_tensors(low(x.to(dtype)))
    head = bool(getattr(low, "fp32_keys", lambda: ())())  # task models end in float32 layers
    result = {}
    for name, r in ref.items():
        o = out[name].double()  # float64: a float32 cosine of a million values can exceed 1
        r = r.double()
        cos = torch.nn.functional.cosine_similarity(r.flatten(), o.flatten(), dim=0).item()
        rel = ((r - o).abs().max() / r.abs().max().clamp_min(1e-12)).item()
        result[name] = {
            "head_fp32": head,
            "cosine": cos,
            "max_rel": rel,
            "out_dtype": str(out[name].dtype).replace("torch.", ""),
            "finite": bool(torch.isfinite(o).all()),
        }
    del low
    return result


def task_hw(task: str, plan: Plan) -> tuple[int, int]:
    """Network input for a correctness forward: the pointmap scale branch needs 1024x768."""
    return (1024, 768) if task == "pointmap" or not plan.quick else plan.hw


# ----------------------------------------------------------------------------- correctness


def run_device_tests(plan: Plan) -> dict[str, Any]:
    """The suite's device tests in a fresh pytest process; counts from its JUnit XML. Quick mode
    runs only pose's (the same machinery, a third of the time)."""
    import xml.etree.ElementTree as ET

    select = "device_path and pose" if plan.quick else "device_path"
    with tempfile.TemporaryDirectory(prefix="sapiens2-gpu-tests-") as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [
            sys.executable, "-m", "pytest", "tests/test_bench_gpu.py", "-k", select, "-rs",
            "-p", "no:cacheprovider", f"--junitxml={xml}",
        ]  # fmt: skip
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
        seconds = time.perf_counter() - t0
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        if xml.exists():
            suite = ET.parse(xml).getroot()
            suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
            counts = {k: int(suite.get(k, 0)) for k in counts}
    failed = counts["failures"] + counts["errors"]
    return {
        "command": " ".join(cmd[2:-1]),
        "returncode": proc.returncode,
        "passed": counts["tests"] - failed - counts["skipped"],
        "failed": failed,
        "skipped": counts["skipped"],
        "seconds": seconds,
        "output": (proc.stdout[-4000:] + proc.stderr[-1000:]) if proc.returncode else "",
    }


def section_correctness(plan: Plan, sec: Section) -> None:
    tests = run_device_tests(plan)
    sec.data["pytest"] = tests
    ok = tests["returncode"] == 0 and tests["failed"] == 0 and tests["passed"] > 0
    sec.add("device tests passed", tests["passed"], "", "all pass", ok, tests["command"])
    sec.add("device tests failed", tests["failed"], "", "0", tests["failed"] == 0)
    sec.add(
        "device tests skipped",
        tests["skipped"],
        "",
        "",
        None,
        "" if plan.cuda else "the CUDA variants: skipped: no CUDA",
    )
    sec.data["bf16_vs_fp32"] = {}
    for size in ["tiny", *plan.real_sizes]:
        for task in tasks_to_run(plan):
            if size != "tiny" and (size not in TASKS[task].sizes or (plan.quick and task != "features")):
                continue  # quick: one real-shape model (0.1b features) keeps the CPU run short
            guarded(sec, f"bf16 vs fp32 {task} {size}", bf16_figure, plan, sec, task, size)
            cleanup(plan.device)


def bf16_figure(plan: Plan, sec: Section, task: str, size: str) -> None:
    model = random_model(task, size, plan.device)
    hw = task_hw(task, plan) if size == "tiny" else (plan.hw if plan.quick else (1024, 768))
    res = compare_dtypes(model, hw, torch.bfloat16)
    sec.data["bf16_vs_fp32"][f"{task} {size}"] = res
    cos = min(r["cosine"] for r in res.values())
    rel = max(r["max_rel"] for r in res.values())
    fp32_out = all(r["finite"] and (r["out_dtype"] == "float32" or not r["head_fp32"]) for r in res.values())
    note = f"max rel diff {rel:.3g}" + ("" if fp32_out else "; a head output is not finite float32")
    met = cos >= TARGET_BF16_COSINE and fp32_out
    if size == "tiny":
        met = met and rel <= TARGET_BF16_TINY_REL
    sec.add(
        f"bf16 vs fp32 {task} {size}: min cosine", round(cos, 5), "", f">= {TARGET_BF16_COSINE}", met, note
    )


# ----------------------------------------------------------------------------- forward


def sdpa_backends(fn: Callable[[], Any], device: torch.device) -> dict[str, int]:
    """Which SDPA kernels one call of ``fn`` ran, by the profiler's op names, with call counts."""
    from torch.profiler import ProfilerActivity, profile

    # The CPU side records every aten op, whatever the device: no CUPTI needed.
    with profile(activities=[ProfilerActivity.CPU]) as prof, torch.inference_mode():
        fn()
        sync(device)
    names = {
        "_scaled_dot_product_flash_attention_for_cpu": "flash (cpu)",
        "_scaled_dot_product_flash_attention": "flash",
        "_scaled_dot_product_efficient_attention": "efficient",
        "_scaled_dot_product_cudnn_attention": "cudnn",
        "_scaled_dot_product_attention_math": "math",
        "_scaled_dot_product_fused_attention_overrideable": "overrideable",
    }
    found: Counter[str] = Counter()
    for ev in prof.key_averages():
        key = ev.key.removeprefix("aten::")
        if key in names:
            found[names[key]] += ev.count
    return dict(found)


def count_flops(fn: Callable[[], Any], model: torch.nn.Module | None = None) -> float:
    """FLOPs (2 per multiply-add) of one call of ``fn``: torch's counter, or, where it cannot count
    an op of this torch version (2.11 rejects grouped-query SDPA shapes), ``shape_flops`` on
    ``model``'s linears, convolutions and attention calls."""
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with FlopCounterMode(display=False) as counter, torch.inference_mode():
            fn()
        return float(counter.get_total_flops())
    except (AssertionError, RuntimeError):
        if model is None:
            raise
        return shape_flops(fn, model)


def shape_flops(fn: Callable[[], Any], model: torch.nn.Module) -> float:
    """FLOPs of one call of ``fn`` from the shapes seen: each ``nn.Linear`` and ``nn.Conv2d`` of
    ``model`` (forward hooks) and each ``scaled_dot_product_attention`` (QK^T and AV products)."""
    import torch.nn.functional as F

    macs = [0.0]

    def linear(mod: torch.nn.Linear, args: tuple, out: torch.Tensor) -> None:
        macs[0] += out.numel() * mod.in_features

    def conv(mod: torch.nn.Conv2d, args: tuple, out: torch.Tensor) -> None:
        kh, kw = mod.kernel_size
        macs[0] += out.numel() * (mod.in_channels // mod.groups) * kh * kw

    sdpa = F.scaled_dot_product_attention

    def counted_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        *lead, n_q, d = q.shape
        macs[0] += 2 * math.prod(lead) * n_q * k.shape[-2] * d  # q k^T, then attn v
        return sdpa(q, k, v, *args, **kwargs)

    hooks = [
        m.register_forward_hook(linear if isinstance(m, torch.nn.Linear) else conv)
        for m in model.modules()
        if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))
    ]
    F.scaled_dot_product_attention = counted_sdpa
    try:
        with torch.inference_mode():
            fn()
    finally:
        F.scaled_dot_product_attention = sdpa
        for h in hooks:
            h.remove()
    return 2 * macs[0]


def published_flops(model: Any, hw: tuple[int, int], batch: int) -> float | None:
    """The zoo's published forward FLOPs for the model's size at 1024x768, else None."""
    arch = ARCHS.get(getattr(model, "size", None) or "")
    if arch is None or arch.tflops_1024x768 is None or tuple(hw) != (1024, 768):
        return None
    return arch.tflops_1024x768 * 1e12 * batch


def reference_pair(size: str, plan: Plan, tmp: Path) -> tuple[torch.nn.Module, torch.nn.Module, int]:
    """(transformers' model, ours) with the same weights, and the head dim."""
    if size == "tiny":
        from tiny_checkpoints import make_tiny_model

        ref = make_tiny_model("features").to(plan.device, plan.dtype)
        head_dim = ref.config.hidden_size // ref.config.num_attention_heads
    else:
        with torch.device(plan.device):  # build on the GPU: a 5b model on the CPU takes minutes
            ref = forward_bench.reference_model(size, plan.hw, plan.dtype, plan.device)
        head_dim = ARCHS[size].head_dim
    ref.save_pretrained(tmp)
    from sapiens2 import load_model

    ours = load_model(
        "features", None if size == "tiny" else size, checkpoint=tmp, device=plan.device, dtype=plan.dtype
    )
    return ref, ours, head_dim


def time_forward(plan: Plan, ours: Any, ref: Any, batch: int, kernels: bool) -> dict[str, Any]:
    """One size and batch: FLOPs, ours and transformers timed (alternating is not needed on a
    GPU; each gets a warm-up), TFLOP/s, % of peak and, when ``kernels``, the SDPA kernels run."""
    x = torch.randn(batch, 3, *plan.hw, device=plan.device, dtype=plan.dtype)
    flops = count_flops(lambda: ours(x), ours)
    ours_ms = median_ms(lambda: ours(x), plan.device, plan.runs)
    ref_ms = median_ms(lambda: ref(pixel_values=x), plan.device, plan.runs)
    tflops = flops / (ours_ms / 1e3) / 1e12
    row = {
        "batch": batch, "hw": list(plan.hw), "gflop": flops / 1e9, "ours_ms": ours_ms,
        "transformers_ms": ref_ms, "speedup": ref_ms / ours_ms, "tflops": tflops,
        "peak_pct": 100 * tflops / plan.peak_tflops if plan.peak_tflops else None,
    }  # fmt: skip
    if kernels:
        row["sdpa"] = sdpa_backends(lambda: ours(x), plan.device)
    return row


def forward_figures(plan: Plan, sec: Section, row: dict[str, Any]) -> None:
    size, batch, pct, speedup = row["size"], row["batch"], row["peak_pct"], row["speedup"]
    label = f"{size} b{batch} {plan.hw[0]}x{plan.hw[1]}"
    sec.add(f"{label}: ours", round(row["ours_ms"], 2), "ms", "", None, f"{row['tflops']:.2f} TFLOP/s")
    judged = plan.cuda and not plan.quick
    is_1b = size == "1b" and batch == 1
    sec.add(
        f"{label}: % of bf16 peak",
        None if pct is None else round(pct, 1),
        "%",
        f">= {TARGET_PEAK_PCT_1B:.0f}" if is_1b else "",
        (pct >= TARGET_PEAK_PCT_1B) if is_1b and judged and pct is not None else None,
        "" if pct is not None else (NO_CUDA if not plan.cuda else "peak unknown: give --peak-tflops"),
    )
    sec.add(
        f"{label}: transformers / ours",
        round(speedup, 3),
        "x",
        f">= {TARGET_VS_TRANSFORMERS}",
        speedup >= TARGET_VS_TRANSFORMERS if judged else None,
        f"transformers {row['transformers_ms']:.2f} ms",
    )
    if "sdpa" in row:
        used = ", ".join(f"{k} x{v}" for k, v in sorted(row["sdpa"].items())) or "none seen"
        sec.add(
            f"{size} SDPA kernels, head dim {row['head_dim']}", used, "", "no math", "math" not in row["sdpa"]
        )


def section_forward(plan: Plan, sec: Section) -> None:
    sec.data["peak_tflops"] = plan.peak_tflops
    sec.data["rows"] = []
    for size in plan.sizes:
        guarded(sec, f"{size} forward", forward_size, plan, sec, size)
        cleanup(plan.device)


def forward_size(plan: Plan, sec: Section, size: str) -> None:
    with tempfile.TemporaryDirectory(prefix="sapiens2-fwd-") as tmp:
        ref, ours, head_dim = reference_pair(size, plan, Path(tmp))
    for batch in plan.batches:
        row = {"size": size, "head_dim": head_dim}
        row.update(time_forward(plan, ours, ref, batch, kernels=batch == plan.batches[0]))
        sec.data["rows"].append(row)
        forward_figures(plan, sec, row)


# ----------------------------------------------------------------------------- request + memory


def _request_args(plan: Plan, people: list[int]) -> argparse.Namespace:
    """The namespace ``bench/request.py``'s helpers read."""
    return argparse.Namespace(
        device=str(plan.device),
        dtype={torch.bfloat16: "bf16", torch.float32: "fp32"}[plan.dtype],
        weights="tiny" if plan.quick else "random",
        input_hw=plan.hw if plan.quick else None,
        people=people,
        runs=plan.request_runs,
        compile="off",
    )


def _build_pipe(task: str, size: str, args: argparse.Namespace) -> tuple[Any, Any]:
    """(pipeline, its borrowed seg pipeline or None), as bench/request.py builds them."""
    seg = request_bench.build("seg", size, args, None) if task == "pointmap" else None
    return request_bench.build(task, size, args, seg), seg


def _photos(plan: Plan, folder: Path) -> list[tuple[Path, tuple[int, int]]]:
    return [(request_bench.make_photo(w, h, folder), (w, h)) for w, h in plan.photos]


def section_request(plan: Plan, sec: Section) -> None:
    size = plan.request_size
    sec.data["cases"] = []
    with tempfile.TemporaryDirectory(prefix="sapiens2-gpu-req-") as tmp:
        photos = _photos(plan, Path(tmp))
        out = Path(tmp) / "out"
        out.mkdir()
        for task in tasks_to_run(plan):
            task_size = size if size == "tiny" or size in TASKS[task].sizes else TASKS[task].sizes[-1]
            guarded(
                sec, f"{task} {task_size} request", request_figures, plan, sec, task, task_size, photos, out
            )
            cleanup(plan.device)


def request_figures(
    plan: Plan, sec: Section, task: str, size: str, photos: list[tuple[Path, tuple[int, int]]], out: Path
) -> None:
    cases = sec.data["cases"]
    judged = plan.cuda and not plan.quick
    with contextlib.redirect_stdout(sys.stderr):  # its progress lines; the table is ours
        done = request_bench.run_task(task, size, _request_args(plan, plan.people), photos, out)
    for case in done:
        model_ms = 1e3 * case.median("model")
        ratio = case.whole / case.median("model")
        cases.append(
            {
                "case": case.label(),
                "whole_ms": 1e3 * case.whole,
                "model_ms": model_ms,
                "whole_over_model": ratio,
                "stages_ms": {s: 1e3 * case.median(s) for s in request_bench.STAGES},
                "peak_mib": case.peak_mb,
            }
        )
        sec.add(
            f"{case.label()}: whole / model",
            round(ratio, 2),
            "x",
            f"<= {TARGET_REQUEST_OVER_MODEL}",
            ratio <= TARGET_REQUEST_OVER_MODEL if judged else None,
            f"whole {1e3 * case.whole:.1f} ms, model {model_ms:.1f} ms",
        )
        if task == "pose" and case.people > 1:
            one_label = case.label().replace(f" {case.people}p ", " 1p ")
            one = next((c for c in cases if c["case"] == one_label), None)
            if one is None:
                continue
            ratio_people = 1e3 * case.whole / one["whole_ms"]
            sec.add(
                f"{case.label()}: {case.people} people / 1",
                round(ratio_people, 2),
                "x",
                f"<= {TARGET_FIVE_OVER_ONE}",
                ratio_people <= TARGET_FIVE_OVER_ONE if judged else None,
            )


def section_memory(plan: Plan, sec: Section) -> None:
    """Peak GPU memory of one 1080p request (pose: one person) per task and size."""
    args = _request_args(plan, [1])
    sec.data["rows"] = []
    with tempfile.TemporaryDirectory(prefix="sapiens2-gpu-mem-") as tmp:
        photo, wh = _photos(plan, Path(tmp))[0]
        out = Path(tmp) / "out"
        out.mkdir()
        for size in plan.sizes:
            for task in tasks_to_run(plan):
                if size != "tiny" and size not in TASKS[task].sizes:
                    continue
                cleanup(plan.device)
                guarded(
                    sec, f"{task} {size} memory", memory_figure, plan, sec, task, size, args, photo, wh, out
                )
    cleanup(plan.device)


def memory_figure(
    plan: Plan, sec: Section, task: str, size: str, args: Any, photo: Path, wh: tuple[int, int], out: Path
) -> None:
    pipe, seg = _build_pipe(task, size, args)
    if plan.cuda:  # after the build: random models are made in fp32, then cast; drop that cache
        torch.cuda.synchronize(plan.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(plan.device)
    models = [pipe.model] + ([seg.model] if seg else [])
    weights = sum(t.numel() * t.element_size() for m in models for t in m.state_dict().values()) / 2**30
    request_bench.one_request(pipe, request_bench.Case(task, size, photo, wh, 1), out)  # cold, as ZeroGPU
    peak = reserved = None
    if plan.cuda:
        peak = torch.cuda.max_memory_allocated(plan.device) / 2**30
        reserved = torch.cuda.max_memory_reserved(plan.device) / 2**30
    sec.data["rows"].append(
        {"task": task, "size": size, "weights_gib": weights, "peak_gib": peak, "reserved_gib": reserved}
    )
    big = size == "5b"
    sec.add(
        f"{task} {size}: peak (weights {weights:.3g} GiB)",
        None if peak is None else round(peak, 2),
        "GiB",
        f"reserved <= {TARGET_5B_PEAK_GIB:.0f}" if big else "",
        reserved <= TARGET_5B_PEAK_GIB if big and reserved is not None else None,
        NO_CUDA if not plan.cuda else f"allocator reserved {reserved:.2f} GiB (+ the CUDA context)",
    )


# ----------------------------------------------------------------------------- zerogpu

_INIT_PROBE = """
import sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
dev = torch.device(sys.argv[1])
x = torch.ones(256, 256, device=dev)
(x @ x).sum().item()  # context, allocator and the BLAS handle
if dev.type == "cuda":
    torch.cuda.synchronize()
print(t1 - t0, time.perf_counter() - t1)
"""


def init_seconds(device: torch.device, tries: int) -> tuple[float, float]:
    """(import torch s, device start s): medians over ``tries`` fresh processes."""
    runs = []
    for _ in range(tries):
        out = subprocess.run(
            [sys.executable, "-c", _INIT_PROBE, str(device)], capture_output=True, text=True, timeout=300
        )
        if out.returncode:
            raise RuntimeError(f"start-up probe failed: {out.stderr[-500:]}")
        runs.append(tuple(float(v) for v in out.stdout.split()))
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def copy_gbps(device: torch.device, mib: int, runs: int = 5) -> float:
    """Pinned host -> ``device`` copy rate, GB/s (1e9 bytes), median of ``runs``."""
    host = torch.empty(mib * 2**20, dtype=torch.uint8).pin_memory()
    dst = torch.empty_like(host, device=device)
    times = []
    for _ in range(runs + 1):
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        dst.copy_(host, non_blocking=True)
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return host.numel() / statistics.median(times[1:]) / 1e9


def sustained_matmul_tflops(device: torch.device, dtype: torch.dtype, n: int, seconds: float) -> float:
    """TFLOP/s of back-to-back n x n products for about ``seconds`` (clocks settle under load)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    sync(device)
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            a @ b
        sync(device)
        count += 10
    return count * 2 * n**3 / (time.perf_counter() - t0) / 1e12


def sustained_model_tflops(plan: Plan) -> tuple[float, str]:
    """TFLOP/s of back-to-back forwards of the 1b backbone (tiny in quick mode) at 1024x768."""
    size = "tiny" if plan.quick else "1b"
    model = random_model("features", size, plan.device)
    model = loaded_copy(model, plan.dtype) if plan.dtype != torch.float32 else model
    x = torch.randn(1, 3, *plan.hw, device=plan.device, dtype=plan.dtype)
    # In the spec's FLOP figures (zoo.ARCHS): the units SUSTAINED_TFLOPS is used in
    # (models.cost.forward_seconds). They are about half the FLOPs counted at 2 per multiply-add.
    flops = published_flops(model, plan.hw, 1) or count_flops(lambda: model(x), model)
    runs = max(3, int(plan.sustain_s / max(1e-3, median_ms(lambda: model(x), plan.device, 1) / 1e3)))
    ms = median_ms(lambda: model(x), plan.device, runs)
    return flops / (ms / 1e3) / 1e12, f"{size} features forward {plan.hw[0]}x{plan.hw[1]}, {runs} runs"


def section_zerogpu(plan: Plan, sec: Section) -> None:
    init_c = getattr(cost, "CUDA_INIT_S", None)
    move_c = getattr(cost, "MOVE_BYTES_PER_S", None)
    tflops_c = getattr(cost, "SUSTAINED_TFLOPS", None)
    sec.data["constants"] = {"CUDA_INIT_S": init_c, "MOVE_BYTES_PER_S": move_c, "SUSTAINED_TFLOPS": tflops_c}
    note = lambda c: "" if c is not None else "constant not declared in sapiens2.models.cost"  # noqa: E731

    import_s, start_s = init_seconds(plan.device, 1 if plan.quick else 3)
    sec.data["import_torch_s"] = import_s
    if plan.cuda:
        sec.add(
            "CUDA start-up (fresh process)",
            round(start_s, 2),
            "s",
            f"<= CUDA_INIT_S = {init_c}",
            start_s <= init_c if init_c is not None else None,
            note(init_c) or f"import torch {import_s:.2f} s, not counted",
        )
        gbps = copy_gbps(plan.device, plan.copy_mib)
        move_gbps = move_c / 1e9 if move_c else None
        sec.add(
            "pinned -> device copy",
            round(gbps, 2),
            "GB/s",
            f">= MOVE_BYTES_PER_S = {move_gbps:g} GB/s" if move_gbps else "MOVE_BYTES_PER_S",
            gbps >= move_gbps if move_gbps else None,
            note(move_c) or f"{plan.copy_mib} MiB",
        )
    else:
        sec.data["cpu_probe_start_s"] = start_s  # the probe ran; the figure needs CUDA
        sec.add("CUDA start-up (fresh process)", None, "s", f"<= CUDA_INIT_S = {init_c}", None, NO_CUDA)
        move = f"{move_c / 1e9:g} GB/s" if move_c else None
        sec.add("pinned -> device copy", None, "GB/s", f">= MOVE_BYTES_PER_S = {move}", None, NO_CUDA)
    mm = sustained_matmul_tflops(plan.device, plan.dtype, plan.matmul_n, plan.sustain_s)
    model_tf, what = sustained_model_tflops(plan)
    dtype = str(plan.dtype).replace("torch.", "")
    sec.add(f"sustained {dtype} matmul {plan.matmul_n}^3", round(mm, 3), "TFLOP/s", "", None)
    sec.add(
        "sustained model TFLOP/s",
        round(model_tf, 3),
        "TFLOP/s",
        f">= SUSTAINED_TFLOPS = {tflops_c}",
        model_tf >= tflops_c if plan.cuda and tflops_c is not None and not plan.quick else None,
        what
        + ("" if plan.cuda else f"; {dtype} on CPU: not comparable")
        + ("; " + note(tflops_c) if note(tflops_c) else ""),
    )


# ----------------------------------------------------------------------------- compile


def section_compile(plan: Plan, sec: Section) -> None:
    """Eager vs ``torch.compile`` of the pose model (1b; tiny in quick mode), batch 2 (one person
    and its flipped copy), through ``compiling.compile_model``: its warm-up is the startup cost."""
    size = "tiny" if plan.quick else "1b"
    model = random_model("pose", size, plan.device)
    model = loaded_copy(model, plan.dtype) if plan.dtype != torch.float32 else model
    hw = plan.hw if plan.quick else (1024, 768)
    x = compiling.example_input(model, 2, hw)
    eager_ms = median_ms(lambda: model(x), plan.device, plan.runs)
    with torch.inference_mode():
        eager_out = model(x).heatmaps.float()
    why = compiling.torch_compile_support(plan.device)
    sec.data["support"] = why or "supported"
    if why:
        # Not measurable here; still run the helper (eager backend, forced) to keep its code alive.
        report = compiling.compile_model(model, [x], backend="eager", force=True)
        sec.data["forced_eager_backend"] = {"applied": report.applied, "seconds": report.seconds}
        sec.add("torch.compile warm-up", None, "s", "", None, f"{NO_CUDA} ({why})")
        sec.add("torch.compile gain", None, "x", "> 1", None, NO_CUDA)
        sec.add(f"eager pose {size} b2", round(eager_ms, 2), "ms", "", None)
        return
    report = compiling.compile_model(model, [x])
    sec.data["report"] = report.line()
    sec.add("torch.compile warm-up", round(report.seconds, 1), "s", "", None, report.line())
    if not report.applied:
        sec.status = f"error: {report.reason}"
        return
    compiled_ms = median_ms(lambda: model(x), plan.device, plan.runs)
    with torch.inference_mode():
        diff = (model(x).heatmaps.float() - eager_out).abs().max().item()
    gain = eager_ms / compiled_ms
    sec.add(
        "torch.compile gain",
        round(gain, 3),
        "x",
        "> 1",
        gain > 1 if not plan.quick else None,
        f"eager {eager_ms:.2f} ms, compiled {compiled_ms:.2f} ms, max |diff| {diff:.3g}",
    )


# ----------------------------------------------------------------------------- driver

RUNNERS: dict[str, Callable[[Plan, Section], None]] = {
    "correctness": section_correctness,
    "forward": section_forward,
    "request": section_request,
    "memory": section_memory,
    "zerogpu": section_zerogpu,
    "compile": section_compile,
}


def run_sections(plan: Plan, names: list[str]) -> list[Section]:
    """Each section in turn; one that raises is reported as an error and the rest still run."""
    done = []
    for name in names:
        sec = Section(name)
        t0 = time.perf_counter()
        print(f"## {name} ...", file=sys.stderr, flush=True)
        try:
            RUNNERS[name](plan, sec)
        except Exception as err:  # a bench run must report every section it can
            sec.status = f"error: {type(err).__name__}: {err}"
        if sec.status == "ok" and sec.data.get("errors"):
            sec.status = f"error: {len(sec.data['errors'])} part(s) failed: " + "; ".join(sec.data["errors"])
        if sec.status == "ok" and not plan.cuda and any(f.note.startswith(NO_CUDA) for f in sec.figures):
            sec.status = "ok (" + NO_CUDA + " for some figures)"
        sec.data["seconds"] = time.perf_counter() - t0
        cleanup(plan.device)
        done.append(sec)
    return done


def _cell(value: Any, unit: str) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        value = f"{value:.5g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return f"{value} {unit}".strip()


def markdown(sections: list[Section], meta: dict[str, Any]) -> str:
    lines = [
        f"device {meta['device_name']}, torch {meta['torch']}, {meta['dtype']}, "
        f"{'quick run (numbers meaningless, targets not judged)' if meta['quick'] else 'full run'}, bf16 peak {meta['peak_tflops'] or '—'} TFLOP/s",
        "",
        "| section | figure | value | target | met | note |",
        "|---|---|---:|---|:-:|---|",
    ]
    verdict = {True: "yes", False: "**NO**", None: ""}
    for sec in sections:
        if not sec.figures:
            lines.append(f"| {sec.name} | — | — | — | | {sec.status} |")
        for fig in sec.figures:
            note = fig.note.replace("|", "/")
            lines.append(
                f"| {sec.name} | {fig.name} | {_cell(fig.value, fig.unit)} | {fig.target} "
                f"| {verdict[fig.met]} | {note} |"
            )
        if sec.status.startswith("error"):
            lines.append(f"| {sec.name} | **section failed** | — | — | **NO** | {sec.status[:200]} |")
    return "\n".join(lines)


def metadata(plan: Plan) -> dict[str, Any]:
    return {
        "device": str(plan.device),
        "device_name": torch.cuda.get_device_name(plan.device)
        if plan.cuda
        else platform.processor() or "cpu",
        "dtype": str(plan.dtype).replace("torch.", ""),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "quick": plan.quick,
        "threads": torch.get_num_threads(),
        "load_average": os.getloadavg()[0],
        "peak_tflops": plan.peak_tflops,
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="tiny models, small photos, single runs (CI)")
    ap.add_argument("--json", type=Path, help="write every section and figure here")
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma list (default: all)")
    ap.add_argument("--sizes", default="0.4b,0.8b,1b,5b", help="forward and memory sizes")
    ap.add_argument("--request-size", default="1b", help="request section size")
    ap.add_argument(
        "--hw", nargs=2, type=int, default=(1024, 768), metavar=("H", "W"), help="forward input (not quick)"
    )
    ap.add_argument(
        "--real-sizes", default="0.4b,5b", help="real-shape bf16-vs-fp32 sizes (head dims 64, 76)"
    )
    ap.add_argument("--runs", type=int, default=10, help="timed forwards per figure after one warm-up")
    ap.add_argument("--request-runs", type=int, default=3, help="timed requests per case after one warm-up")
    ap.add_argument("--peak-tflops", type=float, help="the GPU's dense bf16 peak, when not in BF16_PEAKS")
    args = ap.parse_args(argv)
    unknown = set(args.sections.split(",")) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown section(s) {', '.join(sorted(unknown))}; choose from {', '.join(SECTIONS)}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda but torch sees no CUDA device; use --device cpu --quick")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.quick and args.device == "cpu":
        torch.set_num_threads(1)  # tiny models: extra threads only wait on each other (tests/conftest.py)
    threads.configure_cpu_threads()
    plan = make_plan(args)
    meta = metadata(plan)
    sections = run_sections(plan, args.sections.split(","))
    print(markdown(sections, meta))
    if args.json:
        doc = {"meta": meta, **{s.name: s.to_json() for s in sections}}
        args.json.write_text(json.dumps(doc, indent=1, default=str))
    failed = [s.name for s in sections if s.status.startswith("error")]
    missed = [f"{s.name}: {f.name}" for s in sections for f in s.figures if f.met is False]
    if failed or missed:
        print("\nfailed sections: " + (", ".join(failed) or "none"), file=sys.stderr)
        print("targets missed: " + ("; ".join(missed) or "none"), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
