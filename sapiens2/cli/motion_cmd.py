"""``sapiens2 motion CLIP... --out DIR``: 3D motion of every tracked person of a clip.

Pose (detector, tracker) and the pointmap (with its segmentation) run over the same frames; each
person's keypoints are lifted to metres, bridged over short gaps and smoothed in 3D
(:mod:`sapiens2.video.clip_motion`). Per clip, ``DIR/<name>/`` holds ``<name>_motion.glb`` (an
animated skeleton per person), ``<name>_keypoints3d.npz``, ``<name>_keypoints3d.csv``,
``<name>_motion.bvh`` and the two passes' videos and files.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import Sapiens2Error

NAME = "motion"
HELP = "3D motion from a clip: pose + pointmap -> an animated skeleton per person (GLB, BVH), NPZ and CSV."


def add(parser: argparse.ArgumentParser) -> None:
    from ..video.reader import VideoLimits
    from .tasks import add_checkpoint

    parser.add_argument(
        "inputs", nargs="+", metavar="CLIP", help="video files (MP4, MOV, WebM, animated GIF)"
    )
    parser.add_argument("--out", "-o", default="sapiens2_out", help="output folder (default: %(default)s)")
    parser.add_argument("--size", help="model size of pose and pointmap (default: the tasks' default)")
    parser.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="weights dtype")
    add_checkpoint(parser)  # for pose, pointmap or seg
    parser.add_argument(
        "--stride", type=int, default=1, metavar="N", help="process every N-th frame (default 1)"
    )
    top = VideoLimits().max_frames
    parser.add_argument(
        "--max-frames", type=int, default=top, metavar="N",
        help=f"error if more than N frames would be processed (default {top})",
    )  # fmt: skip
    parser.add_argument("--batch", type=int, default=8, metavar="N", help="frames per forward (default 8)")
    parser.add_argument(
        "--detect-every", type=int, default=5, metavar="K", help="detector every K frames (default 5)"
    )
    parser.add_argument("--no-detector", action="store_true", help="the whole frame is one person")
    parser.add_argument(
        "--no-smoothing", action="store_true", help="no One-Euro smoothing (2D tracks and 3D)"
    )
    parser.add_argument(
        "--max-gap", type=int, default=5, metavar="N", help="bridge gaps up to N frames (default 5)"
    )
    parser.add_argument(
        "--threshold", type=float, default=0.3, metavar="S", help="keypoint score threshold (0.3)"
    )
    parser.add_argument("--face", action="store_true", help="face points in the GLB skeleton too")


def _pipelines(args: argparse.Namespace) -> tuple[Any, Any]:
    import torch

    from ..models.checkpoints import Checkpoints
    from ..tasks.pointmap.pointmap_pipeline import PointmapPipeline
    from ..tasks.pose.pose_pipeline import PosePipeline
    from ..tasks.seg.seg_pipeline import SegPipeline

    ckpt = Checkpoints.parse(args.checkpoint, [PosePipeline.task, PointmapPipeline.task, SegPipeline.task])
    dtype = getattr(torch, args.dtype) if args.dtype else None
    common = {"device": args.device, "dtype": dtype}
    seg_file = ckpt.get(SegPipeline.task)  # none: the pointmap loads its own seg when it needs it
    seg = None if seg_file is None else SegPipeline(args.size, checkpoint=seg_file, **common)
    pointmap = PointmapPipeline(args.size, checkpoint=ckpt.get(PointmapPipeline.task), seg=seg, **common)
    detector = None if args.no_detector else "auto"
    pose = PosePipeline(args.size, checkpoint=ckpt.get(PosePipeline.task), detector=detector, **common)
    return pose, pointmap


def run(args: argparse.Namespace) -> int:
    from ..video import TrackingOptions, VideoLimits
    from ..video.clip_motion import MotionOptions, run_motion
    from .tasks import find_images, unique_folder

    t0 = time.perf_counter()
    try:
        tracking = TrackingOptions(detect_every=args.detect_every, smoothing=not args.no_smoothing)
        options = MotionOptions(
            max_gap=args.max_gap,
            smoothing=not args.no_smoothing,
            score_threshold=args.threshold,
            face=args.face,
        )
        limits = VideoLimits(max_frames=args.max_frames)
        pose, pointmap = _pipelines(args)
    except Sapiens2Error as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    clips, missing = find_images(args.inputs)
    for item in missing:
        print(f"skipped {item}: no such file or folder", file=sys.stderr)
    out_root, taken, done = Path(args.out).expanduser(), set(), 0
    for path in clips:
        try:
            result = run_motion(
                pose, pointmap, path, out_root / unique_folder(path.stem, taken), stride=args.stride,
                limits=limits, batch_size=args.batch, tracking=tracking, motion=options,
                pointmap_options={"use_segmentation": True},
            )  # fmt: skip
        except Exception as err:  # one bad clip never ends the batch
            print(f"skipped {path}: {type(err).__name__}: {err}", file=sys.stderr)
            continue
        done += 1
        for note in result.notices:
            print(f"note ({path.name}): {note}", file=sys.stderr)
        t = result.timing
        print(
            f"{path.name}: {result.frames} frames, {result.people} people -> {result.glb} (pose {t['pose_s']:.1f} s, "
            f"pointmap {t['pointmap_s']:.1f} s, motion files {t['motion_s']:.1f} s)"
        )
    failed = len(clips) - done + len(missing)
    print(f"{done} done, {failed} failed in {time.perf_counter() - t0:.1f} s (outputs in {out_root})")
    return 0 if done else 1
