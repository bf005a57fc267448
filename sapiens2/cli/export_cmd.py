"""``sapiens2 export TASK --format onnx (--size S | --checkpoint PATH) [--int8] [--fp16] --out FILE.onnx``.

Writes the task's network as one ONNX file (docs/ONNX.md): the input and output names and the
metadata a consumer needs to preprocess are in the file.
"""

from __future__ import annotations

import argparse
import sys
import time

from ..errors import Sapiens2Error
from ..models.checkpoints import CHECKPOINT_HELP, Checkpoints
from ..models.zoo import TASKS

NAME = "export"
HELP = "Export a task's network to ONNX (fp32, int8 or fp16), with the metadata to run it anywhere."


def add(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("export_task", metavar="TASK", choices=sorted(TASKS), help="the task to export")
    parser.add_argument("--format", default="onnx", choices=("onnx",), help="file format (onnx)")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--size", help="a zoo size (0.4b, 1b ...): its weights are found as the app finds them"
    )
    which.add_argument("--checkpoint", metavar="[TASK=]PATH", help=CHECKPOINT_HELP)
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument("--int8", action="store_true", help="int8 weights (dynamic; faster on a CPU)")
    precision.add_argument("--fp16", action="store_true", help="half-precision weights (for GPUs)")
    parser.add_argument("--out", "-o", required=True, metavar="FILE.onnx", help="the file to write")


def run(args: argparse.Namespace) -> int:
    from ..models.onnx_export import export_onnx

    t0 = time.perf_counter()
    try:  # PATH or TASK=PATH, as every --checkpoint (TASK must be the exported one)
        checkpoint = (
            args.checkpoint and Checkpoints.parse([args.checkpoint], [args.export_task])[args.export_task]
        )
    except Sapiens2Error as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"Exporting {args.export_task} to {args.out} ...", file=sys.stderr)
    try:
        path = export_onnx(
            args.export_task,
            args.out,
            size=args.size,
            checkpoint=checkpoint or None,
            int8=args.int8,
            fp16=args.fp16,
        )
    except (Sapiens2Error, ValueError) as err:  # weights missing, bad checkpoint, bad path or option
        print(f"error: {err}", file=sys.stderr)
        return 1
    mb = path.stat().st_size / 1e6
    print(f"{path} ({mb:.1f} MB) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0
