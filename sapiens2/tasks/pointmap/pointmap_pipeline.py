"""Pointmap: a photo in, metric XYZ per pixel (camera frame: x right, y down, z forward, metres)
at the original size out, plus depth, a person mask and the implied focal length.

As in the release: aspect-preserving resize (size truncated, ``cv2.INTER_LINEAR``) with centred
zero padding, pointmap divided by the predicted scale (scale = canonical focal / actual focal),
padding cropped off, and -- when the photo is larger than that -- 4 passes of a 3x3 Gaussian
(sigma 0.8) before the bilinear resize to the original size; foreground from the body-part
segmentation. The device returns the network-resolution float32 pointmap; the rest runs in finish.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...inputs.intake import Intake
from ...inputs.network import PadInfo, crop_padding
from ...models.zoo import POINTMAP_CANONICAL_FOCAL, get_task
from ...ops.maps import to_photo
from ...outputs.mesh import PREVIEW_MAX_FACES, GridMesh, finite_points
from ...outputs.writers import NOW, Writer
from ..base import TaskResult
from ..borrowed_seg import SegMaskedPipeline, seg_borrowing
from ..dense import DensePrep, DenseRaw, chunked_forward, start_result, to_cpu32
from ..options import Option
from ..registry import OnDemand, Task, Video, View
from ..result_record import Column, ResultArray, array_record, save_arrays
from ..seg.seg_pipeline import TASK as SEG
from ..seg.seg_pipeline import NearestLabels, SegLogits
from .pointmap_clip import DepthFrames
from .pointmap_files import (
    foreground_points,
    full_resolution_names,
    full_resolution_source,
    make_full_resolution,
    write_full_resolution,
)


@dataclass(kw_only=True)
class PointmapResult(TaskResult):
    """Metric pointmap and depth at the original size.

    ``focal_px`` is the implied focal length in pixels of the ORIGINAL image (what a camera
    model of this photo would use); ``focal_px_input`` is the same focal in pixels of the
    network input (``768 / scale``, the release's definition).
    """

    pointmap: np.ndarray  # (H, W, 3) float32, metres (NaN where the model gave no value)
    depth: np.ndarray  # (H, W) float32 = pointmap Z
    mask: np.ndarray  # (H, W) bool foreground (person, finite, in front of the camera)
    scale: float  # the model's scale output (canonical focal / actual focal)
    focal_px: float  # implied focal length, original-image pixels
    focal_px_input: float  # implied focal length, network-input pixels (= 768 / scale)

    def render(self) -> np.ndarray:
        """Turbo colours of inverse depth on the foreground (bounds: 1st/99th percentile of its
        depth), grey (100) elsewhere."""
        from ...outputs.render import depth_to_turbo

        return depth_to_turbo(self.depth, self.mask, percentiles=(1.0, 99.0), background=100)

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        """Foreground points (N, 3) float32 and their image colours (N, 3) uint8, row-major order."""
        return foreground_points(self.pointmap, self.mask, self.image)

    def sampled_points(self, max_points: int) -> tuple[np.ndarray, np.ndarray]:
        """The points of :meth:`points` that ``export.subsample`` keeps (at most ``max_points``,
        the viewer's cloud), gathered without the whole cloud (~170 MB at 12 MP)."""
        from ...outputs.export import subsample

        at = np.flatnonzero(self.mask & finite_points(self.pointmap))
        at = at[subsample(len(at), max_points)]
        return self.pointmap.reshape(-1, 3)[at], self.image.reshape(-1, 3)[at]

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out.update(
            scale=self.scale,
            focal_px=self.focal_px,
            focal_px_input=self.focal_px_input,
            foreground_points=int(self.mask.sum()),
        )
        return out

    def save(
        self,
        out_dir: str | Path,
        *,
        rendered: np.ndarray | None = None,
        later: bool = False,
        writer: Writer = NOW,
    ) -> list[Path]:
        """Writes ``<name>_depth.npy`` (H, W), ``<name>_pointmap.npy`` (H, W, 3), ``<name>_depth.png``
        (the render), ``<name>_pointcloud.glb`` (a subset of at most ``export.GLB_MAX_POINTS``,
        glTF frame), the :data:`FULL_RESOLUTION` files (the full-resolution mesh as GLB and PLY,
        :mod:`sapiens2.outputs.mesh`, and every foreground point as a PLY) and
        ``<name>_mesh_preview.glb`` (the decimated mesh the 3D viewer shows); returns their paths.
        ``rendered``: an image already rendered (e.g. with the viewer's options) to write as the PNG
        instead of a fresh default ``render()``.

        ``later``: leave the full-resolution files out (at 12 MP they outweigh the rest of the
        request's files): the app makes them only when asked (``TASK.on_demand``)."""
        from ...outputs.export import GLB_MAX_POINTS, safe_path, write_png
        from ...outputs.export import write_point_cloud_glb as write_glb
        from ...outputs.mesh import write_mesh_glb

        def path(suffix: str) -> Path:
            return safe_path(out_dir, self.name, suffix)

        # In order; with a pooled writer each call only checks its input and hands the writing on,
        # so the point cloud is written while the mesh's faces are built here.
        picture = self.render() if rendered is None else rendered
        files = [
            *save_arrays(self, ARRAYS, out_dir, self.name, writer=writer),
            write_png(path("_depth.png"), picture, writer=writer),
        ]
        # later: the viewer's subset only, the same points write_glb picks from the whole cloud
        pts, cols = self.sampled_points(GLB_MAX_POINTS) if later else self.points()
        files.append(write_glb(path("_pointcloud.glb"), pts, cols, writer=writer))
        if not later:
            full = (self.pointmap, self.mask, self.image, self.focal_px)
            files += write_full_resolution(Path(out_dir), self.name, *full, (pts, cols), writer=writer)
        files.append(write_mesh_glb(path("_mesh_preview.glb"), self.mesh(preview=True), writer=writer))
        return files

    def mesh(self, *, preview: bool = False) -> GridMesh:
        """The foreground as a triangle mesh (:func:`sapiens2.outputs.mesh.grid_mesh`; vertices = the
        foreground points in :meth:`points` order), or with ``preview`` the decimated copy of at
        most ``mesh.PREVIEW_MAX_FACES`` faces."""
        from ...outputs.mesh import grid_mesh, preview_mesh

        build = preview_mesh if preview else grid_mesh
        return build(self.pointmap, self.mask, self.image, focal_px=self.focal_px)


@dataclass
class PointmapRaw(DenseRaw):
    """``PointmapPipeline.infer``'s per-photo output: the canonical pointmap at network resolution
    with the padding cut off (float32), the scale output, the letterbox geometry, the seg logits."""

    pointmap: np.ndarray | None = None  # (3, h, w) float32, canonical units (not yet / scale)
    scale: float = float("nan")
    pad: PadInfo | None = None
    seg: SegLogits | NearestLabels | None = None  # NearestLabels: a live frame's


class PointmapPipeline(SegMaskedPipeline):
    """Pointmap: ``PointmapPipeline("0.4b")(photo)`` -> :class:`PointmapResult`.

    ``seg``: the segmentation giving the foreground -- a SegPipeline, a zero-argument function
    returning one (called on every use, never kept), or None to load the seg model of the same size.
    """

    task = "pointmap"
    fixed_input = True
    seg_fallback = "Foreground = every finite, positive depth."

    @property
    def network_hw(self) -> tuple[int, int]:
        """Always the checkpoint's own size: the scale branch only accepts the trained grid."""
        return tuple(self.spec.input_size(self.size or ""))

    def __call__(self, image: Any, *, use_segmentation: bool = True) -> PointmapResult:
        """Pointmap of one image. ``use_segmentation`` runs the body-part segmentation model for the
        foreground; without it (or when it cannot be loaded, with a notice) the foreground is
        every pixel with a finite, positive depth."""
        return self.run_stages(image, use_segmentation=use_segmentation)

    def prepare(
        self, intake: Intake, *, use_segmentation: bool = True, input_hw: Any = None, **_: Any
    ) -> DensePrep:
        return self.prepare_dense(intake, use_segmentation, input_hw)

    def infer(self, batch: list[DensePrep], *, nearest_labels: bool = False, **_: Any) -> list[PointmapRaw]:
        raws = [PointmapRaw(pad=p.pad) for p in batch]
        for a, out in chunked_forward(self, [p.pixels for p in batch], [r.timing for r in raws]):
            scales = out.scale.float().reshape(len(out.pointmap), -1)[:, 0].tolist()
            for j, (pm, scale) in enumerate(zip(out.pointmap, scales, strict=True)):
                raw = raws[a + j]
                raw.pointmap, raw.scale = to_cpu32(crop_padding(pm, raw.pad)), float(scale)
        self.infer_seg(batch, raws, nearest_labels)
        return raws

    def finish(self, raw: PointmapRaw, intake: Intake, **_: Any) -> PointmapResult:
        info, notices = start_result(self, intake, raw)
        scale = raw.scale
        scale_used = scale if np.isfinite(scale) and scale > 0 else 1.0
        if scale_used != scale:
            notices.append(
                f"The model's scale output ({scale:.3g}) is unusable; the pointmap is in canonical units "
                "(scale 1) and the focal length is not known."
            )
        pm = torch.from_numpy(raw.pointmap)
        finite = torch.isfinite(pm)
        if not bool(finite.all()):
            notices.append("The pointmap model returned non-finite values; those pixels are NaN (no point).")
            pm = torch.where(finite, pm, torch.full_like(pm, float("nan")))  # inf -> NaN: one "missing" value
        pointmap = to_photo(pm / scale_used, intake.size_hw)
        with np.errstate(invalid="ignore"):
            valid = finite_points(pointmap) & (pointmap[:, :, 2] > 0)
        if not valid.any():
            notices.append("The model gave no point in front of the camera.")
        fg = self.foreground(raw, intake.size_hw)
        mask = valid if fg is None else fg.numpy() & valid
        focal_in = POINTMAP_CANONICAL_FOCAL / scale_used if scale_used == scale else float("nan")
        # focal lengths scale with the image: network-input px per original px along x is the
        # letterboxed width over the original width (intake downscale and letterbox resize together)
        focal_orig = focal_in * intake.rgb.shape[1] / raw.pad.inner_hw[1]
        return PointmapResult(
            image=intake.rgb,
            info=info,
            notices=notices,
            downscaled=intake.downscaled,
            name=intake.name,
            pointmap=pointmap,
            depth=np.ascontiguousarray(pointmap[:, :, 2]),
            mask=mask,
            scale=scale,
            focal_px=float(focal_orig),
            focal_px_input=float(focal_in),
        )


# ----------------------------------------------------------------------------- declaration


_needs, _work = seg_borrowing("use_segmentation", default=True)


def _mesh_preview(result: Any, files: list[Path]) -> str | None:
    return next((str(p) for p in files if p.name.endswith("_mesh_preview.glb")), None)


#: float32: the on-demand full-resolution mesh is built from the ``_pointmap.npy`` download.
ARRAYS = (
    ResultArray("depth", "float32", "metric depth per pixel", files=("_depth.npy",), in_record=False),
    ResultArray("pointmap", "float32", "metric XYZ per pixel", files=("_pointmap.npy",), in_clip=False),
    ResultArray("mask", "bool", "the person mask"),
)


def _row(result: PointmapResult) -> dict[str, Any]:
    return {
        "scale": result.scale,
        "focal_px": result.focal_px,
        "focal_px_input": result.focal_px_input,
    }


#: A batch row: the arrays above (pointmap float32, the person mask), the scale and focal lengths.
RECORD = array_record(
    ARRAYS,
    (
        Column("scale", "float", "the predicted scale"),
        Column("focal_px", "float", "the implied focal length, photo pixels"),
        Column("focal_px_input", "float", "the implied focal length, network input pixels"),
    ),
    _row,
)


TASK = Task(
    spec=get_task("pointmap"),
    pipeline=PointmapPipeline,
    tab="Pointmap / 3D",
    button="Run pointmap",
    summary="Pointmap / 3D: metric XYZ per pixel, a depth view, a coloured point cloud and mesh.",
    result_label="Depth",
    downloads="Downloads (point cloud GLB, mesh preview GLB, depth and XYZ NPY, depth PNG)",
    work=_work,
    options=(
        Option(
            "use_segmentation",
            "bool",
            True,
            "infer",
            "Person only (runs body parts too)",
            "keep only the person (body-part model) in the point cloud",
        ),
    ),
    views=(View("model3d", f"3D mesh (preview: at most {PREVIEW_MAX_FACES:,} faces)", _mesh_preview),),
    on_demand=(
        OnDemand(
            api_name="pointmap_mesh",
            button="Make the full-resolution mesh and point cloud (GLB + PLY)",
            label="Full-resolution mesh and point cloud (every foreground pixel a vertex)",
            summary=(
                "The full-resolution files of a pointmap result, made on request: the mesh (GLB and "
                "PLY, every foreground pixel a vertex) and the point cloud PLY. Pass the result's id or "
                "any of its file paths or URLs."
            ),
            missing=(
                "This result has no full-resolution files to make (not a pointmap result, or it was "
                "made elsewhere). Run pointmap on the photo first."
            ),
            source=lambda r: full_resolution_source(r.mask, r.image, r.focal_px, r.name),
            names=full_resolution_names,
            make=make_full_resolution,
        ),
    ),
    borrows=(SEG,),
    needs=_needs,
    cli_aliases={"use_segmentation": ("--segmentation",)},
    video=Video(handler=DepthFrames),
    arrays=ARRAYS,
    record=RECORD,
)
