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
from .base import Pipeline, RunInfo, TaskResult
from .options import Option
from .pose_codec import decode_checked, decode_heatmaps, flip_back, heatmap_to_crop, merge_flip
from .pose_crops import CropInfo, apply_affine, crop_geometry, crop_people, warp_crops
from .registry import Switch, Task, Video, View, forward_seconds

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
        return out

    def save(
        self, out_dir: str | Path, *, threshold: float = 0.3, rendered: np.ndarray | None = None
    ) -> list[Path]:
        """Writes ``<name>_pose.json`` (308 named points), ``<name>_coco17.json``,
        ``<name>_openpose_body25.json``, ``<name>_openpose_coco18.json`` (body + hands,
        :mod:`sapiens2.outputs.openpose`), ``<name>_openpose.png`` (the ControlNet conditioning picture) and
        ``<name>_pose.png`` (the rendering); returns the paths. ``threshold`` decides which points
        COCO/OpenPose mark as detected (and the conditioning picture draws). ``rendered``: an image
        already rendered (e.g. with the viewer's options) to write as the PNG instead of a fresh
        ``render(threshold=threshold)``."""
        from ..outputs.export import coco17_json, openpose_body25_json, safe_path, write_json, write_png
        from ..outputs.openpose import openpose_coco18_json

        kp, sc, wh = self.keypoints, self.scores, self._wh()
        picture = self.render(threshold=threshold) if rendered is None else rendered
        return [
            Path(write_json(safe_path(out_dir, self.name, "_pose.json"), self.to_dict())),
            Path(
                write_json(
                    safe_path(out_dir, self.name, "_coco17.json"),
                    coco17_json(
                        kp, sc, self.boxes, image_size=wh, box_scores=self.box_scores, threshold=threshold
                    ),
                )
            ),
            Path(
                write_json(
                    safe_path(out_dir, self.name, "_openpose_body25.json"),
                    openpose_body25_json(kp, sc, threshold=threshold),
                )
            ),
            Path(
                write_json(
                    safe_path(out_dir, self.name, "_openpose_coco18.json"),
                    openpose_coco18_json(kp, sc, image_size=wh, threshold=threshold),
                )
            ),
            Path(
                write_png(safe_path(out_dir, self.name, "_openpose.png"), self.openpose(threshold=threshold))
            ),
            Path(write_png(safe_path(out_dir, self.name, "_pose.png"), picture)),
        ]

    def openpose(self, *, threshold: float = 0.3) -> np.ndarray:
        """The ControlNet OpenPose conditioning picture at the photo's size (body + hands on black)."""
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


class PosePipeline(Pipeline):
    """308-keypoint pose: ``PosePipeline("0.4b")(photo)`` -> :class:`PoseResult`.

    ``detector`` is how people are found when the call gives no boxes: ``"auto"`` (the shared
    DETR; the whole image when its weights are missing), ``None`` (whole image), a
    :class:`sapiens2.inputs.detector.PersonDetector`, or any callable ``f(rgb) -> boxes | (boxes, scores)
    | Detections`` working in the pixels of the image it is given.

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
    ) -> None:
        super().__init__(size, model=model, checkpoint=checkpoint, device=device, dtype=dtype)
        self.detector = detector

    def __call__(
        self,
        image: ImageSource | Intake,
        *,
        boxes: Any = None,
        flip_test: bool | None = None,
        score_threshold: float = 0.3,
        max_people: int = 20,
    ) -> PoseResult:
        """Pose of every person in one image.

        ``boxes``: (P, 4) x1, y1, x2, y2 in original-image pixels (or a ``Detections``) to skip
        detection. ``score_threshold`` / ``max_people`` apply to detected people.
        ``flip_test`` also runs mirrored crops (in the same batch) and averages: a little more
        accurate, one extra crop per person. None (default): on when the model is on a GPU, off
        on a CPU (where it doubles the time).
        """
        return self.run_stages(
            image, boxes=boxes, flip_test=flip_test, score_threshold=score_threshold, max_people=max_people
        )

    def _flip_test(self, flip_test: bool | None) -> bool:
        """``flip_test`` checked; None becomes the device's default (on for CUDA)."""
        if flip_test is None:
            return self.device.type == "cuda"
        if not isinstance(flip_test, bool):
            raise OptionError(f"flip_test must be True or False; got {flip_test!r}.")
        return flip_test

    def prepare(
        self,
        intake: Intake,
        *,
        boxes: Any = None,
        flip_test: bool | None = None,
        input_hw: Any = None,
        **_: Any,
    ) -> PosePrep:
        """The device step's input: caller boxes checked and clipped (OptionError when unusable),
        and the uint8 pixels the device step needs (see :class:`PosePrep`). ``input_hw``: another
        crop size than the checkpoint's (:meth:`~sapiens2.tasks.base.Pipeline.input_size`)."""
        from ..inputs.detector import detect_people

        self._flip_test(flip_test)
        work = intake.work
        if boxes is None:
            return PosePrep(work)
        notices = list(getattr(boxes, "notices", []))
        # a Detections works too; detect_people checks the shape and clips to the image
        found = detect_people(work, boxes=intake.boxes_to_work(getattr(boxes, "boxes", boxes)))
        hw = self.input_size(input_hw)
        if len(found.boxes) * hw[0] * hw[1] * 3 >= work.nbytes:
            return PosePrep(work, found.boxes, notices=notices)
        crops, _ = warp_crops(work, found.boxes, out_hw=hw)
        return PosePrep(None, found.boxes, crops, notices)

    def infer(
        self,
        batch: list[PosePrep],
        *,
        flip_test: bool | None = None,
        score_threshold: float = 0.3,
        max_people: int = 20,
        input_hw: Any = None,
        **_: Any,
    ) -> list[PoseRaw]:
        """Detection where a prep has no boxes, then ONE forward for all crops of all preps (and
        their mirrors with ``flip_test``), decoded on the device; keypoints in working-copy px.
        ``input_hw``: the crop size ``prepare`` was given."""
        flip = self._flip_test(flip_test)
        hw = self.input_size(input_hw)
        info = self.run_info()
        found = [self._people(p, score_threshold, max_people) for p in batch]
        crops = [self._crops(p, d.boxes, hw) for p, d in zip(batch, found, strict=True)]
        if not crops:
            return []
        kp, scores, bad = self._keypoints(torch.cat([x for x, _ in crops]), info, flip, hw)
        share = replace(info, model_s=info.model_s / len(batch))  # one forward for the batch
        raws, start = [], 0
        for prep, det, (x, geom) in zip(batch, found, crops, strict=True):
            people = slice(start, start + x.shape[0])
            start = people.stop
            kp_work = apply_affine(kp[people], geom.inverse).astype(np.float32)
            raws.append(
                _raw(prep, det, kp_work, scores[people], int(bad[people].sum()), flip, replace(share))
            )
        return raws

    def finish(self, raw: PoseRaw, intake: Intake, **_: Any) -> PoseResult:
        """Working-copy pixels -> the photo's pixels, as a :class:`PoseResult`."""
        return PoseResult(
            image=intake.rgb,
            info=replace(raw.info),
            notices=_merged(intake.notices, raw.notices),
            downscaled=intake.downscaled,
            name=intake.name,
            boxes=intake.boxes_to_original(raw.boxes),
            box_scores=raw.box_scores,
            keypoints=intake.points_to_original(raw.keypoints),
            scores=raw.scores,
            detection_source=raw.source,
            num_found=raw.num_found,
            flip_test=raw.flip_test,
        )

    def _crops(self, prep: PosePrep, boxes: np.ndarray, hw: tuple[int, int]) -> tuple[torch.Tensor, CropInfo]:
        """Normalised ``hw`` crops on the device and their geometry (made in prepare, or here)."""
        if prep.crops is None:
            return crop_people(prep.image, boxes, device=self.device, dtype=self.dtype, out_hw=hw)
        if tuple(prep.crops.shape[1:3]) != tuple(hw):
            raise OptionError(f"Pose crops of {prep.crops.shape[1:3]} were prepared; infer was given {hw}.")
        pixels = torch.from_numpy(prep.crops).permute(0, 3, 1, 2)
        x = network_input.normalize(network_input.to_device(pixels, self.device), self.dtype)
        return x, crop_geometry(boxes, hw)

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
        self, x: torch.Tensor, info: RunInfo, flip_test: bool, hw: tuple[int, int]
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
        kp_crop = heatmap_to_crop(kp_hm, tuple(heatmaps.shape[-2:]), hw)
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
    return forward_seconds(size, crops) + 1.0


TASK = Task(
    spec=get_task("pose"),
    pipeline=PosePipeline,
    api_name="pose",
    tab="Pose",
    button="Run pose",
    summary="Pose: 308 keypoints per person (body, hands, feet, face).",
    result_label="Pose",
    downloads="Downloads (308-point JSON, COCO-17, OpenPose BODY_25 / COCO-18, ControlNet pose PNG, drawing)",
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
    ),
    views=(View("json", "Keypoints (308 named points per person)", lambda result, files: result.to_dict()),),
    warm=_warm_detector,
    cli_aliases={"flip_test": ("--flip",)},
    cli_switches=(
        Switch("--no-detector", "skip person detection: the whole image is one person", {"detector": None}),
    ),
    video=Video(
        handler="tracks",
        render_overrides={"show_boxes": False, "show_ids": True},
        detect=_video_detect,
        forwards=_video_forwards,
    ),
)
