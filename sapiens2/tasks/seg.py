"""Body-part segmentation (29 classes): a photo in, one class id per pixel at the original size out.

As in the release, the image is stretched to the network input (no aspect preservation;
``cv2.INTER_AREA`` when shrinking, ``cv2.INTER_CUBIC`` when enlarging) and the logits are resized
bilinearly to the original size before the argmax. The device returns the logits in a compact
exact form (:class:`SegLogits`: the argmax plus full logit vectors only around class
boundaries), and the server resizes them without ever holding 29 full-size planes, so a
12-megapixel photo costs a few uint8 planes instead of 1.4 GB of float logits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import OptionError
from ..imaging import Intake
from ..metadata import SEG_CLASS_NAMES, seg_class_ids
from ..network_input import stretch_release
from ..options import Option
from ..render import blend_segmentation, class_shares, colorize_labels, segmentation_legend
from ..zoo import get_task
from .base import Pipeline, TaskResult
from .dense import DensePrep, DenseRaw, chunked_forward, start_result
from .registry import Task, Video, View, forward_seconds

# finite stand-ins for non-finite logits: a NaN class must never win the argmax
_NEG_FILL, _POS_FILL = -1e30, 1e30
#: Boundary pixels resolved per step in SegLogits.labels: moderate on CPU so the temporaries stay
#: near the cache (1<<16 ran 1.4x faster than 1<<18 on a 12 MP photo), large on GPU (fewer launches).
_CHUNK = {"cpu": 1 << 16, "cuda": 1 << 20}


def _source_index(
    n_out: int, n_in: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """F.interpolate's bilinear sampling (align_corners=False) along one axis: for each output
    index, the two source indices and the weight of the second."""
    scale = torch.tensor(n_in / n_out, dtype=torch.float32)
    src = ((torch.arange(n_out, device=device, dtype=torch.float32) + 0.5) * scale.to(device) - 0.5).clamp_(
        min=0
    )
    i0 = src.long().clamp_(max=n_in - 1)
    i1 = (i0 + 1).clamp_(max=n_in - 1)
    return i0, i1, src - i0


def _mixed_cells(low: torch.Tensor) -> torch.Tensor:
    """(h, w) bool: the source cell (i, j)..(i+1, j+1) has corners of different argmax (edges
    replicate, as the interpolation's clamped indices do)."""
    right = torch.cat([low[:, 1:], low[:, -1:]], 1)
    down = torch.cat([low[1:], low[-1:]], 0)
    diag = torch.cat([right[1:], right[-1:]], 0)
    return (low != right) | (low != down) | (low != diag)


@dataclass
class SegLogits:
    """Network-resolution logits kept only where an argmax after bilinear resizing can need them.

    An output pixel mixes the logit vectors of the 4 source pixels around it; when those 4 share
    one argmax, a convex mix of them has that argmax too. So the argmax (``low``) decides every
    pixel except those whose source cell is mixed, and those need the full logit vectors of the
    cell's 4 corners: ``index`` (flat source indices) and ``values`` (their logits, float32).
    A person photo's logits are a few percent of the 29 x 1024 x 768 (91 MB) float32 tensor.
    """

    low: torch.Tensor  # (h, w) uint8 argmax at network resolution
    index: torch.Tensor  # (N,) int32 flat indices of the corners of mixed cells
    values: torch.Tensor  # (N, C) float32 their logits

    @classmethod
    def from_logits(cls, logits: torch.Tensor) -> SegLogits:
        """(C, h, w) float logits (on any device) -> the compact form on the same device."""
        c, h, w = logits.shape
        flat = logits.float().reshape(c, h * w)
        low = flat.argmax(0).to(torch.uint8).view(h, w)
        mixed = _mixed_cells(low)
        need = mixed.clone()  # a pixel is needed when it is a corner of a mixed cell
        need[:, 1:] |= mixed[:, :-1]
        need[1:] |= mixed[:-1]
        need[1:, 1:] |= mixed[:-1, :-1]
        index = need.flatten().nonzero().squeeze(1)
        return cls(low, index.to(torch.int32), flat[:, index].t().contiguous())

    def cpu(self) -> SegLogits:
        return SegLogits(self.low.cpu(), self.index.cpu(), self.values.cpu())

    def labels(self, out_hw: tuple[int, int]) -> torch.Tensor:
        """(H, W) uint8 = argmax of the logits resized bilinearly (``F.interpolate``,
        ``align_corners=False``) to ``out_hw``, computed without the (C, H, W) tensor."""
        h, w = self.low.shape
        out_h, out_w = int(out_hw[0]), int(out_hw[1])
        dev = self.low.device
        rows = torch.full((h * w,), -1, dtype=torch.long, device=dev)  # source pixel -> row of values
        rows[self.index.long()] = torch.arange(self.index.numel(), device=dev)
        y0, y1, wy = _source_index(out_h, h, dev)
        x0, x1, wx = _source_index(out_w, w, dev)
        labels = self.low[y0][:, x0]  # (H, W): exact wherever the cell is not mixed
        todo = _mixed_cells(self.low)[y0][:, x0].flatten().nonzero().squeeze(1)
        out = labels.view(-1)
        step = _CHUNK.get(dev.type, _CHUNK["cuda"])
        for a in range(0, todo.numel(), step):
            idx = todo[a : a + step]
            yy, xx = idx // out_w, idx % out_w
            ay, ax = wy[yy, None], wx[xx, None]
            r0, r1, c0, c1 = y0[yy] * w, y1[yy] * w, x0[xx], x1[xx]
            v = self.values
            top = v[rows[r0 + c0]] * (1 - ax) + v[rows[r0 + c1]] * ax
            bottom = v[rows[r1 + c0]] * (1 - ax) + v[rows[r1 + c1]] * ax
            out[idx] = (top * (1 - ay) + bottom * ay).argmax(1).to(torch.uint8)
        return labels


def finite_logits(logits: torch.Tensor, notices: list[str]) -> torch.Tensor:
    """Non-finite logits replaced by finite stand-ins (a NaN class never wins), with a notice."""
    if bool(torch.isfinite(logits).all()):
        return logits
    notices.append("The segmentation model returned non-finite values; they were ignored.")
    return torch.nan_to_num(logits.float(), nan=_NEG_FILL, posinf=_POS_FILL, neginf=_NEG_FILL)


def _as_boxes(boxes: Any) -> np.ndarray:
    """Person boxes (P, 4) as float64 x1, y1, x2, y2 in original-image pixels."""
    from ..detect import as_boxes

    return as_boxes(boxes, dtype=np.float64)


def person_masks_from_boxes(foreground: torch.Tensor, boxes: np.ndarray) -> torch.Tensor:
    """(P, H, W) bool: foreground pixels whose centre lies inside each box (boxes may overlap)."""
    h, w = foreground.shape
    dev = foreground.device
    if len(boxes) == 0:
        return torch.zeros((0, h, w), dtype=torch.bool, device=dev)
    b = torch.as_tensor(boxes, dtype=torch.float32, device=dev)
    ys = torch.arange(h, device=dev, dtype=torch.float32) + 0.5
    xs = torch.arange(w, device=dev, dtype=torch.float32) + 0.5
    in_y = (ys[None] >= b[:, 1:2]) & (ys[None] < b[:, 3:4])  # (P, H)
    in_x = (xs[None] >= b[:, 0:1]) & (xs[None] < b[:, 2:3])  # (P, W)
    return in_y[:, :, None] & in_x[:, None, :] & foreground[None]


@dataclass(kw_only=True)
class SegResult(TaskResult):
    """Class id per pixel (0 = background; names in ``sapiens2.metadata.SEG_CLASS_NAMES``)."""

    labels: np.ndarray  # (H, W) uint8 class ids at the original size
    shares: dict[int, float]  # class id -> fraction of image pixels, only classes present
    person_masks: np.ndarray | None = None  # (P, H, W) bool, when person boxes were given
    boxes: np.ndarray | None = None  # (P, 4) the boxes behind person_masks

    def render(self, *, opacity: float = 0.5, classes: Iterable[int | str] | None = None) -> np.ndarray:
        """The photo blended with the class colours (release look at opacity 0.5); ``classes``
        keeps only the listed ids or names (others show the plain photo)."""
        if not 0.0 <= float(opacity) <= 1.0:
            raise OptionError(f"opacity must be between 0 and 1; got {opacity}.")
        ids = None if classes is None else seg_class_ids(classes)
        return blend_segmentation(self.image, self.labels, opacity=float(opacity), classes=ids)

    def legend(self) -> np.ndarray:
        """An RGB image listing the classes present (largest share first) with their colours."""
        ids = sorted(self.shares, key=lambda k: -self.shares[k])
        return segmentation_legend(ids, self.shares)

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out["classes"] = {SEG_CLASS_NAMES[k]: round(v, 6) for k, v in self.shares.items()}
        if self.person_masks is not None:
            out["people"] = int(self.person_masks.shape[0])
        return out

    def save(self, out_dir: str | Path, *, rendered: np.ndarray | None = None) -> list[Path]:
        """Writes ``<name>_seg_labels.png`` (uint8 ids), ``_seg_labels.npy``, ``_seg_color.png``
        (palette only) and ``_seg.png`` (blended with the photo); returns their paths.
        ``rendered``: an image already rendered (e.g. with the viewer's options) to write as the PNG
        instead of a fresh default ``render()``."""
        from ..export import safe_path, write_npy, write_png

        paths = [
            write_png(safe_path(out_dir, self.name, "_seg_labels.png"), self.labels),
            write_npy(safe_path(out_dir, self.name, "_seg_labels.npy"), self.labels),
            write_png(safe_path(out_dir, self.name, "_seg_color.png"), colorize_labels(self.labels)),
            write_png(
                safe_path(out_dir, self.name, "_seg.png"), self.render() if rendered is None else rendered
            ),
        ]
        if self.person_masks is not None and len(self.person_masks):
            paths.append(write_npy(safe_path(out_dir, self.name, "_seg_person_masks.npy"), self.person_masks))
        return [Path(p) for p in paths]


@dataclass
class SegRaw(DenseRaw):
    """``SegPipeline.infer``'s per-photo output: compact logits and, with ``boxes="detect"``,
    the boxes the detector found (in working-copy pixels, as the photo it saw)."""

    logits: SegLogits | None = None
    boxes: np.ndarray | None = None


def _check_boxes(boxes: Any) -> bool:
    """True for ``"detect"``; raises OptionError for any other string."""
    if isinstance(boxes, str) and boxes != "detect":
        raise OptionError(f"boxes must be None, 'detect', or (P, 4) x1, y1, x2, y2 rows; got {boxes!r}.")
    return isinstance(boxes, str)


class SegPipeline(Pipeline):
    """Body-part segmentation: ``SegPipeline("0.4b")(photo)`` -> :class:`SegResult`."""

    task = "seg"

    def __call__(self, image: Any, *, boxes: Any = None) -> SegResult:
        """Segment one image (path, PIL image or numpy RGB).

        ``boxes`` gives per-person masks (the non-background pixels inside each box; a pixel in
        two boxes belongs to both): (P, 4) x1, y1, x2, y2 in original pixels, a ``Detections``,
        or ``"detect"`` to run the person detector (``sapiens2.detect.detect_people``)."""
        return self.run_stages(image, boxes=boxes)

    def prepare(self, intake: Intake, *, boxes: Any = None, **_: Any) -> DensePrep:
        """The release's stretch to the network input (INTER_AREA shrinking, INTER_CUBIC
        enlarging), uint8; the detector's photo only when ``boxes="detect"``."""
        if not _check_boxes(boxes) and boxes is not None:
            _as_boxes(boxes)  # a bad box fails here, before any device time
        photo = intake.work if isinstance(boxes, str) else None
        return DensePrep(stretch_release(intake.work, self.network_hw), photo=photo)

    def seg_logits(self, images: list[np.ndarray], raws: list[DenseRaw]) -> list[SegLogits]:
        """Compact logits (on the CPU) of prepared inputs; device time and notices go to ``raws``."""
        out: list[SegLogits] = []
        for _, result in chunked_forward(self, images, [r.timing for r in raws]):
            for logits in result.logits:
                raw = raws[len(out)]
                out.append(SegLogits.from_logits(finite_logits(logits.float(), raw.notices)).cpu())
        return out

    def infer(self, batch: list[DensePrep], *, boxes: Any = None, **_: Any) -> list[SegRaw]:
        raws = [SegRaw() for _ in batch]
        for raw, logits in zip(raws, self.seg_logits([p.pixels for p in batch], raws), strict=True):
            raw.logits = logits
        if _check_boxes(boxes):
            from ..detect import detect_people

            for raw, prep in zip(raws, batch, strict=True):
                found = detect_people(prep.photo)
                raw.boxes, raw.notices = _as_boxes(found.boxes), [*raw.notices, *found.notices]
        return raws

    def finish(self, raw: SegRaw, intake: Intake, *, boxes: Any = None, **_: Any) -> SegResult:
        """Labels at the photo's size (exact argmax of the bilinearly resized logits), shares,
        and the per-person masks when boxes were given or found."""
        info, notices = start_result(self, intake, raw)
        notices[len(intake.notices) : len(intake.notices)] = getattr(boxes, "notices", [])
        box_arr = raw.boxes if _check_boxes(boxes) else None if boxes is None else _as_boxes(boxes)
        labels = raw.logits.labels(intake.size_hw)
        masks = None
        if box_arr is not None:
            if raw.boxes is not None:  # the detector saw the working copy
                box_arr = intake.boxes_to_original(box_arr).astype(np.float64)
            masks = person_masks_from_boxes(labels != 0, box_arr).numpy()
        labels_np = labels.numpy()
        fractions = class_shares(labels_np)
        shares = {int(k): float(fractions[k]) for k in np.flatnonzero(fractions)}
        return SegResult(
            image=intake.rgb,
            info=info,
            notices=notices,
            downscaled=intake.downscaled,
            name=intake.name,
            labels=labels_np,
            shares=shares,
            person_masks=masks,
            boxes=box_arr,
        )


# ----------------------------------------------------------------------------- declaration


def _gpu_seconds(size: str, pixels: int, infer_opts: Mapping[str, Any]) -> float:
    return forward_seconds(size)  # the resize to the photo runs in the server (finish)


TASK = Task(
    spec=get_task("seg"),
    pipeline=SegPipeline,
    api_name="seg",
    tab="Body parts",
    button="Run body parts",
    summary="Body parts: one of 29 classes per pixel.",
    result_label="Body parts",
    downloads="Downloads (class ids PNG/NPY, colour PNG, blend PNG)",
    gpu_seconds=_gpu_seconds,
    options=(
        Option(
            "opacity",
            "float",
            0.5,
            "render",
            "Colour opacity",
            "colour opacity over the photo",
            low=0.0,
            high=1.0,
            step=0.05,
        ),
        Option(
            "classes",
            "classes",
            None,
            "render",
            "Show only (empty: all)",
            "class names or ids to show (empty: all)",
            choices=tuple(SEG_CLASS_NAMES),
            resolve=seg_class_ids,
        ),
    ),
    views=(View("image", "Classes found", lambda result, files: result.legend()),),
    video=Video(raw_fields={"labels": None}),
)
