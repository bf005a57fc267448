"""DETR (ResNet backbone + transformer encoder/decoder) for person boxes, in plain torch.

No torchvision and no timm: the ResNet, the frozen batch norm, the sine position embedding and
the attention are written here. The architecture is read from the checkpoint's tensor shapes
(:meth:`DetrArch.from_shapes`); only the number of attention heads cannot be seen in the shapes
and comes from ``config.json`` when one sits beside the weights (8, DETR's value, otherwise).

Module names follow the Hub file of ``facebook/detr-resnet-50`` (main revision) with its
prefixes dropped, so that file loads with a prefix strip only:

- ``model.backbone.conv_encoder.model.<torchvision ResNet names>`` -> ``backbone.<same>``
  (``conv1``, ``bn1``, ``layer1.0.conv1``, ``layer1.0.downsample.0`` ...: the main revision
  wraps a timm ResNet, whose module names are torchvision's);
- ``model.<name>`` -> ``<name>`` (``input_projection``, ``encoder.layers.0.self_attn.out_proj``,
  ``decoder.layernorm`` ...); ``class_labels_classifier`` and ``bbox_predictor`` have no prefix.

The ``no_timm`` revision (and what transformers' ``save_pretrained`` writes for a DETR with a
transformers ResNet) names the backbone ``embedder.embedder.convolution``,
``encoder.stages.S.layers.B.layer.K.convolution`` ...; :func:`to_internal_names` maps those too.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import CheckpointError

#: DETR's published head count (all facebook/detr-* checkpoints); not recoverable from shapes.
DEFAULT_HEADS = 8
BN_EPS = 1e-5  # DETR's frozen batch norm eps
LN_EPS = 1e-5  # torch's LayerNorm default, as DETR


# ----------------------------------------------------------------------------- key names

_HUB_BACKBONE = "model.backbone.conv_encoder.model."
_NO_TIMM_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), repl)
    for pattern, repl in (
        (r"^embedder\.embedder\.convolution\.", "conv1."),
        (r"^embedder\.embedder\.normalization\.", "bn1."),
        (r"^encoder\.stages\.(\d+)\.layers\.(\d+)\.shortcut\.convolution\.", "layer{s}.{b}.downsample.0."),
        (r"^encoder\.stages\.(\d+)\.layers\.(\d+)\.shortcut\.normalization\.", "layer{s}.{b}.downsample.1."),
        (r"^encoder\.stages\.(\d+)\.layers\.(\d+)\.layer\.(\d+)\.convolution\.", "layer{s}.{b}.conv{k}."),
        (r"^encoder\.stages\.(\d+)\.layers\.(\d+)\.layer\.(\d+)\.normalization\.", "layer{s}.{b}.bn{k}."),
    )
)


def _backbone_name(name: str) -> str:
    """A backbone tensor name (prefix removed) in torchvision naming; no_timm names are mapped."""
    for pattern, repl in _NO_TIMM_RULES:
        m = pattern.match(name)
        if m:
            # stages and convs count from 0 in transformers' ResNet, from 1 in torchvision's layerN/convK
            numbers = [int(g) for g in m.groups()]
            fields = {k: v if k == "b" else v + 1 for k, v in zip("sbk", numbers, strict=False)}
            return repl.format(**fields) + name[m.end() :]
    return name


def to_internal_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename a DETR checkpoint's tensors to this module's names; drop batch-norm step counters."""
    out: dict[str, torch.Tensor] = {}
    for key, value in tensors.items():
        if key.endswith("num_batches_tracked"):  # present in the Hub file, meaningless for frozen BN
            continue
        if key.startswith(_HUB_BACKBONE):
            name = "backbone." + _backbone_name(key[len(_HUB_BACKBONE) :])
        elif key.startswith("model."):
            name = key[len("model.") :]
        else:
            name = key
        out[name] = value
    return out


# ----------------------------------------------------------------------------- architecture


@dataclass(frozen=True)
class DetrArch:
    """Sizes of one DETR checkpoint, as read from its tensor shapes."""

    stem_width: int
    stage_blocks: tuple[int, ...]  # bottleneck blocks per stage (R50: 3, 4, 6, 3)
    stage_inner: tuple[int, ...]  # 3x3 conv width per stage (R50: 64 ... 512)
    stage_out: tuple[int, ...]  # block output width per stage (R50: 256 ... 2048)
    d_model: int
    encoder_layers: int
    decoder_layers: int
    encoder_ffn: int
    decoder_ffn: int
    num_queries: int
    num_logits: int  # classes + 1 (the last logit is "no object")
    bbox_layers: int
    encoder_heads: int = DEFAULT_HEADS
    decoder_heads: int = DEFAULT_HEADS

    @classmethod
    def from_shapes(
        cls,
        shapes: dict[str, tuple[int, ...]],
        encoder_heads: int = DEFAULT_HEADS,
        decoder_heads: int = DEFAULT_HEADS,
    ) -> DetrArch:
        """Read the sizes from tensor shapes in internal names (see :func:`to_internal_names`)."""

        def need(name: str) -> tuple[int, ...]:
            if name not in shapes:
                raise CheckpointError(
                    f"The detector checkpoint has no tensor {name!r}: it is not a DETR checkpoint with a "
                    "ResNet bottleneck backbone (expected facebook/detr-resnet-50 or a file in its naming)."
                )
            return shapes[name]

        def count(pattern: str) -> int:
            found = {int(m.group(1)) for k in shapes if (m := re.match(pattern, k))}
            return max(found) + 1 if found else 0

        blocks, inner, out = [], [], []
        for s in range(1, 5):
            n = count(rf"^backbone\.layer{s}\.(\d+)\.conv1\.weight$")
            if n == 0:
                need(f"backbone.layer{s}.0.conv3.weight")  # raises with the explanation
            blocks.append(n)
            inner.append(need(f"backbone.layer{s}.0.conv2.weight")[0])
            out.append(need(f"backbone.layer{s}.0.conv3.weight")[0])
        arch = cls(
            stem_width=need("backbone.conv1.weight")[0],
            stage_blocks=tuple(blocks),
            stage_inner=tuple(inner),
            stage_out=tuple(out),
            d_model=need("input_projection.weight")[0],
            encoder_layers=count(r"^encoder\.layers\.(\d+)\."),
            decoder_layers=count(r"^decoder\.layers\.(\d+)\."),
            encoder_ffn=need("encoder.layers.0.fc1.weight")[0],
            decoder_ffn=need("decoder.layers.0.fc1.weight")[0],
            num_queries=need("query_position_embeddings.weight")[0],
            num_logits=need("class_labels_classifier.weight")[0],
            bbox_layers=count(r"^bbox_predictor\.layers\.(\d+)\."),
            encoder_heads=encoder_heads,
            decoder_heads=decoder_heads,
        )
        for heads in (encoder_heads, decoder_heads):
            if heads < 1 or arch.d_model % heads:
                raise CheckpointError(
                    f"Attention heads ({heads}) must divide the detector width d_model={arch.d_model}; "
                    "fix encoder/decoder_attention_heads in the config.json beside the weights."
                )
        return arch


# ----------------------------------------------------------------------------- backbone


class FrozenBatchNorm2d(nn.Module):
    """Batch norm with fixed statistics and affine terms (buffers, as in DETR's checkpoints)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.register_buffer("weight", torch.ones(channels))
        self.register_buffer("bias", torch.zeros(channels))
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.weight * (self.running_var + BN_EPS).rsqrt()
        shift = self.bias - self.running_mean * scale
        return x * scale[None, :, None, None] + shift[None, :, None, None]


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck: 1x1 -> 3x3 (carries the stride) -> 1x1, plus a projected shortcut."""

    def __init__(self, cin: int, inner: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, inner, 1, bias=False)
        self.bn1 = FrozenBatchNorm2d(inner)
        self.conv2 = nn.Conv2d(inner, inner, 3, stride=stride, padding=1, bias=False)
        self.bn2 = FrozenBatchNorm2d(inner)
        self.conv3 = nn.Conv2d(inner, cout, 1, bias=False)
        self.bn3 = FrozenBatchNorm2d(cout)
        self.downsample = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), FrozenBatchNorm2d(cout))
            if stride != 1 or cin != cout
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    """ResNet trunk up to the last stage (stride 32); DETR only uses that last feature map."""

    def __init__(self, arch: DetrArch) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, arch.stem_width, 7, stride=2, padding=3, bias=False)
        self.bn1 = FrozenBatchNorm2d(arch.stem_width)
        cin = arch.stem_width
        for s, (n, inner, cout) in enumerate(
            zip(arch.stage_blocks, arch.stage_inner, arch.stage_out, strict=True)
        ):
            blocks = []
            for b in range(n):
                blocks.append(Bottleneck(cin, inner, cout, stride=2 if (s > 0 and b == 0) else 1))
                cin = cout
            self.add_module(f"layer{s + 1}", nn.Sequential(*blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(x, kernel_size=3, stride=2, padding=1)
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))


def sine_position_embedding(
    height: int, width: int, dim: int, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """DETR's normalised 2-D sine embedding for an unpadded (height, width) map: (height*width, dim).

    Half the channels encode y, half x; each half interleaves sin/cos at geometric frequencies
    (temperature 10000), with positions 1..n scaled to (0, 2*pi].
    """
    half = dim // 2
    eps = 1e-6  # DETR divides by (last position + eps): kept so outputs match its checkpoints
    ys = torch.arange(1, height + 1, device=device, dtype=torch.float32) / (height + eps) * (2 * math.pi)
    xs = torch.arange(1, width + 1, device=device, dtype=torch.float32) / (width + eps) * (2 * math.pi)
    exponent = 2 * (torch.arange(half, device=device) // 2).to(torch.float32) / half
    freqs = 10000.0**exponent

    def encode(pos: torch.Tensor) -> torch.Tensor:
        angles = pos[:, None] / freqs  # (n, half)
        return torch.stack((angles[:, 0::2].sin(), angles[:, 1::2].cos()), dim=2).flatten(1)

    pos_y = encode(ys)[:, None, :].expand(height, width, half)
    pos_x = encode(xs)[None, :, :].expand(height, width, half)
    return torch.cat((pos_y, pos_x), dim=2).reshape(height * width, dim).to(dtype)


# ----------------------------------------------------------------------------- transformer


class DetrAttention(nn.Module):
    """Multi-head attention with separate q/k/v/out projections (DETR's parameter layout)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        b, nq, dim = query.shape

        def split(x: torch.Tensor) -> torch.Tensor:
            return x.view(b, -1, self.heads, dim // self.heads).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            split(self.q_proj(query)), split(self.k_proj(key)), split(self.v_proj(value))
        )
        return self.out_proj(out.transpose(1, 2).reshape(b, nq, dim))


class EncoderLayer(nn.Module):
    """Post-norm encoder layer; the position embedding is added to queries and keys only."""

    def __init__(self, dim: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.self_attn = DetrAttention(dim, heads)
        self.self_attn_layer_norm = nn.LayerNorm(dim, eps=LN_EPS)
        self.fc1 = nn.Linear(dim, ffn)
        self.fc2 = nn.Linear(ffn, dim)
        self.final_layer_norm = nn.LayerNorm(dim, eps=LN_EPS)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        qk = x + pos
        x = self.self_attn_layer_norm(x + self.self_attn(qk, qk, x))
        return self.final_layer_norm(x + self.fc2(F.relu(self.fc1(x))))


class DecoderLayer(nn.Module):
    """Post-norm decoder layer: query self-attention, cross-attention to the image, MLP."""

    def __init__(self, dim: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.self_attn = DetrAttention(dim, heads)
        self.self_attn_layer_norm = nn.LayerNorm(dim, eps=LN_EPS)
        self.encoder_attn = DetrAttention(dim, heads)
        self.encoder_attn_layer_norm = nn.LayerNorm(dim, eps=LN_EPS)
        self.fc1 = nn.Linear(dim, ffn)
        self.fc2 = nn.Linear(ffn, dim)
        self.final_layer_norm = nn.LayerNorm(dim, eps=LN_EPS)

    def forward(
        self, x: torch.Tensor, query_pos: torch.Tensor, memory: torch.Tensor, pos: torch.Tensor
    ) -> torch.Tensor:
        qk = x + query_pos
        x = self.self_attn_layer_norm(x + self.self_attn(qk, qk, x))
        x = self.encoder_attn_layer_norm(x + self.encoder_attn(x + query_pos, memory + pos, memory))
        return self.final_layer_norm(x + self.fc2(F.relu(self.fc1(x))))


class BoxHead(nn.Module):
    """MLP with ReLU between layers; the last layer gives (cx, cy, w, h) logits."""

    def __init__(self, dim: int, num_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Linear(dim, 4 if i == num_layers - 1 else dim) for i in range(num_layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == len(self.layers) - 1 else F.relu(layer(x))
        return x


class Encoder(nn.Module):
    def __init__(self, arch: DetrArch) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            EncoderLayer(arch.d_model, arch.encoder_heads, arch.encoder_ffn)
            for _ in range(arch.encoder_layers)
        )


class Decoder(nn.Module):
    def __init__(self, arch: DetrArch) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderLayer(arch.d_model, arch.decoder_heads, arch.decoder_ffn)
            for _ in range(arch.decoder_layers)
        )
        self.layernorm = nn.LayerNorm(arch.d_model, eps=LN_EPS)


class Detr(nn.Module):
    """DETR for object detection: image -> per-query class logits and normalised boxes.

    ``forward`` takes a normalised batch (B, 3, H, W) without padding (one image per call, or
    images of equal size) and returns ``(logits (B, Q, C+1), boxes (B, Q, 4) as cx, cy, w, h in
    [0, 1] relative to the input)``.
    """

    def __init__(self, arch: DetrArch) -> None:
        super().__init__()
        self.arch = arch
        self.backbone = ResNet(arch)
        self.input_projection = nn.Conv2d(arch.stage_out[-1], arch.d_model, 1)
        self.query_position_embeddings = nn.Embedding(arch.num_queries, arch.d_model)
        self.encoder = Encoder(arch)
        self.decoder = Decoder(arch)
        self.class_labels_classifier = nn.Linear(arch.d_model, arch.num_logits)
        self.bbox_predictor = BoxHead(arch.d_model, arch.bbox_layers)

    @torch.no_grad()
    def fuse_frozen_batchnorm(self) -> Detr:
        """Fold every frozen batch norm into the convolution before it (same outputs, fewer passes).

        The norms are affine maps with fixed numbers, so ``bn(conv(x)) = conv'(x)`` with scaled
        weights and a bias; this removes two full-resolution elementwise passes per convolution.
        Call after loading: the state dict no longer has the ``bn`` tensors afterwards.
        """
        pairs = [(self.backbone, "conv1", "bn1")]
        for module in self.backbone.modules():
            if isinstance(module, Bottleneck):
                pairs += [(module, f"conv{i}", f"bn{i}") for i in (1, 2, 3)]
                if module.downsample is not None:
                    pairs.append((module.downsample, "0", "1"))
        for owner, conv_name, bn_name in pairs:
            conv, bn = getattr(owner, conv_name), getattr(owner, bn_name)
            if not isinstance(bn, FrozenBatchNorm2d):
                continue  # already fused
            scale = bn.weight * (bn.running_var + BN_EPS).rsqrt()
            conv.weight.mul_(scale[:, None, None, None])
            conv.bias = nn.Parameter(bn.bias - bn.running_mean * scale)
            setattr(owner, bn_name, nn.Identity())
        return self

    def forward(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        feats = self.input_projection(self.backbone(pixels))
        b, dim, h, w = feats.shape
        memory = feats.flatten(2).transpose(1, 2)  # (B, h*w, dim)
        pos = sine_position_embedding(h, w, dim, feats.device, feats.dtype)[None]
        for layer in self.encoder.layers:
            memory = layer(memory, pos)
        query_pos = self.query_position_embeddings.weight[None].expand(b, -1, -1)
        x = torch.zeros_like(query_pos)
        for layer in self.decoder.layers:
            x = layer(x, query_pos, memory, pos)
        x = self.decoder.layernorm(x)
        return self.class_labels_classifier(x), self.bbox_predictor(x).sigmoid()


def build_detr(
    tensors: dict[str, torch.Tensor], encoder_heads: int = DEFAULT_HEADS, decoder_heads: int = DEFAULT_HEADS
) -> Detr:
    """A :class:`Detr` sized from and filled with ``tensors`` (any supported naming).

    Raises ``CheckpointError`` when tensors are missing, left over or of the wrong shape.
    """
    named = to_internal_names(tensors)
    arch = DetrArch.from_shapes({k: tuple(v.shape) for k, v in named.items()}, encoder_heads, decoder_heads)
    with torch.device("meta"):
        model = Detr(arch)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(named))
    unexpected = sorted(set(named) - set(expected))
    wrong = sorted(k for k in set(expected) & set(named) if tuple(named[k].shape) != tuple(expected[k].shape))
    if missing or unexpected or wrong:
        parts = [
            f"{label} ({len(keys)}): {', '.join(keys[:4])}{' ...' if len(keys) > 4 else ''}"
            for label, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong))
            if keys
        ]
        raise CheckpointError(
            "The detector checkpoint does not fit DETR with a ResNet bottleneck backbone: "
            + "; ".join(parts)
            + ". Use facebook/detr-resnet-50's model.safetensors (main or no_timm revision)."
        )
    model.load_state_dict(named, assign=True)
    return model.eval()
