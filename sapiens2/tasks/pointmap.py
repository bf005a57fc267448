"""Pointmap: a photo in, metric XYZ per pixel (camera frame: x right, y down, z forward, metres)
at the original size out, plus depth, a person mask and the implied focal length.

As in the release: aspect-preserving resize with centred zero padding, pointmap divided by the
predicted scale (scale = canonical focal / actual focal), padding cropped off, bilinear resize
to the original size; foreground from the body-part segmentation.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..imaging import letterbox, unletterbox
from ..options import Option
from ..zoo import POINTMAP_CANONICAL_FOCAL, get_task
from .base import TaskResult
from .registry import Task, View, forward_seconds
from .seg import SegMaskedPipeline


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
        from ..render import depth_to_turbo

        return depth_to_turbo(self.depth, self.mask, percentiles=(1.0, 99.0), background=100)

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        """Foreground points (N, 3) float32 and their image colours (N, 3) uint8, row-major order."""
        keep = self.mask & np.isfinite(self.pointmap).all(axis=2)
        return self.pointmap[keep], self.image[keep]

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out.update(
            scale=self.scale,
            focal_px=self.focal_px,
            focal_px_input=self.focal_px_input,
            foreground_points=int(self.mask.sum()),
        )
        return out

    def save(self, out_dir: str | Path, *, rendered: np.ndarray | None = None) -> list[Path]:
        """Writes ``<name>_depth.npy`` (H, W), ``<name>_pointmap.npy`` (H, W, 3), ``<name>_depth.png``
        (the render), ``<name>_pointcloud.ply`` (every foreground point, image colours) and
        ``<name>_pointcloud.glb`` (a subset of at most ``export.GLB_MAX_POINTS``, glTF frame); returns their paths.
        ``rendered``: an image already rendered (e.g. with the viewer's options) to write as the PNG
        instead of a fresh default ``render()``."""
        from ..export import safe_path, write_glb, write_npy, write_ply, write_png

        pts, cols = self.points()
        paths = [
            write_npy(safe_path(out_dir, self.name, "_depth.npy"), self.depth),
            write_npy(safe_path(out_dir, self.name, "_pointmap.npy"), self.pointmap),
            write_png(
                safe_path(out_dir, self.name, "_depth.png"), self.render() if rendered is None else rendered
            ),
            write_ply(safe_path(out_dir, self.name, "_pointcloud.ply"), pts, cols),
            write_glb(safe_path(out_dir, self.name, "_pointcloud.glb"), pts, cols),  # subsampled for browsers
        ]
        return [Path(p) for p in paths]


class PointmapPipeline(SegMaskedPipeline):
    """Pointmap: ``PointmapPipeline("0.4b")(photo)`` -> :class:`PointmapResult`.

    ``seg``: the segmentation giving the foreground -- a SegPipeline, a zero-argument function
    returning one (called on every use, never kept), or None to load the seg model of the same size.
    """

    task = "pointmap"

    def __call__(self, image: Any, *, use_segmentation: bool = True) -> PointmapResult:
        """Pointmap of one image. ``use_segmentation`` runs the body-part segmentation model for the
        foreground; without it (or when it cannot be loaded, with a notice) the foreground is
        every pixel with a finite, positive depth."""
        t0, intake, info, notices = self._begin(image)
        in_hw = self.spec.input_size(self.size or "")
        x, pad = letterbox(intake.work, in_hw, self.device, self.dtype)
        out = self.timed_forward(info, x)
        scale = float(out.scale.float().reshape(-1)[0])
        if not (np.isfinite(scale) and scale > 0):
            notices.append(
                f"The model's scale output ({scale}) is unusable; the pointmap is in canonical units "
                "(scale 1) and the focal length is not known."
            )
            scale_used = 1.0
        else:
            scale_used = scale
        pm = out.pointmap.float()
        finite = torch.isfinite(pm)
        if not bool(finite.all()):
            notices.append("The pointmap model returned non-finite values; those pixels are NaN (no point).")
            pm = torch.where(finite, pm, torch.full_like(pm, float("nan")))  # inf -> NaN: one "missing" value
        pm = unletterbox(pm / scale_used, pad, intake.rgb.shape[:2])[0]
        valid = torch.isfinite(pm).all(0) & (pm[2] > 0)
        if not bool(valid.any()):
            notices.append("The model gave no point in front of the camera.")
        fg = None
        if use_segmentation:
            fg = self.seg.foreground(intake, info, notices, "Foreground = every finite, positive depth.")
        mask = valid if fg is None else fg & valid
        pointmap = pm.permute(1, 2, 0).contiguous().cpu().numpy()
        focal_in = POINTMAP_CANONICAL_FOCAL / scale_used if scale_used == scale else float("nan")
        # focal lengths scale with the image: network-input px per original px along x is the
        # letterboxed width over the original width (intake downscale and letterbox resize together)
        focal_orig = focal_in * intake.rgb.shape[1] / pad.inner_hw[1]
        info.total_s = time.perf_counter() - t0
        return PointmapResult(
            image=intake.rgb,
            info=info,
            notices=notices,
            downscaled=intake.downscaled,
            name=intake.name,
            pointmap=pointmap,
            depth=np.ascontiguousarray(pointmap[:, :, 2]),
            mask=mask.cpu().numpy(),
            scale=scale,
            focal_px=float(focal_orig),
            focal_px_input=float(focal_in),
        )


# ----------------------------------------------------------------------------- declaration


def _needs(infer_opts: Mapping[str, Any]) -> tuple[str, ...]:
    return ("seg",) if infer_opts.get("use_segmentation", True) else ()


def _gpu_seconds(size: str, pixels: int, infer_opts: Mapping[str, Any]) -> float:
    return forward_seconds(size, 1 + len(_needs(infer_opts)))


def _glb(result: Any, files: list[Path]) -> str | None:
    return next((str(p) for p in files if p.suffix == ".glb"), None)


TASK = Task(
    spec=get_task("pointmap"),
    pipeline=PointmapPipeline,
    api_name="pointmap",
    tab="Pointmap / 3D",
    button="Run pointmap",
    summary="Pointmap / 3D: metric XYZ per pixel, a depth view and a coloured point cloud.",
    result_label="Depth",
    downloads="Downloads (PLY, GLB, depth and XYZ NPY, depth PNG)",
    gpu_seconds=_gpu_seconds,
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
    views=(View("model3d", "Point cloud (GLB)", _glb),),
    borrows=("seg",),
    needs=_needs,
    cli_aliases={"use_segmentation": ("--segmentation",)},
)
