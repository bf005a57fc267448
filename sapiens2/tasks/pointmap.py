"""Pointmap: a photo in, metric XYZ per pixel (camera frame: x right, y down, z forward, metres)
at the original size out, plus depth, a person mask and the implied focal length.

As in the release: aspect-preserving resize (size truncated, ``cv2.INTER_LINEAR``) with centred
zero padding, pointmap divided by the predicted scale (scale = canonical focal / actual focal),
padding cropped off, and -- when the photo is larger than that -- 4 passes of a 3x3 Gaussian
(sigma 0.8) before the bilinear resize to the original size; foreground from the body-part
segmentation. The device returns the network-resolution float32 pointmap; the rest runs in finish.
"""

from __future__ import annotations

import secrets
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from ..errors import ResultNotFoundError
from ..inputs.intake import Intake
from ..inputs.network import PadInfo, crop_padding
from ..models.zoo import POINTMAP_CANONICAL_FOCAL, get_task
from ..outputs.mesh import PREVIEW_MAX_FACES, GridMesh, finite_points, pixels_where
from .base import TaskResult
from .dense import DensePrep, DenseRaw, chunked_forward, start_result, to_cpu32
from .options import Option
from .registry import OnDemand, Task, Video, View
from .seg import SegLogits
from .seg_borrow import SegMaskedPipeline, seg_borrowing


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
        from ..outputs.render import depth_to_turbo

        return depth_to_turbo(self.depth, self.mask, percentiles=(1.0, 99.0), background=100)

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        """Foreground points (N, 3) float32 and their image colours (N, 3) uint8, row-major order."""
        return foreground_points(self.pointmap, self.mask, self.image)

    def sampled_points(self, max_points: int) -> tuple[np.ndarray, np.ndarray]:
        """The points of :meth:`points` that ``export.subsample`` keeps (at most ``max_points``,
        the viewer's cloud), gathered without the whole cloud (~170 MB at 12 MP)."""
        from ..outputs.export import subsample

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
        self, out_dir: str | Path, *, rendered: np.ndarray | None = None, later: bool = False
    ) -> list[Path]:
        """Writes ``<name>_depth.npy`` (H, W), ``<name>_pointmap.npy`` (H, W, 3), ``<name>_depth.png``
        (the render), ``<name>_pointcloud.ply`` (every foreground point, image colours),
        ``<name>_pointcloud.glb`` (a subset of at most ``export.GLB_MAX_POINTS``, glTF frame),
        ``<name>_mesh_preview.glb`` (the decimated mesh the 3D viewer shows) and
        ``<name>_mesh.glb`` and ``<name>_mesh.ply`` (the full-resolution mesh, :mod:`sapiens2.outputs.mesh`);
        returns their paths. ``rendered``: an image already rendered (e.g. with the viewer's
        options) to write as the PNG instead of a fresh default ``render()``.

        ``later``: leave the full-resolution files out (:data:`FULL_RESOLUTION`: at 12 MP the mesh's
        two files are up to ~1 GB and the point cloud PLY ~190 MB, more than the rest of the
        request's files) and write instead what :func:`full_resolution_files` makes them from when
        asked: the app's way (its "full-resolution files" button)."""
        from ..outputs.export import GLB_MAX_POINTS, safe_path, write_glb, write_npy, write_png
        from ..outputs.mesh import write_mesh_glb

        def path(suffix: str) -> Path:
            return safe_path(out_dir, self.name, suffix)

        # In order; inside file_writes.deferred_writes (as `present` runs it) each call only checks
        # its input and hands the writing to a pool, so the point cloud is written while the
        # mesh's faces are built here, and the big files (~300 MB a mesh file at 12 MP) overlap.
        files = [
            write_npy(path("_depth.npy"), self.depth),
            write_npy(path("_pointmap.npy"), self.pointmap),
            write_png(path("_depth.png"), self.render() if rendered is None else rendered),
        ]
        # later: the viewer's subset only, the same points write_glb picks from the whole cloud
        pts, cols = self.sampled_points(GLB_MAX_POINTS) if later else self.points()
        files.append(write_glb(path("_pointcloud.glb"), pts, cols))  # a subset: the viewer's cloud
        if later:
            keep_full_source(Path(out_dir), self)
        else:
            files += write_full_resolution(
                Path(out_dir), self.name, self.pointmap, self.mask, self.image, self.focal_px, (pts, cols)
            )
        files.append(write_mesh_glb(path("_mesh_preview.glb"), self.mesh(preview=True)))
        return [Path(p) for p in files]

    def mesh(self, *, preview: bool = False) -> GridMesh:
        """The foreground as a triangle mesh (:func:`sapiens2.outputs.mesh.grid_mesh`; vertices = the
        foreground points in :meth:`points` order), or with ``preview`` the decimated copy of at
        most ``mesh.PREVIEW_MAX_FACES`` faces."""
        from ..outputs.mesh import grid_mesh, preview_mesh

        build = preview_mesh if preview else grid_mesh
        return build(self.pointmap, self.mask, self.image, focal_px=self.focal_px)


#: The release's demo smooths the pointmap before enlarging it: 4 passes of a 3x3 Gaussian.
BLUR_SIGMA, BLUR_PASSES = 0.8, 4


def blur_release(pm: torch.Tensor) -> torch.Tensor:
    """(C, h, w) float32 -> ``BLUR_PASSES`` passes of a 3x3 Gaussian (sigma ``BLUR_SIGMA``,
    kernel as ``cv2.getGaussianKernel``), reflect padding (the edge pixel is not repeated:
    torch's "reflect", cv2's default border); a 1-pixel side repeats its edge instead."""
    g = torch.exp(-torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64) / (2 * BLUR_SIGMA**2))
    g = (g / g.sum()).float()
    c = pm.shape[0]
    kernel = (g[:, None] * g[None, :]).expand(c, 1, 3, 3).contiguous()
    mode = "reflect" if min(pm.shape[-2:]) >= 2 else "replicate"
    x = pm[None]
    for _ in range(BLUR_PASSES):
        x = F.conv2d(F.pad(x, (1, 1, 1, 1), mode=mode), kernel, groups=c)
    return x[0]


def to_photo(pm: torch.Tensor, out_hw: tuple[int, int]) -> np.ndarray:
    """(3, h, w) -> (H, W, 3) float32 numpy, the release's way back: when the photo is larger than
    the (cropped) output, blur first (:func:`blur_release`), then bilinear (half-pixel centres, no
    antialias) with ``cv2.INTER_LINEAR`` as the release does. cv2 writes the (H, W, 3) layout the
    result keeps directly and, at 12 MP, runs ~10x faster than torch's bilinear, whose float32
    source coordinates drift by ~1e-5 of the range far from the origin (cv2: ~1e-7)."""
    if out_hw[0] > pm.shape[-2] or out_hw[1] > pm.shape[-1]:
        pm = blur_release(pm)
    hwc = np.ascontiguousarray(pm.permute(1, 2, 0).numpy(), dtype=np.float32)
    if hwc.shape[:2] == tuple(out_hw):
        return hwc
    return cv2.resize(hwc, (out_hw[1], out_hw[0]), interpolation=cv2.INTER_LINEAR)


@dataclass
class PointmapRaw(DenseRaw):
    """``PointmapPipeline.infer``'s per-photo output: the canonical pointmap at network resolution
    with the padding cut off (float32), the scale output, the letterbox geometry, the seg logits."""

    pointmap: np.ndarray | None = None  # (3, h, w) float32, canonical units (not yet / scale)
    scale: float = float("nan")
    pad: PadInfo | None = None
    seg: SegLogits | None = None


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

    def infer(self, batch: list[DensePrep], **_: Any) -> list[PointmapRaw]:
        raws = [PointmapRaw(pad=p.pad) for p in batch]
        for a, out in chunked_forward(self, [p.pixels for p in batch], [r.timing for r in raws]):
            scales = out.scale.float().reshape(len(out.pointmap), -1)[:, 0].tolist()
            for j, (pm, scale) in enumerate(zip(out.pointmap, scales, strict=True)):
                raw = raws[a + j]
                raw.pointmap, raw.scale = to_cpu32(crop_padding(pm, raw.pad)), float(scale)
        self.infer_seg(batch, raws)
        return raws

    def finish(self, raw: PointmapRaw, intake: Intake, **_: Any) -> PointmapResult:
        info, notices = start_result(self, intake, raw)
        scale = raw.scale
        scale_used = scale if np.isfinite(scale) and scale > 0 else 1.0
        if scale_used != scale:
            notices.append(
                f"The model's scale output ({scale}) is unusable; the pointmap is in canonical units "
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


# ----------------------------------------------------------------------------- the big files, later


def foreground_points(
    pointmap: np.ndarray, mask: np.ndarray, image: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The points of ``pointmap`` (H, W, 3) under ``mask`` that are finite, (N, 3) float32, and
    their ``image`` colours (N, 3) uint8, in row-major order."""
    keep = mask & finite_points(pointmap)
    return pixels_where(pointmap, keep), pixels_where(image, keep)


#: The files ``save(..., later=True)`` leaves to :func:`full_resolution_files`, in its order.
FULL_RESOLUTION = ("_mesh.glb", "_mesh.ply", "_pointcloud.ply")


def write_full_resolution(
    folder: Path,
    name: str,
    pointmap: np.ndarray,
    mask: np.ndarray,
    image: np.ndarray,
    focal_px: float,
    points: tuple[np.ndarray, np.ndarray] | None = None,
) -> list[Path]:
    """The :data:`FULL_RESOLUTION` files of a result into ``folder``, in that order: the mesh
    (:func:`sapiens2.outputs.mesh.grid_mesh`) as GLB and PLY, and every foreground point as a PLY.
    ``points``: :func:`foreground_points` of these arrays, when the caller has them already.
    Inside ``deferred_writes`` the cloud is written while the mesh is built."""
    from ..outputs.export import safe_path, write_ply
    from ..outputs.mesh import grid_mesh, write_mesh_glb, write_mesh_ply

    glb, ply, cloud = (safe_path(folder, name, suffix) for suffix in FULL_RESOLUTION)
    write_ply(cloud, *(points if points is not None else foreground_points(pointmap, mask, image)))
    full = grid_mesh(pointmap, mask, image, focal_px=focal_px)
    return [write_mesh_glb(glb, full), write_mesh_ply(ply, full), cloud]


#: What :func:`full_resolution_files` needs besides ``<name>_pointmap.npy``, kept in the request
#: folder (not a download): the mask (bits), the photo (the colours), the focal length, the name.
FULL_SOURCE = Path("on_demand") / "pointmap_full.npz"


def keep_full_source(folder: Path, result: PointmapResult) -> Path:
    """Write :data:`FULL_SOURCE` for ``result`` into ``folder`` (on the pool of an active
    ``deferred_writes``): 1/8 byte a pixel for the mask, 3 for the photo (~38 MB at 12 MP)."""
    from ..outputs.writers import prepare, write_or_defer

    mask, image = np.packbits(result.mask, axis=None), result.image

    def write(p: Path) -> None:
        with open(p, "wb") as f:
            np.savez(
                f, mask=mask, image=image, focal_px=np.float64(result.focal_px), name=np.str_(result.name)
            )

    return write_or_defer(prepare(folder / FULL_SOURCE), write)


def full_resolution_files(folder: Path) -> list[Path]:
    """The :data:`FULL_RESOLUTION` files (the full-resolution mesh, GLB and PLY, and the point cloud
    PLY) of the pointmap result in ``folder`` (written there by ``save(..., later=True)``): the same
    files, byte for byte, that ``save()`` writes at once. Files already made are returned as they
    are; the files only appear complete (written under a temporary name first), so two requests
    at once never see half a file."""
    from ..outputs.export import safe_path
    from ..outputs.writers import WRITE_WORKERS, deferred_writes

    source = folder / FULL_SOURCE
    try:
        with np.load(source, allow_pickle=False) as kept:
            name, focal = str(kept["name"]), float(kept["focal_px"])
            image, bits = kept["image"], kept["mask"]
    except (OSError, KeyError, ValueError) as err:
        raise ResultNotFoundError(
            "This result has no full-resolution files to make (not a pointmap result, or it was "
            "made elsewhere). Run pointmap on the photo first."
        ) from err
    targets = [safe_path(folder, name, suffix) for suffix in FULL_RESOLUTION]
    if all(p.is_file() for p in targets):
        return targets
    pointmap = np.load(safe_path(folder, name, "_pointmap.npy"), allow_pickle=False)
    h, w = image.shape[:2]
    mask = np.unpackbits(bits, count=h * w).reshape(h, w).astype(bool)
    work = folder / f".making-{secrets.token_hex(8)}"
    try:
        # side by side, as save() writes them
        with (
            ThreadPoolExecutor(WRITE_WORKERS, thread_name_prefix="sapiens2-write") as pool,
            deferred_writes(pool),
        ):
            made = write_full_resolution(work, name, pointmap, mask, image, focal)
        for src, dst in zip(made, targets, strict=True):
            Path(src).replace(dst)  # atomic on one file system: a reader sees all or nothing
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return targets


# ----------------------------------------------------------------------------- declaration


_needs, _gpu_seconds = seg_borrowing("use_segmentation", default=True)


def _mesh_preview(result: Any, files: list[Path]) -> str | None:
    return next((str(p) for p in files if p.name.endswith("_mesh_preview.glb")), None)


TASK = Task(
    spec=get_task("pointmap"),
    pipeline=PointmapPipeline,
    api_name="pointmap",
    tab="Pointmap / 3D",
    button="Run pointmap",
    summary="Pointmap / 3D: metric XYZ per pixel, a depth view, a coloured point cloud and mesh.",
    result_label="Depth",
    downloads="Downloads (point cloud GLB, mesh preview GLB, depth and XYZ NPY, depth PNG)",
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
            make=full_resolution_files,
        ),
    ),
    borrows=("seg",),
    needs=_needs,
    cli_aliases={"use_segmentation": ("--segmentation",)},
    video=Video(handler="depth", raw_fields={"depth": np.float32, "mask": None}),
)
