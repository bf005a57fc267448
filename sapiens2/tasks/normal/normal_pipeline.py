"""Surface normals: a photo in, one unit normal per pixel (camera frame: x right, y down, z into
the scene as the release encodes it) at the original size out.

As in the release: aspect-preserving resize (size truncated, ``cv2.INTER_LINEAR``) with centred
zero padding to the network input, per-pixel L2 normalisation, padding cropped off, bilinear
resize to the original size (and one more normalisation, since interpolating unit vectors
shortens them). The device returns network-resolution float32 normals; the rest runs in finish.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import OptionError
from ...inputs.intake import Intake
from ...inputs.network import crop_padding, resize_hwc
from ...models.zoo import get_task
from ...ops.maps import unit_normalise
from ...outputs.writers import NOW, Writer
from ..base import TaskResult
from ..borrowed_seg import SegMaskedPipeline, seg_borrowing
from ..dense import DensePrep, DenseRaw, chunked_forward, start_result, to_cpu32
from ..options import Option
from ..registry import Task, Video
from ..result_record import ResultArray, array_record, save_arrays
from ..seg.seg_pipeline import TASK as SEG
from ..seg.seg_pipeline import NearestLabels, SegLogits


@dataclass(kw_only=True)
class NormalResult(TaskResult):
    """Unit surface normals at the original size, with the person mask when it was asked for."""

    normals: np.ndarray  # (H, W, 3) float32, unit length (zero where the model gave no value)
    mask: np.ndarray | None = None  # (H, W) bool, True on the person (background removal only)

    def render(self, *, background: str = "black") -> np.ndarray:
        """RGB = (n + 1) / 2 * 255 (x->R, y->G, z->B); ``background`` ("black" or "photo") shows
        outside the mask (everywhere the normal is valid when there is no mask)."""
        from .normal_render import normals_to_rgb

        if background not in ("black", "photo"):
            raise OptionError(f"background must be 'black' or 'photo'; got {background!r}.")
        bg: Any = self.image if background == "photo" else "black"
        return normals_to_rgb(self.normals, self.mask, bg)

    def save(
        self, out_dir: str | Path, *, rendered: np.ndarray | None = None, writer: Writer = NOW
    ) -> list[Path]:
        """Writes ``<name>_normal.npy`` (float16, (H, W, 3)), ``<name>_normal.png`` and, with a
        mask, ``<name>_normal_mask.png``; returns their paths.
        ``rendered``: an image already rendered (e.g. with the viewer's options) to write as the PNG
        instead of a fresh default ``render()``."""
        from ...outputs.export import safe_path, write_png

        picture = self.render() if rendered is None else rendered
        paths = save_arrays(self, ARRAYS, out_dir, self.name, writer=writer)
        return [*paths, write_png(safe_path(out_dir, self.name, "_normal.png"), picture, writer=writer)]


@dataclass
class NormalRaw(DenseRaw):
    """``NormalPipeline.infer``'s per-photo output: the model's normals at network resolution
    with the letterbox padding cut off (float32, not yet unit length), the borrowed seg's logits."""

    normals: np.ndarray | None = None  # (3, h, w) float32
    seg: SegLogits | NearestLabels | None = None  # NearestLabels: a live frame's


class NormalPipeline(SegMaskedPipeline):
    """Surface normals: ``NormalPipeline("0.4b")(photo)`` -> :class:`NormalResult`.

    ``seg``: the segmentation used by ``remove_background=True`` -- a SegPipeline, a zero-argument
    function returning one (called on every use, never kept), or None to load the seg model of the same size
    when first needed.
    """

    task = "normal"
    seg_fallback = "Every pixel is kept."

    def __call__(self, image: Any, *, remove_background: bool = False) -> NormalResult:
        """Normals of one image. ``remove_background`` also runs the body-part segmentation model
        (class 0 = background) to mask the person; if it cannot be loaded, a notice says so and
        every pixel is kept."""
        return self.run_stages(image, remove_background=remove_background)

    def prepare(
        self, intake: Intake, *, remove_background: bool = False, input_hw: Any = None, **_: Any
    ) -> DensePrep:
        return self.prepare_dense(intake, remove_background, input_hw)

    def infer(self, batch: list[DensePrep], *, nearest_labels: bool = False, **_: Any) -> list[NormalRaw]:
        raws = [NormalRaw() for _ in batch]
        for a, out in chunked_forward(self, [p.pixels for p in batch], [r.timing for r in raws]):
            for j, n in enumerate(out.normals):
                raws[a + j].normals = to_cpu32(crop_padding(n, batch[a + j].pad))
        self.infer_seg(batch, raws, nearest_labels)
        return raws

    def finish(self, raw: NormalRaw, intake: Intake, **_: Any) -> NormalResult:
        """As the release: unit length at network resolution, bilinear to the photo, unit again
        (interpolating unit vectors shortens them)."""
        info, notices = start_result(self, intake, raw)
        n = raw.normals.transpose(1, 2, 0).astype(np.float32, order="C")  # a copy: raw is kept as is
        if not np.isfinite(n).all():
            notices.append("The normal model returned non-finite values; those pixels are left at zero.")
            np.nan_to_num(n, copy=False, nan=0.0, posinf=0.0, neginf=0.0)
        # channel-last from here: cv2 resizes and normalises the photo-sized array in place
        n = unit_normalise(resize_hwc(unit_normalise(n), intake.size_hw))
        fg = self.foreground(raw, intake.size_hw)
        return NormalResult(
            image=intake.rgb,
            info=info,
            notices=notices,
            downscaled=intake.downscaled,
            name=intake.name,
            normals=n,
            mask=None if fg is None else fg.numpy(),
        )


# ----------------------------------------------------------------------------- declaration


_needs, _work = seg_borrowing("remove_background", default=False)


ARRAYS = (
    ResultArray("normals", "float16", "unit normal per pixel", files=("_normal.npy",)),
    ResultArray("mask", "bool", "the person mask", files=("_normal_mask.png",)),
)


TASK = Task(
    spec=get_task("normal"),
    pipeline=NormalPipeline,
    tab="Normals",
    button="Run normals",
    summary="Surface normals: one unit normal per pixel, shown as RGB.",
    result_label="Normals",
    downloads="Downloads (normals NPY float16, PNG, mask PNG)",
    work=_work,
    options=(
        Option(
            "remove_background",
            "bool",
            False,
            "infer",
            "Remove background (runs body parts too)",
            "mask the person with the body-part model",
        ),
        Option(
            "background",
            "choice",
            "black",
            "render",
            "Background",
            "what shows outside the person",
            choices=("black", "photo"),
            enabled_by="remove_background",
        ),
    ),
    borrows=(SEG,),
    needs=_needs,
    video=Video(),
    arrays=ARRAYS,
    record=array_record(ARRAYS),
)
