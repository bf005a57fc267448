"""Depth (Sapiens v1 only): relative depth per pixel, not metric, with a person foreground.

As the v1 demo (SAPIENS_V1_SPEC.md 4.4): the photo stretched bilinearly to 1024x768, the model's
full-resolution (B, 1, 1024, 768) map resized bilinearly to the photo, saved raw (before any
masking); the foreground comes from the body-part segmentation (class > 0). Shown as the
pointmap tab shows depth: turbo colours of inverse depth on the foreground, bounds at its 1st
and 99th percentiles, background grey (the demo's inferno of inverted min-max depth is the
alternative, docs/SAPIENS_V1.md). Downloads: the raw ``.npy`` in the model's units, a 16-bit PNG
of the foreground (min-max over it, 0 = background), the picture, the mask, and the foreground in
3D, shape up to scale under an assumed field of view (``relative_depth_3d``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...inputs.intake import Intake
from ...inputs.network import crop_padding, resize_hwc
from ...models.zoo import get_task
from ...outputs.writers import NOW, Writer
from ..base import TaskResult
from ..borrowed_seg import SegMaskedPipeline, seg_borrowing
from ..dense import DensePrep, DenseRaw, chunked_forward, start_result, to_cpu32
from ..options import Option
from ..pointmap.pointmap_clip import DepthFrames
from ..registry import Task, Video, View
from ..result_record import ResultArray, array_record, save_arrays
from ..seg.seg_pipeline import TASK as SEG
from ..seg.seg_pipeline import NearestLabels, SegLogits
from .relative_depth_3d import ASSUMED_FOV_DEG, THREE_D_FILES, THREE_D_LABEL, assumed_focal_px, write_depth_3d

#: said wherever v1 depth is shown: its values have no unit
RELATIVE_NOTE = (
    "Sapiens v1 depth is relative, not metric: larger is farther within one photo, but the values "
    "have no unit and are not comparable between photos. Its 3D view is the shape up to scale under "
    f"an assumed {ASSUMED_FOV_DEG:g}° field of view; for metric 3D use the Pointmap tab."
)


@dataclass(kw_only=True)
class DepthResult(TaskResult):
    """Relative depth at the photo's size and the foreground it is shown on."""

    depth: np.ndarray  # (H, W) float32, the model's relative units, raw (NaN where not finite)
    mask: np.ndarray  # (H, W) bool: the person (segmentation) with a finite, positive depth

    def render(self) -> np.ndarray:
        """Turbo colours of inverse depth on the foreground (1st/99th percentile bounds), grey
        (100) elsewhere: the pointmap tab's convention."""
        from ...outputs.render import depth_to_turbo

        return depth_to_turbo(self.depth, self.mask, percentiles=(1.0, 99.0), background=100)

    def range(self) -> tuple[float, float] | None:
        """The foreground's (min, max) depth, what the 16-bit PNG spans; None without foreground."""
        values = self.depth[self.mask]
        return (float(values.min()), float(values.max())) if values.size else None

    def png16(self) -> np.ndarray:
        """(H, W) uint16: foreground depth min-max scaled to 1..65535, background 0."""
        out = np.zeros(self.depth.shape, np.uint16)
        bounds = self.range()
        if bounds is not None:
            lo, hi = bounds
            span = (self.depth[self.mask] - lo) / (hi - lo) if hi > lo else 0.0
            out[self.mask] = np.round(1 + 65534 * np.asarray(span, np.float64)).astype(np.uint16)
        return out

    def to_dict(self) -> dict[str, Any]:
        bounds = self.range()
        return {
            "relative": True,
            "note": RELATIVE_NOTE,
            "foreground_pixels": int(self.mask.sum()),
            "png16_range": None if bounds is None else {"value_1": bounds[0], "value_65535": bounds[1]},
            "3d": {
                "shape": "up to scale (depth up to one factor: the model's scale-invariant log loss)",
                "assumed_horizontal_fov_deg": ASSUMED_FOV_DEG,
                "assumed_focal_px": assumed_focal_px(self.depth.shape[1]),
                "files": [f"{self.name}{suffix}" for suffix in THREE_D_FILES],
            },
            "notices": list(self.notices),
        }

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "foreground_pixels": int(self.mask.sum()), "relative": True}

    def save(
        self, out_dir: str | Path, *, rendered: np.ndarray | None = None, writer: Writer = NOW
    ) -> list[Path]:
        """Writes ``<name>_depth.npy`` (raw, float32), ``<name>_depth16.png`` (:meth:`png16`),
        ``<name>_depth.png`` (the render), ``<name>_depth_mask.png``, ``<name>_depth.json`` (what
        the 16-bit PNG's values mean) and the foreground in 3D
        (:func:`~sapiens2.tasks.relative_depth.relative_depth_3d.write_depth_3d`: point cloud PLY
        and GLB, the viewer's mesh preview GLB)."""
        from ...outputs.export import safe_path, write_json, write_png

        def path(suffix: str) -> Path:
            return safe_path(out_dir, self.name, suffix)

        return [
            *save_arrays(self, ARRAYS, out_dir, self.name, writer=writer),
            write_png(path("_depth16.png"), self.png16(), writer=writer),
            write_png(path("_depth.png"), self.render() if rendered is None else rendered, writer=writer),
            write_json(path("_depth.json"), self.to_dict(), writer=writer),
            *write_depth_3d(out_dir, self.name, self.depth, self.mask, self.image, writer=writer),
        ]


@dataclass
class DepthRaw(DenseRaw):
    """``DepthPipeline.infer``'s per-photo output: the depth map at network resolution."""

    depth: np.ndarray | None = None  # (h, w) float32
    seg: SegLogits | NearestLabels | None = None  # NearestLabels: a live frame's


class DepthPipeline(SegMaskedPipeline):
    """Relative depth (Sapiens v1): ``DepthPipeline("v1-1b")(photo)`` -> :class:`DepthResult`."""

    task = "depth"
    seg_fallback = "Foreground = every pixel with a finite, positive depth."

    def __call__(self, image: Any, *, use_segmentation: bool = True) -> DepthResult:
        """Depth of one image; ``use_segmentation`` runs the body-part model for the foreground
        (without it, or when it cannot be loaded, every finite positive depth is foreground)."""
        return self.run_stages(image, use_segmentation=use_segmentation)

    def prepare(
        self, intake: Intake, *, use_segmentation: bool = True, input_hw: Any = None, **_: Any
    ) -> DensePrep:
        return self.prepare_dense(intake, use_segmentation, input_hw)

    def infer(self, batch: list[DensePrep], *, nearest_labels: bool = False, **_: Any) -> list[DepthRaw]:
        raws = [DepthRaw() for _ in batch]
        for a, out in chunked_forward(self, [p.pixels for p in batch], [r.timing for r in raws]):
            for j, d in enumerate(out.depth):
                raws[a + j].depth = to_cpu32(crop_padding(d[0], batch[a + j].pad))
        self.infer_seg(batch, raws, nearest_labels)
        return raws

    def finish(self, raw: DepthRaw, intake: Intake, **_: Any) -> DepthResult:
        info, notices = start_result(self, intake, raw)
        depth = resize_hwc(raw.depth, intake.size_hw)  # bilinear, half-pixel centres (the demo's)
        finite = np.isfinite(depth)
        if not finite.all():
            notices.append("The depth model returned non-finite values; those pixels are NaN.")
            depth[~finite] = np.nan
        fg = self.foreground(raw, intake.size_hw)
        with np.errstate(invalid="ignore"):
            valid = finite & (depth > 0)
        mask = valid if fg is None else fg.numpy() & valid
        if fg is not None and int((fg.numpy() & finite & ~valid).sum()):
            notices.append("Some person pixels have a depth <= 0 and are shown as background.")
        notices.append(RELATIVE_NOTE)
        return DepthResult(
            image=intake.rgb, info=info, notices=notices, downscaled=intake.downscaled, name=intake.name,
            depth=depth, mask=mask,
        )  # fmt: skip


# ----------------------------------------------------------------------------- declaration


_needs, _work = seg_borrowing("use_segmentation", default=True)


def _mesh_preview(result: Any, files: list[Path]) -> str | None:
    return next((str(p) for p in files if p.name.endswith("_depth_mesh_preview.glb")), None)


ARRAYS = (
    ResultArray("depth", "float32", "relative depth per pixel, the model's units", files=("_depth.npy",)),
    ResultArray("mask", "bool", "the person mask", files=("_depth_mask.png",)),
)


TASK = Task(
    spec=get_task("depth"),
    pipeline=DepthPipeline,
    tab="Depth (v1)",
    button="Run depth",
    summary="Depth (Sapiens v1): relative depth per pixel of the person, not metric, and its 3D shape up to scale.",
    result_label="Relative depth",
    downloads="Downloads (raw depth NPY, 16-bit depth PNG, picture, mask, JSON, point cloud PLY / GLB, mesh GLB)",
    work=_work,
    options=(
        Option(
            "use_segmentation",
            "bool",
            True,
            "infer",
            "Person only (runs body parts too)",
            "the foreground from the body-part model",
        ),
    ),  # fmt: skip
    views=(
        View("json", "Relative depth (not metric)", lambda result, files: result.to_dict()),
        View("model3d", f"3D mesh ({THREE_D_LABEL})", _mesh_preview),
    ),
    borrows=(SEG,),
    needs=_needs,
    cli_aliases={"use_segmentation": ("--segmentation",)},
    video=Video(handler=DepthFrames),
    arrays=ARRAYS,
    record=array_record(ARRAYS),
)
