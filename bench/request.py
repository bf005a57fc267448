"""Whole-request benchmark: one photo through a task, split into the stages a Space request runs.

Stages: ``read`` (file -> upright RGB, ``serving.request_runner.read_photo``), ``preprocess`` (resize / crop /
normalise up to the first forward), ``model`` (synchronised forwards), ``postprocess`` (decode,
resize back, CPU arrays), ``render`` (the picture the app shows) and ``export`` (``result.save``:
the files offered for download). Pre/post come from ``RunInfo.forward_started`` / ``model_s``, so
the pipelines run unmodified. Each figure is the median over ``--runs`` after one warm-up request.

Models have the published shape of each size (head widths as in the spec) and random weights
(no download), built once per task; ``--weights zoo`` loads the real checkpoints instead
(``$SAPIENS2_CHECKPOINTS`` or the Hub cache). Photos are an assets/ photo upscaled and cropped to
each size, written as JPEG into a temporary folder.

    python bench/request.py --tasks pose,seg --sizes 0.4b --photos 1920x1080 --runs 2   # CPU
    python bench/request.py --device cuda --dtype bf16 --sizes 0.4b,0.8b,1b,5b --people 1,5
    python bench/request.py --device cuda --sizes 1b --tasks pose --compile torch

Pose gets person boxes (evenly spread, ``--people``) so no detector runs (bench/detector.py
times the detector). Pointmap runs the seg model too (the app's default foreground). Not a test:
numbers depend on the machine and on what else runs on it (the load average is printed).
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sapiens2.models import compile as compiling  # noqa: E402
from sapiens2.models.loading import load_model  # noqa: E402
from sapiens2.models.zoo import ARCHS, TASKS  # noqa: E402
from sapiens2.runtime import cpus  # noqa: E402
from sapiens2.runtime import threads as cpu_threads  # noqa: E402
from sapiens2.serving.request_runner import read_photo  # noqa: E402
from sapiens2.tasks import pipeline_class  # noqa: E402

STAGES = ("read", "preprocess", "model", "postprocess", "render", "export")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PHOTO = ROOT / "assets" / "nasa-aldrin-moon-fullbody-standing.jpg"
ALL_TASKS = ("pose", "seg", "normal", "pointmap", "matting", "features")


# ----------------------------------------------------------------------------- inputs


def make_photo(width: int, height: int, folder: Path, source: Path = PHOTO) -> Path:
    """``source`` scaled to cover width x height (bicubic), centre-cropped, saved as JPEG q92."""
    im = Image.open(source).convert("RGB")
    s = max(width / im.width, height / im.height)
    im = im.resize((max(width, round(im.width * s)), max(height, round(im.height * s))), Image.BICUBIC)
    left, top = (im.width - width) // 2, (im.height - height) // 2
    path = folder / f"photo_{width}x{height}.jpg"
    im.crop((left, top, left + width, top + height)).save(path, quality=92)
    return path


def person_boxes(n: int, width: int, height: int) -> np.ndarray:
    """``n`` side-by-side standing-person boxes (x1, y1, x2, y2) across the photo."""
    col = width / n
    return np.array(
        [[i * col + 0.15 * col, 0.1 * height, (i + 1) * col - 0.15 * col, 0.95 * height] for i in range(n)],
        dtype=np.float32,
    )


def shape_model(task: str, size: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The published shape of ``task``/``size`` with random weights (PyTorch's default init)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_checkpoints import zoo_shapes  # the spec's widths per task and size (test helper)

    from sapiens2.models.nn.model import build_from_shapes

    try:
        shapes = zoo_shapes(task, size)
    except ValueError as e:  # albedo: no published head shape (its weights are not on the Hub)
        raise SystemExit(f"{task} {size}: no published shape to build ({e}); use its tiny checkpoint") from e
    model, _ = build_from_shapes(shapes, device=device)
    return model.to(dtype).eval()


_TINY_DIR: list[Path] = []


def tiny_model(task: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The test suite's tiny random checkpoint of ``task`` (written once per process into a
    temporary folder), loaded the way the app loads a checkpoint: for smoke runs of the scripts."""
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_checkpoints import TINY_TASKS, make_tiny_checkpoint

    if task not in TINY_TASKS:
        raise SystemExit(f"no tiny checkpoint is defined for {task!r} (tests/tiny_checkpoints.py)")
    if not _TINY_DIR:
        _TINY_DIR.append(Path(tempfile.mkdtemp(prefix="sapiens2-tiny-")))
        atexit.register(shutil.rmtree, _TINY_DIR[0], True)  # ignore_errors: gone with the process
    folder = _TINY_DIR[0] / task
    if not (folder / "config.json").exists():
        make_tiny_checkpoint(task, folder, seed=list(TINY_TASKS).index(task))
    return load_model(task, checkpoint=folder, device=device, dtype=dtype)


# ----------------------------------------------------------------------------- one request


@dataclass
class Case:
    task: str
    size: str
    photo: Path
    wh: tuple[int, int]
    people: int = 0  # pose only
    runs: list[dict[str, float]] = field(default_factory=list)
    peak_mb: float | None = None

    def median(self, stage: str) -> float:
        return statistics.median(r[stage] for r in self.runs)

    @property
    def whole(self) -> float:
        return statistics.median(sum(r[s] for s in STAGES) for r in self.runs)

    @property
    def non_model_share(self) -> float:
        return statistics.median(1 - r["model"] / sum(r[s] for s in STAGES) for r in self.runs)

    def label(self) -> str:
        who = f" {self.people}p" if self.task == "pose" else ""
        return f"{self.task}{who} {self.size} {self.wh[0]}x{self.wh[1]}"


def infer_kwargs(case: Case) -> dict[str, Any]:
    if case.task == "pose":
        return {"boxes": person_boxes(case.people, *case.wh)}
    if case.task == "pointmap":
        return {"use_segmentation": True}
    return {}


def render_and_export(result: Any, task: str, out_dir: Path) -> tuple[float, float]:
    """What serving.present does, split into the shown picture and the files (app defaults)."""
    t0 = time.perf_counter()
    if task == "pose":
        result.render(threshold=0.3, show_boxes=True)
    elif task == "seg":
        result.render(opacity=0.5)
        result.legend()
    elif task == "matting":
        result.render(background=(0, 177, 64))
    else:
        result.render()
    t1 = time.perf_counter()
    result.save(out_dir)
    if task == "pose":
        json.dumps(result.to_dict())  # the JSON panel
    return t1 - t0, time.perf_counter() - t1


def one_request(pipe: Any, case: Case, out_dir: Path) -> dict[str, float]:
    dev = pipe.device
    t0 = time.perf_counter()
    intake = read_photo(str(case.photo))
    t1 = time.perf_counter()
    result = pipe(intake, **infer_kwargs(case))
    t2 = time.perf_counter()
    info = result.info
    pre = (info.forward_started or t1) - t1
    render_s, export_s = render_and_export(result, case.task, out_dir)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return {
        "read": t1 - t0,
        "preprocess": pre,
        "model": info.model_s,
        "postprocess": (t2 - t1) - pre - info.model_s,
        "render": render_s,
        "export": export_s,
    }


# ----------------------------------------------------------------------------- driver


def build(task: str, size: str, args: argparse.Namespace, seg_model: Any) -> Any:
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    if args.weights == "zoo":
        model = load_model(task, size, device=device, dtype=dtype)
    elif args.weights == "tiny":
        model = tiny_model(task, device, dtype)
    else:
        model = shape_model(task, size, device, dtype)
    kwargs: dict[str, Any] = {"model": model}
    if task == "pose":
        kwargs["detector"] = None  # boxes are given
    if task in ("normal", "pointmap"):
        kwargs["seg"] = seg_model
    pipe = pipeline_class(task)(size, **kwargs)
    if args.input_hw and task != "pointmap":  # the pointmap scale branch needs 1024x768
        pipe.input_hw = tuple(args.input_hw)
    return pipe


def sdpa_probe(size: str, device: torch.device, dtype: torch.dtype) -> str:
    """Which fused SDPA kernels accept this size's attention shapes (full and grouped-query layers)
    at 1024x768: the math fallback is several times slower and holds the whole score matrix."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    arch = ARCHS[size]
    n = 1 + 8 + (1024 // 16) * (768 // 16)
    q = torch.randn(1, arch.heads, n, arch.head_dim, device=device, dtype=dtype)
    found = []
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        ok = []
        for kv in (arch.heads, arch.heads // 2):
            k = q[:, :kv]
            try:
                with sdpa_kernel([backend]), torch.inference_mode():
                    torch.nn.functional.scaled_dot_product_attention(q, k, k, enable_gqa=kv != arch.heads)
                ok.append("full" if kv == arch.heads else "gqa")
            except RuntimeError:
                pass
        found.append(f"{backend.name.lower()}: {'+'.join(ok) or 'no'}")
    return f"head_dim {arch.head_dim}: " + ", ".join(found)


def run_task(
    task: str, size: str, args: argparse.Namespace, photos: list[tuple[Path, tuple[int, int]]], out: Path
) -> list[Case]:
    device = torch.device(args.device)
    seg_pipe = None
    if task == "pointmap":  # its foreground comes from the seg model of the same size
        seg_pipe = build("seg", size, args, None)
    t0 = time.perf_counter()
    pipe = build(task, size, args, seg_pipe)
    build_s = time.perf_counter() - t0
    weights_mb = None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        weights_mb = torch.cuda.memory_allocated(device) / 2**20
    print(
        f"# {task} {size}: model ready in {build_s:.1f} s"
        + (f", weights {weights_mb:.0f} MiB" if weights_mb else "")
    )
    if args.compile != "off":
        hw = tuple(args.input_hw) if args.input_hw and task != "pointmap" else None
        ex = [
            compiling.example_input(pipe.model, b, hw or pipe.spec.input_size(size))
            for b in _batches(task, args)
        ]
        report = compiling.compile_model(pipe.model, ex)
        print(f"# {task} {size}: {report.line()}")
    cases = []
    for photo, wh in photos:
        for people in args.people if task == "pose" else [0]:
            case = Case(task, size, photo, wh, people)
            one_request(pipe, case, out)  # warm-up: allocator, kernels, caches
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            for _ in range(args.runs):
                case.runs.append(one_request(pipe, case, out))
            if device.type == "cuda":
                case.peak_mb = torch.cuda.max_memory_allocated(device) / 2**20
            print(f"  {format_row(case)}", flush=True)
            cases.append(case)
    del pipe, seg_pipe
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return cases


def _batches(task: str, args: argparse.Namespace) -> list[int]:
    return sorted(set(args.people)) if task == "pose" else [1]


def format_row(case: Case) -> str:
    cells = " ".join(f"{case.median(s) * 1e3:10.1f}" for s in STAGES)
    peak = f" {case.peak_mb:9.0f}" if case.peak_mb is not None else ""
    return f"{case.label():28s} {cells} {case.whole * 1e3:10.1f} {100 * case.non_model_share:7.1f}%{peak}"


def print_table(cases: list[Case], cuda: bool) -> None:
    head = " ".join(f"{s:>10s}" for s in STAGES)
    peak = f" {'peak MiB':>9s}" if cuda else ""
    print(f"\n{'case (ms, median)':28s} {head} {'whole':>10s} {'non-model':>8s}{peak}")
    for case in cases:
        print(format_row(case))
    print("\nratios")
    for case in cases:
        post = case.median("preprocess") + case.median("postprocess")
        out = case.median("render") + case.median("export")
        print(
            f"  {case.label():28s} non-model/whole {case.non_model_share:6.1%}"
            f"  (pre+post {post * 1e3:.0f} ms, render+export {out * 1e3:.0f} ms, read {case.median('read') * 1e3:.0f} ms)"
            f"  whole/model {case.whole / case.median('model'):.2f}x"
        )
    by_key = {(c.task, c.size, c.wh, c.people): c for c in cases}
    for (task, size, wh, people), case in by_key.items():
        one = by_key.get((task, size, wh, 1))
        if task == "pose" and people > 1 and one is not None:
            print(
                f"  pose {size} {wh[0]}x{wh[1]}: {people} people / 1 person = {case.whole / one.whole:.2f}x (whole request)"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default=",".join(ALL_TASKS), help="comma list (default: all)")
    ap.add_argument("--sizes", default="0.4b", help="comma list; tasks without a size are skipped")
    ap.add_argument("--photos", default="1920x1080,4000x3000", help="comma list of WxH")
    ap.add_argument("--people", default="1", help="pose: comma list of person counts, e.g. 1,5")
    ap.add_argument("--runs", type=int, default=3, help="timed requests per case after one warm-up")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, choices=list(DTYPES), help="default: bf16 on CUDA, else fp32")
    ap.add_argument(
        "--weights",
        default="random",
        choices=["random", "zoo", "tiny"],
        help="random: published shapes; zoo: real checkpoints; tiny: the tests' tiny models (smoke runs)",
    )
    ap.add_argument("--compile", default="off", choices=["off", "torch"], help="torch.compile (CUDA only)")
    ap.add_argument(
        "--input-hw", nargs=2, type=int, metavar=("H", "W"), help="smaller network input (smoke runs)"
    )
    ap.add_argument("--json", type=Path, help="also write the raw timings here")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: the package's default)")
    args = ap.parse_args()
    args.dtype = args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")
    args.people = [int(p) for p in args.people.split(",")]
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = cpu_threads.configure_cpu_threads()
    load0 = os.getloadavg()
    print(
        f"device {args.device} ({torch.cuda.get_device_name(args.device) if args.device.startswith('cuda') else 'cpu'}), "
        f"{args.dtype}, torch {torch.__version__}, threads {threads}, cpus {cpus.available_cpus()}, "
        f"weights {args.weights}, runs {args.runs} after 1 warm-up, load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}"
    )
    if args.device.startswith("cuda"):
        for size in args.sizes.split(","):
            print(
                f"# SDPA kernels for {size}: {sdpa_probe(size, torch.device(args.device), DTYPES[args.dtype])}"
            )
    cases: list[Case] = []
    with tempfile.TemporaryDirectory(prefix="sapiens2-bench-") as tmp:
        tmp_path = Path(tmp)
        photos = []
        for spec in args.photos.split(","):
            w, h = (int(v) for v in spec.lower().split("x"))
            photos.append((make_photo(w, h, tmp_path), (w, h)))
        out = tmp_path / "out"
        out.mkdir()
        for size in args.sizes.split(","):
            for task in args.tasks.split(","):
                if size not in TASKS[task].sizes and args.weights != "tiny":
                    if args.weights == "zoo" or size not in ARCHS:
                        print(
                            f"# {task}: no {size} checkpoint (sizes {', '.join(TASKS[task].sizes)}); skipped"
                        )
                        continue
                    print(f"# {task}: {size} is not published for this task; timing its shape anyway")
                cases += run_task(task, size, args, photos, out)
    print_table(cases, args.device.startswith("cuda"))
    load1 = os.getloadavg()
    print(f"load average at the end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {"case": c.label(), "runs": c.runs, "peak_mib": c.peak_mb, "whole_s": c.whole}
                    for c in cases
                ],
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
