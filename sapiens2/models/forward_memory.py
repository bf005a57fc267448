"""How many inputs one forward may take: the bytes one input adds to a forward, estimated from the
model's own widths, against the memory the device has free.

Every task's ``infer`` runs its forwards in chunks of :func:`items_per_forward` inputs (a pose
crop, and its mirror with flip test, count as inputs), so a crowded batch (8 frames x 20 people)
needs one chunk's memory, never the whole batch's; the results are the unchunked forward's.

The rule (docs/DESIGN.md, "Bounded forwards"): per input, the backbone's widest moment (the
residual stream, its norm, q/k/v and the attention's output, the FFN's gated halves), the head's
widest layer (its input and output at once, the float32 predictor's input copy), and the output
three times (the output and two working copies while the task reduces it on the device: pose's
flip merge and DARK blur, seg's finite check), with a margin. Free memory: on CUDA what the driver
reports plus what torch's cache holds unused; on a CPU a share of the host's available memory
(``MemAvailable``, within the cgroup's limit), capped, because the host also holds the decoded
photos and other workers, and a CPU forward's time per input does not fall with a larger batch.
``$SAPIENS2_FORWARD_ITEMS`` (or a pipeline's ``forward_items``) sets the count outright.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from .zoo import ARCHS

#: Env var: inputs per forward, set outright (a positive integer; anything else is ignored).
FORWARD_ITEMS_ENV = "SAPIENS2_FORWARD_ITEMS"
#: Never more inputs per forward than this: past it a GPU gains no throughput (every input is
#: already ~3,000 tokens) and a larger batch only delays the first results.
MAX_ITEMS = 32
#: The estimate times this: allocator rounding and fragmentation, kernels' workspaces.
MARGIN = 1.25
#: The output's copies alive while a task reduces it on the device (itself and two working copies).
OUTPUT_COPIES = 3
#: Share of the reported free device memory a forward may plan for (the rest: other streams,
#: the allocator's slack, the borrowed models' forwards that follow).
DEVICE_SHARE = 0.7
#: Share of the host's available memory a CPU forward may plan for, and its cap.
HOST_SHARE = 0.25
HOST_CAP_BYTES = 4 << 30
#: Per-input bytes assumed for a model that declares no widths (a custom module): a 1b forward's order.
UNKNOWN_ITEM_BYTES = 1 << 30


def forced_items() -> int | None:
    """``$SAPIENS2_FORWARD_ITEMS`` as a positive int, else None."""
    raw = os.environ.get(FORWARD_ITEMS_ENV, "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else None


def _backbone_bytes(cfg: Any, input_hw: tuple[int, int], e: int) -> int:
    """The normalised input (float32, then ``dtype``), the patch tokens, and one block's widest
    moment over the encoder's tokens (the tokens also stay alive while the head runs)."""
    h, w = input_hw
    pixels = 3 * h * w * (4 + e)
    patches = (h // cfg.patch_size) * (w // cfg.patch_size)
    tokens = patches // (cfg.tokenizer_window**2 if cfg.tokenizer_layers else 1) + 1 + cfg.registers
    block = tokens * (6 * cfg.hidden + 2 * cfg.ffn_hidden)
    return pixels + e * (patches * cfg.hidden + block + tokens * cfg.hidden)


def _head_bytes(cfg: Any, grid: tuple[int, int], e: int) -> tuple[int, int]:
    """(the head's widest layer in bytes, its float32 output's bytes), walking its layers: each
    layer holds its input and its output at once."""
    h, w = grid
    ch, peak = cfg.in_channels, 0
    if cfg.input_conv is not None:
        peak, ch = 2 * ch * h * w, cfg.input_conv[0]
    for out, _ in cfg.upsample:  # a transposed conv, or a conv to 4x then a pixel shuffle: 2x the side
        peak = max(peak, ch * h * w + 4 * out * h * w, 8 * out * h * w)
        ch, h, w = out, 2 * h, 2 * w
    for out, _ in cfg.conv:
        peak = max(peak, (ch + out) * h * w)
        ch = out
    output = 4 * cfg.num_outputs * h * w
    return max(e * peak, (e + 4) * ch * h * w + output), output  # the predictor: a float32 copy in


def item_bytes(model: torch.nn.Module, input_hw: tuple[int, int], dtype: torch.dtype) -> int:
    """Estimated peak bytes one input adds to a forward of ``model`` at ``input_hw`` in ``dtype``
    (see the module docstring); from ``model.arch`` (the loader's widths), else the zoo's row for
    ``model.size`` (backbone only), else :data:`UNKNOWN_ITEM_BYTES`."""
    e = dtype.itemsize
    arch = getattr(model, "arch", None)
    cfg = getattr(arch, "backbone", None)
    if cfg is None:
        zoo = ARCHS.get(getattr(model, "size", None) or "")
        if zoo is None:
            return UNKNOWN_ITEM_BYTES
        from .nn.backbone import BackboneConfig

        cfg = BackboneConfig(zoo.hidden, zoo.heads, zoo.head_dim, (zoo.heads,) * zoo.layers, zoo.ffn_hidden)
    total = _backbone_bytes(cfg, input_hw, e)
    head = getattr(arch, "head", None)
    if head is not None:
        peak, output = _head_bytes(head, (input_hw[0] // cfg.stride, input_hw[1] // cfg.stride), e)
        total += peak + OUTPUT_COPIES * output
    return int(MARGIN * total)


def _meminfo_available(path: Path = Path("/proc/meminfo")) -> int | None:
    try:
        for line in path.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_headroom(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes left under the cgroup v2 memory limit, else None (no limit, or not readable)."""
    try:
        limit = (root / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((root / "memory.current").read_text()))
    except (OSError, ValueError):
        return None


def host_budget() -> int:
    """Bytes a CPU forward may plan for: :data:`HOST_SHARE` of the available memory, capped."""
    known = [b for b in (_meminfo_available(), _cgroup_headroom()) if b is not None]
    if not known and hasattr(os, "sysconf"):
        try:
            known.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError):
            pass
    available = min(known) if known else HOST_CAP_BYTES
    return int(min(HOST_CAP_BYTES, HOST_SHARE * available))


def device_budget(device: torch.device) -> int:
    """Bytes a forward on ``device`` may plan for: on CUDA :data:`DEVICE_SHARE` of the free memory
    (the driver's free plus torch's cached, unused blocks); elsewhere :func:`host_budget`."""
    if device.type != "cuda":
        return host_budget()
    try:
        free, _total = torch.cuda.mem_get_info(device)
    except (AssertionError, RuntimeError):
        # "cuda" without a driver: ZeroGPU's CUDA emulated by `spaces` on a CPU build (its own
        # tests, a CPU Space with SPACES_ZERO_GPU set), where the forward runs on the host
        return host_budget()
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(DEVICE_SHARE * (free + max(0, cached)))


def items_per_forward(
    model: torch.nn.Module,
    input_hw: tuple[int, int],
    device: torch.device,
    dtype: torch.dtype,
    forced: int | None = None,
) -> int:
    """Inputs one forward may take: ``forced`` (a pipeline's setting), else
    ``$SAPIENS2_FORWARD_ITEMS``, else the device's budget over :func:`item_bytes`, within
    [1, :data:`MAX_ITEMS`] (one input always runs, even where it may not fit)."""
    chosen = forced or forced_items()
    if chosen is not None:
        return max(1, int(chosen))
    per = max(1, item_bytes(model, input_hw, dtype))
    return max(1, min(MAX_ITEMS, device_budget(device) // per))


__all__ = [
    "FORWARD_ITEMS_ENV",
    "MAX_ITEMS",
    "device_budget",
    "host_budget",
    "item_bytes",
    "items_per_forward",
]
