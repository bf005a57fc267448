"""The pointmap result's CPU work after the model: render, the mesh, each download file, save().

A synthetic 12 MP pointmap (an ellipsoid 0.35 m deep in front of a wall 0.6 m behind it, every
pixel foreground): ~12 M vertices and ~24 M faces, the most a 12 MP mesh holds, so the mesh
files are as large as they get (~480 MB GLB, ~500 MB PLY). Medians over ``--runs``; files go to
a temporary folder and are removed after each run.

    python bench/pointmap_downloads.py                        # 4000x3000, 3 runs
    python bench/pointmap_downloads.py --photo 1920x1080 --runs 5

To compare two versions, run it from both checkouts alternately (the machine's load moves single
figures by 30 % or more). Not a test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sapiens2.outputs import export, mesh  # noqa: E402
from sapiens2.tasks.base import RunInfo  # noqa: E402
from sapiens2.tasks.pointmap import PointmapResult  # noqa: E402


def synthetic(w: int, h: int) -> PointmapResult:
    """An ellipsoid on a wall seen by a pinhole camera (focal 0.8 x width), random colours."""
    f = 0.8 * w
    v, u = np.mgrid[0:h, 0:w].astype(np.float32)
    r2 = ((u - w / 2) / (0.3 * w)) ** 2 + ((v - h / 2) / (0.45 * h)) ** 2
    z = np.where(r2 < 1, 2.0 - 0.35 * np.sqrt(np.clip(1 - r2, 0, 1)), 2.6).astype(np.float32)
    pm = np.stack([(u - w / 2) / f * z, (v - h / 2) / f * z, z], axis=-1)
    return PointmapResult(
        image=np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8),
        info=RunInfo("pointmap", "synthetic", "cpu", "float32"),
        name="bench",
        pointmap=pm,
        depth=np.ascontiguousarray(pm[:, :, 2]),
        mask=np.ones((h, w), bool),
        scale=1.0,
        focal_px=f,
        focal_px_input=f,
    )


def pooled_save(res: Any, folder: Path, picture: Any) -> list[Path]:
    """``res.save`` as the app and the CLI run it (``serving.present``): its writes on a pool."""
    from concurrent.futures import ThreadPoolExecutor

    from sapiens2.outputs.writers import WRITE_WORKERS, Writer

    with ThreadPoolExecutor(WRITE_WORKERS) as pool, Writer(pool) as writer:
        return res.save(folder, rendered=picture, writer=writer)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--photo", default="4000x3000", help="WxH")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    w, h = (int(x) for x in args.photo.split("x"))
    res = synthetic(w, h)
    load = os.getloadavg()
    print(f"{w}x{h}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} CPUs")
    times: dict[str, list[float]] = {}
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)

        def timed(label: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            value = fn(*args, **kwargs)
            times.setdefault(label, []).append(time.perf_counter() - t0)
            return value

        for _ in range(args.runs):
            picture = timed("render", res.render)
            files = timed("save, one by one", res.save, out / "save", rendered=picture)
            sizes = {p.name: p.stat().st_size for p in files}
            shutil.rmtree(out / "save")
            timed("save, app's pool", pooled_save, res, out / "save", picture)
            shutil.rmtree(out / "save")
            pts, cols = timed("points", res.points)
            full = timed("mesh (full)", res.mesh)
            timed("mesh GLB", mesh.write_mesh_glb, out / "m.glb", full)
            timed("mesh PLY", mesh.write_mesh_ply, out / "m.ply", full)
            timed("point cloud PLY", export.write_point_cloud_ply, out / "c.ply", pts, cols)
            timed("point cloud GLB", export.write_point_cloud_glb, out / "c.glb", pts, cols)
            for p in out.iterdir():
                p.unlink()
    print(f"mesh: {len(full.vertices):,} vertices, {full.num_faces:,} faces")
    for label, ts in times.items():
        print(f"{label:18s} {statistics.median(ts):7.3f} s")
    for name, size in sizes.items():
        print(f"{name:28s} {size / 1e6:8.1f} MB")


if __name__ == "__main__":
    main()
