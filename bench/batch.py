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

Then, apart from the runs, the bytes one photo's item holds after each step, next to its file, its
working copy and the network inputs. Tiny checkpoints (``tests/tiny_checkpoints.py``) at
``--network-size``; pose uses the whole photo as its box, or with ``--detector`` finds its people
with a tiny random DETR in a step of its own (as it does by default with the real one).

    python bench/batch.py                                   # pose, 200 photos, 3 repetitions (~10 min here)
    python bench/batch.py --tasks pose seg --photos 100 --repeats 1
    python bench/batch.py --detector --photo-side 4000 --photos 100 --repeats 2
    python bench/batch.py --tasks pose seg --two-node      # Ray: a two-raylet cluster (ray start x 2)

``--two-node`` starts a real cluster first (tests/ray_cluster.py: ``ray start --head`` and a second
``ray start --address``, one CPU each, token authentication) and every Ray run joins it
(``--address``), so its start-up no longer counts Ray's own start; it is stopped at the end.

Not a test: numbers depend on the machine and on what else runs on it (the load average is
printed before and after each run).
"""

from __future__ import annotations

import argparse
import os
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
from sapiens2.batch import flow  # noqa: E402
from sapiens2.batch.job import BatchJob, task_plan  # noqa: E402
from sapiens2.batch.stages import stages_for  # noqa: E402
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


def commit_times(commits: list[tuple[float, int]]) -> str:
    """``t1 s (n1), t2 s (n2) ...``: when each part was committed, with the photos done by then."""
    return ", ".join(f"{t:.1f} s ({n})" for t, n in commits) or "none"


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
            "errors": errors, "between": summary.bytes_between, "load": f"{before} -> {load()}",
            "commits": summary.commits}  # fmt: skip


def stage_bytes(job: BatchJob, photo: Path) -> list[str]:
    """One photo through the steps in this process, as the Ray engine hands it on: the pickled
    item after each step (prepare; with the person detector, its step and the crops; each
    forward), next to the photo's file, its working copy and the network inputs, in bytes."""
    stages = stages_for(job.plans)
    [item] = flow.read_prepare([(str(photo), job.tasks)], stages, max_side=job.max_side)
    work = item.intake.work.nbytes if item.intake is not None else load_image(photo).work.nbytes
    rows = [("prepare", len(item.dumps()))]
    finders = [st for st in stages.values() if st.finds_people]
    for st in finders:
        st.load_finder("cpu")
        flow.find_people([item], st)
        rows.append((f"detect {st.task.name}", len(item.dumps())))
    if finders:
        flow.prepare_found(
            [flow.Item.loads(item.dumps())], stages, max_side=job.max_side
        )  # as Ray: decoded again
        flow.prepare_found([item], stages, max_side=job.max_side)
        rows.append(("crops", len(item.dumps())))
    for st in stages.values():
        st.load("cpu", job.dtype)
        flow.forward([item], st)
        rows.append((f"forward {st.task.name}", len(item.dumps())))
    inputs = ", ".join(
        f"{t.name} {h * w * 3:,}"
        for t, (h, w) in ((t, st.cpu_pipeline().network_hw) for t, st in stages.items())
    )
    lines = [f"| after {name} | {n:,} |" for name, n in rows]
    lines.append(f"| (the photo's file; its working copy) | {photo.stat().st_size:,}; {work:,} |")
    lines.append(f"| (network input per image or person crop, uint8: {inputs}) | |")
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
    ap.add_argument("--detector", action="store_true",
                    help="pose finds its people with a (tiny random) DETR, as by default, not the whole photo")  # fmt: skip
    ap.add_argument("--two-node", action="store_true",
                    help="ray: join a two-raylet cluster this bench starts (one CPU each) instead of a local Ray")  # fmt: skip
    ap.add_argument("--detector-actors", type=int, default=None,
                    help="ray: detector actors (default: none on CPUs, the read step detects)")  # fmt: skip
    args = ap.parse_args()

    from tiny_checkpoints import make_tiny_checkpoint, make_tiny_detr

    from sapiens2.batch.ray_engine import RayOptions
    from sapiens2.tasks import registry

    torch.set_num_threads(args.threads or available_cpus())
    tmp = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    cluster = None
    if args.two_node:  # before Ray is imported: it reads the token settings once, at import
        from ray_cluster import start_cluster

        cluster = start_cluster(nodes=2, cpus=1)
        os.environ.update({k: cluster.env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")})
        print(f"two-node cluster at {cluster.address} (token authentication), load {load()}", flush=True)
    try:
        tasks = [registry.get(t) for t in args.tasks]  # the command's names, looked up once
        names = [t.name for t in tasks]
        ckpts = {t: make_tiny_checkpoint(t, tmp / "ckpt" / t) for t in dict.fromkeys([*names, "seg"])}
        photos_dir = tmp / "photos"
        made = make_photos(photos_dir, args.photos, args.photo_side)
        detector = None
        if args.detector:
            make_tiny_detr(tmp / "ckpt" / "detr")
            detector = str(tmp / "ckpt" / "detr")
        plans = tuple(
            task_plan(t, checkpoints=ckpts, network_hw=args.network_size,
                      pipeline_kwargs={"detector": detector} if "detector" in t.pipeline.parts else None)
            for t in tasks
        )  # fmt: skip
        print(f"torch {torch.__version__}, {available_cpus()} CPUs, local torch threads {torch.get_num_threads()}, "
              f"tasks {' '.join(names)}, {len(made)} photos of {args.photo_side} px, network "
              f"{args.network_size[0]}x{args.network_size[1]}, batch {args.batch_size}, "
              f"person detector {'tiny DETR' if detector else 'off (whole photo)'}, load {load()}")  # fmt: skip
        runs = []
        for r in range(args.repeats):
            for engine in args.engines:
                job = BatchJob(plans, str(tmp / f"out-{engine}"), batch_size=args.batch_size,
                               rows_per_part=args.rows_per_part)  # fmt: skip
                run = one_run(
                    engine,
                    job,
                    photos_dir,
                    RayOptions(
                        address=cluster.address if cluster else None, detector_actors=args.detector_actors
                    )
                    if engine == "ray"
                    else None,
                )
                runs.append(run)
                between = (
                    ", ".join(f"{k} {v / 1e3:,.0f} kB" for k, v in run["between"].items()) or "in process"
                )
                print(f"run {r + 1} {engine:5s} wall {run['wall']:6.1f} s · {run['rate']:5.2f} photos/s once started · "
                      f"start-up {run['start']:5.1f} s · commits at {commit_times(run['commits'])} · "
                      f"{run['photos']} photos, {run['errors']} errors · "
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
        print("\n| one photo, as the Ray engine hands it on | bytes (the pickled item) |")
        print("|---|---|")
        print("\n".join(stage_bytes(BatchJob(plans, str(tmp / "x")), made[0])))
    finally:
        if cluster is not None:
            print(f"the cluster's processes used {cluster.cpu_seconds():.1f} CPU-s", flush=True)
            cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
