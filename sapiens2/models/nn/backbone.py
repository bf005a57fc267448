"""The Sapiens2 ViT backbone (every size) and the 1b-4k window tokenizer.

Pre-norm ViT in the DINOv3 style: ``[cls, registers, patches]`` tokens, 2D RoPE on the patch
tokens only, QK-norm before RoPE, grouped-query attention in the middle layers, SwiGLU FFN,
RMSNorm, layer scale on the attention branch and a final RMSNorm (``ln1``). Module and parameter
names equal the checkpoint's key names, so a release file loads with a strict key check.
Every width and count comes from a ``BackboneConfig`` that ``backbone_config_from_shapes`` reads
off a checkpoint's tensor shapes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import CheckpointError, InputImageError

RMS_EPS = 1e-6
ROPE_BASE = 100.0

Shapes = Mapping[str, tuple[int, ...]]


@dataclass(frozen=True)
class BackboneConfig:
    hidden: int
    heads: int
    head_dim: int
    kv_heads: tuple[int, ...]  # one entry per layer; == heads for full multi-head attention
    ffn_hidden: int
    registers: int = 8
    patch_size: int = 16
    qk_norm: bool = True
    qkv_bias: tuple[bool, bool, bool] = (True, True, True)
    tokenizer_layers: int = 0  # > 0: the 1b-4k window tokenizer sits in front of the encoder
    tokenizer_window: int = 4
    tokenizer_ffn_hidden: int = 0

    @property
    def layers(self) -> int:
        return len(self.kv_heads)

    @property
    def stride(self) -> int:
        """Input pixels per encoder token along each side (16, or 64 with the window tokenizer)."""
        return self.patch_size * (self.tokenizer_window if self.tokenizer_layers else 1)


class RMSNorm(nn.Module):
    """RMSNorm over the last dim (weight only); low-precision inputs are normalised in fp32."""

    def __init__(self, dim: int, eps: float = RMS_EPS) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = RMS_EPS) -> torch.Tensor:
    """x / rms(x) * weight with the mean of squares accumulated in fp32.

    Three passes over x (a norm reduction, two multiplies) instead of the five or six of the
    textbook form; on CPU that is about twice as fast and the result agrees to ~1e-7.
    """
    if x.is_cuda and x.dtype != torch.float32:
        # CUDA, bf16/fp16: torch's fused kernel normalises in fp32 and rounds to x's dtype in one
        # pass (a faster forward: docs/PERFORMANCE.md); the weight is applied after rounding, the
        # same order as below.
        return F.rms_norm(x, (x.shape[-1],), None, eps).mul_(weight)
    r = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32)
    r = torch.rsqrt(r.square() / x.shape[-1] + eps)  # tiny (..., 1) tensors
    if x.dtype == torch.float32:
        return torch.mul(x, r).mul_(weight)
    # low precision: normalise in fp32, round to the input dtype, then scale (transformers' order)
    return torch.mul(x, r).to(x.dtype).mul_(weight)


class LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


class Attention(nn.Module):
    """Multi-head / grouped-query self-attention with optional QK-norm, RoPE and layer scale.

    The checkpoint stores separate ``wq``/``wk``/``wv``; they are fused into one ``qkv`` projection
    when loaded (one GEMM instead of three) and split back in ``state_dict()``, so the module still
    reads and writes the release's key names.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        *,
        qk_norm: bool,
        layer_scale: bool,
        qkv_bias: tuple[bool, bool, bool] = (True, True, True),
    ) -> None:
        super().__init__()
        if heads % kv_heads:
            raise CheckpointError(f"{heads} query heads cannot be grouped over {kv_heads} key/value heads.")
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.splits = (heads * head_dim, kv_heads * head_dim, kv_heads * head_dim)
        self.qkv_bias = qkv_bias
        self.qkv = nn.Linear(dim, sum(self.splits), bias=any(qkv_bias))
        self.proj = nn.Linear(heads * head_dim, dim)
        self.q_norm = RMSNorm(head_dim) if qk_norm else None
        self.k_norm = RMSNorm(head_dim) if qk_norm else None
        self.gamma = LayerScale(dim) if layer_scale else None
        self.register_load_state_dict_pre_hook(_fuse_qkv_on_load)
        self.register_state_dict_post_hook(_split_qkv_on_save)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention output (times layer scale); plus ``residual`` when given, in one fused pass."""
        b, n, _ = x.shape
        q, k, v = self.qkv(x).split(self.splits, dim=-1)
        q = q.view(b, n, self.heads, self.head_dim).transpose(1, 2)  # (B, heads, N, head_dim) views
        k = k.view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:  # QK-norm comes before RoPE
            q = self.q_norm(q)
            k = self.k_norm(k)
        if rope is not None:
            q, k = apply_rope(q, k, *rope)
        gqa = self.kv_heads != self.heads
        if gqa and q.is_cuda and q.dtype == torch.float32:
            # CUDA's fused kernels take grouped K/V only in fp16/bf16; fp32 would drop to the math
            # kernel, which is slower than repeating K/V (the release does the same)
            k, v = (t.repeat_interleave(self.heads // self.kv_heads, dim=1) for t in (k, v))
            gqa = False
        # enable_gqa broadcasts each K/V head over its query heads without a repeated copy
        out = F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
        out = self.proj(out.transpose(1, 2).reshape(b, n, -1))
        if self.gamma is None:
            return out if residual is None else residual + out
        if residual is None:
            return self.gamma(out)
        return torch.addcmul(residual, out, self.gamma.weight)  # residual + gamma * out


_QKV = ("wq", "wk", "wv")


def _fuse_qkv_on_load(module: Attention, state_dict: dict, prefix: str, *_args) -> None:
    for kind in ("weight", "bias"):
        names = [f"{prefix}{w}.{kind}" for w in _QKV]
        if kind == "bias" and not any(module.qkv_bias):
            continue
        present = [name in state_dict for name in names]
        expected = [True] * 3 if kind == "weight" else list(module.qkv_bias)
        if present != expected:
            continue  # leave the keys alone: load_state_dict reports what is missing
        parts = [state_dict.pop(name) if has else None for name, has in zip(names, expected, strict=True)]
        like = next(p for p in parts if p is not None)
        parts = [
            p if p is not None else like.new_zeros(size) for p, size in zip(parts, module.splits, strict=True)
        ]
        state_dict[f"{prefix}qkv.{kind}"] = torch.cat(parts, dim=0)


def fuse_qkv_in_state(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    """Fuse every attention's ``wq``/``wk``/``wv`` tensors of ``state_dict`` into ``qkv``, in place.

    The load pre-hook does the same, but on load_state_dict's shallow copy of the dict, so the
    caller's dict would keep every part alive until the load ends (one more copy of all q/k/v
    weights). Fusing in the caller's dict first frees each layer's parts as soon as they are
    joined; the pre-hook then finds nothing left to do.
    """
    for name, module in model.named_modules():
        if isinstance(module, Attention):
            _fuse_qkv_on_load(module, state_dict, f"{name}." if name else "")


def _split_qkv_on_save(module: Attention, state_dict: dict, prefix: str, _meta) -> None:
    for kind, present in (("weight", (True, True, True)), ("bias", module.qkv_bias)):
        fused = state_dict.pop(f"{prefix}qkv.{kind}", None)
        if fused is None:
            continue
        for w, part, has in zip(_QKV, fused.split(module.splits, dim=0), present, strict=True):
            if has:
                state_dict[f"{prefix}{w}.{kind}"] = part


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k (B, heads, N, head_dim) in the dtype of ``cos``/``sin`` (N, head_dim).

    The prefix rows of cos/sin are 1/0, so cls and register tokens pass unchanged (up to the
    dtype round trip the release also does) and no split/concat of the sequence is needed.
    ``sin`` already carries the sign of rotate_half: sin_signed = [-sin, +sin] over the halves.
    Results are written contiguous in (B, heads, N, head_dim), the layout SDPA reads fastest.
    """
    dtype = q.dtype
    half = q.shape[-1] // 2
    out = []
    for x in (q, k):
        x = x.to(cos.dtype)
        if torch.is_grad_enabled() and x.requires_grad:  # in-place and out= are not differentiable
            swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
            out.append((x * cos + swapped * sin).to(dtype))
            continue
        rotated = torch.mul(x, cos, out=torch.empty(x.shape, dtype=x.dtype, device=x.device))
        # each half gets the other half's product added in place: no rotate_half copy of x. Two
        # rounded products then a rounded sum, exactly as the reference computes it (a fused
        # addcmul would round once and drift from the release's bfloat16 numbers)
        rotated[..., :half].add_(x[..., half:] * sin[:, :half])
        rotated[..., half:].add_(x[..., :half] * sin[:, half:])
        out.append(rotated.to(dtype))
    return out[0], out[1]


class RopeTable:
    """cos/sin tables of the 2D RoPE for one grid size, cached per (grid, device, dtype)."""

    def __init__(self, head_dim: int, prefix: int) -> None:
        if head_dim % 4:
            raise CheckpointError(f"RoPE needs a head dim divisible by 4, got {head_dim}.")
        self.head_dim, self.prefix = head_dim, prefix
        self._cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(
        self, h: int, w: int, device: torch.device, rope_dtype: torch.dtype | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if torch.compiler.is_compiling() or torch.compiler.is_exporting():
            # tensors made while tracing are placeholders: never keep them for eager calls
            return self._build(h, w, device, rope_dtype)
        key = (h, w, str(device), rope_dtype)
        if key not in self._cache:
            if len(self._cache) > 16:
                self._cache.clear()
            self._cache[key] = self._build(h, w, device, rope_dtype)
        return self._cache[key]

    def _build(
        self, h: int, w: int, device: torch.device, rope_dtype: torch.dtype | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Two published behaviours. The original release builds the table in bfloat16 (coordinates,
        # periods, angles, sin/cos) and casts q/k to bfloat16 for the rotation even in an fp32 run:
        # the weights were trained that way, so rope_dtype=None reproduces it. transformers builds the
        # table in fp32 (rope_dtype=torch.float32); its outputs differ slightly from the release's.
        hd = self.head_dim
        if rope_dtype is None or rope_dtype == torch.bfloat16:
            dd = {"device": device, "dtype": torch.bfloat16}
            periods = ROPE_BASE ** (2 * torch.arange(hd // 4, **dd) / (hd // 2))
            coords = self._coords(h, w, dd)
            angles = 2 * math.pi * coords[:, :, None] / periods[None, None, :]
        else:
            dd = {"device": device, "dtype": torch.float32}
            inv_freq = 1 / ROPE_BASE ** (torch.arange(hd // 4, device=device, dtype=torch.float64) * 4 / hd)
            coords = self._coords(h, w, dd)
            angles = 2 * math.pi * coords[:, :, None] * inv_freq.float()[None, None, :]
        angles = angles.flatten(1, 2).tile(2)  # (hw, hd): all y-angles, all x-angles, repeated
        cos, sin = torch.cos(angles), torch.sin(angles)
        sin = torch.cat((-sin[:, : hd // 2], sin[:, hd // 2 :]), dim=-1)  # sign of rotate_half
        one = torch.ones(self.prefix, hd, **dd)
        cos = torch.cat((one, cos))
        sin = torch.cat((one * 0, sin))
        dtype = rope_dtype or torch.bfloat16
        return cos.to(dtype), sin.to(dtype)

    @staticmethod
    def _coords(h: int, w: int, dd: dict) -> torch.Tensor:
        ys = torch.arange(0.5, h, **dd) / h
        xs = torch.arange(0.5, w, **dd) / w
        coords = torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1).flatten(0, 1)
        return 2.0 * coords - 1.0  # patch centres in [-1, 1], row-major


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w12 = nn.Linear(dim, 2 * hidden)
        self.w3 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w12(x).chunk(2, dim=-1)  # first half is the gate
        if torch.is_grad_enabled() and gate.requires_grad:  # silu's backward needs its input
            return self.w3(F.silu(gate) * up)
        # in place in the gate half of w12's output: w3 reads it through its row stride, so no
        # (N, hidden) buffer is allocated, and silu runs on it at the speed of a contiguous tensor
        return self.w3(F.silu(gate, inplace=True).mul_(up))


class Block(nn.Module):
    def __init__(
        self,
        dim: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        ffn_hidden: int,
        *,
        qk_norm: bool = True,
        layer_scale: bool = True,
        qkv_bias: tuple[bool, bool, bool] = (True, True, True),
    ) -> None:
        super().__init__()
        self.ln1 = RMSNorm(dim)
        self.attn = Attention(
            dim, heads, kv_heads, head_dim, qk_norm=qk_norm, layer_scale=layer_scale, qkv_bias=qkv_bias
        )
        self.ln2 = RMSNorm(dim)
        self.ffn = SwiGLU(dim, ffn_hidden)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        x = self.attn(self.ln1(x), rope, residual=x)
        return self.ffn(self.ln2(x)).add_(x)  # in place on the fresh FFN output: no extra buffer


class PatchEmbed(nn.Module):
    def __init__(self, dim: int, patch_size: int) -> None:
        super().__init__()
        self.projection = nn.Conv2d(3, dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(x)


class WindowTokenizer(nn.Module):
    """The 1b-4k tokenizer: each ``window x window`` group of patch tokens becomes one token.

    Per window: a learned window-CLS token is prepended, a local absolute position embedding
    (1 + window^2 positions) is added, full-attention blocks without QK-norm, RoPE or layer scale
    run over the window, and the window-CLS output is kept. Key names (``tokenizer.w_cls``,
    ``tokenizer.local_pos_embed``, ``tokenizer.blocks.N.*``) and the head count (the encoder's)
    follow the release's public standalone backbone; the spec is silent on them.
    """

    def __init__(self, dim: int, heads: int, layers: int, ffn_hidden: int, window: int = 4) -> None:
        super().__init__()
        self.window = window
        self.w_cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.local_pos_embed = nn.Parameter(torch.zeros(1, 1 + window * window, dim))
        head_dim = dim // heads
        self.blocks = nn.ModuleList(
            Block(dim, heads, heads, head_dim, ffn_hidden, qk_norm=False, layer_scale=False)
            for _ in range(layers)
        )

    def forward(self, x: torch.Tensor, h: int, w: int, chunk: int = 4096) -> torch.Tensor:
        """(B, h*w, D) patch tokens -> (B, h/window * w/window, D) window tokens."""
        b, _, d = x.shape
        ws = self.window
        gh, gw = h // ws, w // ws
        windows = x.view(b, gh, ws, gw, ws, d).permute(0, 1, 3, 2, 4, 5).reshape(b * gh * gw, ws * ws, d)
        out = []
        for start in range(0, windows.shape[0], chunk):  # bounded memory at 4K inputs
            part = windows[start : start + chunk]
            t = torch.cat((self.w_cls.expand(part.shape[0], -1, -1), part), dim=1) + self.local_pos_embed
            for blk in self.blocks:
                t = blk(t)
            out.append(t[:, 0])
        return torch.cat(out).view(b, gh * gw, d)


class Backbone(nn.Module):
    """Sapiens2 encoder. ``forward`` returns the final-normed tokens and the encoder grid."""

    def __init__(self, config: BackboneConfig, rope_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        c = config
        self.config = c
        self.rope_dtype = rope_dtype
        self.patch_embed = PatchEmbed(c.hidden, c.patch_size)
        if c.tokenizer_layers:
            self.tokenizer = WindowTokenizer(
                c.hidden, c.heads, c.tokenizer_layers, c.tokenizer_ffn_hidden, c.tokenizer_window
            )
        else:
            self.tokenizer = None
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.hidden))
        self.storage_tokens = nn.Parameter(torch.zeros(1, c.registers, c.hidden)) if c.registers else None
        self.blocks = nn.ModuleList(
            Block(c.hidden, c.heads, kv, c.head_dim, c.ffn_hidden, qk_norm=c.qk_norm, qkv_bias=c.qkv_bias)
            for kv in c.kv_heads
        )
        self.ln1 = RMSNorm(c.hidden)
        self.num_prefix_tokens = 1 + c.registers
        self._rope = RopeTable(c.head_dim, self.num_prefix_tokens)

    def check_input(self, pixel_values: torch.Tensor) -> None:
        """Raise ``InputImageError`` (a ValueError) for anything but (B, 3, H, W) with H, W % stride == 0."""
        if not isinstance(pixel_values, torch.Tensor):
            raise InputImageError(
                f"Expected a torch.Tensor of shape (B, 3, H, W), got {type(pixel_values).__name__}."
            )
        shape = tuple(pixel_values.shape)
        if pixel_values.ndim != 4:
            raise InputImageError(f"Expected a 4-D tensor (B, 3, H, W), got shape {shape}.")
        if shape[1] != 3:
            raise InputImageError(f"Expected 3 colour channels in dim 1 (B, 3, H, W), got shape {shape}.")
        device = self.cls_token.device
        if pixel_values.device != device and device.type != "meta":
            raise InputImageError(
                f"The input is on {pixel_values.device} but the model on {device}; "
                f"move it first, e.g. pixel_values.to({str(device)!r})."
            )
        s = self.config.stride
        if shape[2] % s or shape[3] % s or shape[2] == 0 or shape[3] == 0:
            note = " (the 4K window tokenizer merges 4x4 patches of 16 px)" if self.tokenizer else ""
            raise InputImageError(
                f"Height and width must be positive multiples of {s}{note}, got {shape[2]}x{shape[3]}; "
                f"resize or pad the input, e.g. to {max(s, shape[2] // s * s)}x{max(s, shape[3] // s * s)}."
            )

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        self.check_input(pixel_values)
        x = self.patch_embed(pixel_values.to(self.cls_token.dtype))
        b, _, h, w = x.shape
        x = x.flatten(2).transpose(1, 2)
        if self.tokenizer is not None:
            x = self.tokenizer(x, h, w)
            h, w = h // self.tokenizer.window, w // self.tokenizer.window
        prefix = [self.cls_token.expand(b, -1, -1)]
        if self.storage_tokens is not None:
            prefix.append(self.storage_tokens.expand(b, -1, -1))
        x = torch.cat((*prefix, x), dim=1)
        rope = self._rope(h, w, x.device, self.rope_dtype)
        for blk in self.blocks:
            x = blk(x, rope)
        return self.ln1(x), (h, w)

    def feature_map(self, tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """Patch tokens as a (B, D, h, w) map for the dense heads."""
        b, _, d = tokens.shape
        patches = tokens[:, self.num_prefix_tokens :]
        return patches.transpose(1, 2).reshape(b, d, *grid)


_BLOCK_RE = re.compile(r"^blocks\.(\d+)\.ln1\.weight$")


def backbone_config_from_shapes(shapes: Shapes, prefix: str = "") -> BackboneConfig:
    """Read every width and count of the backbone from a checkpoint's tensor shapes."""

    def get(name: str) -> tuple[int, ...]:
        try:
            return tuple(shapes[prefix + name])
        except KeyError:
            raise CheckpointError(
                f"The checkpoint has no tensor {prefix + name!r}: not a Sapiens2 backbone."
            ) from None

    hidden = get("cls_token")[-1]
    patch = get("patch_embed.projection.weight")
    layers = sorted(
        int(m.group(1)) for k in shapes if (m := _BLOCK_RE.match(k[len(prefix) :])) and k.startswith(prefix)
    )
    if not layers or layers != list(range(len(layers))):
        raise CheckpointError("The checkpoint's backbone blocks are missing or not numbered 0..N-1.")
    qk_norm = prefix + "blocks.0.attn.q_norm.weight" in shapes
    if not qk_norm:
        raise CheckpointError("The checkpoint has no QK-norm weights, so its head count cannot be read.")
    head_dim = get("blocks.0.attn.q_norm.weight")[0]
    heads = get("blocks.0.attn.wq.weight")[0] // head_dim
    # a layer without wk keeps full heads here; the strict key check then reports the missing key
    kv_heads = tuple(
        shapes.get(f"{prefix}blocks.{i}.attn.wk.weight", (heads * head_dim,))[0] // head_dim for i in layers
    )
    qkv_bias = tuple(f"{prefix}blocks.0.attn.{w}.bias" in shapes for w in _QKV)
    registers = shapes[prefix + "storage_tokens"][1] if prefix + "storage_tokens" in shapes else 0
    tok_layers = sum(
        1 for k in shapes if re.match(re.escape(prefix) + r"tokenizer\.blocks\.\d+\.ln1\.weight$", k)
    )
    window, tok_ffn = 4, 0
    if tok_layers:
        window = math.isqrt(get("tokenizer.local_pos_embed")[1] - 1)
        tok_ffn = get("tokenizer.blocks.0.ffn.w12.weight")[0] // 2
    return BackboneConfig(
        hidden=hidden,
        heads=heads,
        head_dim=head_dim,
        kv_heads=kv_heads,
        ffn_hidden=get("blocks.0.ffn.w12.weight")[0] // 2,
        registers=registers,
        patch_size=patch[-1],
        qk_norm=qk_norm,
        qkv_bias=qkv_bias,  # type: ignore[arg-type]
        tokenizer_layers=tok_layers,
        tokenizer_window=window,
        tokenizer_ffn_hidden=tok_ffn,
    )
