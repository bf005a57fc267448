"""Tiny random Sapiens2 checkpoints written by the ``transformers`` reference (test-only).

Each checkpoint is a real ``transformers`` model (``Sapiens2Config`` at a tiny width) saved with
``save_pretrained``, so the folder holds the Hub's own key names in ``model.safetensors`` plus a
``config.json``. Layer *counts* of the heads follow the release (transformers' key renaming only
knows the release's Sequential indices); only widths are tiny. Output channel counts stay real
(308 heatmaps, 29 classes, ...) so pipelines built on these behave like the real ones.

Other test modules import this file: keep ``make_tiny_checkpoint``'s signature stable.
"""

from __future__ import annotations

import copy
import hashlib
import shutil
from pathlib import Path
from typing import Any

import torch

TASK_NAMES = ("pose", "seg", "normal", "pointmap", "matting", "pretrain")

#: The tiny backbone: 4 layers, the middle two GQA (4 query heads, 2 kv heads), head_dim 16.
TINY_BACKBONE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_attention_heads": 2,
    "num_first_full_attention_layers": 1,
    "num_last_full_attention_layers": 1,
    "num_register_tokens": 8,
    # The network input of every task. It only matters for the pointmap scale branch, whose MLP
    # input width is sized from it (grid 64x48 -> three stride-2 convs -> 8x6).
    "image_size": (1024, 768),
}

_PIXEL_SHUFFLE = {"use_pixel_shuffle": True, "upsample_kernel_size": 3, "conv_kernel_size": 3}

#: Per task: transformers model class name, number of outputs, head config (release layer counts).
TINY_TASKS: dict[str, tuple[str, int | None, dict[str, Any] | None]] = {
    "pose": (
        "Sapiens2ForPoseEstimation",
        308,
        {"upsample_out_channels": [16, 8], "conv_out_channels": [8, 8, 8]},
    ),
    "seg": (
        "Sapiens2ForSemanticSegmentation",
        29,
        {"upsample_out_channels": [16, 8, 4, 4], "conv_out_channels": [4, 4]},
    ),
    "normal": (
        "Sapiens2ForNormalEstimation",
        3,
        {**_PIXEL_SHUFFLE, "upsample_out_channels": [16, 8, 4, 4], "conv_out_channels": [4, 4, 4]},
    ),
    "pointmap": (
        "Sapiens2ForPointmapEstimation",
        3,
        {
            **_PIXEL_SHUFFLE,
            "upsample_out_channels": [16, 8, 4, 4],
            "conv_out_channels": [4, 4, 4],
            "scale_conv_out_channels": [16, 8, 4],
            "scale_final_hidden_sizes": [16, 8],
        },
    ),
    "matting": (
        "Sapiens2ForImageMatting",
        4,
        {**_PIXEL_SHUFFLE, "upsample_out_channels": [16, 8, 4, 4], "conv_out_channels": [4, 4, 4]},
    ),
    "pretrain": ("Sapiens2Model", None, None),
}


def tiny_config(task: str, **overrides: Any):
    """The ``Sapiens2Config`` used for ``task``; ``overrides`` replace top-level config fields,
    and a ``head_config`` dict override is merged into the task's head settings."""
    from transformers import Sapiens2Config

    if task not in TINY_TASKS:
        raise ValueError(f"unknown task {task!r}; one of {', '.join(TINY_TASKS)}")
    _, num_labels, head = TINY_TASKS[task]
    kwargs: dict[str, Any] = dict(TINY_BACKBONE)
    head_over = overrides.pop("head_config", None) or {}
    kwargs.update(overrides)
    if head is not None:
        kwargs["head_config"] = {**copy.deepcopy(head), **head_over}
    if num_labels is not None:
        kwargs["num_labels"] = num_labels
    return Sapiens2Config(**kwargs)


@torch.no_grad()
def _perturb(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Make every parameter non-trivial: transformers initialises layer scale and norms to 1 and
    biases to 0, which would hide a mix-up of those tensors in a parity test."""
    for name, param in model.named_parameters():
        if name.endswith("lambda1"):
            param.copy_(torch.rand(param.shape, generator=gen) + 0.5)  # layer scale in [0.5, 1.5)
        elif "norm" in name and name.endswith("weight"):
            param.copy_(1.0 + 0.2 * torch.randn(param.shape, generator=gen))
        elif name.endswith("bias"):
            param.copy_(0.05 * torch.randn(param.shape, generator=gen))
        elif name.endswith(("cls_token", "register_tokens")):
            param.copy_(torch.randn(param.shape, generator=gen))


def make_tiny_model(task: str, *, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    """The transformers reference model for ``task`` (eval mode, fp32, random weights)."""
    import transformers

    config = tiny_config(task, **overrides)
    cls_name = TINY_TASKS[task][0]
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(config)
    _perturb(model, torch.Generator().manual_seed(seed + 1))
    return model.eval()


def make_tiny_checkpoint(task: str, folder: Path, *, seed: int = 0, **overrides: Any) -> Path:
    """Write a tiny random checkpoint for ``task`` into ``folder`` (``model.safetensors`` +
    ``config.json``, via transformers' ``save_pretrained``) and return ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    make_tiny_model(task, seed=seed, **overrides).save_pretrained(folder)
    return folder


def place_release_layout(checkpoint: Path, root: Path, task: str, size: str) -> Path:
    """Copy a tiny checkpoint to ``root/<task>/sapiens2_<size>_<task>.safetensors`` (the layout
    ``$SAPIENS2_CHECKPOINTS`` expects) and return the new file."""
    from sapiens2.zoo import get_task

    source = _weights_file(checkpoint)
    dest = Path(root) / get_task(task).local_path(size)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, dest)
    return dest


def place_hf_cache(
    checkpoint: Path, cache_dir: Path, task: str, size: str, filename: str | None = None
) -> Path:
    """Put a tiny checkpoint into a Hugging Face cache at ``cache_dir`` in the Hub's layout:
    ``models--facebook--sapiens2-<task>-<size>/{blobs,refs/main,snapshots/<commit>/<filename>}``.

    ``filename`` defaults to the release's file name; pass ``"model.safetensors"`` for the
    transformers copy. Returns the snapshot path of the file.
    """
    from sapiens2.zoo import get_task

    spec = get_task(task)
    repo_id = spec.repo_id(size)
    filename = filename or spec.filename(size)
    source = _weights_file(checkpoint)
    data = source.read_bytes()
    repo = Path(cache_dir) / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(repo_id.encode()).hexdigest()  # any 40-hex id works as a revision
    blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit / filename
    snap.parent.mkdir(parents=True, exist_ok=True)
    if snap.exists() or snap.is_symlink():
        snap.unlink()
    try:  # the real cache links snapshots to blobs; fall back to a copy where links fail
        snap.symlink_to(Path("..") / ".." / "blobs" / blob.name)
    except OSError:
        shutil.copyfile(blob, snap)
    return snap


def _weights_file(checkpoint: Path) -> Path:
    checkpoint = Path(checkpoint)
    return checkpoint / "model.safetensors" if checkpoint.is_dir() else checkpoint


def zoo_shapes(task: str, size: str) -> dict[str, tuple[int, ...]]:
    """Tensor shapes of a release checkpoint of ``task``/``size`` (the spec's widths), built on the
    meta device without memory: for size detection and error-message tests at real sizes."""
    from sapiens2.nn.backbone import BackboneConfig
    from sapiens2.nn.heads import HeadConfig
    from sapiens2.nn.model import ArchInfo, Sapiens2FeatureModel, Sapiens2TaskModel
    from sapiens2.zoo import ARCHS

    a = ARCHS[size]
    kv = tuple(a.heads if (i < 8 or i >= a.layers - 8) else a.heads // 2 for i in range(a.layers))
    backbone = BackboneConfig(
        hidden=a.hidden,
        heads=a.heads,
        head_dim=a.head_dim,
        kv_heads=kv,
        ffn_hidden=a.ffn_hidden,
        tokenizer_layers=a.tokenizer_layers,
        tokenizer_ffn_hidden=4 * a.hidden,
    )
    k3 = lambda chans: tuple((c, 3) for c in chans)  # noqa: E731
    k1 = lambda chans: tuple((c, 1) for c in chans)  # noqa: E731
    big = size == "5b"
    heads = {
        "pose": HeadConfig(
            "deconv",
            "conv_pose",
            a.hidden,
            308,
            upsample=tuple((c, 4) for c in ((1536, 1024) if size == "1b" else (1024, 768))),
            conv=k1((768, 512, 256) if size == "1b" else (512, 512, 256)),
        ),
        "seg": HeadConfig(
            "deconv",
            "conv_seg",
            a.hidden,
            29,
            upsample=tuple((c, 4) for c in (512, 256, 128, 64)),
            conv=k1((64, 64)),
        ),
        "normal": HeadConfig(
            "pixel_shuffle",
            "conv_normal",
            a.hidden,
            3,
            input_conv=(a.hidden, 3),
            upsample=k3((1536, 768, 512, 256) if big else (768, 512, 256, 128)),
            conv=k3((128, 64, 32) if big else (64, 32, 16)),
        ),
        "pointmap": HeadConfig(
            "pointmap",
            "conv_pointmap",
            a.hidden,
            3,
            input_conv=(a.hidden, 3),
            upsample=k3((1536, 768, 768, 768) if big else (1536, 768, 512, 256)),
            conv=k3((128, 64, 32) if big else (64, 32, 16)),
            scale_conv=k1((1536, 512, 128)),
            scale_mlp=((6144, 512), (512, 128), (128, 1)),
        ),
        "matting": HeadConfig(
            "pixel_shuffle",
            "conv_matting",
            a.hidden,
            4,
            input_conv=(a.hidden, 3),
            upsample=k3((768, 512, 256, 128)),
            conv=k3((64, 32, 16)),
        ),
    }
    info = ArchInfo(task, size, backbone, heads.get(task))
    with torch.device("meta"):
        model = Sapiens2FeatureModel(info) if task == "pretrain" else Sapiens2TaskModel(info)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def write_header_only(path: Path, shapes: dict[str, tuple[int, ...]], dtype: str = "BF16") -> Path:
    """A safetensors file with a header and no tensor data: enough for anything that reads only
    the header (describe_checkpoint, task/size checks), at any model size, in a few KB."""
    import json
    import math
    import struct

    header, offset = {}, 0
    for name, shape in sorted(shapes.items()):
        n = 2 * math.prod(shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    return path
