"""``load_model``: find a checkpoint, build the model it describes on the meta device, load it.

Resolution order (see ``sapiens2.models.weights.find_weights``): an explicit ``checkpoint`` (file or
folder) -> ``$SAPIENS2_CHECKPOINTS/<task>/sapiens2_<size>_<task>.safetensors`` -> the Hugging Face
Hub cache (the release file name, then ``model.safetensors``). Only safetensors are read, and
exported ``.onnx`` files (run by ONNX Runtime: ``sapiens2.models.onnx_runtime``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn
from tqdm import tqdm

from ..errors import CheckpointError, DeviceError, OptionError, WeightsUnavailableError
from ..runtime.devices import default_device
from ..zerogpu.entry import cuda_emulation
from .nn.backbone import fuse_qkv_in_state
from .nn.model import IGNORED_KEYS, ArchInfo, arch_from_shapes, build_from_shapes, expected_keys
from .onnx_runtime import is_onnx
from .v1_files import describe_v1_file, is_graph_checkpoint, load_v1_model, wants_v1
from .weights import ENV_VAR, _pick_in_folder, find_weights, local_root, read_header
from .zoo import get_task

_DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}
#: Bytes per element of the safetensors dtype names (for the progress total; unknown names count 4).
_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "BF16": 2,
    "F16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}


def load_model(
    task: str,
    size: str | None = None,
    *,
    checkpoint: str | os.PathLike | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    rope_dtype: torch.dtype | None = None,
) -> nn.Module:
    """A ready ``eval()`` Sapiens2 model for ``task``; ``model(pixel_values)`` returns its output dataclass.

    ``size``: a zoo size ("0.4b", "1b", ...); with an explicit ``checkpoint`` the file decides the
    model and a size only checks it (:func:`checkpoint_size_conflict`); with neither, the zoo's default size
    for the device. ``device`` defaults to CUDA when available; ``dtype`` (bf16 on CUDA, fp32
    elsewhere) is the backbone's and the heads' trunk; each head's final projection and the
    pointmap scale branch stay float32 (``nn.heads``). ``rope_dtype``: None = the release's
    bfloat16 RoPE, ``torch.float32`` = transformers'. An ``.onnx`` checkpoint runs in ONNX Runtime
    (``models.onnx_runtime``) behind the same interface.
    """
    if is_onnx(checkpoint):
        return _load_onnx(task, size, checkpoint, device)
    spec = get_task(task)
    if size is not None:
        spec.check_size(size)
    dev = torch.device(device) if device is not None else default_device()
    dtype = _parse_dtype(dtype, dev)
    if rope_dtype not in (None, torch.float32, torch.bfloat16):
        raise OptionError(
            f"rope_dtype must be None (release: bfloat16), torch.float32 or torch.bfloat16, got {rope_dtype}."
        )
    if checkpoint is None and size is None:
        size = spec.default_size(dev.type == "cuda")
    if wants_v1(size, checkpoint):  # a Sapiens v1 TorchScript / ExportedProgram file (models/v1_files.py)
        return load_v1_model(task, size, checkpoint, dev, dtype)

    path = resolve_checkpoint(task, size, checkpoint)
    shapes = read_header(path)
    try:
        model, info = build_from_shapes(shapes, device="meta", rope_dtype=rope_dtype)
    except CheckpointError as err:
        raise CheckpointError(f"{path}: {err}") from None
    _check_identity(path, info, task, size, explicit=checkpoint is not None)
    _check_keys(path, model, shapes)
    with cuda_emulation():  # ZeroGPU: a request thread moves to emulated CUDA too
        _load_into(model, path, dev, dtype)
    model.checkpoint_path = str(path)  # where the weights came from (shown in UIs and metadata)
    return model.eval()


def _load_onnx(
    task: str, size: str | None, path: str | os.PathLike, device: str | torch.device | None
) -> nn.Module:
    """An exported network behind the same model interface (``models.onnx_runtime``); a size
    only checks the file, as for any explicit checkpoint. ``dtype`` is not applied: the file's
    precision is its own (export with --fp16 or --int8); its input and outputs are float32."""
    from .onnx_runtime import load_onnx

    if size is not None:
        get_task(task).check_size(size)
    model = load_onnx(task, path, device)
    conflict = checkpoint_size_conflict(model.size, size)
    if conflict is not None:
        raise CheckpointError(f"{path} is size {model.size}, not {size}. {conflict}")
    return model


def describe_checkpoint(path: str | os.PathLike) -> dict[str, object]:
    """What a checkpoint holds (task, zoo size or None, widths, depths, heads, KV layout, registers,
    head widths), read from the safetensors header only."""
    if is_onnx(path):
        from .onnx_runtime import describe_onnx

        return describe_onnx(path)
    path = Path(path)
    if is_graph_checkpoint(path):  # a v1 graph: what its name and bytes say, without loading it
        return describe_v1_file(path)
    if path.is_dir():
        path = _pick_in_folder(path, ())
    try:
        return {"path": str(path), **arch_from_shapes(read_header(path)).describe()}
    except CheckpointError as err:
        if str(path) in str(err):
            raise
        raise CheckpointError(f"{path}: {err}") from None


def _parse_dtype(dtype: torch.dtype | str | None, dev: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if dev.type == "cuda" else torch.float32  # bf16: how the models were trained
    if isinstance(dtype, str):
        if dtype.lower() not in _DTYPES:
            raise OptionError(f"Unknown dtype {dtype!r}; choose one of: {', '.join(_DTYPES)}.")
        return _DTYPES[dtype.lower()]
    if dtype not in _DTYPES.values():
        raise OptionError(f"dtype must be float32, bfloat16 or float16, got {dtype}.")
    return dtype


def resolve_checkpoint(
    task: str, size: str | None = None, checkpoint: str | os.PathLike | None = None
) -> Path:
    """The weight file ``load_model`` would use: explicit ``checkpoint`` -> ``$SAPIENS2_CHECKPOINTS``
    (release layout) -> Hugging Face Hub cache/download. Without a checkpoint a size is required."""
    spec = get_task(task)
    if size is None and checkpoint is None:
        raise OptionError(f"Give a size ({', '.join(spec.sizes)}) or a checkpoint for {task}.")
    if size is None:  # explicit checkpoint, any size: the names below are only used to pick in a folder
        return find_weights(f"facebook/sapiens2-{spec.release}", (), spec.release, checkpoint)
    if not spec.on_hub and checkpoint is None:
        root = local_root()
        if root is None or not (root / spec.local_path(size)).is_file():
            raise WeightsUnavailableError(
                f"The {spec.name} weights are not on the Hugging Face Hub: pass a checkpoint "
                f"(--checkpoint {spec.name}=PATH) or put it at ${ENV_VAR}/{spec.local_path(size)}."
            )
    return find_weights(spec.repo_id(size), (spec.filename(size),), spec.local_path(size), checkpoint)


def _what(info: ArchInfo) -> str:
    b = info.backbone
    size = f"size {info.size}" if info.size else "a custom size"
    return (
        f"a Sapiens2 {info.task} checkpoint, {size} (hidden {b.hidden}, {b.layers} layers, {b.heads} heads)"
    )


def checkpoint_size_conflict(file_size: str | None, size: str | None) -> str | None:
    """The one rule for a size given together with an explicit checkpoint, shared by the Python
    API, the command line and the app: the file decides the model, and the size only checks it.

    A file of a published size (its shapes match 0.4b, 1b ...) must be that size; a file of no
    published size (other widths, the tests' tiny models) has nothing to check and takes any size
    (results are labelled "custom"). No size means the file's own. Returns what to do about a
    conflict, or None.
    """
    if size in (None, "") or file_size is None or size == file_size:
        return None
    return (
        f"With a checkpoint the size only checks the file: choose size {file_size} or no size to use "
        f"this file, or point to a {size} file."
    )


def _check_identity(path: Path, info: ArchInfo, task: str, size: str | None, *, explicit: bool) -> None:
    if info.task != task:
        raise CheckpointError(
            f"{path} is {_what(info)}, not a {task} checkpoint: use it as the {info.task} "
            f"checkpoint, or give a {task} file."
        )
    if size is None or info.size == size:
        return
    if not explicit:  # found by size (local root or Hub): a file of another shape is a wrong file
        raise CheckpointError(
            f"{path} is {_what(info)}, not size {size}: the file found for size {size} is not one. "
            "Delete it and download it again, or pass the file you meant as the checkpoint."
        )
    conflict = checkpoint_size_conflict(info.size, size)
    if conflict is not None:
        raise CheckpointError(f"{path} is {_what(info)}, not size {size}. {conflict}")


def _few(keys: list[str], n: int = 5) -> str:
    more = f" and {len(keys) - n} more" if len(keys) > n else ""
    return ", ".join(keys[:n]) + more


def _check_keys(path: Path, model: nn.Module, shapes: dict[str, tuple[int, ...]]) -> None:
    """Strict check by the checkpoint's own key names, with shapes, before any tensor is read."""
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    have = {k: v for k, v in shapes.items() if k not in IGNORED_KEYS}
    missing = sorted(set(want) - set(have))
    unexpected = sorted(set(have) - set(want))
    wrong = sorted(k for k in set(want) & set(have) if want[k] != tuple(have[k]))
    problems = []
    if missing:
        problems.append(f"missing keys: {_few(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {_few(unexpected)}")
    if wrong:
        problems.append(
            "wrong shapes: " + _few([f"{k} {tuple(have[k])} (expected {want[k]})" for k in wrong])
        )
    if problems:
        raise CheckpointError(
            f"{path} does not match the Sapiens2 layout ({'; '.join(problems)}). "
            "It may be damaged or from another code base; download the release file again."
        )


def _load_into(model: nn.Module, path: Path, dev: torch.device, dtype: torch.dtype) -> None:
    """Read each tensor on the CPU (safetensors memory-maps the file), cast it, move it with
    ``.to(dev)`` and assign the lot into the meta-built model.

    One tensor is in flight at a time, so there is never a second full copy. Nothing asks
    safetensors for device memory: under ZeroGPU the server process only emulates CUDA, and
    safetensors' direct CUDA reads go through pinned host memory, which needs a real CUDA context.
    """
    keys = expected_keys(model)
    fp32 = model.fp32_keys() if hasattr(model, "fp32_keys") else set()  # heads' final layers
    state: dict[str, torch.Tensor] = {}
    with _open_checkpoint(path) as fh, _progress(fh, keys, path) as bar:
        for key in keys:
            tensor = _read_tensor(fh, key, path)
            state[key] = _to_device(tensor, dev, torch.float32 if key in fp32 else dtype, path)
            bar.update(tensor.numel() * tensor.element_size())
    fuse_qkv_in_state(model, state)
    model.load_state_dict(state, strict=True, assign=True)
    still_meta = [n for n, p in model.named_parameters() if p.is_meta]
    if still_meta:  # cannot happen after a strict load; guards against silent garbage
        raise CheckpointError(f"{path}: parameters left unloaded: {_few(still_meta)}.")


@contextmanager
def _open_checkpoint(path: Path) -> Iterator[Any]:
    try:
        fh = safe_open(str(path), framework="pt", device="cpu")
    except Exception as err:  # safetensors raises its own error type for damaged files
        raise _damaged(path, err) from err
    with fh:
        yield fh


def _progress(fh: Any, keys: list[str], path: Path) -> Any:
    """A byte-counting tqdm bar (the CLI shows it; ``gr.Progress(track_tqdm=True)`` relays it)."""
    total = 0
    for key in keys:
        info = fh.get_slice(key)
        total += math.prod(info.get_shape()) * _DTYPE_BYTES.get(info.get_dtype(), 4)
    return tqdm(
        total=total, unit="B", unit_scale=True, desc=f"Loading {path.name}", leave=False, delay=0.5
    )  # a load that ends in under half a second leaves no bar behind


def _read_tensor(fh: Any, key: str, path: Path) -> torch.Tensor:
    try:
        return fh.get_tensor(key)
    except Exception as err:
        raise _damaged(path, err) from err


def _to_device(tensor: torch.Tensor, dev: torch.device, dtype: torch.dtype, path: Path) -> torch.Tensor:
    """Cast on the CPU (a smaller transfer when narrowing), then move; the file is fine if this fails."""
    try:
        if tensor.is_floating_point() and tensor.dtype != dtype:
            tensor = tensor.to(dtype)
        return tensor.to(dev)
    except torch.OutOfMemoryError:
        raise  # the serving layer turns this into its out-of-memory advice
    except (RuntimeError, AssertionError) as err:  # a CPU-only torch asserts on CUDA
        raise DeviceError(
            f"The weights in {path} read fine, but moving them to {dev} failed ({err}). The file "
            f"is not the problem: check that {dev} is available to this process (for CUDA: a GPU, "
            "a CUDA build of torch, and under ZeroGPU a server process that has not touched CUDA "
            "itself), or load on another device."
        ) from err


def _damaged(path: Path, err: BaseException) -> CheckpointError:
    return CheckpointError(
        f"Could not read the tensors of {path} ({err}): the file is damaged or incomplete. "
        "Delete it and download it again (for the Hub cache: `hf cache delete`, or remove the file)."
    )
