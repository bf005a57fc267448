"""Live's body-part labels: the class argmax at the network's resolution, enlarged nearest-neighbour.

The photo tabs, clips, batch and the API keep the release's labels to the bit: the argmax of the
logits resized bilinearly to the photo (:class:`~sapiens2.tasks.seg.seg_logits.SegLogits`). A live
view cannot afford that on a CPU (docs/LIVE.md, "Body parts and depth"), so its device step takes
the argmax once at the network's resolution and returns only that uint8 map
(:class:`NearestLabels`); the server enlarges it to the frame by nearest neighbour. The two differ
only where the 2x2 network pixels around an output pixel disagree (a class edge): there the exact
label is decided inside that cell, this one is the class of the nearest of those network pixels,
at most half a network pixel away along each axis.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .seg_logits import class_argmax, finite_logits


def network_labels(logits: torch.Tensor, notices: list[str]) -> torch.Tensor:
    """(C, h, w) logits (any device, any float dtype) -> (h, w) uint8 argmax on that device, the
    first class among ties, as ``finite_logits`` then ``argmax`` give it.

    The non-finite check rides on the argmax's own maximum (:func:`class_argmax`): only where a
    maximum is NaN or infinite are the logits made finite, with ``finite_logits``' notice, and the
    argmax taken again. A -inf below a pixel's maximum changes no label and goes without a notice."""
    c, h, w = logits.shape
    if c > 255:  # the labels are bytes
        return finite_logits(logits.float(), notices).argmax(0).to(torch.uint8)
    low = class_argmax(logits.float().reshape(c, h * w))
    if low is None:
        low = class_argmax(finite_logits(logits.float(), notices).reshape(c, h * w))
    return low.view(h, w)


def nearest_index(n_out: int, n_in: int) -> np.ndarray:
    """For each of ``n_out`` output pixels the source pixel whose centre is nearest (pixel
    centres aligned, as the bilinear resize aligns them; an exact half goes to the later one)."""
    return ((2 * np.arange(n_out, dtype=np.int64) + 1) * n_in // (2 * n_out)).clip(0, n_in - 1)


def _enlarged(low: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
    h, w = low.shape
    out_h, out_w = int(out_hw[0]), int(out_hw[1])
    if out_h < 1 or out_w < 1:
        raise ValueError(f"out_hw must be positive; got {out_hw!r}.")
    return low.take(nearest_index(out_h, h), 0).take(nearest_index(out_w, w), 1)


@dataclass
class NearestLabels:
    """The network-resolution label map a live frame's device step returns (a few hundred kB of
    bytes instead of the compact logits); ``labels``/``foreground`` as
    :class:`~sapiens2.tasks.seg.seg_logits.SegLogits` name them, enlarged nearest-neighbour."""

    low: torch.Tensor  # (h, w) uint8 argmax at network resolution

    @classmethod
    def from_logits(cls, logits: torch.Tensor, notices: list[str]) -> NearestLabels:
        return cls(network_labels(logits, notices))

    def cpu(self) -> NearestLabels:
        return NearestLabels(self.low.cpu())

    def labels(self, out_hw: tuple[int, int]) -> torch.Tensor:
        """(H, W) uint8 on the CPU: the network-resolution labels enlarged nearest-neighbour."""
        return torch.from_numpy(_enlarged(self.low.cpu().numpy(), out_hw))

    def foreground(self, out_hw: tuple[int, int]) -> torch.Tensor:
        """(H, W) bool on the CPU: ``labels(out_hw) != 0`` (not the background class)."""
        return torch.from_numpy(_enlarged(self.low.cpu().numpy() != 0, out_hw))


__all__ = ["NearestLabels", "nearest_index", "network_labels"]
