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

#: The tasks transformers can build (parity tests run against these).
TASK_NAMES = ("pose", "seg", "normal", "pointmap", "matting", "features")
#: Tasks of the release that transformers lacks: their tiny checkpoint is the tiny normal backbone
#: plus a reference head written here from the spec, in the release's key names.
RELEASE_ONLY = ("albedo",)
#: Tasks with Sapiens v1 weights only (no Sapiens2 checkpoint): a tiny v1 TorchScript file instead.
V1_ONLY = ("depth",)

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
    "features": ("Sapiens2Model", None, None),
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
    if task in RELEASE_ONLY:
        return _release_only_checkpoint(task, folder, seed)
    if task in V1_ONLY:  # a tiny v1-shaped TorchScript graph (tests/v1_models.py), the folder's one .pt2
        from v1_models import save_v1

        save_v1(task, folder)
        return folder
    make_tiny_model(task, seed=seed, **overrides).save_pretrained(folder)
    return folder


def all_task_names() -> tuple[str, ...]:
    """Every zoo task (the registry's rows): each has a tiny checkpoint maker here."""
    from sapiens2.models.zoo import TASKS

    missing = set(TASKS) - set(TASK_NAMES) - set(RELEASE_ONLY) - set(V1_ONLY)
    assert not missing, f"no tiny checkpoint for {sorted(missing)}: add one to tests/tiny_checkpoints.py"
    return tuple(TASKS)


# ----------------------------------------------------------------------------- release-only heads


class RefRMSNorm2d(torch.nn.Module):
    """The spec's RMSNorm2d: ``nn.RMSNorm`` over channels, eps 1e-6, with a weight. As in the
    release it holds the ``nn.RMSNorm`` as its attribute ``norm``, so the checkpoint's key is
    ``<position>.norm.weight``; the arithmetic is written out here, not borrowed from the package."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = torch.nn.RMSNorm(channels, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + 1e-6)
        return x * rms * self.norm.weight.view(1, -1, 1, 1)


class RefAlbedoHead(torch.nn.Module):
    """SPEC section 3: the normal head with RMSNorm2d where normal has InstanceNorm, in the
    release's names and Sequential indices: input_conv.{0,1}, upsample_blocks.k.{0,2},
    conv_layers.{0,1,3,4,6,7}, conv_albedo (1x1 -> 3). Kernels 3."""

    def __init__(self, in_ch: int, upsample: tuple[int, ...], conv: tuple[int, ...] = (64, 32, 16)) -> None:
        super().__init__()
        nn = torch.nn
        self.input_conv = nn.Sequential(nn.Conv2d(in_ch, in_ch, 3, padding=1), RefRMSNorm2d(in_ch), nn.SiLU())
        blocks, ch = [], in_ch
        for out in upsample:
            conv4 = nn.Conv2d(ch, 4 * out, 3, padding=1)
            blocks.append(nn.Sequential(conv4, nn.PixelShuffle(2), RefRMSNorm2d(out), nn.SiLU()))
            ch = out
        self.upsample_blocks = nn.ModuleList(blocks)
        layers: list[torch.nn.Module] = []
        for out in conv:
            layers += [nn.Conv2d(ch, out, 3, padding=1), RefRMSNorm2d(out), nn.SiLU()]
            ch = out
        self.conv_layers = nn.Sequential(*layers)
        self.conv_albedo = nn.Conv2d(ch, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.input_conv(x)
        for block in self.upsample_blocks:
            x = block(x)
        return self.conv_albedo(self.conv_layers(x))


def tiny_albedo_head(seed: int = 0) -> RefAlbedoHead:
    """The reference albedo head at the tiny widths, random: norm weights away from 1 and biases
    away from 0, so a mix-up of tensors shows."""
    torch.manual_seed(seed)
    head = RefAlbedoHead(TINY_BACKBONE["hidden_size"], (16, 8, 4, 4), (4, 4, 4))
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for module in head.modules():
            if isinstance(module, RefRMSNorm2d):
                module.norm.weight.copy_(1.0 + 0.3 * torch.randn(module.norm.weight.shape, generator=gen))
            elif isinstance(module, torch.nn.Conv2d):
                module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=gen))
    return head.eval()


def _release_only_checkpoint(task: str, folder: Path, seed: int) -> Path:
    import tempfile

    from safetensors.torch import load_file, save_file

    with tempfile.TemporaryDirectory() as tmp:  # the backbone in the file's own key names
        make_tiny_model("normal", seed=seed).save_pretrained(tmp)
        state = load_file(Path(tmp) / "model.safetensors")
    backbone = {k: v for k, v in state.items() if not k.startswith("decode_head.")}
    head = {f"decode_head.{k}": v for k, v in tiny_albedo_head(seed).state_dict().items()}
    save_file({k: v.contiguous() for k, v in {**backbone, **head}.items()}, str(folder / "model.safetensors"))
    return folder


def place_release_layout(checkpoint: Path, root: Path, task: str, size: str) -> Path:
    """Copy a tiny checkpoint to ``root/<task>/sapiens2_<size>_<task>.safetensors`` (the layout
    ``$SAPIENS2_CHECKPOINTS`` expects) and return the new file."""
    from sapiens2.models.zoo import get_task

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
    from sapiens2.models.zoo import get_task

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
    from sapiens2.models.nn.backbone import BackboneConfig
    from sapiens2.models.nn.heads import HeadConfig
    from sapiens2.models.nn.model import ArchInfo, Sapiens2FeatureModel, Sapiens2TaskModel
    from sapiens2.models.zoo import ARCHS

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
        model = Sapiens2FeatureModel(info) if task == "features" else Sapiens2TaskModel(info)
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


#: The tiny DETR's labels: DETR's COCO map starts the same way (0 unused, 1 person).
DETR_LABELS = {0: "N/A", 1: "person", 2: "car"}


def make_tiny_detr(folder: Path, *, seed: int = 0) -> Any:
    """A tiny random transformers DETR (transformers-ResNet backbone) saved with ``save_pretrained``
    into ``folder`` (model.safetensors + config.json); returns the model. Its heads are spread so
    that "person" is the top class of several queries (transformers' init makes all queries alike)."""
    from transformers import DetrConfig, DetrForObjectDetection, ResNetConfig

    torch.manual_seed(seed)
    backbone = ResNetConfig(
        embedding_size=8, hidden_sizes=[16, 24, 32, 40], depths=[1, 2, 1, 1], out_features=["stage4"]
    )
    config = DetrConfig(
        use_timm_backbone=False, backbone_config=backbone, d_model=16, encoder_layers=1, decoder_layers=2,
        encoder_ffn_dim=24, decoder_ffn_dim=24, encoder_attention_heads=2, decoder_attention_heads=4,
        num_queries=12, num_labels=3, id2label=DETR_LABELS, label2id={v: k for k, v in DETR_LABELS.items()},
    )  # fmt: skip
    model = DetrForObjectDetection(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("class_labels") or "query_position" in name:
                p.normal_(0, 1.0)
            elif name.startswith("bbox_predictor"):
                p.normal_(0, 0.3)
            elif "proj" in name and "backbone" not in name:
                p.normal_(0, 0.5)
        for name, b in model.named_buffers():
            if name.endswith("running_var"):
                b.uniform_(0.5, 2.0)
            elif name.endswith("running_mean"):
                b.normal_(0, 0.1)
        model.class_labels_classifier.bias[1] += 1.5
    model.save_pretrained(folder)
    return model
