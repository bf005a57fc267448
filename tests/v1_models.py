"""Tiny Sapiens v1-shaped graphs written by the tests: the real input and output shapes
(SAPIENS_V1_SPEC.md 1.2) at a tiny width, saved as TorchScript (``torch.jit.trace`` +
``torch.jit.save``) and as an ExportedProgram (``torch.export.save``)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

#: task -> (output channels, stride-2 upsamplings after the 16x patch grid); pretrain has none
SHAPES = {"pose17": (17, 2), "pose133": (133, 2), "pose": (308, 2), "seg": (28, 3), "normal": (3, 3),
          "depth": (1, 4), "features": (0, 0)}  # fmt: skip
WIDTH = 8  # not a published v1 width: the files are custom-size models


class TinyV1(nn.Module):
    """Patch embedding (3 -> C, k16 s16) then ConvTranspose x ``ups`` and a 1x1 conv to ``out``
    channels; ``out == 0``: the pretrain graph, a 1-tuple of the (B, C, H/16, W/16) grid."""

    def __init__(self, out: int, ups: int) -> None:
        super().__init__()
        torch.manual_seed(out * 10 + ups)
        self.patch_embed = nn.Conv2d(3, WIDTH, 16, 16)
        layers: list[nn.Module] = []
        for _ in range(ups):
            layers += [nn.ConvTranspose2d(WIDTH, WIDTH, 4, 2, 1, bias=False), nn.SiLU()]
        self.head = nn.Sequential(*layers, nn.Conv2d(WIDTH, out, 1)) if out else None

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor]:
        f = self.patch_embed(x)
        return (f,) if self.head is None else self.head(f)


def save_v1(
    kind: str, folder: Path, fmt: str = "torchscript", batch: int = 1, hw: tuple[int, int] | None = None
) -> Path:
    """Write the tiny ``kind`` graph as ``sapiens_tiny_<kind>_<fmt>.pt2`` in ``folder``, traced or
    exported at ``hw`` (default: the release's input)."""
    out, ups = SHAPES[kind]
    model = TinyV1(out, ups).eval()
    hw = hw or ((1024, 1024) if kind == "features" else (1024, 768))
    x = torch.zeros(batch, 3, *hw)
    path = folder / f"sapiens_tiny_{kind}_{fmt}.pt2"
    if fmt == "torchscript":
        torch.jit.save(torch.jit.trace(model, x), str(path))
    else:
        torch.export.save(torch.export.export(model, (x,)), str(path))
    return path
