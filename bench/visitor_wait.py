"""What a visitor waits for: the served app, called through gradio_client, per task and photo size.

The real app (``app.build_demo``) runs on tiny random checkpoints (as the tests build them), so
the model costs almost nothing and what is left is the request path around it: upload, intake,
the pipeline stages, rendering, writing the downloads, and Gradio's pre/postprocessing. For each
photo (1080p, 12 MP, 48 MP by default) and task it reports, as medians over ``--runs`` calls:

* ``wall``: the client's wall time, from ``predict`` (upload included) to the result being
  ready (results are not downloaded: ``download_files=False``);
* ``info``: the run info's "done in" seconds (what the page tells the visitor): from the
  request's arrival at the server to the function's return (Gradio's output processing after it,
  0.00 to 0.03 s here, is in ``wall`` only);
* ``floor``: decoding the same photo and writing one fast PNG (zlib level 1) at its size, timed
  in the same run: the least any request that returns a full-size picture must cost.

The server runs in its own process, as a visitor's server does (``--in-process`` serves it in
this one, as the first versions of this bench did: the client's threads then share the
server's interpreter).

    python bench/visitor_wait.py                                   # every photo task, 3 sizes
    python bench/visitor_wait.py --tasks pose,seg --photos 4000x3000 --runs 3
    python bench/visitor_wait.py --json out.json                   # also write the rows

Not a test: the numbers depend on the machine and its load (the load average is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from PIL import Image

os.environ["HF_HUB_OFFLINE"] = "1"  # before huggingface_hub is imported: no detector download tries
ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "tests", ROOT / "bench"):
    sys.path.insert(0, str(_p))

from request import make_photo  # noqa: E402  (bench/request.py: an assets photo at a given size)

PHOTOS = ("1920x1080", "4000x3000", "8000x6000")
#: ``pointmap_mesh``: the extra wait of a visitor who then asks for the full-resolution mesh
TASKS = ("pose", "seg", "normal", "pointmap", "pointmap_mesh", "matting", "features")
TOTAL = re.compile(r": done in ([0-9.]+) s\.")  # the run info's first line (serving.present.run_info)


def floor_seconds(photo: Path, folder: Path) -> float:
    """Decode ``photo`` and write it as one fast PNG: the least a full-size answer costs."""
    t0 = time.perf_counter()
    with Image.open(photo) as im:
        rgb = np.asarray(im.convert("RGB"))
    ok, buf = cv2.imencode(".png", rgb[..., ::-1], [cv2.IMWRITE_PNG_COMPRESSION, 1])
    assert ok
    (folder / "floor.png").write_bytes(buf.tobytes())
    return time.perf_counter() - t0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(folder: Path, threads: int | None = None) -> tuple[Any, str]:
    """The app on tiny checkpoints, served on 127.0.0.1 (as tests/test_app.py does). ``threads``:
    torch's CPU threads; None leaves the app's own choice (``runtime.threads.configure_cpu_threads``)."""
    from sapiens2.runtime import heap

    # as app.py's start does it: before any other thread allocates (writing the checkpoints
    # below starts threads, whose own malloc arenas the one-heap setting would not cover)
    heap.configure()
    import torch

    if threads:
        torch.set_num_threads(threads)
    os.environ.setdefault("GRADIO_EXAMPLES_CACHE", str(folder / "examples"))
    from tiny_checkpoints import TASK_NAMES, make_tiny_checkpoint

    import app
    from sapiens2 import serving

    ckpts = {t: make_tiny_checkpoint(t, folder / "ckpt" / t, seed=i) for i, t in enumerate(TASK_NAMES)}
    manager = serving.ModelManager(device="cpu", checkpoints=ckpts)
    demo = app.build_demo(manager, folders=serving.RequestFolders(folder / "requests"))
    _, url, _ = app.launch(demo, host="127.0.0.1", port=free_port(), prevent_thread_lock=True, quiet=True)
    return demo, url


def serve_process(folder: Path, threads: int | None) -> tuple[subprocess.Popen[str], str]:
    """The app served by a child process (``--serve-only``): the process and its URL."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-only", str(folder)]
    if threads:
        cmd += ["--threads", str(threads)]
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    for line in child.stdout:  # start-up noise, then the URL
        if line.startswith("URL "):
            return child, line.split()[1]
    raise RuntimeError(f"the server process ended before serving (exit {child.wait()})")


def serve_only(folder: Path, threads: int | None) -> None:
    """Serve until standard input closes (the parent ended or let go)."""
    demo, url = serve(folder, threads)
    print("URL", url, flush=True)
    try:
        sys.stdin.read()
    finally:
        demo.close()


def call(client: Any, task: str, photo: Path) -> tuple[float, float, str]:
    """(client wall seconds, run info total seconds, run info) of one request. ``pointmap_mesh``:
    a pointmap run first (not timed), then the full-resolution mesh of its result, timed."""
    from gradio_client import handle_file

    args: tuple[Any, ...] = (handle_file(str(photo)),)
    if task == "pointmap_mesh":
        files = client.predict(*args, api_name="/pointmap")[2]
        args = (files[0]["url"],)  # any file of the result names it
    t0 = time.perf_counter()
    out = client.predict(*args, api_name=f"/{task}")
    wall = time.perf_counter() - t0
    info = out[-1]
    m = TOTAL.search(info)
    return wall, float(m.group(1)) if m else float("nan"), info


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--photos", default=",".join(PHOTOS), help="WxH,... (JPEG q92 of an assets photo)")
    ap.add_argument("--runs", type=int, default=3, help="calls per task and photo (median)")
    ap.add_argument("--runs-large", type=int, default=1, help="calls per task for photos over 20 MP")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--show-info", action="store_true", help="print each run info line")
    ap.add_argument(
        "--threads", type=int, help="torch CPU threads (default: the app's own, one per usable CPU)"
    )
    ap.add_argument("--in-process", action="store_true", help="serve the app in this process")
    ap.add_argument("--serve-only", type=Path, help=argparse.SUPPRESS)  # the child's part
    args = ap.parse_args(argv)
    if args.serve_only:
        serve_only(args.serve_only, args.threads)
        return []
    from gradio_client import Client

    from sapiens2.runtime import heap

    heap.configure()  # the floor's process gets the server's heap settings too
    tmp = Path(tempfile.mkdtemp(prefix="visitor_wait_"))
    if args.in_process:
        demo, url = serve(tmp, args.threads)
        stop = demo.close
    else:
        child, url = serve_process(tmp, args.threads)

        def stop() -> None:
            assert child.stdin is not None
            child.stdin.close()
            child.wait(timeout=60)

    client = Client(url, download_files=False, verbose=False)
    tasks = args.tasks.split(",")
    load = os.getloadavg()
    print(
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} CPUs, "
        f"server torch threads {args.threads or 'as the app sets them'}, "
        f"server {'in this process' if args.in_process else 'in its own process'}, tiny models"
    )
    small = make_photo(640, 480, tmp)
    for task in tasks:  # warm-up: model loads and first-call costs stay out of the figures
        call(client, task, small)
    rows: list[dict[str, Any]] = []
    print(
        f"{'photo':>10} {'task':>13} {'wall s':>7} {'info s':>7} {'floor s':>7} {'wall/floor':>10} {'info/wall':>9}"
    )
    try:
        for spec in args.photos.split(","):
            w, h = map(int, spec.split("x"))
            photo = make_photo(w, h, tmp)
            runs = args.runs if w * h <= 20e6 else args.runs_large
            for task in tasks:
                walls, infos, floors = [], [], []
                for _ in range(runs):
                    floors.append(floor_seconds(photo, tmp))
                    wall, total, info = call(client, task, photo)
                    walls.append(wall)
                    infos.append(total)
                    if args.show_info:
                        print("   ", info)
                row = {
                    "photo": spec,
                    "task": task,
                    "runs": runs,
                    "wall_s": statistics.median(walls),
                    "info_s": statistics.median(infos),
                    "floor_s": statistics.median(floors),
                }
                rows.append(row)
                print(
                    f"{spec:>10} {task:>13} {row['wall_s']:7.2f} {row['info_s']:7.2f} {row['floor_s']:7.2f} "
                    f"{row['wall_s'] / row['floor_s']:10.1f} {row['info_s'] / row['wall_s']:9.2f}",
                    flush=True,
                )
    finally:
        stop()
        shutil.rmtree(tmp, ignore_errors=True)  # the request folders: ~0.3 GB a 12 MP pointmap call
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
