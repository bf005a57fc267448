"""The pose task's result: per person a box and 308 keypoints on the photo (and, with the
``keypoints_3d`` option, in metres), drawn, and written as the 308-point JSON, the ControlNet
conditioning picture and the keypoint formats (COCO-17, COCO-WholeBody-133, OpenPose BODY_25 and
COCO-18 with hands and faces, a CSV)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...outputs.writers import NOW, Writer
from ..base import TaskResult
from ..registry import FileGroup
from . import pose_3d

#: the keypoint formats ``PoseResult.save`` writes besides the 308-point JSON and the pictures
#: (the pose tab's second download list)
KEYPOINT_FILES = (
    "_coco17.json",
    "_coco_wholebody.json",
    "_openpose_body25.json",
    "_openpose_coco18.json",
    "_keypoints.csv",
)
#: the pose tab's second download list: those files
KEYPOINT_FORMATS = FileGroup(
    "Keypoint formats (COCO-17, COCO-WholeBody-133, OpenPose BODY_25 / COCO-18 with hands and face, CSV)",
    KEYPOINT_FILES,
)


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
    #: the model's keypoint set (``sapiens2.data.keypoint_sets``); ``keypoints`` is always the
    #: 308 layout, a 17 / 133 model's points lifted into it (the others score 0)
    keypoint_set: str = "goliath308"
    native: tuple[np.ndarray, np.ndarray] | None = None  # a 17 / 133 model's own points and scores

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
        from .pose_render import draw_pose

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
        from .pose_files import pose_json

        out = pose_json(
            self.keypoints, self.scores, self.boxes, image_size=self._wh(), box_scores=self.box_scores
        )
        out["detection"] = {"source": self.detection_source, "num_found": self.num_found}
        out["keypoint_set"] = self.keypoint_set
        if self.native is not None:  # the model's own points besides their 308 lift
            from ...data.keypoint_sets import BY_NAME

            kset = BY_NAME[self.keypoint_set]
            triples = np.concatenate([self.native[0], self.native[1][..., None]], axis=-1)  # (P, K, 3)
            people = [[[round(float(x), 2), round(float(y), 2), round(float(c), 4)] for x, y, c in person]
                      for person in triples]  # fmt: skip
            out["keypoint_set_points"] = {"names": list(kset.names), "people": people}
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
        self,
        out_dir: str | Path,
        *,
        threshold: float = 0.3,
        rendered: np.ndarray | None = None,
        writer: Writer = NOW,
    ) -> list[Path]:
        """Writes ``<name>_pose.json`` (308 named points), ``<name>_openpose.png`` (the ControlNet
        conditioning picture) and ``<name>_pose.png`` (the rendering), then the keypoint formats
        (:data:`KEYPOINT_FILES`): ``<name>_coco17.json``, ``<name>_coco_wholebody.json`` (133
        points, COCO's results layout), ``<name>_openpose_body25.json`` and
        ``<name>_openpose_coco18.json`` (bodies, hands and faces, :mod:`sapiens2.tasks.pose.openpose`),
        ``<name>_keypoints.csv`` (a row per person and keypoint); with 3D keypoints (the
        ``keypoints_3d`` option) also ``<name>_keypoints3d.json`` and ``<name>_skeleton3d.glb``
        (:mod:`sapiens2.tasks.pose.pose_3d`); returns the paths. ``threshold`` decides which points
        COCO-17/OpenPose mark as detected (and the conditioning picture draws). ``rendered``: an
        image already rendered (e.g. with the viewer's options) to write as the PNG instead of a
        fresh ``render(threshold=threshold)``."""
        from ...outputs.export import safe_path, write_json, write_png
        from . import keypoint_formats as kf
        from .openpose import openpose_coco18_json
        from .pose_files import coco17_json, openpose_body25_json

        kp, sc, wh, thr, bs = self.keypoints, self.scores, self._wh(), threshold, self.box_scores
        pictures = {
            "_openpose.png": self.openpose(threshold=thr),
            "_pose.png": self.render(threshold=thr) if rendered is None else rendered,
        }
        formats = {
            "_coco17.json": coco17_json(kp, sc, self.boxes, image_size=wh, box_scores=bs, threshold=thr),
            "_coco_wholebody.json": kf.coco_wholebody_json(
                kp, sc, box_scores=bs, threshold=thr, points133=self._own(133)
            ),  # fmt: skip
            "_openpose_body25.json": openpose_body25_json(kp, sc, threshold=thr, image_size=wh),
            "_openpose_coco18.json": openpose_coco18_json(kp, sc, image_size=wh, threshold=thr),
        }

        def path(suffix: str) -> Path:
            return safe_path(out_dir, self.name, suffix)

        return [
            write_json(path("_pose.json"), self.to_dict(), writer=writer),
            *(write_png(path(s), p, writer=writer) for s, p in pictures.items()),
            *(write_json(path(s), d, writer=writer) for s, d in formats.items()),
            kf.write_keypoints_csv(
                path("_keypoints.csv"),
                path("").name,
                *self.native or (kp, sc),
                writer=writer,
                names=self._names(),
            ),  # fmt: skip
            *([] if self.keypoints_3d is None else pose_3d.save(self, out_dir, threshold=thr, writer=writer)),
        ]

    def openpose(self, *, threshold: float = 0.3) -> np.ndarray:
        """The ControlNet OpenPose conditioning picture at the photo's size (bodies, hands and
        faces on black)."""
        from .openpose import draw_openpose

        return draw_openpose(self.keypoints, self.scores, self.image.shape[:2], threshold=threshold)

    def _own(self, count: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The model's own points when its set has ``count`` of them (else None: from the 308)."""
        return self.native if self.native is not None and self.native[1].shape[-1] == count else None

    def _names(self) -> tuple[str, ...]:
        from ...data.keypoint_sets import BY_NAME

        return BY_NAME[self.keypoint_set].names

    def _wh(self) -> tuple[int, int]:
        return int(self.image.shape[1]), int(self.image.shape[0])


__all__ = ["KEYPOINT_FILES", "KEYPOINT_FORMATS", "PoseResult"]
