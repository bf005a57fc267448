"""Batch command line: ``python -m sapiens2 TASK INPUT... --size SIZE --out DIR``.

Images and folders (searched recursively) in; per image, one subfolder of DIR holding the same
export files as ``result.save``. A bad file is reported and skipped; the batch goes on. Exit code
0 when at least one image succeeded, 1 otherwise (2 for a malformed command line).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .errors import OptionError, Sapiens2Error

#: CLI task name -> zoo task name
TASK_NAMES = {
    "pose": "pose",
    "seg": "seg",
    "normal": "normal",
    "pointmap": "pointmap",
    "matting": "matting",
    "features": "pretrain",
}
IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif", ".jfif", ".heic", ".heif", ".avif"}
)
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sapiens2",
        description="Run a Sapiens2 task on images and folders; write the export files per image.",
    )
    p.add_argument("task", choices=sorted(TASK_NAMES), help="what to compute")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="image files or folders (searched recursively)")
    p.add_argument("--out", "-o", default="sapiens2_out", help="output folder (default: %(default)s)")
    p.add_argument("--size", help="model size, e.g. 0.4b or 1b (default: the task's default for the device)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    p.add_argument(
        "--dtype", choices=sorted(DTYPES), help="weights dtype (default: bfloat16 on GPU, float32 on CPU)"
    )
    p.add_argument("--checkpoint", help="a .safetensors file or a folder holding one (instead of the Hub)")
    p.add_argument(
        "--flip", action="store_true", help="pose: flip test (averages the mirrored crop; 2x compute)"
    )
    p.add_argument(
        "--no-detector",
        action="store_true",
        help="pose: skip person detection; the whole image is one person",
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=0.3,
        help="pose: keypoint score below which COCO/OpenPose files mark a point undetected (default: 0.3)",
    )
    p.add_argument(
        "--remove-background",
        action="store_true",
        help="normal: blank the background (runs the segmentation model too)",
    )
    p.add_argument(
        "--no-segmentation",
        action="store_true",
        help="pointmap: foreground = all valid depth instead of the segmentation model's person pixels",
    )
    p.add_argument(
        "--background",
        help="matting: composite background, '#rrggbb' or an image file (default: chroma green)",
    )
    return p


def find_images(inputs: Iterable[str]) -> tuple[list[Path], list[str]]:
    """Files to process (explicit paths always; folders: regular files with image extensions,
    recursive, sorted) and the inputs that do not exist.

    Only ``stat`` is used here, which never blocks. An explicit FIFO, device or socket is kept, so
    that the reader refuses it by name from its ``stat`` ("'x' is a FIFO (named pipe), not an image
    file") without opening it, rather than calling it missing; inside folders such entries are skipped.
    """
    files: list[Path] = []
    missing: list[str] = []
    for item in inputs:
        path = Path(item).expanduser()
        if path.is_dir():
            files.extend(
                sorted(f for f in path.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_EXTENSIONS)
            )
        elif path.exists():
            files.append(path)
        else:
            missing.append(item)
    return list(dict.fromkeys(files)), missing


def unique_folder(stem: str, taken: set[str]) -> str:
    """A folder name for one image's outputs: its sanitised stem, suffixed -2, -3 ... when taken."""
    from .export import safe_stem  # the same rule as the exported file names

    base = safe_stem(stem)
    name, k = base, 2
    while name.lower() in taken:
        name, k = f"{base}-{k}", k + 1
    taken.add(name.lower())
    return name


def _call_options(args: argparse.Namespace, task: str) -> dict[str, Any]:
    if task == "pose":
        return {"flip_test": args.flip}
    if task == "normal":
        return {"remove_background": args.remove_background}
    if task == "pointmap":
        return {"use_segmentation": not args.no_segmentation}
    return {}


def _save_options(args: argparse.Namespace) -> dict[str, Any]:
    if args.task == "matting":
        return {"background": _matting_background(args.background)}
    if args.task == "pose":
        if not 0.0 <= args.threshold <= 1.0:
            raise OptionError(f"--threshold must be between 0 and 1; got {args.threshold}.")
        return {"threshold": args.threshold}
    return {}


def _matting_background(value: str | None) -> Any:
    from .render import CHROMA_GREEN, parse_color

    if value is None:
        return CHROMA_GREEN
    if Path(value).expanduser().is_file():
        from .imaging import load_image

        return load_image(value).rgb
    return parse_color(value)  # raises OptionError for anything else


def _progress(total: int) -> Any:
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm comes with huggingface_hub
        return None
    return tqdm(total=total, unit="image", file=sys.stderr, dynamic_ncols=True, disable=None)


def _say(bar: Any, message: str) -> None:
    if bar is not None:
        bar.write(message, file=sys.stderr)
    else:
        print(message, file=sys.stderr)


def _make_pipeline(args: argparse.Namespace) -> Any:
    import torch

    from .tasks import pipeline

    dtype = getattr(torch, DTYPES[args.dtype]) if args.dtype else None
    extra = {"detector": None} if args.task == "pose" and args.no_detector else {}
    return pipeline(
        TASK_NAMES[args.task], args.size, checkpoint=args.checkpoint, device=args.device, dtype=dtype, **extra
    )


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    files, missing = find_images(args.inputs)
    for item in missing:
        print(f"skipped {item}: no such file or folder", file=sys.stderr)
    if not files:
        print(f"0 done, {len(missing)} failed in {time.perf_counter() - t0:.1f} s (no images found)")
        return 1
    try:
        save_opts = _save_options(args)
        pipe = _make_pipeline(args)
    except Sapiens2Error as err:  # weights missing, bad checkpoint, bad option: once, no traceback
        print(f"error: {err}", file=sys.stderr)
        return 1
    call_opts = _call_options(args, args.task)
    out_root = Path(args.out).expanduser()
    taken: set[str] = set()
    done, failed = 0, len(missing)
    seen_notices: set[str] = set()
    bar = _progress(len(files))
    try:
        for path in files:
            try:
                result = pipe(path, **call_opts)
                result.save(out_root / unique_folder(path.stem, taken), **save_opts)
            except Exception as err:  # one bad image (or an out-of-memory) never ends the batch
                failed += 1
                _say(bar, f"skipped {path}: {type(err).__name__}: {err}")
            else:
                done += 1
                for note in result.notices:
                    if note not in seen_notices:  # the same fallback for every image: say it once
                        seen_notices.add(note)
                        _say(bar, f"note ({path.name}): {note}")
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    print(f"{done} done, {failed} failed in {time.perf_counter() - t0:.1f} s (outputs in {out_root})")
    return 0 if done else 1


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
