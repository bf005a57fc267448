"""Video benchmark: frames per second of whole clips through ``sapiens2.video.run_video``, per task.

A synthetic clip (an assets/ photo panning a few pixels a frame, written as VP8 WebM) goes
through the runner exactly as a request would: decode, prepare, one ``infer`` per batch, finish,
render, VP8 encode, exports. Models have the published shape of a size and random weights (no
download). Pose gets one person per frame from the whole-frame box (``detector=None``: the
detector's cost is in bench/detector.py); normals run without background removal and pointmap
without its seg model, so each row is one model's cost. The pointmap scale branch is sized for
1024x768, so pointmap always runs at that input whatever ``--input-hw`` says.

    python bench/video.py                                           # CPU, 0.4b, small input, ~5 min
    python bench/video.py --device cuda --dtype bf16 --size 1b --input-hw 1024 768 \\
        --clip 1920x1080 --frames 64 --batch 16                    # GPU (not run here)
    python bench/video.py --smoothing                               # One-Euro table only (no model)
    python bench/video.py --codecs --clip 1280 720                  # which encoders open, their speed

The pipelines are used through their single call (one forward per frame) until they grow
prepare/infer/finish; the ``batch`` column is then the runner's batch, not the model's. Not a
test: numbers depend on the machine and on what else runs on it (the load average is printed).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from request import DTYPES, PHOTO, shape_model  # noqa: E402

from sapiens2.runtime import threads as cpu_threads  # noqa: E402
from sapiens2.tasks import pipeline_class  # noqa: E402
from sapiens2.tasks.pose.keypoint_smoothing import OneEuroFilter  # noqa: E402
from sapiens2.video import VideoLimits, VideoWriter, run_video  # noqa: E402
from sapiens2.video.clip_steps import staged  # noqa: E402

OPTIONS = {
    "pose": {},
    "seg": {},
    "normal": {"remove_background": False},
    "pointmap": {"use_segmentation": False},
    "matting": {},
}


def make_clip(path: Path, frames: int, wh: tuple[int, int], fps: float = 25.0) -> Path:
    """The assets photo, cover-resized to wh plus a margin, panning 2 px a frame."""
    from sapiens2.inputs.intake import load_image
    from sapiens2.tasks.matting.matting_render import cover_resize

    w, h = wh
    big = cover_resize(load_image(PHOTO).rgb, (h, w + 2 * frames))
    with VideoWriter(path, fps) as out:
        for i in range(frames):
            out.write(np.ascontiguousarray(big[:, 2 * i : 2 * i + w]))
        return out.close()


def build(task: str, args: argparse.Namespace) -> Any:
    model = shape_model(task, args.size, torch.device(args.device), DTYPES[args.dtype])
    kwargs: dict[str, Any] = {"model": model}
    if task == "pose":
        kwargs["detector"] = None
    pipe = pipeline_class(task)(args.size, **kwargs)
    if task != "pointmap":
        pipe.input_hw = tuple(args.input_hw)
    return pipe


def bench_task(task: str, clips: dict[int, Path], out: Path, args: argparse.Namespace) -> dict[str, Any]:
    pipe = build(task, args)
    limits = VideoLimits(max_frames=10_000, max_seconds=3600, max_side=max(args.clip))
    frames = args.frames_pointmap if task == "pointmap" else args.frames
    kw = {"batch_size": args.batch, "options": OPTIONS[task], "limits": limits}
    run_video(pipe, clips[1], out / "warm", **kw)  # warm-up frame: allocator, kernels, caches
    r = run_video(pipe, clips[frames], out / task, **kw)
    t = r.timing
    hw = (1024, 768) if task == "pointmap" else tuple(args.input_hw)
    return {
        "task": task, "frames": r.frames, "batch": args.batch, "input": f"{hw[0]}x{hw[1]}",
        "estimate_s": r.frames * first_estimate(task, args.size, hw, tuple(args.clip)),
        "total_s": t["total_s"], "fps": r.frames / t["total_s"], "infer_s": t["infer_s"],
        "model_s": t["model_s"], "decode_s": t["decode_s"], "other_s": t["total_s"] - t["infer_s"] - t["decode_s"],
        "staged": type(staged(pipe)).__name__,
    }  # fmt: skip


def first_estimate(task: str, size: str, hw: tuple[int, int], clip_wh: tuple[int, int]) -> float:
    """The Video tab's seconds per frame before any clip has run (``VideoRequests.cpu_seconds``):
    the published shape's multiply-accumulates at ``hw`` and the per-pixel costs."""
    from sapiens2.models import cost
    from sapiens2.serving.frame_cost import frame_macs, frame_network_pixels
    from sapiens2.tasks import registry

    decl = registry.get(task)
    opts = {**decl.defaults(), **OPTIONS[task]}
    macs = frame_macs(decl, size, opts, hw)
    pixels = frame_network_pixels(decl, size, opts, hw)
    return cost.cpu_frame_seconds(macs or 0.0, pixels, clip_wh[0] * clip_wh[1])


def smoothing_table() -> None:
    """One-Euro on a synthetic track (30 fps, Gaussian noise sigma 3 px): jitter and error."""
    t = np.arange(300) / 30.0
    print(
        "| motion | min_cutoff | beta | jitter raw -> smoothed (px) | error vs truth raw -> smoothed (px) |"
    )
    print("|---|---|---|---|---|")
    motions = (
        (0.0, 0.0, "still"),
        (100.0, 0.5, "0.5 Hz, 100 px (<= 314 px/s)"),
        (200.0, 1.0, "1 Hz, 200 px (<= 1257 px/s)"),
    )
    for amp, freq, label in motions:
        truth = np.stack(
            [320 + amp * np.sin(2 * np.pi * freq * t), 240 + 0.5 * amp * np.cos(2 * np.pi * freq * t)], 1
        )
        noisy = truth + np.random.default_rng(0).normal(0, 3.0, truth.shape)
        for mc, beta in ((1.0, 0.007), (1.0, 0.02), (1.0, 0.05), (0.5, 0.05)):
            f = OneEuroFilter(min_cutoff=mc, beta=beta)
            out = np.array([f(ti, noisy[i : i + 1])[0] for i, ti in enumerate(t)])
            jit = [float(np.sqrt((np.diff(a[10:], 2, axis=0) ** 2).sum(1).mean())) for a in (noisy, out)]
            err = [float(np.sqrt(((a[10:] - truth[10:]) ** 2).sum(1).mean())) for a in (noisy, out)]
            print(
                f"| {label} | {mc} | {beta} | {jit[0]:.2f} -> {jit[1]:.2f} | {err[0]:.2f} -> {err[1]:.2f} |"
            )


def codec_table(wh: tuple[int, int], frames: int = 30) -> None:
    """Encode time, size and PSNR of the panning clip per codec OpenCV's FFmpeg can open here."""
    import cv2

    from sapiens2.inputs.intake import load_image
    from sapiens2.tasks.matting.matting_render import cover_resize

    w, h = wh
    big = cover_resize(load_image(PHOTO).rgb, (h, w + 2 * frames))
    clip = [
        cv2.cvtColor(np.ascontiguousarray(big[:, 2 * i : 2 * i + w]), cv2.COLOR_RGB2BGR)
        for i in range(frames)
    ]
    print(f"| codec | container | opens | encode s ({frames} frames {w}x{h}) | bytes | PSNR dB (mean) |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for fourcc, suffix in (("VP80", ".webm"), ("VP90", ".webm"), ("avc1", ".mp4"), ("mp4v", ".mp4")):
            path = str(Path(tmp) / f"{fourcc}{suffix}")
            t0 = time.perf_counter()
            writer = cv2.VideoWriter(path, cv2.CAP_FFMPEG, cv2.VideoWriter_fourcc(*fourcc), 25.0, (w, h))
            if not writer.isOpened():
                print(f"| {fourcc} | {suffix} | no | | | |")
                continue
            for f in clip:
                writer.write(f)
            writer.release()
            dt = time.perf_counter() - t0
            cap, psnr = cv2.VideoCapture(path, cv2.CAP_FFMPEG), []
            for f in clip:
                ok, g = cap.read()
                psnr.append(cv2.PSNR(f, g) if ok else 0.0)
            print(f"| {fourcc} | {suffix} | yes | {dt:.2f} | {os.path.getsize(path)} | {np.mean(psnr):.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="pose,seg,normal,pointmap,matting")
    ap.add_argument("--size", default="0.4b")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, choices=list(DTYPES), help="default: bf16 on CUDA, else fp32")
    ap.add_argument("--input-hw", nargs=2, type=int, default=(256, 192), metavar=("H", "W"))
    ap.add_argument("--clip", nargs=2, type=int, default=(320, 240), metavar=("W", "H"), help="frame size")
    ap.add_argument("--frames", type=int, default=4, help="timed frames per task")
    ap.add_argument("--frames-pointmap", type=int, default=2, help="pointmap runs at 1024x768: fewer frames")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--smoothing", action="store_true", help="print the One-Euro table and stop")
    ap.add_argument("--codecs", action="store_true", help="print the encoder table (at --clip size) and stop")
    args = ap.parse_args()
    if args.smoothing:
        smoothing_table()
        return
    if args.codecs:
        codec_table(tuple(args.clip))
        return
    args.dtype = args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")
    threads = cpu_threads.configure_cpu_threads()
    load = os.getloadavg()
    print(
        f"device {args.device}, {args.dtype}, torch {torch.__version__}, threads {threads}, size {args.size}, "
        f"clip {args.clip[0]}x{args.clip[1]}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    t0 = time.perf_counter()
    print(
        "| task | input | frames | batch | frames/s | first estimate s | total s | infer s | model s | decode s "
        "| other s | stages |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="sapiens2-video-bench-") as tmp:
        out = Path(tmp)
        clips = {
            n: make_clip(out / f"clip{n}.webm", n, tuple(args.clip))
            for n in {1, args.frames, args.frames_pointmap}
        }
        for task in args.tasks.split(","):
            r = bench_task(task, clips, out, args)
            print(
                f"| {r['task']} | {r['input']} | {r['frames']} | {r['batch']} | {r['fps']:.3f} | "
                f"{r['estimate_s']:.1f} | {r['total_s']:.1f} | "
                f"{r['infer_s']:.1f} | {r['model_s']:.1f} | {r['decode_s']:.2f} | {r['other_s']:.2f} | {r['staged']} |",
                flush=True,
            )
    print(f"# wall time {time.perf_counter() - t0:.0f} s, load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
