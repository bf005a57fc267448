"""ONNX Runtime against torch on the CPU: torch fp32, ORT fp32 and ORT int8, side by side.

Sections (``--sections``, default all):

- ``forward``: the features backbone of each ``--sizes`` at 1024x768, each ``--batches``; runs
  alternate between the three (drifting machine load hits all alike), each figure is the median
  of ``--runs`` after one warm-up; plus ORT fp32's and int8's error against torch on that input.
- ``request``: the whole CPU pose request (bench/request.py's stages: read a 1920x1080 JPEG,
  crop, model, decode, render, save) with one given person box (no detector), pose ``--pose-size``.
- ``int8``: int8's error on every ``--int8-tasks`` output at ``--int8-size`` (random weights).
- ``gemm``: the ceiling: one linear layer of the 0.1b backbone at 1024x768 (3081 tokens, 768 ->
  2304, the fused qkv) in torch fp32, ORT fp32 and ORT int8 (the same one-node graph through
  ``quantize_dynamic``), in GFLOP/s; not in the default sections.

Models have the published shapes and random weights (nothing is downloaded), so the errors say
how int8 moves these networks' numbers, not how it changes results on trained weights. Not a test:
the numbers depend on the machine and on what else runs on it; the load average is recorded.

    python bench/onnx_speed.py --json onnx.json                               # everything (long on 2 cores)
    python bench/onnx_speed.py --sections forward --sizes 0.1b --batches 1 --runs 3
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
# this file is bench/onnx_speed.py: with bench/ on the path, `import onnx` anywhere would find it
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))


def _bench_module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


req = _bench_module("request")  # shape_model, make_photo and one request's stages

from sapiens2.models.loading import load_model  # noqa: E402
from sapiens2.models.onnx_export import export_model, output_names, quantize_file  # noqa: E402
from sapiens2.models.onnx_runtime import OnnxModel  # noqa: E402
from sapiens2.tasks import pipeline_class  # noqa: E402

IMPLS = ("torch fp32", "ORT fp32", "ORT int8")
HW = (1024, 768)


def load() -> float:
    return round(os.getloadavg()[0], 2)


def errors(ref: Any, got: Any, task: str) -> dict[str, float]:
    """Per output: max |diff| / max |ref| and the cosine of the flattened tensors."""
    out = {}
    for name, field, _ in output_names(task):
        a = getattr(ref, field).double().flatten()
        b = getattr(got, field).double().flatten()
        out[f"{name} rel"] = float((a - b).abs().max() / a.abs().max().clamp_min(1e-30))
        out[f"{name} cos"] = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
    return out


def models(task: str, size: str, folder: Path) -> dict[str, Any]:
    """torch fp32 (random weights at the published shape), its ORT fp32 export and int8 copy."""
    if size == "tiny":  # the tests' tiny checkpoints
        sys.path.insert(0, str(ROOT / "tests"))
        from tiny_checkpoints import all_task_names, make_tiny_checkpoint

        seed = all_task_names().index(task)  # the same models as the tests' fixture
        model = load_model(task, checkpoint=make_tiny_checkpoint(task, folder / "tiny" / task, seed=seed))
    else:
        model = req.shape_model(task, size, torch.device("cpu"), torch.float32)
    t0 = time.perf_counter()
    fp32 = export_model(model, folder / f"{task}_{size}.onnx")
    t1 = time.perf_counter()
    int8 = quantize_file(fp32, folder / f"{task}_{size}_int8.onnx")
    t2 = time.perf_counter()
    print(
        f"# {task} {size}: export {t1 - t0:.0f} s ({_megabytes(fp32):.0f} MB), "
        f"int8 {t2 - t1:.0f} s ({_megabytes(int8):.0f} MB)",
        flush=True,
    )
    return {"torch fp32": model, "ORT fp32": OnnxModel(fp32, "cpu"), "ORT int8": OnnxModel(int8, "cpu")}


def _megabytes(path: Path) -> float:
    """An export's size: the file and its external data (``<name>.data``) when it has some."""
    data = path.with_name(path.name + ".data")
    return (path.stat().st_size + (data.stat().st_size if data.is_file() else 0)) / 1e6


def alternate(calls: dict[str, Callable[[], Any]], runs: int) -> dict[str, list[float]]:
    """One warm-up each, then ``runs`` rounds of every call in turn; seconds per call."""
    for call in calls.values():
        call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(runs):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    return times


def forward_rows(args: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    rows = []
    for size in args.sizes:
        impl = models("features", size, folder)
        for batch in args.batches:
            x = torch.randn(batch, 3, *HW, generator=torch.Generator().manual_seed(0))
            with torch.inference_mode():
                ref = impl["torch fp32"](x)
                errs = {k: errors(ref, impl[k](x), "features") for k in IMPLS[1:]}
            l0 = load()
            times = alternate({k: (lambda m=m, x=x: _forward(m, x)) for k, m in impl.items()}, args.runs)
            for name in IMPLS:
                row = _row("forward", f"features {size}", batch, name, times, l0, errs.get(name))
                rows.append(row)
                print(_line(row), flush=True)
        del impl
        gc.collect()
    return rows


def _forward(model: Any, x: torch.Tensor) -> Any:
    with torch.inference_mode():
        return model(x)


def _row(
    section: str, what: str, batch: int, impl: str, times: dict[str, list[float]], l0: float, errs: Any
) -> dict[str, Any]:
    med = statistics.median(times[impl])
    base = statistics.median(times["torch fp32"])
    return {
        "section": section,
        "what": what,
        "batch": batch,
        "impl": impl,
        "median_s": round(med, 3),
        "runs_s": [round(t, 3) for t in times[impl]],
        "speedup_vs_torch": round(base / med, 2),
        "load_before": l0,
        "load_after": load(),
        "errors": errs,
    }


def _line(row: dict[str, Any]) -> str:
    err = ""
    if row["errors"]:
        err = "  " + ", ".join(f"{k} {v:.3g}" for k, v in row["errors"].items())
    return (
        f"  {row['what']:16s} b{row['batch']}  {row['impl']:10s} {row['median_s']:8.3f} s  "
        f"x{row['speedup_vs_torch']:.2f}  load {row['load_before']}-{row['load_after']}{err}"
    )


def request_rows(args: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    impl = models("pose", args.pose_size, folder)
    pipes = {k: pipeline_class("pose")(args.pose_size, model=m, detector=None) for k, m in impl.items()}
    photo = req.make_photo(1920, 1080, folder)
    case = req.Case("pose", args.pose_size, photo, (1920, 1080), people=1)
    out = folder / "out"
    out.mkdir(exist_ok=True)
    stages: dict[str, list[dict[str, float]]] = {k: [] for k in pipes}

    def call(name: str) -> Callable[[], None]:
        return lambda: stages[name].append(req.one_request(pipes[name], case, out))

    results = {k: pipes[k](req.read_photo(str(photo)), **req.infer_kwargs(case)) for k in pipes}
    ref = results["torch fp32"].keypoints
    # the networks' own difference: with random weights the heatmaps are nearly flat, so a tiny
    # difference can move an argmax across the crop; the heatmaps say whether the export is right
    x = torch.randn(1, 3, *impl["ORT fp32"].input_hw, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        heat_ref = impl["torch fp32"](x)
        heat_errs = {k: errors(heat_ref, impl[k](x), "pose") for k in IMPLS[1:]}
    l0 = load()
    times = alternate({k: call(k) for k in pipes}, args.runs)
    rows = []
    for name in IMPLS:
        runs = stages[name][1:]  # the first is alternate()'s warm-up
        kp = results[name].keypoints
        errs = {
            "keypoints max px": float(np.abs(kp - ref).max()),
            "model s": statistics.median(r["model"] for r in runs),
            **heat_errs.get(name, {}),
        }
        row = _row("request", f"pose {args.pose_size} 1p 1080p", 1, name, times, l0, errs)
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def int8_rows(args: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    rows = []
    x = torch.randn(1, 3, *HW, generator=torch.Generator().manual_seed(1))
    for task in args.int8_tasks:
        size = args.int8_size
        if task == "features" and size not in ("tiny", "0.4b"):
            size = "0.1b"
        if task == "matting" and size != "tiny":
            size = "1b"  # its only published size
        impl = models(task, size, folder)
        with torch.inference_mode():
            ref = impl["torch fp32"](x)
            for name in IMPLS[1:]:
                row = {
                    "section": "int8",
                    "what": f"{task} {size}",
                    "impl": name,
                    "errors": errors(ref, impl[name](x), task),
                }
                rows.append(row)
                print(
                    f"  {row['what']:16s} {name:10s} "
                    + ", ".join(f"{k} {v:.3g}" for k, v in row["errors"].items()),
                    flush=True,
                )
        del impl
        gc.collect()
    return rows


def gemm_rows(args: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper, save_model

    from sapiens2.models.onnx_export import _quantize  # the package's own int8 settings

    tokens, d_in, d_out = 64 * 48 + 9, 768, 3 * 768
    rng = np.random.default_rng(0)
    w = rng.standard_normal((d_in, d_out)).astype(np.float32) / d_in**0.5
    x = rng.standard_normal((tokens, d_in)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [tokens, d_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [tokens, d_out])],
        [numpy_helper.from_array(w, "w")],
    )
    fp32 = folder / "linear.onnx"
    save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(fp32))
    int8 = _quantize(fp32, folder / "linear_int8.onnx")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    sessions = {
        "ORT fp32": ort.InferenceSession(str(fp32), opts),
        "ORT int8": ort.InferenceSession(str(int8), opts),
    }
    xt, wt = torch.from_numpy(x), torch.from_numpy(w)

    def torch_mm() -> None:
        with torch.inference_mode():
            torch.mm(xt, wt)

    calls = {"torch fp32": torch_mm} | {k: (lambda s=s: s.run(None, {"x": x})) for k, s in sessions.items()}
    l0 = load()
    times = alternate(calls, max(args.runs, 15))
    flop = 2 * tokens * d_in * d_out
    rows = []
    for name in IMPLS:
        row = _row("gemm", "linear 768->2304", 1, name, times, l0, None)
        row["gflops"] = round(flop / statistics.median(times[name]) / 1e9, 1)
        rows.append(row)
        print(_line(row) + f"  {row['gflops']} GFLOP/s", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default="forward,request,int8")
    ap.add_argument("--sizes", default="0.1b,0.4b", help="features sizes for the forward section")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch and ONNX Runtime intra-op threads")
    ap.add_argument("--pose-size", default="0.4b")
    # albedo's head has no published shape (its weights are not on the Hub): tiny only
    ap.add_argument("--int8-tasks", default="features,pose,seg,normal,pointmap,matting")
    ap.add_argument(
        "--int8-size", default="0.4b", help="a zoo size (features: 0.1b unless 0.4b; matting: 1b), or tiny"
    )
    ap.add_argument("--json", type=Path, help="write every row and the conditions here")
    args = ap.parse_args()
    args.sizes = args.sizes.split(",")
    args.batches = [int(b) for b in args.batches.split(",")]
    args.int8_tasks = args.int8_tasks.split(",")
    torch.set_num_threads(args.threads)
    import onnxruntime

    meta = {
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "threads": args.threads,
        "cpus": os.cpu_count(),
        "load_start": os.getloadavg(),
        "runs": args.runs,
        "input": f"{HW[0]}x{HW[1]}",
    }
    print(
        f"# torch {meta['torch']}, onnxruntime {meta['onnxruntime']}, {args.threads} threads, load {meta['load_start']}"
    )
    rows: list[dict[str, Any]] = []
    sections = {"forward": forward_rows, "request": request_rows, "int8": int8_rows, "gemm": gemm_rows}
    with tempfile.TemporaryDirectory(prefix="sapiens2-onnx-bench-") as tmp:
        for name in args.sections.split(","):
            rows += sections[name](args, Path(tmp))
            if args.json:  # what is done so far survives a later section's failure
                meta["load_end"] = os.getloadavg()
                args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
