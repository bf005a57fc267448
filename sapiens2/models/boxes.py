"""Person boxes as numbers: overlap (IoU), non-maximum suppression and checked (N, 4) arrays.

One implementation serves the detector (torch, on its device) and the clip tracker (numpy).
Boxes are ``x1, y1, x2, y2`` in pixels.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..errors import OptionError


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pairwise IoU of (N, 4) and (M, 4) xyxy boxes: (N, M); empty boxes have IoU 0."""
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(dim=2)
    area_a = (a[:, 2:] - a[:, :2]).clamp(min=0).prod(dim=1)
    area_b = (b[:, 2:] - b[:, :2]).clamp(min=0).prod(dim=1)
    union = area_a[:, None] + area_b[None, :] - inter
    # the clamp only keeps the masked-out division finite; where union > 0 it changes nothing
    return torch.where(
        union > 0, inter / union.clamp(min=torch.finfo(union.dtype).tiny), torch.zeros_like(inter)
    )


def iou_matrix(a: Any, b: Any) -> np.ndarray:
    """:func:`box_iou` of numpy boxes (anything shaped (N, 4)), in float64: (N, M)."""
    ta = torch.from_numpy(np.asarray(a, np.float64).reshape(-1, 4))
    tb = torch.from_numpy(np.asarray(b, np.float64).reshape(-1, 4))
    return box_iou(ta, tb).numpy()


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy non-maximum suppression in plain torch.

    Visits boxes by decreasing score (ties: lower index first) and drops every later box whose
    IoU with a kept one is greater than ``iou_threshold``. Returns kept indices, best first.
    """
    if boxes.ndim != 2 or boxes.shape[-1] != 4 or scores.shape != boxes.shape[:1]:
        raise OptionError(
            f"nms needs boxes (N, 4) and scores (N,); got {tuple(boxes.shape)} and {tuple(scores.shape)}."
        )
    order = torch.sort(scores, descending=True, stable=True).indices
    if order.numel() == 0:
        return order
    # DETR gives at most a few hundred boxes: one IoU matrix, then a cheap loop on the CPU.
    overlaps = (box_iou(boxes[order].float(), boxes[order].float()) > iou_threshold).cpu()
    suppressed = torch.zeros(order.numel(), dtype=torch.bool)
    keep = []
    for i in range(order.numel()):
        if suppressed[i]:
            continue
        keep.append(i)
        suppressed |= overlaps[i]
    return order[torch.tensor(keep, dtype=torch.long, device=order.device)]


def xyxy_from_centres(boxes: torch.Tensor, width: int, height: int) -> torch.Tensor:
    """(..., 4) ``cx, cy, w, h`` boxes relative to the image (DETR's) -> xyxy pixels."""
    cx, cy, bw, bh = boxes.float().unbind(-1)
    xyxy = torch.stack((cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2), dim=-1)
    return xyxy * torch.tensor([width, height, width, height], dtype=xyxy.dtype, device=xyxy.device)


def as_boxes(boxes: Any, what: str = "boxes", dtype: Any = np.float32) -> np.ndarray:
    """(N, 4) x1, y1, x2, y2 boxes from a list, array, tensor or anything with ``.boxes``; an
    OptionError naming ``what`` when they are not finite numbers of that shape."""
    boxes = getattr(boxes, "boxes", boxes)
    if isinstance(boxes, torch.Tensor):
        boxes = boxes.detach().cpu().numpy()
    try:
        arr = np.asarray(boxes, dtype=dtype)
    except (TypeError, ValueError) as err:
        raise OptionError(f"{what} must be numbers shaped (N, 4) as x1, y1, x2, y2; {err}.") from None
    if arr.size == 0:
        return arr.reshape(0, 4)
    if arr.ndim == 1 and arr.size == 4:
        arr = arr[None]
    if arr.ndim != 2 or arr.shape[1] != 4:
        raise OptionError(f"{what} must be shaped (N, 4) as x1, y1, x2, y2 in pixels; got shape {arr.shape}.")
    if not np.isfinite(arr).all():
        raise OptionError(f"{what} contain NaN or infinite values.")
    return arr
