"""Pose's optional 3D keypoints: the pointmap borrowed the way normals borrow segmentation.

With the pose option ``keypoints_3d``, the pose pipeline also runs the pointmap model (and its
body-part segmentation, for the people's mask) on the same photo, in the same three stages: the
pointmap's prep rides in the pose prep, its forward follows pose's in ``infer``, and ``finish``
lifts every keypoint with :func:`sapiens2.tasks.pose.pose_lift.lift_keypoints`. The result carries
:class:`Keypoints3D`; ``save`` writes ``<name>_keypoints3d.json`` and ``<name>_skeleton3d.glb``
(the point cloud with the skeletons inside).

The skeleton-in-cloud GLB is a download, not a view of the tab: a view would add an output to
``/pose`` and shift its files and run info for every API caller (:func:`skeleton_view` is ready
for one).

Off by default: it runs two more models (pointmap and segmentation at 1024x768) beside the pose
crops, about three times a pose request's GPU seconds and ~40 s more per photo on a 2-core CPU
at 0.4b, for a download few visitors need.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import CheckpointError, OptionError, WeightsUnavailableError
from ...inputs.intake import Intake
from ...outputs.writers import NOW, Writer
from ..options import Option
from ..pointmap.pointmap_pipeline import TASK as POINTMAP
from ..pointmap.pointmap_pipeline import PointmapPipeline
from ..registry import Task
from ..seg.seg_pipeline import TASK as SEG
from .pose_lift import lift_keypoints

OPTION = "keypoints_3d"
#: pose's option that turns the 3D keypoints on
DECLARATION = Option(
    OPTION, "bool", False, "infer", "3D keypoints (runs pointmap and body parts too)",
    "give every keypoint X, Y, Z in metres from the pointmap, and show the skeleton in the point cloud",
)  # fmt: skip
#: Points of the photo's cloud in the skeleton GLB (the viewer's; the pointmap task has them all).
CLOUD_POINTS = 150_000


@dataclass
class Keypoints3D:
    """A photo's 3D keypoints (camera frame, metres) and the cloud they are shown in."""

    points: np.ndarray  # (P, 308, 3) float32, NaN where no depth was found
    samples: np.ndarray  # (P, 308) int32 pointmap samples behind each point
    focal_px: float
    cloud: np.ndarray  # (N, 3) float32 a subset of the person's points
    cloud_colors: np.ndarray  # (N, 3) uint8


class LazyPointmap:
    """The pointmap pipeline pose borrows: given, from a factory (called on every use, never
    kept: the server's model cache stays free to evict it), or loaded next to the pose model."""

    def __init__(self, source: Any, owner: Any) -> None:
        if source is not None and not (isinstance(source, PointmapPipeline) or callable(source)):
            raise OptionError(
                f"pointmap must be a PointmapPipeline, a function returning one, or None; got {type(source).__name__}."
            )
        self._factory = None if isinstance(source, PointmapPipeline) else source
        self._pipe = source if isinstance(source, PointmapPipeline) else None
        self._owner = owner
        self._lock = threading.Lock()

    def get(self) -> PointmapPipeline:
        if self._factory is not None:
            return self._factory()
        with self._lock:
            if self._pipe is None:
                own = self._owner
                size = own.size if own.size in POINTMAP.spec.sizes else None
                self._pipe = PointmapPipeline(size, device=own.device, dtype=own.dtype)
            return self._pipe

    def available(self, notices: list[str]) -> Any:
        """The pipeline, or None with a notice when its weights cannot be had."""
        try:
            return self.get()
        except (WeightsUnavailableError, CheckpointError) as err:
            notices.append(f"No 3D keypoints: the pointmap model is unavailable ({err}).")
            return None


def prepare(borrowed: LazyPointmap, intake: Intake, notices: list[str]) -> Any:
    """The pointmap's own prep of the photo (with the people's mask), or None."""
    pipe = borrowed.available(notices)
    return None if pipe is None else pipe.prepare(intake, use_segmentation=True)


def infer(borrowed: LazyPointmap, preps: list[Any]) -> list[Any]:
    """The pointmap forward for the preps that carry one (None elsewhere), on the device."""
    todo = [i for i, p in enumerate(preps) if p is not None]
    out: list[Any] = [None] * len(preps)
    if todo:
        raws = borrowed.get().infer([preps[i] for i in todo])
        for i, raw in zip(todo, raws, strict=True):
            out[i] = raw
    return out


def finish(
    borrowed: LazyPointmap,
    raw: Any,
    intake: Intake,
    keypoints: np.ndarray,
    boxes: np.ndarray,
    notices: list[str],
) -> Keypoints3D | None:
    """The pointmap at the photo's size, and the keypoints (photo pixels) lifted from it (on the
    people's mask: with no segmentation the mask is every valid point, and the box still
    bounds each person)."""
    if raw is None:
        return None
    pm = borrowed.get().finish(raw, intake)
    notices.extend(n for n in pm.notices if n not in notices)
    lifted = lift_keypoints(keypoints, pm.pointmap, pm.mask, boxes)
    cloud, colors = pm.sampled_points(CLOUD_POINTS)
    return Keypoints3D(lifted.points, lifted.samples, float(pm.focal_px), cloud, colors)


def needs(infer_opts: Mapping[str, Any]) -> tuple[Task, ...]:
    """What a pose request loads besides pose: the pointmap and its segmentation when asked (each
    one more forward of a photo: ``models.cost.Work.borrowed``)."""
    return (POINTMAP, SEG) if infer_opts.get(OPTION) else ()


def save(result: Any, out_dir: str | Path, *, threshold: float, writer: Writer = NOW) -> list[Path]:
    """``<name>_keypoints3d.json`` and ``<name>_skeleton3d.glb`` of a pose result with 3D keypoints."""
    from ...outputs.export import safe_path, write_json
    from .skeleton3d import keypoints3d_json, write_skeleton_cloud_glb

    k3 = result.keypoints_3d
    shown = np.where((result.scores >= threshold)[..., None], k3.points, np.nan)
    doc = keypoints3d_json(
        k3.points, result.keypoints, result.scores, k3.samples, image_size=result._wh(),
        focal_px=k3.focal_px, boxes=result.boxes,
    )  # fmt: skip
    return [
        write_json(safe_path(out_dir, result.name, "_keypoints3d.json"), doc, writer=writer),
        write_skeleton_cloud_glb(
            safe_path(out_dir, result.name, "_skeleton3d.glb"),
            k3.cloud,
            k3.cloud_colors,
            shown,
            writer=writer,
        ),
    ]


def skeleton_view(result: Any, files: list[Path]) -> str | None:
    return next((str(p) for p in files if p.name.endswith("_skeleton3d.glb")), None)


__all__: list[str] = [
    "CLOUD_POINTS",
    "DECLARATION",
    "OPTION",
    "Keypoints3D",
    "LazyPointmap",
    "finish",
    "infer",
    "needs",
    "prepare",
    "save",
    "skeleton_view",
]
