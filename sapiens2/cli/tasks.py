"""The per-task commands: ``sapiens2 TASK INPUT... --size SIZE --out DIR [task options]``.

One sub-command per registered task; its flags are generated from the task's declared options
(``python -m sapiens2 pose --help`` lists them). Images, clips and folders (searched recursively)
in; per input, one subfolder of DIR holding the same files the app offers as downloads. A clip
(MP4/MOV/WebM by its first bytes, or an animated GIF) of a video task goes through
``sapiens2.video`` (``--stride``, ``--max-frames``, ``--batch``; pose: ``--detect-every``,
``--no-smoothing``): the rendered WebM plus the task's per-frame files. A bad file is reported and
skipped; the batch goes on. Exit code 0 when at least one input succeeded, 1 otherwise (2 for a
malformed command line).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import OptionError, Sapiens2Error
from ..inputs.intake import IMAGE_EXTENSIONS
from ..models.checkpoints import CHECKPOINT_HELP, Checkpoints
from ..tasks import registry
from ..tasks.options import Option

VIDEO_EXTENSIONS = frozenset({".mp4", ".m4v", ".mov", ".webm", ".mkv"})
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}  # fmt: skip


def flag(opt: Option) -> str:
    return "--" + opt.name.replace("_", "-")


def add_option(parser: argparse.ArgumentParser, task: registry.Task, opt: Option) -> None:
    """One option as flags; unset flags stay None (the option's default)."""
    flags = [flag(opt), *task.cli_aliases.get(opt.name, ())]
    kwargs: dict[str, Any] = {"dest": opt.name, "default": None, "help": opt.describe(gpu=False)}
    if opt.kind == "bool":
        kwargs["action"] = argparse.BooleanOptionalAction
    elif opt.kind in ("float", "int"):
        kwargs.update(type=float if opt.kind == "float" else int, metavar="N")
    elif opt.kind == "choice":
        kwargs["choices"] = opt.choices
    elif opt.kind == "classes":
        kwargs.update(nargs="+", metavar="CLASS")
    elif opt.kind == "color":
        kwargs["metavar"] = "COLOUR"
    elif opt.kind == "image":
        kwargs["metavar"] = "FILE"
    parser.add_argument(*flags, **kwargs)


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "inputs", nargs="+", metavar="INPUT", help="image files or folders (searched recursively)"
    )
    parser.add_argument("--out", "-o", default="sapiens2_out", help="output folder (default: %(default)s)")
    parser.add_argument("--size", help="model size (default: the task's default for the device)")
    parser.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    parser.add_argument(
        "--dtype", choices=sorted(DTYPES), help="weights dtype (default: bfloat16 on GPU, float32 on CPU)"
    )
    add_checkpoint(parser)
    add_runtime(parser)


def add_checkpoint(parser: argparse.ArgumentParser) -> None:
    """``--checkpoint [TASK=]PATH``, repeatable: the same flag and help in every command."""
    parser.add_argument(
        "--checkpoint", action="append", default=[], metavar="[TASK=]PATH", help=CHECKPOINT_HELP
    )


def task_names() -> str:
    """Every task a command takes, in tab order: the one list of the help texts and errors."""
    return ", ".join(registry.declared())


def add_video(parser: argparse.ArgumentParser, task: registry.Task) -> None:
    """Flags that apply to clips (video tasks only)."""
    from ..video.reader import VideoLimits

    top = VideoLimits().max_frames
    group = parser.add_argument_group("clips (MP4, MOV, WebM, animated GIF)")
    group.add_argument(
        "--stride", type=int, default=1, metavar="N", help="process every N-th frame (default 1)"
    )
    group.add_argument(
        "--max-frames", type=int, default=top, metavar="N",
        help=f"error if more than N frames would be processed (default {top})",
    )  # fmt: skip
    group.add_argument("--batch", type=int, default=8, metavar="N", help="frames per forward (default 8)")
    if task.video is not None and task.video.detect:  # detector + tracker flags
        group.add_argument(
            "--detect-every", type=int, default=5, metavar="K",
            help="run the person detector on every K-th processed frame, track in between (default 5)",
        )  # fmt: skip
        group.add_argument(
            "--no-smoothing", action="store_true", help="do not smooth keypoints over time (One-Euro)"
        )


def add_commands(sub: argparse._SubParsersAction) -> None:
    """One sub-command per declared task; its flags from the task's options."""
    shown = registry.all_tasks(_env_checkpoints())
    for task in registry.declared().values():
        # every task is listed; one without weights here (albedo: not on the Hub) says what it needs
        summary = (
            task.summary if task.name in shown else f"{task.summary} Needs --checkpoint (not on the Hub)."
        )
        tp = sub.add_parser(task.name, description=summary, help=summary)
        add_common(tp)
        if task.video is not None:
            add_video(tp, task)
        for opt in task.options:
            add_option(tp, task, opt)
        for switch in task.cli_switches:
            tp.add_argument(switch.flag, action="store_true", help=switch.help)


def _env_checkpoints() -> Checkpoints:
    """``$SAPIENS2_TASK_CHECKPOINTS``, which lists a task that is not on the Hub in the help too
    (a malformed value lists nothing more: each command takes its own ``--checkpoint``)."""
    try:
        return Checkpoints.from_env()
    except OptionError:
        return Checkpoints()


def is_clip(path: Path) -> bool:
    """A video by its first bytes (MP4/MOV/WebM), or a GIF with more than one frame."""
    from ..video.reader import sniff_video

    kind = sniff_video(path)
    if kind != "gif":
        return kind is not None
    from PIL import Image

    try:
        with Image.open(path) as im:
            return getattr(im, "n_frames", 1) > 1
    except Exception:  # unreadable: the image reader will say why
        return False


def find_images(inputs: Iterable[str]) -> tuple[list[Path], list[str]]:
    """Files to process (explicit paths always; folders: regular files with image or video
    extensions, recursive, sorted) and the inputs that do not exist.

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
                sorted(
                    f
                    for f in path.rglob("*")
                    if f.is_file() and f.suffix.lower() in IMAGE_EXTENSIONS | VIDEO_EXTENSIONS
                )
            )
        elif path.exists():
            files.append(path)
        else:
            missing.append(item)
    return list(dict.fromkeys(files)), missing


def unique_folder(stem: str, taken: set[str]) -> str:
    """A folder name for one image's outputs: its sanitised stem, suffixed -2, -3 ... when taken."""
    from ..outputs.export import safe_stem  # the same rule as the exported file names

    base = safe_stem(stem)
    name, k = base, 2
    while name.lower() in taken:
        name, k = f"{base}-{k}", k + 1
    taken.add(name.lower())
    return name


def request_options(args: argparse.Namespace, task: registry.Task) -> tuple[dict[str, Any], dict[str, Any]]:
    """The task's options from the flags, checked like any request (messages name the flags).
    A colour option given an image file's path uses the task's image option instead (matting's
    ``--background`` takes either)."""
    values = {o.name: getattr(args, o.name) for o in task.options}
    image_opt = next((o for o in task.options if o.kind == "image"), None)
    for opt in task.options:
        value = values[opt.name]
        if (
            opt.kind == "color"
            and image_opt
            and isinstance(value, str)
            and Path(value).expanduser().is_file()
        ):
            values[opt.name], values[image_opt.name] = None, str(Path(value).expanduser())
    return task.split(values, gpu=_on_gpu(args.device), where=flag)


def _on_gpu(device: str | None) -> bool:
    if device:
        return device.startswith("cuda")
    import torch

    return torch.cuda.is_available()


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


def add_runtime(parser: argparse.ArgumentParser) -> None:
    """``--runtime`` (the task commands, ``batch``): torch, or the model exported to ONNX once."""
    from ..models.onnx_cache import RUNTIMES

    parser.add_argument(
        "--runtime",
        choices=tuple(RUNTIMES),
        default="torch",
        help="torch (default), or onnxruntime / onnxruntime-int8: the model is exported to ONNX the "
        "first time (cached beside the Hugging Face cache) and run by ONNX Runtime (docs/ONNX.md)",
    )


def make_pipeline(args: argparse.Namespace, task: registry.Task) -> Any:
    import torch

    dtype = getattr(torch, DTYPES[args.dtype]) if args.dtype else None
    extra: dict[str, Any] = {}
    for switch in task.cli_switches:
        if getattr(args, switch.flag.lstrip("-").replace("-", "_")):
            extra.update(switch.kwargs)
    checkpoint = _checkpoint(args, task)
    runtime = getattr(args, "runtime", None)
    pipe = task.pipeline(
        args.size, checkpoint=checkpoint, device=args.device, dtype=dtype, runtime=runtime, **extra
    )
    if checkpoint and args.size and getattr(pipe, "size", args.size) is None:  # say what ran
        print(
            f"note: {checkpoint} has no published size; it runs as 'custom' (--size {args.size} "
            "is not checked)",
            file=sys.stderr,
        )
    return pipe


def _checkpoint(args: argparse.Namespace, task: registry.Task) -> Path | None:
    """The command's one ``--checkpoint``, as PATH or TASK=PATH (TASK must be this command's)."""
    if len(args.checkpoint) > 1:
        raise OptionError(f"{task.name} takes one --checkpoint; got {len(args.checkpoint)}.")
    return Checkpoints.parse(args.checkpoint, [task.name]).get(task.name)


def run_images(args: argparse.Namespace, task: registry.Task, files: list[Path], failed: int) -> int:
    """Every image through one pipeline; one subfolder of outputs per image."""
    from ..serving import present

    t0 = time.perf_counter()
    try:
        infer_opts, render_opts = request_options(args, task)
        pipe = make_pipeline(args, task)
    except Sapiens2Error as err:  # weights missing, bad checkpoint, bad option: once, no traceback
        print(f"error: {err}", file=sys.stderr)
        return 1
    out_root = Path(args.out).expanduser()
    taken: set[str] = set()
    done, seen = 0, set()
    bar = _progress(len(files))
    try:
        for path in files:
            try:
                result = pipe(path, **infer_opts)
                present(task, result, out_root / unique_folder(path.stem, taken), **render_opts)
            except Exception as err:  # one bad image (or an out-of-memory) never ends the batch
                failed += 1
                _say(bar, f"skipped {path}: {type(err).__name__}: {err}")
            else:
                done += 1
                for note in (n for n in result.notices if n not in seen):  # say each fallback once
                    seen.add(note)
                    _say(bar, f"note ({path.name}): {note}")
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    print(f"{done} done, {failed} failed in {time.perf_counter() - t0:.1f} s (outputs in {out_root})")
    return 0 if done else 1


def run_clips(args: argparse.Namespace, task: registry.Task, clips: list[Path]) -> tuple[int, int]:
    """Every clip through the task's pipeline in batches; (done, failed)."""
    from ..serving.video import video_render_options
    from ..video import TrackingOptions, VideoLimits, run_video

    try:
        infer_opts, render_opts = request_options(args, task)
        tracking = TrackingOptions(
            detect_every=getattr(args, "detect_every", 5), smoothing=not getattr(args, "no_smoothing", False)
        )
        limits = VideoLimits(max_frames=args.max_frames)
        pipe = make_pipeline(args, task)
    except Sapiens2Error as err:
        print(f"error: {err}", file=sys.stderr)
        return 0, len(clips)
    out_root, taken = Path(args.out).expanduser(), set()
    done = failed = 0
    for path in clips:
        bar = _progress(0)
        if bar is not None:
            bar.unit, bar.desc = "frame", path.name

        def progress(n: int, planned: int | None, bar: Any = bar) -> None:
            if bar is not None:
                bar.total = planned
                bar.update(n - bar.n)

        try:
            result = run_video(
                pipe, path, out_root / unique_folder(path.stem, taken), task=task, stride=args.stride,
                limits=limits, batch_size=args.batch, options=infer_opts,
                render_options=video_render_options(task, render_opts), tracking=tracking, progress=progress,
            )  # fmt: skip
        except Exception as err:  # one bad clip never ends the batch
            failed += 1
            _say(bar, f"skipped {path}: {type(err).__name__}: {err}")
        else:
            done += 1
            for note in result.notices:
                _say(bar, f"note ({path.name}): {note}")
            _say(bar, f"{path.name}: {result.frames} frames at {result.fps:.3g} fps -> {result.video}")
        finally:
            if bar is not None:
                bar.close()
    return done, failed


def run(args: argparse.Namespace) -> int:
    task = registry.get(args.task)
    files, missing = find_images(args.inputs)
    for item in missing:
        print(f"skipped {item}: no such file or folder", file=sys.stderr)
    clips = [f for f in files if task.video is not None and is_clip(f)]
    images = [f for f in files if f not in clips]
    if not files:
        print(f"0 done, {len(missing)} failed in 0.0 s (no images found)")
        return 1
    if not clips:
        return run_images(args, task, images, len(missing))
    t0 = time.perf_counter()
    done, failed = run_clips(args, task, clips)
    if images:
        return 0 if run_images(args, task, images, len(missing) + failed) == 0 or done else 1
    print(
        f"{done} done, {failed + len(missing)} failed in {time.perf_counter() - t0:.1f} s (outputs in {args.out})"
    )
    return 0 if done else 1
