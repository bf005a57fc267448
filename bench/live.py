"""Live benchmark: a 640x480 camera through the live path (``sapiens2.serving.live``) on this CPU.

A camera thread puts JPEG frames (what the page sends) into the session's newest-only mailbox at
``--fps``; the session takes the newest, runs decode -> load (cache hit) -> prepare -> the model
-> finish -> render, and each rendered frame is encoded for the page exactly as the app's
output does it (``gr.Image(format="jpeg").postprocess``: JPEG, hash, file in Gradio's cache).
The models are the test suite's tiny checkpoints (``tests/tiny_checkpoints.py``, random weights,
real heads): the model's own time is small and the rest, the live path's overhead, is what is
measured; ``--size 0.4b`` (or any published size) builds that size's published shape with random
weights instead, for a GPU's frames/s (``--device cuda --dtype bf16``). Pose has no detector
weights here, so the whole frame is one person.

    python bench/live.py --json live.json                  # pose, 512x384 input, 60 frames at 20 a second
    python bench/live.py --task pose --input release --frames 30
    python bench/live.py --fps 0 --frames 30                # every frame processed: no drops
    python bench/live.py --all --json live_all.json         # every video task at every input
    python bench/live.py --device cuda --dtype bf16 --size 0.4b --all --frames 200   # a GPU (not run here)

Per frame: ``model`` = the forwards (the pipeline's own ``model_s``); ``overhead`` = everything
else of the frame (decode, load, people, prepare, the device step outside the forward, finish,
render, encode); ``host`` = the part of it outside the device step (what stays on the CPU when
a GPU runs the device step); ``device_beyond_model`` = the device step's work around the forward
(normalising, pose's heatmap decoding, seg's logit compaction), on this CPU here; ``latency`` =
capture to encoded. The JSON holds the figures the issue asks
for (``frames``, ``dropped``, ``model_ms_p50``, ``overhead_ms_p50``, ``latency_ms_p95``), the
median of each stage, and the conditions (load average, threads). Not a test: the numbers
depend on what else runs on the machine.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from sapiens2 import serving  # noqa: E402
from sapiens2.serving.live import INPUTS, LatestFrame, LiveOptions, LiveSession  # noqa: E402

PHOTO = ROOT / "assets"
TASKS = ("pose", "seg", "normal", "pointmap", "matting")


def camera_frames(n: int, wh: tuple[int, int] = (640, 480)) -> list[bytes]:
    """``n`` JPEG frames: an assets photo panning 2 px a frame (what the page's webcam sends)."""
    from PIL import Image

    from sapiens2.inputs.intake import load_image
    from sapiens2.tasks.matting.matting_render import cover_resize

    photo = next(p for p in sorted(PHOTO.glob("*")) if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    w, h = wh
    big = cover_resize(load_image(str(photo)).rgb, (h, w + 2 * n))
    out = []
    for i in range(n):
        data = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(big[:, 2 * i : 2 * i + w])).save(data, format="JPEG", quality=90)
        out.append(data.getvalue())
    return out


def tiny_manager(folder: Path) -> serving.ModelManager:
    from tiny_checkpoints import all_task_names, make_tiny_checkpoint

    checkpoints = {t: make_tiny_checkpoint(t, folder / t, seed=i) for i, t in enumerate(all_task_names())}
    return serving.ModelManager(device="cpu", checkpoints=checkpoints)


def shaped_manager(device: str, dtype: torch.dtype) -> serving.ModelManager:
    """Models of each task's published shape at the requested size, random weights (no download;
    ``bench/request.py``'s ``shape_model``); pose finds no detector weights: the whole frame."""
    sys.path.insert(0, str(ROOT / "bench"))
    from request import shape_model

    from sapiens2.tasks import registry

    def factory(task: str, size: str | None, **kw: Any) -> Any:
        kw.pop("checkpoint", None)
        model = shape_model(
            task, size or registry.get(task).spec.default_size(True), torch.device(device), dtype
        )
        return registry.get(task).pipeline(
            size, model=model, **{k: v for k, v in kw.items() if k not in ("device", "dtype")}
        )

    return serving.ModelManager(device=device, dtype=dtype, factory=factory)


def encoder() -> Any:
    """The app's per-frame output encoding: gr.Image(format="jpeg").postprocess(array)."""
    import gradio as gr

    return gr.Image(format="jpeg", interactive=False).postprocess


def run(
    manager: serving.ModelManager,
    task: str,
    network_input: str,
    frames: list[bytes],
    fps: float,
    size: str | None,
) -> dict:
    from sapiens2.tasks import registry

    session = LiveSession(manager)
    # the task's own defaults otherwise (pointmap: with its seg model)
    options = LiveOptions(registry.get(task), size=size, input=network_input)
    encode = encoder()
    session.step(frames[0], options)  # warm-up: the model loads, caches fill
    session = LiveSession(manager)
    box, rows = LatestFrame(), []

    def show(frame: Any) -> None:
        t0 = time.perf_counter()
        encode(frame.image)
        done = time.perf_counter()
        encode_s = done - t0
        device = frame.stages.get("device", 0.0)
        rows.append(
            {
                "model": frame.model_s,
                "overhead": frame.step_s - frame.model_s + encode_s,
                "host": frame.step_s - device + encode_s,
                "device_beyond_model": device - frame.model_s,
                "latency": frame.latency_s + encode_s,
                **frame.stages,
                "encode": encode_s,
            }
        )

    def camera() -> None:
        for data in frames:
            if fps > 0:
                box.put(data)
                time.sleep(1.0 / fps)
            else:  # as fast as the session takes them: nothing is dropped
                box.put(data)
                while box.put_count - box.dropped - len(rows) > 0 and not box.closed:
                    time.sleep(0.0005)
        box.close()

    feeder = threading.Thread(target=camera)
    t0 = time.perf_counter()
    feeder.start()
    stats = session.run(box, options, show, idle_s=60.0)
    feeder.join()
    wall = time.perf_counter() - t0

    def p(key: str, q: float) -> float:
        return round(1e3 * float(np.percentile([r.get(key, 0.0) for r in rows], q)), 2)

    return {
        "task": task,
        "size": size or "tiny",
        "input": network_input,
        "frames": stats.frames,
        "dropped": stats.dropped,
        "offered": len(frames),
        "fps": round(stats.frames / wall, 2),
        "model_ms_p50": p("model", 50),
        "overhead_ms_p50": p("overhead", 50),
        "host_ms_p50": p("host", 50),
        "device_beyond_model_ms_p50": p("device_beyond_model", 50),
        "latency_ms_p50": p("latency", 50),
        "latency_ms_p95": p("latency", 95),
        "stages_ms_p50": {
            k: p(k, 50)
            for k in ("decode", "load", "people", "prepare", "device", "finish", "render", "encode")
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="pose", choices=TASKS)
    ap.add_argument("--input", default="512x384", choices=list(INPUTS))
    ap.add_argument("--all", action="store_true", help="every task at every input")
    ap.add_argument("--frames", type=int, default=60, help="frames the camera offers")
    ap.add_argument(
        "--fps", type=float, default=20.0,
        help="the camera's rate (the page sends 20 a second); 0: the next frame as soon as one is shown",
    )  # fmt: skip
    ap.add_argument(
        "--threads", type=int, default=1,
        help="torch threads (default 1, as the test suite: tiny models are small ops, and on a shared "
        "2-core machine two threads mostly wait for each other; 0: torch's own count)",
    )  # fmt: skip
    ap.add_argument(
        "--size", default="tiny", help="tiny (the test checkpoints) or a published size (random weights)"
    )
    ap.add_argument("--device", default="cpu", help="cpu or cuda (published sizes only)")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"], help="published sizes only")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    meta = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "load_average": [round(v, 2) for v in os.getloadavg()],
        "camera": "640x480 JPEG",
        "fps_offered": args.fps,
    }
    print(json.dumps(meta))
    frames = camera_frames(args.frames)
    runs = [(t, i) for t in TASKS for i in INPUTS] if args.all else [(args.task, args.input)]
    meta["device"], meta["size"] = args.device, args.size
    with tempfile.TemporaryDirectory() as tmp:
        if args.size == "tiny":
            manager, size = tiny_manager(Path(tmp)), None
        else:
            dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
            manager, size = shaped_manager(args.device, dtype), args.size
        results = []
        for task, network_input in runs:
            row = run(manager, task, network_input, frames, args.fps, size)
            print(json.dumps(row))
            results.append(row)
    meta["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    if args.json:
        out = results[0] if len(results) == 1 else {"runs": results}
        args.json.write_text(json.dumps({**out, "meta": meta}, indent=2) + "\n")


if __name__ == "__main__":
    main()
