"""Seg's ``finish`` stage: ``SegLogits.labels`` (network logits -> a class id per photo pixel), old vs new.

Times the resize of 29 x 1024 x 768 logits to a photo (12 MP by default) with the code of a
baseline commit (``--baseline``, loaded from git) and the working tree's, alternating in one run,
and prints medians. Cases:

* ``random``: i.i.d. normal logits, the tests' tiny random checkpoints: nearly every source cell
  has corners of different classes ("mixed");
* ``blobs``: smooth logits (a few large class regions): a few % of the cells are mixed, as for a
  real model on a person photo;
* ``partial``: random logits in the top ``--partial`` fraction of the rows, blobs below; with
  ``--crossover`` a sweep of that fraction times the working tree's dense and sparse paths, to
  place ``seg_logits._DENSE_FROM``.

Each row also checks that both codes give the same result (the colour PNG: the new palette PNG
decodes to the old RGB picture). ``--device cuda`` runs from_logits on the GPU, as served.

    python bench/seg_finish.py                               # random and blobs at 4000x3000, 5 runs
    python bench/seg_finish.py --cases random --runs 3 --threads 1
    python bench/seg_finish.py --crossover 0.02,0.05,0.1,0.2,0.4 --runs 3

Not a test: the numbers depend on the machine and its load (the load average is printed).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sapiens2.data.metadata import SEG_PALETTE  # noqa: E402
from sapiens2.outputs.export import write_png, write_png_palette  # noqa: E402
from sapiens2.tasks.seg import seg_logits as new  # noqa: E402
from sapiens2.tasks.seg.seg_render import colorize_labels, label_ids  # noqa: E402

NET_HW = (1024, 768)
CLASSES = 29


def load_baseline(rev: str) -> ModuleType:
    """sapiens2/tasks/seg/seg_pipeline.py as of git ``rev`` (or the .py file ``rev``, for a copy
    without git), imported as a sibling module of the package's."""
    if rev.endswith(".py") and Path(rev).is_file():
        text = Path(rev).read_text()
    else:
        git = ["git", "-C", str(ROOT), "show", f"{rev}:sapiens2/tasks/seg/seg_pipeline.py"]
        text = subprocess.run(git, capture_output=True, text=True, check=True).stdout
    name = "sapiens2.tasks.seg._seg_baseline"
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__file__ = str(
        ROOT / "sapiens2" / "tasks" / "seg" / "_seg_baseline.py"
    )  # relative imports resolve
    module.__package__ = "sapiens2.tasks.seg"
    sys.modules[name] = module  # dataclasses look the module up
    exec(compile(text, module.__file__, "exec"), module.__dict__)
    return module


def blobs(gen: torch.Generator, hw: tuple[int, int]) -> torch.Tensor:
    """Smooth logits: a coarse 8 x 6 random field upsampled, so classes form a few large regions."""
    coarse = torch.randn(1, CLASSES, 8, 6, generator=gen) * 4
    return F.interpolate(coarse, size=hw, mode="bilinear", align_corners=False)[0]


def make_logits(case: str, partial: float, seed: int = 0) -> torch.Tensor:
    """(29, 1024, 768) float32 logits of one case, on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    if case == "random":
        return torch.randn(CLASSES, *NET_HW, generator=gen)
    logits = blobs(gen, NET_HW)
    if case == "partial":
        rows = round(partial * NET_HW[0])
        logits[:, :rows] = torch.randn(CLASSES, rows, NET_HW[1], generator=gen)
    return logits


def timed(fn: Callable[[], object], into: list[float]) -> None:
    t0 = time.perf_counter()
    fn()
    into.append(time.perf_counter() - t0)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def compare(case: str, logits: torch.Tensor, out_hw: tuple[int, int], runs: int, old: ModuleType) -> None:
    """Old vs new: from_logits on the logits' device, labels on the CPU (as served: the compact
    form comes back from the GPU), and the colour PNG of the labels."""
    dev = logits.device
    compact_old = old.SegLogits.from_logits(logits).cpu()
    compact_new = new.SegLogits.from_logits(logits).cpu()
    mixed = float(new._mixed_cells(compact_new.low).float().mean())
    labels_old, labels_new = compact_old.labels(out_hw), compact_new.labels(out_hw)
    same = {"labels": torch.equal(labels_old, labels_new)}
    same["from_logits"] = (  # the new form keeps its logits channel-first
        torch.equal(compact_old.low, compact_new.low)
        and torch.equal(compact_old.index, compact_new.index)
        and torch.equal(compact_old.values, compact_new.values.t())
    )
    lab = labels_new.numpy()
    folder = Path(tempfile.mkdtemp())
    old_png = lambda: write_png(folder / "old.png", colorize_labels(lab))  # noqa: E731
    new_png = lambda: write_png_palette(folder / "new.png", label_ids(lab), SEG_PALETTE)  # noqa: E731
    new_png()
    with Image.open(folder / "new.png") as im:
        same["color png"] = np.array_equal(np.asarray(im.convert("RGB")), colorize_labels(lab))

    def from_logits(module: ModuleType) -> None:
        module.SegLogits.from_logits(logits)
        sync(dev)

    stages = ("labels", "from_logits", "color png")
    times: dict[str, list[float]] = {f"{k} {t}": [] for k in stages for t in ("old", "new")}
    for i in range(runs):  # alternate, and flip who goes first, so drifting load hits both alike
        pairs = [("old", old, compact_old, old_png), ("new", new, compact_new, new_png)]
        for tag, module, compact, png in pairs if i % 2 == 0 else pairs[::-1]:
            timed(lambda m=module: from_logits(m), times[f"from_logits {tag}"])
            timed(lambda c=compact: c.labels(out_hw), times[f"labels {tag}"])
            timed(png, times[f"color png {tag}"])
    med = {k: statistics.median(v) for k, v in times.items()}
    for what in stages:
        a, b = med[f"{what} old"], med[f"{what} new"]
        where = dev.type if what == "from_logits" else "cpu"
        ok = "yes" if same[what] else "**NO**"
        print(f"| {case} | {mixed:.3f} | {what} ({where}) | {a:.3f} | {b:.3f} | {a / b:.1f}x | {ok} |")


def crossover(fractions: list[float], out_hw: tuple[int, int], runs: int) -> None:
    print("\n| random rows | mixed cells | dense s | sparse s | same |\n|---|---|---|---|---|")
    for f in fractions:
        compact = new.SegLogits.from_logits(make_logits("partial", f))
        mixed = float(new._mixed_cells(compact.low).float().mean())
        times: dict[bool, list[float]] = {True: [], False: []}
        for i in range(runs):
            for dense in (True, False) if i % 2 == 0 else (False, True):
                timed(lambda d=dense, c=compact: c.labels(out_hw, dense=d), times[dense])
        same = torch.equal(compact.labels(out_hw, dense=True), compact.labels(out_hw, dense=False))
        d, s = statistics.median(times[True]), statistics.median(times[False])
        print(f"| {f:.2f} | {mixed:.3f} | {d:.3f} | {s:.3f} | {'yes' if same else '**NO**'} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--photo", default="4000x3000", help="output size WxH (default 4000x3000, 12 MP)")
    ap.add_argument("--cases", default="random,blobs", help="comma list of random, blobs, partial")
    ap.add_argument("--partial", type=float, default=0.3, help="random rows' fraction for the partial case")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument(
        "--device", default="cpu", help="where from_logits runs (cuda: as served); labels run on the CPU"
    )
    ap.add_argument(
        "--baseline", default="5396e9b", help="git revision of the old seg.py, or a copy of it (.py)"
    )
    ap.add_argument(
        "--crossover", default="", help="comma list of random-row fractions: dense vs sparse sweep"
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    width, height = (int(v) for v in args.photo.lower().split("x"))
    out_hw = (height, width)
    print(
        f"torch {torch.__version__}, {args.device}, float32, {torch.get_num_threads()} threads, "
        f"load average {os.getloadavg()[0]:.2f}, photo {width}x{height}, logits {CLASSES}x{NET_HW[0]}x{NET_HW[1]}, "
        f"medians of {args.runs} (old and new alternating), baseline {args.baseline}"
    )
    if args.cases:
        old = load_baseline(args.baseline)
        print(
            "\n| case | mixed cells | stage | old s | new s | speed-up | same result |\n|---|---|---|---|---|---|---|"
        )
        for case in args.cases.split(","):
            compare(case, make_logits(case, args.partial).to(args.device), out_hw, args.runs, old)
    if args.crossover:
        crossover([float(v) for v in args.crossover.split(",")], out_hw, args.runs)
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
