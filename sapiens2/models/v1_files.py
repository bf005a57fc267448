"""Sapiens v1 files: recognising them by their bytes, finding them, loading them.

v1 is published as TorchScript (``*_torchscript.pt2``, fp32) and as bfloat16 ExportedPrograms
(``*_bfloat16.pt2``), one file per Hub repo ``facebook/sapiens-<task>-<size>-<format>``
(SAPIENS_V1_SPEC.md 1.3-1.4). Both carry a graph that runs when loaded and called, so such a
file is read only from those repos or from a path the operator gave (``load_model(checkpoint=)``,
``--checkpoint``, ``$SAPIENS2_TASK_CHECKPOINTS``, ``$SAPIENS2_CHECKPOINTS``); nothing a visitor
sends reaches here. A plain ``torch.save`` pickle is refused (never unpickled).
"""

from __future__ import annotations

import os
import re
import struct
import zipfile
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, WeightsUnavailableError
from ..zerogpu.entry import cuda_emulation
from ..zerogpu.loadguard import check_loading_allowed
from .v1_model import V1Model
from .weights import local_root
from .zoo import V1_RULES, V1_SIZE_OF_WIDTH, get_task, is_v1, v1_parts

SAFETENSORS, TORCHSCRIPT, EXPORTED = "safetensors", "torchscript", "bfloat16"
#: the only Hub repos a graph-carrying file is downloaded from
TRUSTED_REPO = re.compile(r"^facebook/sapiens-[a-z]+(-[a-z]+)?-(0\.3b|0\.6b|1b|2b)-(torchscript|bfloat16)$")


def file_format(path: str | os.PathLike) -> str:
    """What ``path`` holds, from its bytes: :data:`SAFETENSORS`, :data:`TORCHSCRIPT` (a
    ``torch.jit.save`` archive) or :data:`EXPORTED` (a ``torch.export.save`` archive).
    CheckpointError for anything else (a pickled ``torch.save`` file included)."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(9)
    except OSError as err:
        raise CheckpointError(f"Cannot read {path} ({err}).") from err
    if len(head) == 9 and head[8:9] == b"{" and struct.unpack("<Q", head[:8])[0] > 0:
        return SAFETENSORS
    if head[:4] == b"PK\x03\x04":
        names = _zip_names(path)
        if any(n.endswith(("/archive_format", "/serialized_exported_program.json")) for n in names):
            return EXPORTED
        if any("/code/__torch__" in n for n in names) and any(n.endswith("/constants.pkl") for n in names):
            return TORCHSCRIPT
        raise CheckpointError(
            f"{path} is a zip archive but neither a TorchScript nor an ExportedProgram file (a pickled "
            "torch.save checkpoint is not read: it could run any code). Use a Sapiens2 .safetensors "
            "file or a Sapiens v1 *_torchscript.pt2 / *_bfloat16.pt2 file."
        )
    raise CheckpointError(
        f"{path} is not a checkpoint this package reads: expected a .safetensors file, or a Sapiens v1 "
        "TorchScript or ExportedProgram (.pt2) archive."
    )


def _zip_names(path: Path) -> list[str]:
    try:
        with zipfile.ZipFile(path) as zf:
            return zf.namelist()
    except (zipfile.BadZipFile, OSError) as err:
        raise CheckpointError(f"{path} looks like a zip archive but cannot be read ({err}).") from err


def is_graph_checkpoint(checkpoint: str | os.PathLike | None) -> bool:
    """An explicit checkpoint that is a v1 graph: a file of that format, or a folder whose only
    checkpoint is a ``.pt2``."""
    if checkpoint is None:
        return False
    path = Path(checkpoint).expanduser()
    if path.is_dir():
        return bool(list(path.glob("*.pt2"))) and not list(path.glob("*.safetensors"))
    if not path.is_file():
        return False
    try:
        return file_format(path) != SAFETENSORS
    except CheckpointError:
        if zipfile.is_zipfile(path):
            raise  # a pickled torch.save archive: say so, never read it
        return False  # damaged or foreign: the safetensors reader names what is wrong


def wants_v1(size: str | None, checkpoint: str | os.PathLike | None) -> bool:
    """``load_model``'s one dispatch question: a v1 zoo size, or an explicit v1 file."""
    return is_v1(size) or is_graph_checkpoint(checkpoint)


def _one_pt2(folder: Path, fmt: str | None) -> Path:
    found = sorted(p for p in folder.glob("*.pt2") if fmt is None or p.name.endswith(f"_{fmt}.pt2"))
    if len(found) != 1:
        what = "no" if not found else f"{len(found)}"
        raise WeightsUnavailableError(f"{folder} holds {what} {fmt or 'v1'} .pt2 files; it must hold one.")
    return found[0]


def find_v1_file(task: str, size: str | None, checkpoint: str | os.PathLike | None = None) -> Path:
    """The v1 file for ``task``: ``checkpoint`` (a file, or a folder with one .pt2), else the lite
    layout's folder under ``$SAPIENS2_CHECKPOINTS`` (``TaskSpec.local_path``), else the zoo
    size's Hub repo, whose single ``*_<format>.pt2`` is found by listing the repo."""
    check_loading_allowed(f"the Sapiens v1 {task} weights")
    if checkpoint is not None:
        path = Path(checkpoint).expanduser()
        if path.is_dir():
            return _one_pt2(path, None)
        if not path.is_file():
            raise WeightsUnavailableError(f"Checkpoint {path} does not exist.")
        return path
    spec = get_task(task)
    spec.check_size(str(size))
    fmt = v1_parts(str(size))[1]
    root = local_root()
    if root is not None and (root / spec.local_path(str(size))).is_dir():
        return _one_pt2(root / spec.local_path(str(size)), fmt)
    return hub_file(spec.repo_id(str(size)), fmt)


def hub_file(repo_id: str, fmt: str) -> Path:
    """Download (or find in the cache) the one ``*_<fmt>.pt2`` of a trusted v1 repo."""
    if not TRUSTED_REPO.match(repo_id):
        raise CheckpointError(
            f"{repo_id} is not a Sapiens v1 repo: graph files come only from facebook/sapiens-*."
        )
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download

    try:
        names = [n for n in HfApi().list_repo_files(repo_id) if n.endswith(f"_{fmt}.pt2")]
    except Exception as err:  # offline, no such repo: the cache may still hold it
        try:
            folder = Path(snapshot_download(repo_id, allow_patterns=[f"*_{fmt}.pt2"], local_files_only=True))
            return _one_pt2(folder, fmt)
        except Exception:
            raise WeightsUnavailableError(
                f"Could not list https://huggingface.co/{repo_id} ({type(err).__name__}: {err}) and it "
                "is not in the Hugging Face cache. Go online, or download its .pt2 file yourself and "
                "pass it as the checkpoint (--checkpoint TASK=PATH).",
                plain="This Sapiens v1 model's weights are not on this server and cannot be downloaded now.",
            ) from err
    if len(names) != 1:
        raise WeightsUnavailableError(f"{repo_id} holds {len(names)} *_{fmt}.pt2 files; expected one.")
    return Path(hf_hub_download(repo_id, names[0]))


_NAMED_SIZE = re.compile(r"sapiens_(0\.3b|0\.6b|1b|2b)_")


def describe_v1_file(path: str | os.PathLike) -> dict[str, object]:
    """What a v1 file is, without loading its graph: its format (bytes) and its zoo size (the
    release's name ``sapiens_<size>_...``; None for a renamed file). Its task is not in its
    bytes' header: None (the loaded graph's output says it)."""
    path = Path(path).expanduser()
    if path.is_dir():
        path = _one_pt2(path, None)
    fmt = file_format(path)
    named = _NAMED_SIZE.search(path.name)
    size = f"v1-{named[1]}" + ("-bf16" if fmt == EXPORTED else "") if named else None
    return {"path": str(path), "task": None, "size": size, "generation": V1_RULES.generation, "format": fmt}


def load_v1_model(
    task: str,
    size: str | None,
    checkpoint: str | os.PathLike | None,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
) -> V1Model:
    """A ready v1 model. TorchScript runs in float32 as the v1 demos run it (a traced graph may
    hold float32 constants: it is not cast); an ExportedProgram in ``dtype`` (``load_model``'s
    default: bfloat16 on CUDA as the demos, float32 on a CPU, where bfloat16 is emulated and
    slower). The size is the zoo's, or read from the file's width (None: a custom file)."""
    spec = get_task(task)
    path = find_v1_file(task, size, checkpoint)
    size = size if is_v1(size) else None  # a Sapiens2 size given with a v1 file checks nothing
    fmt = file_format(path)
    if fmt == SAFETENSORS:
        raise CheckpointError(f"{path} is a safetensors file, not a Sapiens v1 .pt2 file; give no v1 size.")
    with cuda_emulation():
        graph, batch = _load_graph(path, fmt, device, dtype)
    found = _size_of(graph, fmt)
    if size is not None and found is not None and v1_parts(size)[0] != found:
        raise CheckpointError(f"{path} is a Sapiens v1 {found} model, not {size}.")
    if checkpoint is None:
        zoo_size = size  # found by its zoo size (lite layout or Hub)
    else:  # the file decides; a width of no published size is a custom model (as load_model's rule)
        zoo_size = f"v1-{found}" + ("-bf16" if fmt == EXPORTED else "") if found else None
    if zoo_size is not None and zoo_size not in spec.sizes:
        zoo_size = None  # a published width with no zoo row for this task: custom
    input_hw = spec.input_size(zoo_size or "v1-")
    exported = _exported_hw(graph) if fmt == EXPORTED else None
    if exported is not None and exported != tuple(input_hw):
        raise CheckpointError(
            f"{path} was exported for {exported[0]}x{exported[1]} inputs and runs at no other size; a Sapiens "
            f"v1 {task} model takes {input_hw[0]}x{input_hw[1]}."
        )
    model = V1Model(
        graph, task=task, output=spec.output, rules=V1_RULES, size=zoo_size, fmt=fmt,
        input_hw=input_hw, batch=batch,
    )  # fmt: skip
    model.checkpoint_path = str(path)
    model.keypoints = _keypoints_named(path.name) if spec.output == "PoseOutput" else None
    with cuda_emulation():
        return model.to(device).eval()


def _keypoints_named(name: str) -> int | None:
    """A pose file's keypoint count as the release names it (coco_wholebody 133, coco 17,
    goliath 308); None for another name (the heatmaps tell at the first forward)."""
    for part, count in (("coco_wholebody", 133), ("_coco_", 17), ("goliath", 308)):
        if part in name:
            return count
    return None


def _load_graph(
    path: Path, fmt: str, device: torch.device, dtype: torch.dtype
) -> tuple[torch.nn.Module, int | None]:
    try:
        if fmt == TORCHSCRIPT:
            # read onto the CPU, then move: jit.load's own map_location reaches the C++ CUDA
            # allocator, which ZeroGPU's emulation (Python-level torch modes) cannot stand in for
            return torch.jit.load(str(path), map_location="cpu").to(device).eval(), None
        program = torch.export.load(str(path))
        graph = program.module().to(device=device, dtype=dtype)
        return graph, _fixed_batch(graph)
    except torch.OutOfMemoryError:
        raise
    except Exception as err:
        raise CheckpointError(
            f"Could not load the {fmt} file {path} ({type(err).__name__}: {err}). It may be damaged or "
            f"made by a newer torch than {torch.__version__}; download it again."
        ) from err


def _input_shape(graph: torch.nn.Module) -> tuple[Any, ...]:
    """The shape an ExportedProgram's input was exported with (symbols where it is dynamic)."""
    for node in getattr(getattr(graph, "graph", None), "nodes", ()):
        if node.op == "placeholder" and "val" in node.meta:
            return tuple(node.meta["val"].shape)
    return ()


def _fixed_batch(graph: torch.nn.Module) -> int | None:
    """The batch an ExportedProgram was exported with when it is static (None: dynamic)."""
    shape = _input_shape(graph)
    return int(shape[0]) if shape and isinstance(shape[0], int) else None


def _exported_hw(graph: torch.nn.Module) -> tuple[int, int] | None:
    """The (H, W) an ExportedProgram was exported with when both are static: its shape guards
    refuse any other input (None: dynamic, or not known)."""
    hw = _input_shape(graph)[-2:]
    return (int(hw[0]), int(hw[1])) if len(hw) == 2 and all(isinstance(v, int) for v in hw) else None


def _size_of(graph: torch.nn.Module, fmt: str) -> str | None:
    """The v1 size of a graph, from its patch embedding's width (3 -> C, 16 x 16)."""
    for _, p in graph.named_parameters():
        if p.ndim == 4 and p.shape[1] == 3 and tuple(p.shape[2:]) == (16, 16):
            return V1_SIZE_OF_WIDTH.get(int(p.shape[0]))
    return None


__all__ = [
    "EXPORTED",
    "SAFETENSORS",
    "TORCHSCRIPT",
    "file_format",
    "find_v1_file",
    "load_v1_model",
    "wants_v1",
]
