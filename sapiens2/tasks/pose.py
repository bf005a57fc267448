"""Top-down pose with 308 keypoints: people boxes -> crops -> one forward -> keypoints on the photo.

Flow of :class:`PosePipeline`, in its three stages (``__call__`` = all three in a row):

1. ``prepare`` (CPU, server): intake done by the caller (upright RGB + a working copy of at most
   ``max_side`` px); caller boxes checked and clipped; the prep keeps only uint8 pixels: the
   release's person crops of known boxes when smaller than the working copy, else the copy;
2. ``infer`` (the device step; on ZeroGPU the only part inside the GPU function): person boxes
   where a prep has none (``detect_people``: DETR, an injected detector, or the whole image
   ``[0, 0, w-1, h-1]``); every box -> centre, size x1.25, widened to 3:4 -> UDP affine crop to
   768x1024 (:func:`sapiens2.tasks.pose_crops.crop_people`); ONE forward for all crops of all preps, plus
   their mirrored copies when ``flip_test`` (mirrored heatmaps flipped back, left/right channels
   swapped, averaged with the plain ones); :func:`decode_heatmaps` (argmax + DARK-UDP) in float32
   on the device; heatmap px -> crop px -> working-copy px. Only (P, 308) arrays come back;
3. ``finish`` (CPU, server): working-copy px -> original px, the :class:`PoseResult`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..data.metadata import FLIP_INDEX, NUM_KEYPOINTS
from ..errors import OptionError
from ..inputs import network as network_input
from ..inputs.intake import ImageSource, Intake
from ..models.zoo import get_task
from . import pose_3d
from .base import Pipeline, RunInfo, TaskResult
from .options import Option
from .pose_codec import decode_checked, decode_heatmaps, flip_back, heatmap_to_crop, merge_flip
from .pose_crops import CropInfo, apply_affine, crop_geometry, crop_people, warp_crops
from .registry import FileGroup, Switch, Task, Video, View, forward_seconds

if TYPE_CHECKING:
    from ..inputs.detector import Detections

__all__ = ["PosePipeline", "PosePrep", "PoseRaw", "PoseResult", "decode_heatmaps", "flip_back", "merge_flip"]


@dataclass(kw_only=True)
class PoseResult(TaskResult):
    """Per person: a box and 308 keypoints (x, y, score) in original-image pixels."""

    boxes: np.ndarray  # (P, 4) float32 x1, y1, x2, y2
    box_scores: np.ndarray  # (P,) float32 (1.0 for caller / whole-image boxes)
    keypoints: np.ndarray  # (P, 308, 2) float32 x, y
    scores: np.ndarray  # (P, 308) float32 heatmap maxima (<= 0: not found)
    detection_source: str = "detector"  # "detector" | "caller" | "whole_image"
    num_found: int = 0  # people the detector found before the max_people cap
    flip_test: bool = False
    keypoints_3d: pose_3d.Keypoints3D | None = None  # with the keypoints_3d option

    @property
    def num_people(self) -> int:
        return int(self.keypoints.shape[0])

    def render(
        self,
        *,
        threshold: float = 0.3,
        show_face: bool = True,
        body_only: bool = False,
        show_boxes: bool = False,
    ) -> np.ndarray:
        """The photo with skeletons (links, then points) for keypoints scoring >= ``threshold``."""
        from ..outputs.render import draw_pose

        return draw_pose(
            self.image,
            self.keypoints,
            self.scores,
            threshold=threshold,
            show_face=show_face,
            body_only=body_only,
            boxes=self.boxes if show_boxes else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """The 308-point JSON (names, x, y, score per person) plus how the people were found."""
        from ..outputs.export import pose_json

        out = pose_json(
            self.keypoints, self.scores, self.boxes, image_size=self._wh(), box_scores=self.box_scores
        )
        out["detection"] = {"source": self.detection_source, "num_found": self.num_found}
        out["flip_test"] = self.flip_test
        out["notices"] = list(self.notices)
        return out

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out.update(people=self.num_people, detection=self.detection_source, flip_test=self.flip_test)
        if self.keypoints_3d is not None:
            out["keypoints_with_depth"] = int(np.isfinite(self.keypoints_3d.points).all(-1).sum())
        return out

    def save(
        self, out_dir: str | Path, *, threshold: float = 0.3, rendered: np.ndarray | None = None
    ) -> list[Path]:
        """Writes ``<name>_pose.json`` (308 named points), ``<name>_openpose.png`` (the ControlNet
        conditioning picture) and ``<name>_pose.png`` (the rendering), then the keypoint formats:
        ``<name>_coco17.json``, ``<name>_coco_wholebody.json`` (133 points, COCO's results layout),
        ``<name>_openpose_body25.json`` and ``<name>_openpose_coco18.json`` (bodies, hands and
        faces, :mod:`sapiens2.outputs.openpose`), ``<name>_keypoints.csv`` (a row per person and
        keypoint); with 3D keypoints (the ``keypoints_3d`` option) also
        ``<name>_keypoints3d.json`` and ``<name>_skeleton3d.glb`` (:mod:`sapiens2.tasks.pose_3d`); returns the paths. ``threshold`` decides which points COCO-17/OpenPose mark as
        detected (and the conditioning picture draws). ``rendered``: an image already rendered
        (e.g. with the viewer's options) to write as the PNG instead of a fresh
        ``render(threshold=threshold)``."""
        from ..outputs import keypoint_formats as kf
        from ..outputs.export import coco17_json, openpose_body25_json, safe_path, write_json, write_png
        from ..outputs.openpose import openpose_coco18_json

        kp, sc, wh, bs = self.keypoints, self.scores, self._wh(), self.box_scores
        picture = self.render(threshold=threshold) if rendered is None else rendered

        def path(suffix: str) -> Path:
            return safe_path(out_dir, self.name, suffix)

        formats = {
            "_coco17.json": coco17_json(
                kp, sc, self.boxes, image_size=wh, box_scores=bs, threshold=threshold
            ),
            "_coco_wholebody.json": kf.coco_wholebody_json(kp, sc, box_scores=bs, threshold=threshold),
            "_openpose_body25.json": openpose_body25_json(kp, sc, threshold=threshold),
            "_openpose_coco18.json": openpose_coco18_json(kp, sc, image_size=wh, threshold=threshold),
        }
        files = [
            write_json(path("_pose.json"), self.to_dict()),
            write_png(path("_openpose.png"), self.openpose(threshold=threshold)),
            write_png(path("_pose.png"), picture),
            *(write_json(path(suffix), doc) for suffix, doc in formats.items()),
            kf.write_keypoints_csv(path("_keypoints.csv"), path("").name, kp, sc),
            *([] if self.keypoints_3d is None else pose_3d.save(self, out_dir, threshold=threshold)),
        ]
        return [Path(f) for f in files]

    def openpose(self, *, threshold: float = 0.3) -> np.ndarray:
        """The ControlNet OpenPose conditioning picture at the photo's size (bodies, hands and
        faces on black)."""
        from ..outputs.openpose import draw_openpose

        return draw_openpose(self.keypoints, self.scores, self.image.shape[:2], threshold=threshold)

    def _wh(self) -> tuple[int, int]:
        return int(self.image.shape[1]), int(self.image.shape[0])


@dataclass
class PosePrep:
    """One photo's input to the device step (small and picklable: uint8 pixels, no model data).

    Without boxes: the working copy, and the device step runs the detector. With ``boxes``
    (P, 4, working-copy pixels): the release's uint8 person crops made here when they are
    smaller than the working copy (a large photo), else the working copy.
    """

    image: np.ndarray | None  # (h, w, 3) uint8 working copy
    boxes: np.ndarray | None = None
    crops: np.ndarray | None = None  # (P, H, W, 3) uint8 at the network input size
    notices: list[str] = field(default_factory=list)
    pointmap: Any = None  # the borrowed pointmap's prep (keypoints_3d)


@dataclass
class PoseRaw:
    """One photo's device result: per person a box and 308 keypoints in working-copy pixels."""

    keypoints: np.ndarray  # (P, 308, 2) float32
    scores: np.ndarray  # (P, 308) float32
    boxes: np.ndarray  # (P, 4) float32
    box_scores: np.ndarray  # (P,) float32
    source: str
    num_found: int
    flip_test: bool
    info: RunInfo
    notices: list[str] = field(default_factory=list)
    pointmap: Any = None  # the borrowed pointmap's raw (keypoints_3d)


class PosePipeline(Pipeline):
    """308-keypoint pose: ``PosePipeline("0.4b")(photo)`` -> :class:`PoseResult`.

    ``detector`` is how people are found when the call gives no boxes: ``"auto"`` (the shared
    DETR; the whole image when its weights are missing), ``None`` (whole image), a
    :class:`sapiens2.inputs.detector.PersonDetector`, or any callable ``f(rgb) -> boxes | (boxes, scores)
    | Detections`` working in the pixels of the image it is given. ``pointmap``: the pointmap
    pipeline for the ``keypoints_3d`` option (a PointmapPipeline, a zero-argument function
    returning one, or None to load the same size when first asked).

    Stages: :meth:`prepare` (CPU: checks, caller boxes, the pixels the crops need), :meth:`infer`
    (the device: detection, crops, one forward for every crop of every photo, decoding; returns
    only keypoints and boxes), :meth:`finish` (CPU: back to the photo's pixels).
    """

    task = "pose"

    def __init__(
        self,
        size: str | None = None,
        *,
        model: torch.nn.Module | None = None,
        checkpoint: str | Path | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        detector: Any = "auto",
        pointmap: Any = None,
    ) -> None:
        super().__init__(size, model=model, checkpoint=checkpoint, device=device, dtype=dtype)
        self.detector = detector
        self.pointmap = pose_3d.LazyPointmap(pointmap, self)

    def __call__(
        self,
        image: ImageSource | Intake,
        *,
        boxes: Any = None,
        flip_test: bool | None = None,
        score_threshold: float = 0.3,
        max_people: int = 20,
        keypoints_3d: bool = False,
    ) -> PoseResult:
        """Pose of every person in one image.

        ``boxes``: (P, 4) x1, y1, x2, y2 in original-image pixels (or a ``Detections``) to skip
        detection. ``score_threshold`` / ``max_people`` apply to detected people.
        ``flip_test`` also runs mirrored crops (in the same batch) and averages: a little more
        accurate, one extra crop per person. None (default): on when the model is on a GPU, off
        on a CPU (where it doubles the time). ``keypoints_3d`` also runs the pointmap (and its
        segmentation) and gives every keypoint X, Y, Z in metres (``result.keypoints_3d``).
        """
        return self.run_stages(
            image, boxes=boxes, flip_test=flip_test, score_threshold=score_threshold, max_people=max_people,
            keypoints_3d=keypoints_3d,
        )  # fmt: skip

    def _flip_test(self, flip_test: bool | None) -> bool:
        """``flip_test`` checked; None becomes the device's default (on for CUDA)."""
        if flip_test is None:
            return self.device.type == "cuda"
        if not isinstance(flip_test, bool):
            raise OptionError(f"flip_test must be True or False; got {flip_test!r}.")
        return flip_test

    def prepare(
        self, intake: Intake, *, boxes: Any = None, flip_test: bool | None = None, keypoints_3d: bool = False,
        **_: Any,
    ) -> PosePrep:  # fmt: skip
        """The device step's input: caller boxes checked and clipped (OptionError when unusable),
        and the uint8 pixels the device step needs (see :class:`PosePrep`); with ``keypoints_3d``
        the pointmap's own prep too."""
        prep = self._prepare_pose(intake, boxes, flip_test)
        if keypoints_3d:
            prep.pointmap = pose_3d.prepare(self.pointmap, intake, prep.notices)
        return prep

    def _prepare_pose(self, intake: Intake, boxes: Any, flip_test: bool | None) -> PosePrep:
        from ..inputs.detector import detect_people

        self._flip_test(flip_test)
        work = intake.work
        if boxes is None:
            return PosePrep(work)
        notices = list(getattr(boxes, "notices", []))
        # a Detections works too; detect_people checks the shape and clips to the image
        found = detect_people(work, boxes=intake.boxes_to_work(getattr(boxes, "boxes", boxes)))
        in_h, in_w = self.network_hw
        if len(found.boxes) * in_h * in_w * 3 >= work.nbytes:
            return PosePrep(work, found.boxes, notices=notices)
        crops, _ = warp_crops(work, found.boxes, out_hw=self.network_hw)
        return PosePrep(None, found.boxes, crops, notices)

    def infer(
        self,
        batch: list[PosePrep],
        *,
        flip_test: bool | None = None,
        score_threshold: float = 0.3,
        max_people: int = 20,
        **_: Any,
    ) -> list[PoseRaw]:
        """Detection where a prep has no boxes, then ONE forward for all crops of all preps (and
        their mirrors with ``flip_test``), decoded on the device; keypoints in working-copy px."""
        flip = self._flip_test(flip_test)
        info = self.run_info()
        found = [self._people(p, score_threshold, max_people) for p in batch]
        crops = [self._crops(p, d.boxes) for p, d in zip(batch, found, strict=True)]
        if not crops:
            return []
        kp, scores, bad = self._keypoints(torch.cat([x for x, _ in crops]), info, flip)
        share = replace(info, model_s=info.model_s / len(batch))  # one forward for the batch
        in_3d = pose_3d.infer(self.pointmap, [p.pointmap for p in batch])
        raws, start = [], 0
        for prep, det, (x, geom), pm in zip(batch, found, crops, in_3d, strict=True):
            people = slice(start, start + x.shape[0])
            start = people.stop
            kp_work = apply_affine(kp[people], geom.inverse).astype(np.float32)
            raw = _raw(prep, det, kp_work, scores[people], int(bad[people].sum()), flip, replace(share))
            raw.pointmap = pm
            raws.append(raw)
        return raws

    def finish(self, raw: PoseRaw, intake: Intake, **_: Any) -> PoseResult:
        """Working-copy pixels -> the photo's pixels, as a :class:`PoseResult` (with the 3D
        keypoints when the pointmap ran)."""
        notices = _merged(intake.notices, raw.notices)
        boxes, keypoints = intake.boxes_to_original(raw.boxes), intake.points_to_original(raw.keypoints)
        return PoseResult(
            image=intake.rgb,
            info=replace(raw.info),
            notices=notices,
            downscaled=intake.downscaled,
            name=intake.name,
            boxes=boxes,
            box_scores=raw.box_scores,
            keypoints=keypoints,
            scores=raw.scores,
            detection_source=raw.source,
            num_found=raw.num_found,
            flip_test=raw.flip_test,
            keypoints_3d=pose_3d.finish(self.pointmap, raw.pointmap, intake, keypoints, boxes, notices),
        )

    def _crops(self, prep: PosePrep, boxes: np.ndarray) -> tuple[torch.Tensor, CropInfo]:
        """Normalised crops on the device and their geometry (crops made in prepare, or here)."""
        if prep.crops is None:
            return crop_people(
                prep.image, boxes, device=self.device, dtype=self.dtype, out_hw=self.network_hw
            )
        pixels = torch.from_numpy(prep.crops).permute(0, 3, 1, 2)
        x = network_input.normalize(network_input.to_device(pixels, self.device), self.dtype)
        return x, crop_geometry(boxes, self.network_hw)

    def _people(self, prep: PosePrep, score_threshold: float, max_people: int) -> Detections:
        from ..inputs.detector import Detections, detect_people

        if prep.boxes is not None:
            return Detections(prep.boxes, np.ones(len(prep.boxes), np.float32), "caller", len(prep.boxes))
        return detect_people(
            prep.image,
            detector=self.detector,
            score_threshold=score_threshold,
            max_people=max_people,
            device=self.device,
        )

    def _keypoints(
        self, x: torch.Tensor, info: RunInfo, flip_test: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(N, 308, 2) keypoints in crop pixels, (N, 308) scores and (N,) counts of non-finite
        heatmaps for a batch of N crops.

        The mirrored crops join the same forward; decoding runs in float32 on the model's
        device and only the final arrays come back.
        """
        p = x.shape[0]
        if flip_test:
            x = torch.cat([x, x.flip(-1)])
        # float32 before the flip average and the decoding: a bf16 model's heatmaps hold 8
        # significant bits, which the averaging and DARK's log-derivatives must not lose more of
        heatmaps = self.timed_forward(info, x).heatmaps.float()
        if heatmaps.shape[1] != NUM_KEYPOINTS:
            raise OptionError(
                f"The pose model returned {heatmaps.shape[1]} heatmaps; this pipeline expects {NUM_KEYPOINTS}."
            )
        # maps holding NaN/inf, per crop (the decoder treats those values as 0)
        bad = (~torch.isfinite(heatmaps)).flatten(2).any(-1).sum(1)
        bad = (bad[:p] + bad[p:]) if flip_test else bad
        if flip_test:
            heatmaps = merge_flip(heatmaps[:p], heatmaps[p:], FLIP_INDEX)
        kp_hm, scores, _ = decode_checked(heatmaps)
        kp_crop = heatmap_to_crop(kp_hm, tuple(heatmaps.shape[-2:]), self.network_hw)
        return kp_crop.cpu().numpy(), scores.cpu().numpy().astype(np.float32), bad.cpu().numpy()


def _raw(
    prep: PosePrep,
    det: Detections,
    keypoints: np.ndarray,
    scores: np.ndarray,
    bad: int,
    flip_test: bool,
    info: RunInfo,
) -> PoseRaw:
    """One photo's device result: keypoints and boxes in working-copy pixels, and its notices."""
    notices = _merged(prep.notices, det.notices)
    if bad:
        notices.append(
            f"The pose model returned NaN/inf in {bad} heatmap(s); those values were treated as 0."
        )
    return PoseRaw(
        keypoints=keypoints,
        scores=scores,
        boxes=np.asarray(det.boxes, dtype=np.float32),
        box_scores=np.asarray(det.scores, dtype=np.float32),
        source=det.source,
        num_found=int(det.num_found),
        flip_test=flip_test,
        info=info,
        notices=notices,
    )


def _merged(*lists: list[str]) -> list[str]:
    """Notices in order, each once."""
    return list(dict.fromkeys(n for notices in lists for n in notices))


# ----------------------------------------------------------------------------- declaration


def _warm_detector(device: str) -> bool:
    from ..inputs.detector import warm_detector

    return warm_detector(device)


def _video_detect(pipe: Any, infer_opts: Mapping[str, Any]) -> Any:
    """The clip's person detection, as a photo's: the pipeline's detector, threshold and cap."""
    from ..inputs.detector import detect_people

    def detect(rgb: np.ndarray) -> Detections:
        return detect_people(
            rgb,
            detector=getattr(pipe, "detector", "auto"),
            score_threshold=infer_opts.get("score_threshold", 0.3),
            max_people=infer_opts.get("max_people", 20),
            device=getattr(pipe, "device", None),
        )

    return detect


def _video_forwards(infer_opts: Mapping[str, Any]) -> int:
    return 2 if infer_opts.get("flip_test") else 1


def _gpu_seconds(size: str, pixels: int, infer_opts: Mapping[str, Any]) -> float:
    # every person is one crop of the batch (twice with flip test), plus the DETR detector
    crops = int(infer_opts.get("max_people") or 20) * (2 if infer_opts.get("flip_test") else 1)
    return forward_seconds(size, crops) + 1.0 + pose_3d.extra_seconds(size, infer_opts)


#: the keypoint formats ``PoseResult.save`` writes besides the 308-point JSON and the pictures
KEYPOINT_FILES = (
    "_coco17.json",
    "_coco_wholebody.json",
    "_openpose_body25.json",
    "_openpose_coco18.json",
    "_keypoints.csv",
)

TASK = Task(
    spec=get_task("pose"),
    pipeline=PosePipeline,
    api_name="pose",
    tab="Pose",
    button="Run pose",
    summary="Pose: 308 keypoints per person (body, hands, feet, face).",
    result_label="Pose",
    downloads="Downloads (308-point JSON, ControlNet pose PNG, drawing; 3D keypoints JSON + GLB with that option)",
    gpu_seconds=_gpu_seconds,
    options=(
        Option(
            "threshold",
            "float",
            0.3,
            "render",
            "Keypoint threshold",
            "keypoints scoring below this are not drawn",
            low=0.0,
            high=1.0,
            step=0.05,
        ),
        Option(
            "flip_test",
            "bool",
            False,
            "infer",
            "Flip test (slower, a bit more accurate)",
            "also run the mirrored crops and average",
            gpu_default=True,
        ),
        Option("show_face", "bool", True, "render", "Face points", "draw the face points"),
        Option(
            "body_only", "bool", False, "render", "Body only (no hands, feet, face)", "draw only the body"
        ),
        Option("show_boxes", "bool", True, "render", "Person boxes", "draw the person boxes"),
        Option(
            "max_people", "int", 20, "infer", "Max people", "at most this many people", low=1, high=50, step=1
        ),
        Option(
            pose_3d.OPTION,
            "bool",
            False,
            "infer",
            "3D keypoints (runs pointmap and body parts too)",
            "give every keypoint X, Y, Z in metres from the pointmap, and show the skeleton in the point cloud",
        ),
    ),
    # the skeleton-in-cloud GLB is a download, not a view: a view would add an output to /pose and
    # shift its files and run info for every API caller (pose_3d.skeleton_view is ready for one)
    views=(View("json", "Keypoints (308 named points per person)", lambda result, files: result.to_dict()),),
    borrows=("pointmap",),
    needs=pose_3d.needs,
    warm=_warm_detector,
    cli_aliases={"flip_test": ("--flip",)},
    cli_switches=(
        Switch("--no-detector", "skip person detection: the whole image is one person", {"detector": None}),
    ),
    file_groups=(
        FileGroup(
            "Keypoint formats (COCO-17, COCO-WholeBody-133, OpenPose BODY_25 / COCO-18 with hands and face, CSV)",
            KEYPOINT_FILES,
        ),
    ),
    video=Video(
        handler="tracks",
        render_overrides={"show_boxes": False, "show_ids": True},
        detect=_video_detect,
        forwards=_video_forwards,
    ),
)
