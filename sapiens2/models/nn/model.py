"""Task model = Sapiens2 backbone + one head, built from a checkpoint's tensor shapes.

``build_from_shapes(shapes)`` reads what the file holds (task from the head's predictor name,
every width and count from tensor shapes) and returns the model plus an ``ArchInfo``.
``model(pixel_values)`` takes the normalised (B, 3, H, W) tensor and returns the typed outputs
of ``sapiens2.models.nn.outputs``. No pre/post-processing lives here (see ``sapiens2.tasks``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from ...errors import CheckpointError
from ..zoo import ARCHS, TASKS, is_v1
from .backbone import Backbone, BackboneConfig, backbone_config_from_shapes
from .heads import HeadConfig, build_head, head_config_from_shapes
from .outputs import FeaturesOutput, TaskOutput, output_type

Shapes = Mapping[str, tuple[int, ...]]

#: Tensors a checkpoint may hold that the model recomputes instead (the release stores RoPE periods).
IGNORED_KEYS = ("rope_embed.periods", "backbone.rope_embed.periods")


@dataclass(frozen=True)
class ArchInfo:
    """What a checkpoint holds, read from its tensor shapes."""

    task: str
    size: str | None  # the zoo size whose published shape matches, None for tiny/custom models
    backbone: BackboneConfig
    head: HeadConfig | None

    def describe(self) -> dict[str, object]:
        b = self.backbone
        return {
            "task": self.task,
            "size": self.size,
            "hidden": b.hidden,
            "layers": b.layers,
            "heads": b.heads,
            "head_dim": b.head_dim,
            "kv_heads": list(b.kv_heads),
            "ffn_hidden": b.ffn_hidden,
            "registers": b.registers,
            "patch_size": b.patch_size,
            "tokenizer_layers": b.tokenizer_layers,
            "head": self.head.widths() if self.head else None,
        }


def match_zoo_size(cfg: BackboneConfig) -> str | None:
    """The zoo size with this backbone's published shape (GQA layout included), else None."""
    for key, arch in ARCHS.items():
        if is_v1(key):  # Sapiens v1 files are graphs, never read by shape
            continue
        # the release: first 8 and last 8 layers full multi-head, heads/2 KV heads in between
        kv = tuple(
            arch.heads if (i < 8 or i >= arch.layers - 8) else arch.heads // 2 for i in range(arch.layers)
        )
        if (
            (arch.hidden, arch.layers, arch.heads, arch.head_dim, arch.ffn_hidden)
            == (cfg.hidden, cfg.layers, cfg.heads, cfg.head_dim, cfg.ffn_hidden)
            and kv == cfg.kv_heads
            and bool(arch.tokenizer_layers) == bool(cfg.tokenizer_layers)
        ):
            return arch.size
    return None


def arch_from_shapes(shapes: Shapes) -> ArchInfo:
    """Task, size, backbone and head configuration of a checkpoint, from its tensor shapes only."""
    keys = [k for k in shapes if k not in IGNORED_KEYS]
    if any(k.startswith("backbone.") for k in keys):
        head = head_config_from_shapes(shapes, "decode_head.")
        backbone = backbone_config_from_shapes(shapes, "backbone.")
        task = head.task
    elif "cls_token" in shapes:
        head, backbone, task = None, backbone_config_from_shapes(shapes, ""), _bare_backbone_task()
    else:
        sample = ", ".join(sorted(keys)[:4]) or "no tensors"
        raise CheckpointError(
            f"This is not a Sapiens2 checkpoint: no 'cls_token' nor 'backbone.*' tensors (found {sample})."
        )
    if head is not None and TASKS[task].head != head.kind:
        raise CheckpointError(
            f"The {task} checkpoint has a {head.kind} head; Sapiens2 {task} models use a {TASKS[task].head} head."
        )
    return ArchInfo(task, match_zoo_size(backbone), backbone, head)


def _bare_backbone_task() -> str:
    """The zoo task whose checkpoints are the bare backbone (no head): "features"."""
    return next(spec.name for spec in TASKS.values() if spec.head is None)


class Sapiens2TaskModel(nn.Module):
    """Backbone + head for a dense task. ``forward`` returns the task's output dataclass."""

    def __init__(self, info: ArchInfo, rope_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if info.head is None:
            raise ValueError("a task model needs a head; use Sapiens2FeatureModel for 'features'")
        self.task: str = info.task
        self.size: str | None = info.size
        self.arch = info
        self.backbone = Backbone(info.backbone, rope_dtype)
        self.decode_head = build_head(info.head)
        #: the typed output the zoo row names (the head's raw result -> e.g. PoseOutput)
        self.output_type = output_type(TASKS[info.task].output)

    def fp32_keys(self) -> set[str]:
        """State-dict keys the loader keeps float32 whatever ``dtype`` (see ``nn.heads``)."""
        names = tuple(f"decode_head.{m}." for m in self.decode_head.fp32_modules)
        return {k for k in self.state_dict() if k.startswith(names)}

    @property
    def rope_dtype(self) -> torch.dtype | None:
        return self.backbone.rope_dtype

    def forward(self, pixel_values: torch.Tensor) -> TaskOutput:
        tokens, grid = self.backbone(pixel_values)
        features = self.backbone.feature_map(tokens, grid)
        return self.output_type.from_head(self.decode_head(features))


class Sapiens2FeatureModel(Backbone):
    """The bare backbone (task 'features'; checkpoint keys carry no prefix)."""

    def __init__(self, info: ArchInfo, rope_dtype: torch.dtype | None = None) -> None:
        super().__init__(info.backbone, rope_dtype)
        self.task: str = info.task
        self.size: str | None = info.size
        self.arch = info

    def forward(self, pixel_values: torch.Tensor) -> FeaturesOutput:  # type: ignore[override]
        tokens, grid = super().forward(pixel_values)
        return FeaturesOutput(cls_embedding=tokens[:, 0], patch_features=self.feature_map(tokens, grid))


def build_from_shapes(
    shapes: Shapes, *, device: torch.device | str | None = "meta", rope_dtype: torch.dtype | None = None
) -> tuple[nn.Module, ArchInfo]:
    """Build (by default on the meta device, i.e. without memory) the model a checkpoint describes."""
    info = arch_from_shapes(shapes)
    with torch.device(device or "cpu"):
        if info.head is None:
            model: nn.Module = Sapiens2FeatureModel(info, rope_dtype)
        else:
            model = Sapiens2TaskModel(info, rope_dtype)
    return model, info


def expected_keys(model: nn.Module) -> list[str]:
    """The checkpoint key names a model loads (its state_dict names, fused qkv split back)."""
    return list(model.state_dict().keys())


__all__ = ["ArchInfo", "Sapiens2FeatureModel", "Sapiens2TaskModel", "arch_from_shapes", "build_from_shapes"]
