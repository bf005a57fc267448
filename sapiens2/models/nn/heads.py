"""Task heads, one module per kind, shared by the tasks that use it.

- ``DeconvHead``: transposed-conv upsampling + 1x1 convs (pose: 308 heatmaps at 1/4 resolution;
  segmentation: 29 logits at full resolution).
- ``PixelShuffleHead``: conv + PixelShuffle upsampling (normal: 3 channels; matting: 4 channels).
- ``PointmapHead``: the pixel-shuffle head plus the scale branch (stride-2 convs + MLP).

The norm after each conv is InstanceNorm (no parameters) in the released heads, or the release's
``RMSNorm2d`` (albedo): a module holding an ``nn.RMSNorm`` as ``norm``, so its only tensor is
``<position>.norm.weight`` (SAPIENS2_SPEC.md section 3). A checkpoint with such keys gets it.

All layers are Sequentials whose indices equal the checkpoint's key names
(``decode_head.deconv_layers.3.weight`` ...); every width, count and kernel size comes from a
``HeadConfig`` read off the checkpoint's tensor shapes by ``head_config_from_shapes``.

Mixed precision: the trunk runs in the model's dtype (bf16 on GPUs), but each head's final
projection (and the pointmap's scale branch) is kept and run in float32 -- ``fp32_modules`` names
them, the loader keeps their weights float32 -- so outputs leave the head as float32. In bf16
(8 significant bits) that last layer would quantise a 2 to 4 m depth to 1.6 cm steps.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from ...errors import CheckpointError, InputImageError
from ..zoo import TASKS

Shapes = Mapping[str, tuple[int, ...]]

#: eps of the channel RMSNorm (the release's ``nn.RMSNorm(..., eps=1e-6)``)
RMS_EPS = 1e-6


def predictors() -> dict[str, str]:
    """Name of the final 1x1 conv in a checkpoint -> task, from the zoo rows (``TaskSpec.predictor``):
    the predictor's name says the task."""
    return {spec.predictor: spec.name for spec in TASKS.values() if spec.predictor}


@dataclass(frozen=True)
class HeadConfig:
    kind: str  # "deconv" | "pixel_shuffle" | "pointmap" (the zoo's ``TaskSpec.head``)
    predictor: str  # attribute / key name of the final conv, e.g. "conv_pose"
    in_channels: int
    num_outputs: int
    input_conv: tuple[int, int] | None = None  # (out channels, kernel) of the optional input conv
    upsample: tuple[tuple[int, int], ...] = ()  # (out channels, kernel) per 2x upsampling step
    conv: tuple[tuple[int, int], ...] = ()  # (out channels, kernel) per refinement conv
    bias: dict[str, bool] | None = None  # which conv groups have a bias
    scale_conv: tuple[tuple[int, int], ...] = ()  # pointmap: (out channels, kernel) per stride-2 conv
    scale_mlp: tuple[tuple[int, int], ...] = ()  # pointmap: (in, out) per Linear
    norm: str = "instance"  # "instance" (no parameters) or "rms" (channel RMSNorm with a weight)

    @property
    def task(self) -> str:
        return predictors()[self.predictor]

    def widths(self) -> dict[str, object]:
        """The head's layer widths, for describe_checkpoint()."""
        out: dict[str, object] = {"kind": self.kind, "outputs": self.num_outputs}
        if self.input_conv:
            out["input_conv"] = self.input_conv[0]
        out["upsample"] = [c for c, _ in self.upsample]
        out["conv"] = [c for c, _ in self.conv]
        if self.norm != "instance":
            out["norm"] = self.norm
        if self.scale_conv:  # the pointmap head's scale branch
            out["scale_conv"] = [c for c, _ in self.scale_conv]
            out["scale_mlp"] = [o for _, o in self.scale_mlp]
        return out


class RMSNorm2d(nn.Module):
    """``nn.RMSNorm`` over the channels of a (B, C, H, W) map, with a per-channel weight.

    The ``nn.RMSNorm`` is the attribute ``norm``, as in the release, so the state-dict key is
    ``<position>.norm.weight`` and a release checkpoint loads by its own names.
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(channels, eps=RMS_EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _norm_act(channels: int, norm: str = "instance") -> list[nn.Module]:
    layer = RMSNorm2d(channels) if norm == "rms" else nn.InstanceNorm2d(channels)
    return [layer, nn.SiLU()]


def run_fp32(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` in the module's own dtype (float32 as loaded), float32 out."""
    return module(x.to(next(module.parameters()).dtype)).float()


def _conv_stack(
    in_ch: int,
    layers: tuple[tuple[int, int], ...],
    *,
    stride: int = 1,
    bias: bool = True,
    norm: str = "instance",
) -> tuple[nn.Sequential, int]:
    """[Conv, norm, SiLU] x n: conv i sits at index 3*i, as in the release."""
    mods: list[nn.Module] = []
    for out_ch, k in layers:
        mods += [
            nn.Conv2d(in_ch, out_ch, k, stride=stride, padding=(k - 1) // 2, bias=bias),
            *_norm_act(out_ch, norm),
        ]
        in_ch = out_ch
    return nn.Sequential(*mods), in_ch


class DeconvHead(nn.Module):
    """[ConvTranspose(k4, s2, p1), IN, SiLU] x n -> [1x1 Conv, IN, SiLU] x m -> 1x1 predictor."""

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.predictor_name = cfg.predictor
        bias = cfg.bias or {}
        mods: list[nn.Module] = []
        ch = cfg.in_channels
        for out_ch, k in cfg.upsample:
            # padding (k - 2) / 2 makes a stride-2 transposed conv exactly double the size
            mods += [
                nn.ConvTranspose2d(
                    ch, out_ch, k, stride=2, padding=(k - 2) // 2, bias=bias.get("deconv", False)
                ),
                *_norm_act(out_ch, cfg.norm),
            ]
            ch = out_ch
        self.deconv_layers = nn.Sequential(*mods)
        self.conv_layers, ch = _conv_stack(ch, cfg.conv, bias=bias.get("conv", True), norm=cfg.norm)
        self.add_module(cfg.predictor, nn.Conv2d(ch, cfg.num_outputs, 1))
        self.fp32_modules: tuple[str, ...] = (cfg.predictor,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_layers(self.deconv_layers(x))
        return run_fp32(getattr(self, self.predictor_name), x)


class PixelShuffleHead(nn.Module):
    """[3x3 Conv, IN, SiLU] -> [Conv to 4c, PixelShuffle(2), IN, SiLU] x n -> [Conv, IN, SiLU] x m -> 1x1."""

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.predictor_name = cfg.predictor
        bias = cfg.bias or {}
        ch = cfg.in_channels
        if cfg.input_conv is not None:
            self.input_conv, ch = _conv_stack(
                ch, (cfg.input_conv,), bias=bias.get("input_conv", True), norm=cfg.norm
            )
        else:
            self.input_conv = None
        blocks = []
        for out_ch, k in cfg.upsample:
            conv = nn.Conv2d(ch, 4 * out_ch, k, padding=(k - 1) // 2, bias=bias.get("upsample", True))
            blocks.append(nn.Sequential(conv, nn.PixelShuffle(2), *_norm_act(out_ch, cfg.norm)))
            ch = out_ch
        self.upsample_blocks = nn.ModuleList(blocks)
        self.conv_layers, ch = _conv_stack(ch, cfg.conv, bias=bias.get("conv", True), norm=cfg.norm)
        self.add_module(cfg.predictor, nn.Conv2d(ch, cfg.num_outputs, 1))
        self.fp32_modules: tuple[str, ...] = (cfg.predictor,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_conv is not None:
            x = self.input_conv(x)
        for block in self.upsample_blocks:
            x = block(x)
        return run_fp32(getattr(self, self.predictor_name), self.conv_layers(x))


class PointmapHead(PixelShuffleHead):
    """Pixel-shuffle head for XYZ plus the scale branch on the backbone features.

    The scale MLP's first Linear takes the flattened grid after the stride-2 convs, so a
    checkpoint only accepts the input size it was trained at (1024x768 for the release).
    """

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__(cfg)
        self.scale_conv_layers, ch = _conv_stack(cfg.in_channels, cfg.scale_conv, stride=2)
        self.scale_channels = ch
        mlp: list[nn.Module] = [nn.Flatten()]
        for i, (n_in, n_out) in enumerate(cfg.scale_mlp):
            mlp.append(nn.Linear(n_in, n_out))
            if i < len(cfg.scale_mlp) - 1:
                mlp.append(nn.SiLU())
        self.scale_final_layer = nn.Sequential(*mlp)
        self.scale_in_features = cfg.scale_mlp[0][0] if cfg.scale_mlp else 0
        self.fp32_modules = (cfg.predictor, "scale_conv_layers", "scale_final_layer")

    def scale_grid(self, h: int, w: int) -> tuple[int, int]:
        """Grid size after the stride-2 scale convs for an (h, w) feature map."""
        for conv in self.scale_conv_layers[::3]:
            k, p = conv.kernel_size[0], conv.padding[0]
            h, w = (h + 2 * p - k) // 2 + 1, (w + 2 * p - k) // 2 + 1
        return h, w

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        gh, gw = self.scale_grid(*x.shape[-2:])
        if gh * gw * self.scale_channels != self.scale_in_features:
            raise InputImageError(
                f"This pointmap checkpoint's scale branch needs {self.scale_in_features // self.scale_channels} "
                f"grid cells after its stride-2 convs, but a {x.shape[-2] * 16}x{x.shape[-1] * 16} input gives "
                f"{gh}x{gw}. Run it at the input size it was trained for "
                "(1024x768 for the released pointmap models)."
            )
        scale = run_fp32(self.scale_final_layer, run_fp32(self.scale_conv_layers, x))
        return super().forward(x), scale


HEAD_CLASSES: dict[str, type[nn.Module]] = {
    "deconv": DeconvHead,
    "pixel_shuffle": PixelShuffleHead,
    "pointmap": PointmapHead,
}


def build_head(cfg: HeadConfig) -> nn.Module:
    return HEAD_CLASSES[cfg.kind](cfg)


def _indexed(
    shapes: Shapes, prefix: str, group: str, suffix: str = ".weight"
) -> list[tuple[int, tuple[int, ...]]]:
    """(index, shape) of ``prefix + group.<i> + suffix`` tensors, sorted by index."""
    pat = re.compile(re.escape(prefix + group) + r"\.(\d+)" + re.escape(suffix) + "$")
    return sorted((int(m.group(1)), tuple(v)) for k, v in shapes.items() if (m := pat.match(k)))


def head_config_from_shapes(shapes: Shapes, prefix: str = "decode_head.") -> HeadConfig:
    """Read the head's kind, widths and kernel sizes from a checkpoint's tensor shapes."""
    known = predictors()
    names = [p for p in known if prefix + p + ".weight" in shapes]
    if len(names) != 1:
        found = sorted({k[len(prefix) :].split(".")[0] for k in shapes if k.startswith(prefix)})
        raise CheckpointError(
            f"Cannot tell the task of this checkpoint's head: expected one of "
            f"{', '.join(prefix + p for p in known)}, found {found or 'no head at all'}."
        )
    predictor = names[0]
    pred_shape = shapes[prefix + predictor + ".weight"]

    def has(name: str) -> bool:
        return prefix + name in shapes

    deconv = [(i, s) for i, s in _indexed(shapes, prefix, "deconv_layers") if len(s) == 4]
    # conv weights are 4-D (an RMSNorm2d's weight is ``<i>.norm.weight``, which _indexed skips)
    convs = [(s[0], s[-1]) for _, s in _indexed(shapes, prefix, "conv_layers") if len(s) == 4]
    norm = "rms" if _has_norm_weight(shapes, prefix) else "instance"
    bias = {"conv": has("conv_layers.0.bias") or not convs}
    if deconv:
        in_ch = deconv[0][1][0]
        upsample = tuple((s[1], s[-1]) for _, s in deconv)  # ConvTranspose weight: (in, out, k, k)
        bias["deconv"] = has("deconv_layers.0.bias")
        return HeadConfig(
            "deconv",
            predictor,
            in_ch,
            pred_shape[0],
            upsample=upsample,
            conv=tuple(convs),
            bias=bias,
            norm=norm,
        )

    blocks = [(i, shapes[f"{prefix}upsample_blocks.{i}.0.weight"]) for i in _block_ids(shapes, prefix)]
    input_conv = [(i, s) for i, s in _indexed(shapes, prefix, "input_conv") if len(s) == 4]
    if not blocks:
        raise CheckpointError(f"The head {predictor} has neither deconv_layers nor upsample_blocks.")
    in_ch = input_conv[0][1][1] if input_conv else blocks[0][1][1]
    bias["input_conv"] = has("input_conv.0.bias")
    bias["upsample"] = has("upsample_blocks.0.0.bias")
    common = {
        "predictor": predictor,
        "in_channels": in_ch,
        "num_outputs": pred_shape[0],
        "input_conv": (input_conv[0][1][0], input_conv[0][1][-1]) if input_conv else None,
        "upsample": tuple((s[0] // 4, s[-1]) for _, s in blocks),  # conv to 4c, then PixelShuffle(2)
        "conv": tuple(convs),
        "bias": bias,
        "norm": norm,
    }
    scale_conv = [(i, s) for i, s in _indexed(shapes, prefix, "scale_conv_layers") if len(s) == 4]
    if not scale_conv:
        return HeadConfig("pixel_shuffle", **common)
    mlp = _indexed(shapes, prefix, "scale_final_layer")
    return HeadConfig(
        "pointmap",
        **common,
        scale_conv=tuple((s[0], s[-1]) for _, s in scale_conv),
        scale_mlp=tuple((s[1], s[0]) for _, s in mlp),
    )


def _has_norm_weight(shapes: Shapes, prefix: str) -> bool:
    """True when the trunk's norms are the release's RMSNorm2d: ``<group>.<i>.norm.weight`` keys.

    Only that layout counts: a 1-D ``.weight`` directly at a norm's position is no release
    layout and is then refused by name as an unexpected key (``loading._check_keys``)."""
    groups = ("deconv_layers", "conv_layers", "input_conv", "upsample_blocks.0")
    return any(_indexed(shapes, prefix, group, ".norm.weight") for group in groups)


def _block_ids(shapes: Shapes, prefix: str) -> list[int]:
    pat = re.compile(re.escape(prefix) + r"upsample_blocks\.(\d+)\.0\.weight$")
    return sorted(int(m.group(1)) for k in shapes if (m := pat.match(k)))
