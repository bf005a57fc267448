"""``sapiens2 batch``: the local engine against the Ray engine on the same photos with tiny models.

For each repetition, both engines run the same job over the same ``--photos`` JPEGs (crops of the
assets/ photos, ``--photo-side`` px on the long side) into fresh OUT folders, in this process,
as ``sapiens2.batch.run`` runs them (the Ray engine starts and stops its own local Ray each time:
its start-up is part of what is measured). Per run:

* ``wall``: the whole run, listing to the last commit;
* ``photos/s``: throughput once started, from the commit times of the parts (``--rows-per-part``
  photos each): photos between the first and the last commit over the time between them;
* ``start-up``: the time before the run produced at that rate (first commit minus the time its
  photos take at that rate): model loads, and for Ray its start, workers and actors;
* bytes per photo passed between the steps (Ray: the pickled items, as they travel).

Then, apart from the runs, the bytes of one photo's prep and raw per task next to the working copy
and the network input (pose's prep is the person crop when the box is known in prepare). Tiny checkpoints
(``tests/tiny_checkpoints.py``) at ``--network-size``; pose uses the whole photo as its box.

    python bench/batch.py                                   # pose, 200 photos, 3 repetitions (~10 min here)
    python bench/batch.py --tasks pose seg --photos 100 --repeats 1

Not a test: numbers depend on the machine and on what else runs on it (the load average is
printed before and after each run).
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import cv2  # noqa: E402
import torch  # noqa: E402

from sapiens2 import batch  # noqa: E402
from sapiens2.batch.job import BatchJob, task_plan  # noqa: E402
from sapiens2.batch.stages import TaskStages  # noqa: E402
from sapiens2.inputs.intake import load_image  # noqa: E402
from sapiens2.runtime.cpus import available_cpus  # noqa: E402

ASSETS = sorted(p for p in (ROOT / "assets").iterdir() if p.suffix in (".jpg", ".png"))


def make_photos(folder: Path, n: int, side: int) -> list[Path]:
    """``n`` JPEGs: crops of the assets/ photos at different places and scales, long side ``side``."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    sources = [cv2.imread(str(p)) for p in ASSETS]
    out = []
    for i in range(n):
        img = sources[i % len(sources)]
        h, w = img.shape[:2]
        ch, cw = int(h * rng.uniform(0.6, 1.0)), int(w * rng.uniform(0.6, 1.0))
        y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        crop = img[y : y + ch, x : x + cw]
        scale = side / max(crop.shape[:2])
        crop = cv2.resize(
            crop, (round(crop.shape[1] * scale), round(crop.shape[0] * scale)), interpolation=cv2.INTER_AREA
        )
        path = folder / f"photo{i:04d}.jpg"
        cv2.imwrite(str(path), crop, [cv2.IMWRITE_JPEG_QUALITY, 90])
        out.append(path)
    return out


def steady(commits: list[tuple[float, int]]) -> tuple[float, float]:
    """(photos/s between the first and the last commit, start-up seconds before that rate)."""
    if len(commits) < 2:
        return float("nan"), float("nan")
    (t0, n0), (t1, n1) = commits[0], commits[-1]
    if t1 <= t0 or n1 <= n0:  # a tiny run: every part committed at once, no rate to see
        return float("nan"), float("nan")
    rate = (n1 - n0) / (t1 - t0)
    return rate, t0 - n0 / rate


def load() -> str:
    try:
        return "/".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover - not on Linux
        return "?"


def one_run(engine: str, job: BatchJob, photos_dir: Path, ray_opts: Any) -> dict[str, Any]:
    shutil.rmtree(job.out, ignore_errors=True)
    before = load()
    summary = batch.run(job, str(photos_dir), engine=engine, engine_options=ray_opts, progress=False)
    rate, start = steady(summary.commits)
    errors = sum(summary.errors.values())
    return {"engine": engine, "wall": summary.seconds, "rate": rate, "start": start, "photos": summary.photos,
            "errors": errors, "between": summary.bytes_between, "load": f"{before} -> {load()}"}  # fmt: skip


def stage_bytes(job: BatchJob, photo: Path) -> list[str]:
    """Per task, one photo: the pickled prep (prepare -> forward) and raw (forward -> finish), the
    photo's working copy and the network input, in bytes."""
    intake = load_image(photo)
    lines = []
    for plan in job.plans:
        stage = TaskStages(plan)
        prep = stage.prepare(intake)
        stage.load("cpu", job.dtype)
        raw = stage.forward([prep])[0]
        hw = stage.cpu_pipeline().network_hw
        sizes = (len(pickle.dumps(prep, protocol=5)), len(pickle.dumps(raw, protocol=5)), intake.work.nbytes)
        lines.append(f"| {plan.task.name} | {' | '.join(f'{n:,}' for n in sizes)} | {hw[0] * hw[1] * 3:,} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", nargs="+", default=["pose"])
    ap.add_argument("--photos", type=int, default=200)
    ap.add_argument("--photo-side", type=int, default=640)
    ap.add_argument("--network-size", type=int, nargs=2, default=(256, 192), metavar=("H", "W"))
    ap.add_argument("--batch-size", type=int, default=8)
    # several commits in 200 photos (the rate "once started" needs two), without tiny parts whose
    # commits outweigh the tiny model's work (docs/SCALE.md)
    ap.add_argument("--rows-per-part", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads of the local engine (0: every CPU)")
    ap.add_argument("--engines", nargs="+", default=["local", "ray"], choices=["local", "ray"])
    args = ap.parse_args()

    from tiny_checkpoints import make_tiny_checkpoint

    from sapiens2.batch.ray_engine import RayOptions
    from sapiens2.tasks import registry

    torch.set_num_threads(args.threads or available_cpus())
    tmp = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    try:
        tasks = [registry.get(t) for t in args.tasks]  # the command's names, looked up once
        names = [t.name for t in tasks]
        ckpts = {t: make_tiny_checkpoint(t, tmp / "ckpt" / t) for t in dict.fromkeys([*names, "seg"])}
        photos_dir = tmp / "photos"
        made = make_photos(photos_dir, args.photos, args.photo_side)
        plans = tuple(
            task_plan(t, checkpoints=ckpts, network_hw=args.network_size,
                      pipeline_kwargs={"detector": None} if "detector" in t.pipeline.parts else None)
            for t in tasks
        )  # fmt: skip
        print(f"torch {torch.__version__}, {available_cpus()} CPUs, local torch threads {torch.get_num_threads()}, "
              f"tasks {' '.join(names)}, {len(made)} photos of {args.photo_side} px, network "
              f"{args.network_size[0]}x{args.network_size[1]}, batch {args.batch_size}, load {load()}")  # fmt: skip
        runs = []
        for r in range(args.repeats):
            for engine in args.engines:
                job = BatchJob(plans, str(tmp / f"out-{engine}"), batch_size=args.batch_size,
                               rows_per_part=args.rows_per_part)  # fmt: skip
                run = one_run(engine, job, photos_dir, RayOptions() if engine == "ray" else None)
                runs.append(run)
                between = (
                    ", ".join(f"{k} {v / 1e3:,.0f} kB" for k, v in run["between"].items()) or "in process"
                )
                print(f"run {r + 1} {engine:5s} wall {run['wall']:6.1f} s · {run['rate']:5.2f} photos/s once started · "
                      f"start-up {run['start']:5.1f} s · {run['photos']} photos, {run['errors']} errors · "
                      f"between steps per photo: {between} · load {run['load']}", flush=True)  # fmt: skip
        print(
            "\n| engine | runs | photos/s once started (median, each) | start-up s (median, each) | wall s (median) |"
        )
        print("|---|---|---|---|---|")
        med = {}
        for engine in args.engines:
            mine = [r for r in runs if r["engine"] == engine]
            if not mine:
                continue
            rates, starts = [r["rate"] for r in mine], [r["start"] for r in mine]
            med[engine] = statistics.median(rates)
            print(f"| {engine} | {len(mine)} | {med[engine]:.2f} ({', '.join(f'{x:.2f}' for x in rates)}) | "
                  f"{statistics.median(starts):.1f} ({', '.join(f'{x:.1f}' for x in starts)}) | "
                  f"{statistics.median(r['wall'] for r in mine):.1f} |")  # fmt: skip
        if len(med) == 2:
            print(f"\nray / local throughput once started: {med['ray'] / med['local']:.2f} (target >= 0.7)")
        print(
            "\n| task | prep bytes (pickled) | raw bytes (pickled) | working copy bytes | network input bytes |"
        )
        print("|---|---|---|---|---|")
        print("\n".join(stage_bytes(BatchJob(plans, str(tmp / "x")), made[0])))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
