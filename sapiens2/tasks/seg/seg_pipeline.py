"""Body-part segmentation (29 classes): a photo in, one class id per pixel at the original size out.

As in the release, the image is stretched to the network input (no aspect preservation;
``cv2.INTER_AREA`` when shrinking, ``cv2.INTER_CUBIC`` when enlarging) and the logits are resized
bilinearly to the original size before the argmax. The device returns the logits in a compact
exact form (:class:`sapiens2.tasks.seg.seg_logits.SegLogits`: the argmax plus full logit vectors only
around class boundaries), which the server resizes without ever holding 29 full-size planes.
Live alone asks for ``nearest_labels``: the device returns the network-resolution argmax and the
frame's labels are it enlarged nearest-neighbour (:mod:`sapiens2.tasks.seg.seg_nearest`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...data.metadata import SEG_CLASS_NAMES, SEG_PALETTE, seg_class_ids
from ...errors import OptionError
from ...inputs.intake import Intake
from ...inputs.network import dense_input
from ...models.boxes import as_boxes
from ...models.zoo import get_task
from ...outputs.writers import NOW, Writer
from ..base import Pipeline, TaskResult
from ..dense import DensePrep, DenseRaw, chunked_forward, start_result
from ..options import Option
from ..registry import Task, Video, View
from ..result_record import ResultArray, array_record, save_arrays
from .seg_logits import SegLogits, finite_logits
from .seg_nearest import NearestLabels
from .seg_render import (
    blend_segmentation,
    class_shares,
    label_ids,
    segmentation_legend,
    segmentation_legend_html,
)

__all__ = [
    "TASK",
    "NearestLabels",
    "SegLogits",
    "SegPipeline",
    "SegRaw",
    "SegResult",
    "person_masks_from_boxes",
]


def _as_boxes(boxes: Any) -> np.ndarray:
    """Person boxes (P, 4) as float64 x1, y1, x2, y2 in original-image pixels."""
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
    """Class id per pixel (0 = background; names in ``sapiens2.data.metadata.SEG_CLASS_NAMES``)."""

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

    def legend_html(self) -> str:
        """The same legend as readable text (HTML): names for people, largest share first."""
        return segmentation_legend_html(sorted(self.shares, key=lambda k: -self.shares[k]), self.shares)

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out["classes"] = {SEG_CLASS_NAMES[k]: round(v, 6) for k, v in self.shares.items()}
        if self.person_masks is not None:
            out["people"] = int(self.person_masks.shape[0])
        return out

    def save(
        self, out_dir: str | Path, *, rendered: np.ndarray | None = None, writer: Writer = NOW
    ) -> list[Path]:
        """Writes ``<name>_seg_labels.png`` (uint8 ids), ``_seg_labels.npy``, ``_seg_color.png``
        (palette only) and ``_seg.png`` (blended with the photo); returns their paths.
        ``rendered``: an image already rendered (e.g. with the viewer's options) to write as the PNG
        instead of a fresh default ``render()``."""
        from ...outputs.export import safe_path, write_png, write_png_palette

        def path(suffix: str) -> Path:
            return safe_path(out_dir, self.name, suffix)

        paths = [
            *save_arrays(self, ARRAYS, out_dir, self.name, writer=writer),
            # indices + palette: decodes to colorize_labels(labels), a faster encode than RGB
            write_png_palette(path("_seg_color.png"), label_ids(self.labels), SEG_PALETTE, writer=writer),
            write_png(path("_seg.png"), self.render() if rendered is None else rendered, writer=writer),
        ]
        return paths


@dataclass
class SegRaw(DenseRaw):
    """``SegPipeline.infer``'s per-photo output: compact logits and, with ``boxes="detect"``,
    the boxes the detector found (in working-copy pixels, as the photo it saw)."""

    logits: SegLogits | NearestLabels | None = None  # NearestLabels: Live's (``nearest_labels``)
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
        or ``"detect"`` to run the person detector (``sapiens2.models.detector.detect_people``)."""
        return self.run_stages(image, boxes=boxes)

    def prepare(self, intake: Intake, *, boxes: Any = None, input_hw: Any = None, **_: Any) -> DensePrep:
        """The release's stretch to the network input (INTER_AREA shrinking, INTER_CUBIC
        enlarging), uint8; the detector's photo only when ``boxes="detect"``. ``input_hw``:
        another network input (:meth:`~sapiens2.tasks.base.Pipeline.input_size`)."""
        if not _check_boxes(boxes) and boxes is not None:
            _as_boxes(boxes)  # a bad box fails here, before any device time
        photo = intake.work if isinstance(boxes, str) else None
        pixels, _ = dense_input(intake.work, self.input_size(input_hw), self.rules.dense_resize)
        return DensePrep(pixels, photo=photo)

    def seg_logits(
        self, images: list[np.ndarray], raws: list[DenseRaw], nearest: bool = False
    ) -> list[SegLogits | NearestLabels]:
        """Compact logits (on the CPU) of prepared inputs, or with ``nearest`` only their
        network-resolution argmax (Live's); device time and notices go to ``raws``."""
        out: list[SegLogits | NearestLabels] = []
        for _, result in chunked_forward(self, images, [r.timing for r in raws]):
            for logits in result.logits:
                notices = raws[len(out)].notices
                if nearest:
                    out.append(NearestLabels.from_logits(logits, notices).cpu())
                else:
                    out.append(SegLogits.from_logits(finite_logits(logits.float(), notices)).cpu())
        return out

    def infer(
        self, batch: list[DensePrep], *, boxes: Any = None, nearest_labels: bool = False, **_: Any
    ) -> list[SegRaw]:
        """``nearest_labels`` (Live): return the network-resolution argmax only; ``finish`` then
        enlarges it nearest-neighbour instead of the exact resize (seg_nearest.py)."""
        raws = [SegRaw() for _ in batch]
        pixels = [p.pixels for p in batch]
        for raw, logits in zip(raws, self.seg_logits(pixels, raws, nearest_labels), strict=True):
            raw.logits = logits
        if _check_boxes(boxes):
            from ...models.detector import detect_people

            for raw, prep in zip(raws, batch, strict=True):
                found = detect_people(prep.photo)
                raw.boxes, raw.notices = _as_boxes(found.boxes), [*raw.notices, *found.notices]
        return raws

    def finish(self, raw: SegRaw, intake: Intake, *, boxes: Any = None, **_: Any) -> SegResult:
        """Labels at the photo's size (exact argmax of the bilinearly resized logits; Live's
        ``nearest_labels``: the network's argmax enlarged nearest-neighbour), shares,
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


ARRAYS = (
    ResultArray("labels", "uint8", "class id per pixel", files=("_seg_labels.png", "_seg_labels.npy")),
    # (people, H, W) with boxes="detect": a photo download only
    ResultArray(
        "person_masks",
        "bool",
        "each person's mask",
        ("_seg_person_masks.npy",),
        in_record=False,
        in_clip=False,
    ),
)


TASK = Task(
    spec=get_task("seg"),
    pipeline=SegPipeline,
    tab="Body parts",
    button="Run body parts",
    summary="Body parts: one of 29 classes per pixel.",
    result_label="Body parts",
    downloads="Downloads (class ids PNG/NPY, colour PNG, blend PNG)",
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
    views=(View("html", "Body parts found", lambda result, files: result.legend_html()),),
    video=Video(),
    arrays=ARRAYS,
    record=array_record(ARRAYS),
)
