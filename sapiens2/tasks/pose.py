"""Top-down pose with 308 keypoints: people boxes -> crops -> one forward -> keypoints on the photo.

Flow of :class:`PosePipeline`:

1. intake (upright RGB + a working copy of at most ``max_side`` px);
2. person boxes on the working copy: ``detect_people`` (DETR, an injected detector, the
   caller's boxes, or the whole image);
3. every box -> centre, size x1.25, widened to 3:4 -> UDP affine crop to 768x1024
   (:func:`sapiens2.imaging.crop_people`);
4. ONE forward for all crops, plus their mirrored copies when ``flip_test`` (mirrored heatmaps
   flipped back, left/right channels swapped, averaged with the plain ones);
5. :func:`decode_heatmaps` (argmax + DARK-UDP) on the model's device, heatmap px -> crop px ->
   working-image px -> original px. Only the final (P, 308) arrays go to the CPU.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import OptionError
from ..imaging import ImageSource, Intake, apply_affine, crop_people
from ..metadata import FLIP_INDEX, NUM_KEYPOINTS
from ..options import Option
from ..zoo import get_task
from .base import Pipeline, RunInfo, TaskResult
from .pose_codec import decode_checked, decode_heatmaps, flip_back, heatmap_to_crop, merge_flip
from .registry import Switch, Task, View, forward_seconds

__all__ = ["PosePipeline", "PoseResult", "decode_heatmaps", "flip_back", "merge_flip"]


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
        from ..render import draw_pose

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
        from ..export import pose_json

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
        ``<name>_openpose_body25.json`` and ``<name>_pose.png`` (the rendering); returns the paths.
        ``threshold`` decides which points COCO/OpenPose mark as detected. ``rendered``: an image
        already rendered (e.g. with the viewer's options) to write as the PNG instead of a fresh
        ``render(threshold=threshold)``."""
        from ..export import coco17_json, openpose_body25_json, safe_path, write_json, write_png

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
            Path(write_png(safe_path(out_dir, self.name, "_pose.png"), picture)),
        ]

    def _wh(self) -> tuple[int, int]:
        return int(self.image.shape[1]), int(self.image.shape[0])


class PosePipeline(Pipeline):
    """308-keypoint pose: ``PosePipeline("0.4b")(photo)`` -> :class:`PoseResult`.

    ``detector`` is how people are found when the call gives no boxes: ``"auto"`` (the shared
    DETR; the whole image when its weights are missing), ``None`` (whole image), a
    :class:`sapiens2.detect.PersonDetector`, or any callable ``f(rgb) -> boxes | (boxes, scores)
    | Detections`` working in the pixels of the image it is given.
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
        flip_test: bool = False,
        score_threshold: float = 0.3,
        max_people: int = 20,
    ) -> PoseResult:
        """Pose of every person in one image.

        ``boxes``: (P, 4) x1, y1, x2, y2 in original-image pixels (or a ``Detections``) to skip
        detection. ``score_threshold`` / ``max_people`` apply to detected people.
        ``flip_test`` also runs mirrored crops (in the same batch) and averages: slower, a little
        more accurate.
        """
        from ..detect import detect_people

        if not isinstance(flip_test, bool):
            raise OptionError(f"flip_test must be True or False; got {flip_test!r}.")
        t0, intake, info, notices = self._begin(image)
        work_boxes = None
        if boxes is not None:
            notices += list(getattr(boxes, "notices", []))
            # a Detections works too; detect_people checks the shape and clips to the image
            work_boxes = intake.boxes_to_work(getattr(boxes, "boxes", boxes))
        found = detect_people(
            intake.work,
            boxes=work_boxes,
            detector=self.detector,
            score_threshold=score_threshold,
            max_people=max_people,
            device=self.device,
        )
        notices += [n for n in found.notices if n not in notices]

        keypoints, scores = self.keypoints_on_work(
            intake.work, found.boxes, info, notices, flip_test=flip_test
        )
        info.total_s = time.perf_counter() - t0
        return PoseResult(
            image=intake.rgb,
            info=info,
            notices=notices,
            downscaled=intake.downscaled,
            name=intake.name,
            boxes=intake.boxes_to_original(found.boxes),
            box_scores=np.asarray(found.scores, dtype=np.float32),
            keypoints=intake.points_to_original(keypoints),
            scores=scores,
            detection_source=found.source,
            num_found=int(found.num_found),
            flip_test=flip_test,
        )

    def keypoints_on_work(
        self,
        work: np.ndarray,
        boxes: np.ndarray,
        info: RunInfo,
        notices: list[str],
        *,
        flip_test: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(P, 308, 2) keypoints in ``work`` pixels and (P, 308) scores for (P, 4) boxes there.

        All crops (and their mirrors) go through the model in one batch; decoding runs on the
        model's device and only the final arrays come back.
        """
        in_hw = self.network_hw
        x, crops = crop_people(work, boxes, device=self.device, dtype=self.dtype, out_hw=in_hw)
        p = x.shape[0]
        if flip_test:
            x = torch.cat([x, x.flip(-1)])
        heatmaps = self.timed_forward(info, x).heatmaps.float()
        if heatmaps.shape[1] != NUM_KEYPOINTS:
            raise OptionError(
                f"The pose model returned {heatmaps.shape[1]} heatmaps; this pipeline expects {NUM_KEYPOINTS}."
            )
        if flip_test:
            heatmaps = merge_flip(heatmaps[:p], heatmaps[p:], FLIP_INDEX)
        kp_hm, scores, bad = decode_checked(heatmaps)
        if bad:
            notices.append(
                f"The pose model returned NaN/inf in {bad} heatmap(s); those values were treated as 0."
            )
        kp_crop = heatmap_to_crop(kp_hm, tuple(heatmaps.shape[-2:]), in_hw)
        kp_work = apply_affine(kp_crop, crops.inverse)
        return kp_work.cpu().numpy().astype(np.float32), scores.cpu().numpy().astype(np.float32)


# ----------------------------------------------------------------------------- declaration


def _warm_detector(device: str) -> bool:
    from ..detect import warm_detector

    return warm_detector(device)


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
    downloads="Downloads (308-point JSON, COCO-17, OpenPose BODY_25, PNG)",
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
)
