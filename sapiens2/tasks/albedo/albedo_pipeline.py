"""Albedo: a photo in, the surface colour without shading (RGB in [0, 1]) per pixel out.

The release ships it (``sapiens/dense/configs/albedo``, ``tools/vis/vis_albedo.py``) but its
weights are not on the Hub, so the zoo row says ``on_hub=False``: the task shows only where a
checkpoint is found (``--checkpoint albedo=PATH`` or the release's layout under
``$SAPIENS2_CHECKPOINTS``). Its head is the normal head with a channel RMSNorm (read from the
checkpoint's shapes by ``sapiens2.models.nn.heads``).

As in the release: the input is letterboxed exactly as for normals; the output is clamped to
[0, 1], the padding cropped, the result resized bilinearly (``align_corners=False``) to the
photo, x255 truncated to uint8, and the background (segmentation class 0) set to grey 100.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...errors import OptionError
from ...inputs.intake import Intake
from ...inputs.network import crop_padding, resize_to
from ...models.zoo import get_task
from ...outputs.writers import NOW, Writer
from ..base import TaskResult
from ..borrowed_seg import SegMaskedPipeline, seg_borrowing
from ..dense import DensePrep, DenseRaw, chunked_forward, start_result, to_cpu32
from ..options import Option
from ..registry import Task, Video
from ..result_record import ResultArray, array_record, save_arrays
from ..seg.seg_pipeline import TASK as SEG
from ..seg.seg_pipeline import NearestLabels, SegLogits

#: the release's background grey (vis_albedo.py)
BACKGROUND_GREY = 100


@dataclass(kw_only=True)
class AlbedoResult(TaskResult):
    """Albedo at the original size, with the person mask when segmentation ran."""

    albedo: np.ndarray  # (H, W, 3) float32 in [0, 1]
    mask: np.ndarray | None = None  # (H, W) bool, True on the person

    def render(self, *, background: str = "grey") -> np.ndarray:
        """uint8 RGB = albedo x 255 truncated (the release's cast); outside the mask grey 100
        (``background="grey"``, the release) or the photo (``"photo"``)."""
        if background not in ("grey", "photo"):
            raise OptionError(f"background must be 'grey' or 'photo'; got {background!r}.")
        out = (self.albedo * 255.0).astype(np.uint8)
        if self.mask is not None:
            out[~self.mask] = BACKGROUND_GREY if background == "grey" else self.image[~self.mask]
        return out

    def save(
        self, out_dir: str | Path, *, rendered: np.ndarray | None = None, writer: Writer = NOW
    ) -> list[Path]:
        """Writes ``<name>_albedo.png``, ``<name>_albedo.npy`` (float16, (H, W, 3) in [0, 1]) and,
        with a mask, ``<name>_albedo_mask.png``; ``rendered`` replaces the default PNG."""
        from ...outputs.export import safe_path, write_png

        picture = self.render() if rendered is None else rendered
        paths = [write_png(safe_path(out_dir, self.name, "_albedo.png"), picture, writer=writer)]
        return paths + save_arrays(self, ARRAYS, out_dir, self.name, writer=writer)


@dataclass
class AlbedoRaw(DenseRaw):
    """``AlbedoPipeline.infer``'s per-photo output: the model's albedo at network resolution, the
    letterbox padding cut off (float32, not yet clamped), and the borrowed seg's logits."""

    albedo: np.ndarray | None = None  # (3, h, w) float32
    seg: SegLogits | NearestLabels | None = None  # NearestLabels: a live frame's


class AlbedoPipeline(SegMaskedPipeline):
    """Albedo: ``AlbedoPipeline("1b", checkpoint=...)(photo)`` -> :class:`AlbedoResult`.

    ``seg``: the segmentation that greys the background (see :class:`SegMaskedPipeline`)."""

    task = "albedo"
    seg_fallback = "Every pixel is kept."

    def __call__(self, image: Any, *, use_segmentation: bool = True) -> AlbedoResult:
        """Albedo of one image; ``use_segmentation`` also runs the body-part model to grey the
        background, as the release does (if it cannot be loaded, a notice says so)."""
        return self.run_stages(image, use_segmentation=use_segmentation)

    def prepare(
        self, intake: Intake, *, use_segmentation: bool = True, input_hw: Any = None, **_: Any
    ) -> DensePrep:
        return self.prepare_dense(intake, use_segmentation, input_hw)

    def infer(self, batch: list[DensePrep], *, nearest_labels: bool = False, **_: Any) -> list[AlbedoRaw]:
        raws = [AlbedoRaw() for _ in batch]
        for a, out in chunked_forward(self, [p.pixels for p in batch], [r.timing for r in raws]):
            for j, values in enumerate(out.values):
                raws[a + j].albedo = to_cpu32(crop_padding(values, batch[a + j].pad))
        self.infer_seg(batch, raws, nearest_labels)
        return raws

    def finish(self, raw: AlbedoRaw, intake: Intake, **_: Any) -> AlbedoResult:
        """Clamp to [0, 1], bilinear to the photo (clamped again: float rounding in the resize can
        give 1 + 1e-7)."""
        info, notices = start_result(self, intake, raw)
        a = torch.from_numpy(raw.albedo)
        if not bool(torch.isfinite(a).all()):
            notices.append("The albedo model returned non-finite values; those pixels are left black.")
            a = torch.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0)
        a = resize_to(a.clamp(0.0, 1.0)[None], intake.size_hw)[0].clamp_(0.0, 1.0)
        fg = self.foreground(raw, intake.size_hw)
        return AlbedoResult(
            image=intake.rgb,
            info=info,
            notices=notices,
            downscaled=intake.downscaled,
            name=intake.name,
            albedo=a.permute(1, 2, 0).contiguous().numpy(),
            mask=None if fg is None else fg.numpy(),
        )


# ----------------------------------------------------------------------------- declaration


_needs, _work = seg_borrowing("use_segmentation", default=True)


ARRAYS = (
    ResultArray("albedo", "float16", "surface colour per pixel, in [0, 1]", files=("_albedo.npy",)),
    ResultArray("mask", "bool", "the person mask", files=("_albedo_mask.png",)),
)


TASK = Task(
    spec=get_task("albedo"),
    pipeline=AlbedoPipeline,
    tab="Albedo",
    button="Run albedo",
    summary="Albedo: the surface colour without shading, per pixel.",
    result_label="Albedo",
    downloads="Downloads (albedo PNG, NPY float16, mask PNG)",
    work=_work,
    options=(
        Option(
            "use_segmentation",
            "bool",
            True,
            "infer",
            "Find the person (runs body parts too)",
            "find the person with the body-part model, so the background can be grey or the photo",
        ),
        Option(
            "background",
            "choice",
            "grey",
            "render",
            "Background",
            "what shows outside the person: grey, as the release does, or the photo",
            choices=("grey", "photo"),
            enabled_by="use_segmentation",
        ),
    ),
    borrows=(SEG,),
    needs=_needs,
    video=Video(),
    arrays=ARRAYS,
    record=array_record(ARRAYS),
)
