"""Top-down pose with 308 keypoints: people boxes -> crops -> one forward -> keypoints on the photo.

``prepare`` (CPU) checks caller boxes and keeps only uint8 pixels (the release's person crops when
smaller than the working copy); ``infer`` (the device) finds people where no boxes were given,
crops each (centre, size x1.25, widened to 3:4, UDP affine to 768x1024), runs ONE forward for the
crops of every photo (and their mirrors with ``flip_test``) and decodes the heatmaps there (argmax
+ DARK-UDP), so only (P, 308) arrays come back; ``finish`` (CPU) maps them to the photo's pixels.
With ``keypoints_3d`` the pointmap is borrowed at each stage (:mod:`sapiens2.tasks.pose.pose_3d`).
docs/FIDELITY_POSE.md compares each step with the release.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...data.keypoint_sets import keypoint_set
from ...data.metadata import NUM_KEYPOINTS
from ...errors import OptionError
from ...inputs.intake import ImageSource, Intake
from ...models.cost import Work
from ...models.zoo import get_task
from ..base import Pipeline, RunInfo
from ..options import Option
from ..registry import Switch, Task, Video, View
from ..result_record import Column, Record
from . import pose_3d
from .pose_clip import PoseFrames
from .pose_codec import decode_crops, decode_heatmaps, flip_back, merge_flip
from .pose_crops import apply_affine, crop_geometry, crop_people, crops_to_device, warp_crops
from .pose_result import KEYPOINT_FORMATS, PoseResult
from .pose_stages import PosePrep, PoseRaw, notices_once, people_spans, pose_raw, with_set

if TYPE_CHECKING:
    from ...models.detector import Detections, DetectorInput

__all__ = ["PosePipeline", "PosePrep", "PoseRaw", "PoseResult", "decode_heatmaps", "flip_back", "merge_flip"]


class PosePipeline(Pipeline):
    """308-keypoint pose: ``PosePipeline("0.4b")(photo)`` -> :class:`PoseResult`.

    ``detector`` is how people are found when the call gives no boxes: ``"auto"`` (the shared
    DETR; the whole image when its weights are missing), ``None`` (whole image), a
    :class:`sapiens2.models.detector.PersonDetector`, or any callable ``f(rgb) -> boxes | (boxes, scores)
    | Detections`` working in the pixels of the image it is given. ``pointmap``: the pointmap
    pipeline for the ``keypoints_3d`` option (a PointmapPipeline, a zero-argument function
    returning one, or None to load the same size when first asked).

    Stages: :meth:`prepare` (CPU: checks, caller boxes, the pixels the crops need), :meth:`infer`
    (the device: detection, crops, one forward for every crop of every photo, decoding; returns
    only keypoints and boxes), :meth:`finish` (CPU: back to the photo's pixels).
    """

    task = "pose"
    parts = {"detector": "auto", "pointmap": None}

    def attach(self, detector: Any = "auto", pointmap: Any = None) -> None:
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
        return self.run_stages(image, boxes=boxes, flip_test=flip_test, score_threshold=score_threshold,
                               max_people=max_people, keypoints_3d=keypoints_3d)  # fmt: skip

    def _flip_test(self, flip_test: bool | None) -> bool:
        """``flip_test`` checked; None becomes the declaration's default for the device (on for
        CUDA), as a batch plan resolves it (``Task.resolve``)."""
        if flip_test is None:
            return bool(TASK.defaults(gpu=self.device.type == "cuda")["flip_test"])
        if not isinstance(flip_test, bool):
            raise OptionError(f"flip_test must be True or False; got {flip_test!r}.")
        return flip_test

    def prepare(
        self, intake: Intake, *, boxes: Any = None, flip_test: bool | None = None, keypoints_3d: bool = False,
        input_hw: Any = None, people: Detections | None = None, **_: Any,
    ) -> PosePrep:  # fmt: skip
        """The device step's input: caller boxes checked and clipped (OptionError when unusable),
        and the uint8 pixels the device step needs (see :class:`PosePrep`); with ``keypoints_3d``
        the pointmap's own prep too. ``input_hw``: another crop size than the checkpoint's
        (:meth:`~sapiens2.tasks.base.Pipeline.input_size`). ``people``: what :meth:`find_people`
        found in this photo (working-copy pixels), used as the detector's own result would be."""
        hw = self.input_size(input_hw)
        if people is not None:
            self._flip_test(flip_test)
            prep = self._cropped(PosePrep(intake.work, found=people), hw)
        else:
            prep = self._prepare_pose(intake, boxes, flip_test, hw)
        prep.pointmap = pose_3d.prepare(self.pointmap, intake, prep.notices) if keypoints_3d else None
        return prep

    def _prepare_pose(
        self, intake: Intake, boxes: Any, flip_test: bool | None, hw: tuple[int, int]
    ) -> PosePrep:
        from ...models.detector import detect_people

        self._flip_test(flip_test)
        work = intake.work
        if boxes is None and self.detector is not None:
            return PosePrep(work)  # the device step detects: it needs the photo
        if boxes is None:  # no detector: the whole photo is the box, known here
            whole = detect_people(work, detector=None)
            return self._cropped(PosePrep(work, found=whole), hw)
        notices = list(getattr(boxes, "notices", []))
        # a Detections works too; detect_people checks the shape and clips to the image
        found = detect_people(work, boxes=intake.boxes_to_work(getattr(boxes, "boxes", boxes)))
        return self._cropped(PosePrep(work, notices=notices, found=found), hw)

    def people_input(self, intake: Intake, *, boxes: Any = None, **_: Any) -> DetectorInput | None:
        """CPU: the person detector's input for ``intake`` (its working copy at the DETR's input
        size, uint8), when this pipeline's people come from a DETR and no boxes are given; else None
        (:meth:`prepare` knows the people, or a callable detector needs the photo in :meth:`infer`).
        With it, a batch finds the people in a device step of its own (:meth:`find_people`) and
        prepares the crops after it, so the photo never goes to a device step."""
        from ...models.detector import people_input

        return None if boxes is not None else people_input(self.detector, intake.work)

    def people_apart(self) -> bool:
        """The people come from a DETR (``"auto"``, a checkpoint path, a PersonDetector), which
        :meth:`find_people` can run on its inputs alone; not for no detector or a callable."""
        from ...models.detector import runs_apart

        return runs_apart(self.detector)

    def warm_people(self) -> None:
        """Load the detector :meth:`find_people` runs, now: a missing or broken DETR checkpoint
        path raises here, before any photo (``"auto"`` without weights: the whole photo, later)."""
        from ...models.detector import load_detector

        if self.people_apart():
            load_detector(self.detector, self.device)

    def find_people(
        self, inputs: list[DetectorInput], *, score_threshold: float = 0.3, max_people: int = 20, **_: Any
    ) -> list[Detections]:
        """The device step between :meth:`people_input` and ``prepare(..., people=)``: the people of
        each input, as :meth:`infer` would find them in the working copy."""
        return [self.detect(inp, score_threshold=score_threshold, max_people=max_people) for inp in inputs]

    def _cropped(self, prep: PosePrep, hw: tuple[int, int]) -> PosePrep:
        """``prep`` with the release's uint8 ``hw`` person crops instead of the working copy, when
        they are the smaller (the network input, not the photo, goes to the device step)."""
        if len(prep.boxes) * hw[0] * hw[1] * 3 >= prep.image.nbytes:
            return prep
        crops, _ = warp_crops(prep.image, prep.boxes, out_hw=hw)
        return replace(prep, image=None, crops=crops)

    def infer(
        self, batch: list[PosePrep], *, flip_test: bool | None = None, score_threshold: float = 0.3,
        max_people: int = 20, input_hw: Any = None, **_: Any,
    ) -> list[PoseRaw]:  # fmt: skip
        """Detection where a prep has no boxes, then the crops of all preps (and their mirrors with
        ``flip_test``) in as few forwards as the device's memory allows (one unless the batch is
        crowded: :meth:`_all_keypoints`), decoded on the device; keypoints in working-copy px.
        ``input_hw``: the crop size ``prepare`` was given."""
        from ...models.detector import check_options

        flip = self._flip_test(flip_test)
        check_options(score_threshold, max_people=max_people)  # also where prepare found the people
        hw = self.input_size(input_hw)
        info = self.run_info()
        found = [self._people(p, score_threshold, max_people) for p in batch]
        if not batch:
            return []
        kp, scores, bad = self._all_keypoints(batch, found, info, flip, hw)
        share = replace(info, model_s=info.model_s / len(batch))  # the batch's forwards, shared
        in_3d = pose_3d.infer(self.pointmap, [p.pointmap for p in batch])
        raws, start = [], 0
        kset = keypoint_set(kp.shape[1])  # a v1 model's 17 / 133, lifted into the 308 layout
        for prep, det, pm in zip(batch, found, in_3d, strict=True):
            people = slice(start, start + len(det.boxes))
            start = people.stop
            kp_work = apply_affine(kp[people], crop_geometry(det.boxes, hw).inverse).astype(np.float32)
            lifted = kset.lift(kp_work, scores[people])
            bad_maps = int(bad[people].sum())
            raw = pose_raw(prep, det, *lifted, bad_maps, flip, replace(share), pm)
            raws.append(with_set(raw, kset, kp_work, scores[people]))
        return raws

    def finish(self, raw: PoseRaw, intake: Intake, **_: Any) -> PoseResult:
        """Working-copy pixels -> the photo's pixels, as a :class:`PoseResult` (with the 3D
        keypoints when the pointmap ran)."""
        notices = notices_once(intake.notices, self.small_photo_notices(intake), raw.notices)
        boxes, keypoints = intake.boxes_to_original(raw.boxes), intake.points_to_original(raw.keypoints)
        native = None if raw.native is None else (intake.points_to_original(raw.native[0]), raw.native[1])
        return PoseResult(
            keypoint_set=raw.keypoint_set, native=native,
            image=intake.rgb, info=replace(raw.info), notices=notices, downscaled=intake.downscaled,
            name=intake.name, boxes=boxes, box_scores=raw.box_scores, keypoints=keypoints,
            scores=raw.scores, detection_source=raw.source, num_found=raw.num_found, flip_test=raw.flip_test,
            keypoints_3d=pose_3d.finish(self.pointmap, raw.pointmap, intake, keypoints, boxes, notices),
        )  # fmt: skip

    def _crops(
        self, prep: PosePrep, boxes: np.ndarray, hw: tuple[int, int], people: slice = slice(None)
    ) -> torch.Tensor:
        """Normalised ``hw`` crops on the device (made in prepare, or here) of the ``people`` among
        ``boxes`` (each crop is its box's alone, so a slice is exact)."""
        if prep.crops is None:
            return crop_people(prep.image, boxes[people], device=self.device, dtype=self.dtype, out_hw=hw)[0]
        if tuple(prep.crops.shape[1:3]) != tuple(hw):
            raise OptionError(f"Pose crops of {prep.crops.shape[1:3]} were prepared; infer was given {hw}.")
        return crops_to_device(prep.crops[people], boxes[people], self.device, self.dtype)[0]

    def _all_keypoints(
        self, batch: list[PosePrep], found: list[Detections], info: RunInfo, flip: bool, hw: tuple[int, int]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every person of the batch, in prep order, through forwards of at most
        ``forward_chunk()`` inputs (a crop and its mirror are two), made crop by crop as each
        forward needs them: a crowded batch holds one chunk's crops and heatmaps, never all."""
        counts = [len(d.boxes) for d in found]
        step = max(1, self.forward_chunk(hw) // (2 if flip else 1))
        parts = []
        for lo in range(0, sum(counts), step):
            x = torch.cat([self._crops(batch[i], found[i].boxes, hw, people)
                           for i, people in people_spans(counts, lo, lo + step)])  # fmt: skip
            parts.append(self._keypoints(x, info, flip, hw))
        if not parts:
            k = getattr(self.model, "keypoints", None) or 308  # a v1 file's set, when its name says it
            return np.zeros((0, k, 2), np.float32), np.zeros((0, k), np.float32), np.zeros(0, np.int64)
        kp, scores, bad = zip(*parts, strict=True)
        return np.concatenate(kp), np.concatenate(scores), np.concatenate(bad)

    def _people(self, prep: PosePrep, score_threshold: float, max_people: int) -> Detections:
        if prep.found is not None:
            return prep.found
        return self.detect(prep.image, score_threshold=score_threshold, max_people=max_people)

    def detect(
        self, rgb: np.ndarray | DetectorInput, *, score_threshold: float = 0.3, max_people: int = 20
    ) -> Detections:
        """The people in ``rgb`` as this pipeline finds them (its ``detector``), in its pixels."""
        from ...models.detector import detect_people

        return detect_people(rgb, detector=self.detector, score_threshold=score_threshold,
                             max_people=max_people, device=self.device)  # fmt: skip

    def _keypoints(
        self, x: torch.Tensor, info: RunInfo, flip: bool, hw: tuple[int, int]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One forward of the N crops (and their mirrors with ``flip_test``), decoded on the
        device (:func:`~sapiens2.tasks.pose.pose_codec.decode_crops`) into ``hw`` crop pixels."""
        heatmaps = self.timed_forward(info, torch.cat([x, x.flip(-1)]) if flip else x).heatmaps
        return decode_crops(heatmaps, flip, hw)


# ----------------------------------------------------------------------------- declaration


def _warm_detector(device: str) -> bool:
    from ...models.detector import warm_detector

    return warm_detector(device)


def _video_detect(pipe: PosePipeline, infer_opts: Mapping[str, Any]) -> Any:
    """The clip's person detection, as a photo's: the pipeline's detector, threshold and cap."""
    cut = {k: infer_opts[k] for k in ("score_threshold", "max_people") if k in infer_opts}
    return functools.partial(pipe.detect, **cut)


def _work(infer_opts: Mapping[str, Any]) -> Work:
    """One crop per person (up to ``max_people``), twice with flip test; the detector first; with
    ``keypoints_3d`` one forward each of the pointmap and its segmentation."""
    flips = 2 if infer_opts.get("flip_test") else 1
    people = int(infer_opts.get("max_people") or 20)
    return Work(forwards=flips, people=people, detector=True, borrowed=len(pose_3d.needs(infer_opts)))


OPTIONS = (
    Option("threshold", "float", 0.3, "render", "Keypoint threshold",
           "keypoints scoring below this are not drawn", low=0.0, high=1.0, step=0.05),
    Option("flip_test", "bool", False, "infer", "Flip test (slower, a bit more accurate)",
           "also run the mirrored crops and average", gpu_default=True),
    Option("show_face", "bool", True, "render", "Face points", "draw the face points"),
    Option("body_only", "bool", False, "render", "Body only (no hands, feet, face)", "draw only the body"),
    Option("show_boxes", "bool", True, "render", "Person boxes", "draw the person boxes"),
    Option("max_people", "int", 20, "infer", "Max people", "at most this many people",
           low=1, high=50, step=1),
    pose_3d.DECLARATION,
)  # fmt: skip


def _row(result: PoseResult) -> dict[str, Any]:
    return {
        "keypoints": result.keypoints,
        "scores": result.scores,
        "boxes": result.boxes,
        "box_scores": result.box_scores,
        "detection": result.detection_source,
        "keypoint_set": getattr(result, "keypoint_set", "goliath308"),  # a v1 17/133 model's, lifted
        # a v1 17 / 133 model's own points, as it gave them (flat: people x K x 2, K from the set)
        "native_keypoints": None if result.native is None else result.native[0],
        "native_scores": None if result.native is None else result.native[1],
    }


#: A batch row: people's points, scores and boxes, how they were found, the keypoint layout.
RECORD = Record(
    (
        Column("keypoints", "tensor", "people x 308 x (x, y), photo pixels", (NUM_KEYPOINTS, 2)),
        Column("scores", "tensor", "people x 308 keypoint scores", (NUM_KEYPOINTS,)),
        Column("boxes", "tensor", "people x (x1, y1, x2, y2), photo pixels", (4,)),
        Column("box_scores", "tensor", "one score per person box"),
        Column("detection", "string", "how people were found"),
        Column("keypoint_set", "string", "the model's keypoint set (v1 17/133 points lifted to 308)"),
        Column("native_keypoints", "tensor", "a v1 17/133 model's own points, flat people x K x (x, y)"),
        Column("native_scores", "tensor", "a v1 17/133 model's own scores, flat people x K"),
    ),
    _row,
)


TASK = Task(
    spec=get_task("pose"),
    pipeline=PosePipeline,
    tab="Pose",
    button="Run pose",
    summary="Pose: 308 keypoints per person (body, hands, feet, face).",
    result_label="Pose",
    downloads="Downloads (308-point JSON, ControlNet pose PNG, drawing; 3D keypoints JSON + GLB with that option)",
    work=_work,
    options=OPTIONS,
    views=(View("json", "Keypoints (308 named points per person)", lambda result, files: result.to_dict()),),
    borrows=(pose_3d.POINTMAP,),
    needs=pose_3d.needs,
    warm=_warm_detector,
    cli_aliases={"flip_test": ("--flip",)},
    cli_switches=(
        Switch("--no-detector", "skip person detection: the whole image is one person", {"detector": None}),
    ),
    file_groups=(KEYPOINT_FORMATS,),
    video=Video(
        handler=PoseFrames,
        render_overrides={"show_boxes": False, "show_ids": True},
        detect=_video_detect,
    ),
    record=RECORD,
)
