"""The files a pose clip leaves for download: its tracks in every keypoint format.

Pose (one file per format, every frame in it; writers from :mod:`sapiens2.outputs.export` per frame):

* ``<name>_pose_tracks.json``: ``{"format": "sapiens2-308-video", "fps", "frames": [{"frame",
  "time_s", "image_size", "people": [{"track_id", "box", "box_score", "keypoints": [308 x
  {name, x, y, score}]}]}]}``;
* ``<name>_coco17.json``: COCO keypoints, one ``images`` entry per frame (``id`` = frame
  index, ``frame_id``/``time_s``), annotations carrying ``track_id`` (as PoseTrack does);
* ``<name>_coco_wholebody.json``: COCO-WholeBody results (133 points), one entry per person and
  frame, ``image_id`` = frame index, with ``track_id`` and ``time_s``
  (:mod:`sapiens2.tasks.pose.keypoint_formats`);
* ``<name>_openpose_body25.zip``: OpenPose's own layout, one ``<name>_<frame:012d>_keypoints.json``
  per frame, ``person_id`` = [track id], with hands (21 + 21) and face (70);
* ``<name>_openpose_coco18.zip``: the same with COCO-18 bodies (:mod:`sapiens2.tasks.pose.openpose`);
* ``<name>_keypoints.csv``: one row per frame, person and 308 keypoint (image, frame, time_s,
  person = track id, keypoint_id, name, x, y, score);
* ``<name>_openpose.webm``: the ControlNet OpenPose conditioning picture of every processed frame
  (skeletons on black, the clip's size and output frame rate), for pose-guided video models.

"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...data.keypoint_sets import BY_NAME
from ...outputs.export import jsonable, safe_path
from ...outputs.webm_writer import VideoWriter
from . import keypoint_formats as kf
from .openpose import draw_openpose, openpose_coco18_json
from .pose_files import coco17_json, openpose_body25_json, pose_json


@dataclass
class PoseFrame:
    """One processed frame's people, in track order."""

    frame: int  # source frame index
    time_s: float
    track_ids: list[int]
    boxes: np.ndarray  # (P, 4)
    box_scores: np.ndarray  # (P,)
    keypoints: np.ndarray  # (P, 308, 2) as drawn (smoothed when smoothing is on)
    keypoints_raw: np.ndarray  # (P, 308, 2) as the model gave them
    scores: np.ndarray  # (P, 308)
    #: a Sapiens v1 17 / 133 model's own (P, K, 2) points and (P, K) scores, as it gave them (the
    #: tracks and smoothing run on their 308 lift); None for a 308 model
    native: tuple[np.ndarray, np.ndarray] | None = None
    keypoint_set: str = "goliath308"


def _dumps(obj: Any) -> str:
    return json.dumps(jsonable(obj), allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def write_pose_tracks(
    out_dir: Path,
    name: str,
    frames: list[PoseFrame],
    *,
    size: tuple[int, int],
    fps: float,
    meta: dict[str, Any],
) -> Path:
    """``<name>_pose_tracks.json``, written frame by frame (never one giant string)."""
    path = safe_path(out_dir, name, "_pose_tracks.json")
    head = {"format": "sapiens2-308-video", "fps": fps, "image_size": {"width": size[0], "height": size[1]}}
    head["keypoint_set"] = own_set(frames)  # the model's (a v1 17 / 133 set is lifted to the 308 here)
    with open(path, "w", encoding="utf-8") as f:
        f.write(_dumps({**head, **meta})[:-1] + ',"frames":[')
        for i, fr in enumerate(frames):
            doc = pose_json(fr.keypoints, fr.scores, fr.boxes, image_size=size, box_scores=fr.box_scores)
            for person, tid in zip(doc["people"], fr.track_ids, strict=True):
                person["track_id"] = tid
            f.write(
                ("," if i else "") + _dumps({"frame": fr.frame, "time_s": fr.time_s, "people": doc["people"]})
            )
        f.write("]}")
    return path


def write_coco_tracks(
    out_dir: Path, name: str, frames: list[PoseFrame], *, size: tuple[int, int], threshold: float
) -> Path:
    """``<name>_coco17.json``: one image per frame, annotations with ``track_id``."""
    images, annotations, categories = [], [], None
    for fr in frames:
        doc = coco17_json(
            fr.keypoints, fr.scores, fr.boxes, image_size=size, box_scores=fr.box_scores,
            threshold=threshold, image_id=fr.frame,
        )  # fmt: skip
        categories = doc["categories"]
        images.append({**doc["images"][0], "frame_id": fr.frame, "time_s": fr.time_s})
        for ann, tid in zip(doc["annotations"], fr.track_ids, strict=True):
            annotations.append({**ann, "id": len(annotations) + 1, "track_id": tid})
    if categories is None:
        categories = coco17_json(np.zeros((0, 308, 2)), np.zeros((0, 308)), None, image_size=size)[
            "categories"
        ]
    path = safe_path(out_dir, name, "_coco17.json")
    path.write_text(_dumps({"images": images, "annotations": annotations, "categories": categories}), "utf-8")
    return path


def write_wholebody_tracks(out_dir: Path, name: str, frames: list[PoseFrame], *, threshold: float) -> Path:
    """``<name>_coco_wholebody.json``: COCO-WholeBody results of every frame (``image_id`` =
    frame index), each person with its ``track_id`` and the frame's ``time_s``."""
    path = safe_path(out_dir, name, "_coco_wholebody.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write("[")
        first = True
        for fr in frames:
            extra = [{"track_id": tid, "time_s": fr.time_s} for tid in fr.track_ids]
            own = fr.native if fr.native is not None and fr.native[1].shape[-1] == 133 else None
            for person in kf.coco_wholebody_json(
                fr.keypoints, fr.scores, box_scores=fr.box_scores, threshold=threshold,
                image_id=fr.frame, extra=extra, points133=own,
            ):  # fmt: skip
                f.write(("" if first else ",") + _dumps(person))
                first = False
        f.write("]")
    return path


def write_keypoints_csv(out_dir: Path, name: str, frames: list[PoseFrame]) -> Path:
    """``<name>_keypoints.csv``: the whole clip, one row per frame, person (track id) and keypoint
    (of the model's own set: a v1 17 / 133 model's points as it gave them, as the photo's CSV)."""
    path = safe_path(out_dir, name, "_keypoints.csv")
    stem = safe_path(out_dir, name, "").name
    rows = (
        row
        for fr in frames
        for row in kf.csv_rows(
            stem,
            *(fr.native or (fr.keypoints, fr.scores)),
            fr.track_ids,
            lead=(fr.frame, f"{fr.time_s:.4f}"),
            names=BY_NAME[fr.keypoint_set].names,
        )  # fmt: skip
    )
    return kf.write_csv(path, kf.CLIP_COLUMNS, rows)


def write_openpose_zip(
    out_dir: Path,
    name: str,
    frames: list[PoseFrame],
    *,
    threshold: float,
    size: tuple[int, int],
    coco18: bool = False,
) -> Path:
    """``<name>_openpose_body25.zip``: OpenPose's per-frame JSON files (bodies, hands, faces),
    ``person_id`` = track id, the frames' ``size`` (width, height) as each file's canvas. With
    ``coco18``: ``<name>_openpose_coco18.zip``, with COCO-18 bodies."""
    kind = "coco18" if coco18 else "body25"
    path = safe_path(out_dir, name, f"_openpose_{kind}.zip")
    stem = safe_path(out_dir, name, "").name
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for fr in frames:
            write = openpose_coco18_json if coco18 else openpose_body25_json
            doc = write(fr.keypoints, fr.scores, image_size=size, threshold=threshold)
            for person, tid in zip(doc["people"], fr.track_ids, strict=True):
                person["person_id"] = [tid]
            z.writestr(f"{stem}_{fr.frame:012d}_keypoints.json", _dumps(doc))
    return path


def write_openpose_video(
    out_dir: Path, name: str, frames: list[PoseFrame], *, size: tuple[int, int], fps: float, threshold: float
) -> Path | None:
    """``<name>_openpose.webm``: the ControlNet conditioning picture per frame (None: no frame)."""

    if not frames:
        return None
    path = safe_path(out_dir, name, "_openpose.webm")
    with VideoWriter(path, fps) as out:
        for fr in frames:
            out.write(draw_openpose(fr.keypoints, fr.scores, (size[1], size[0]), threshold=threshold))
        return out.close()


def own_set(frames: list[PoseFrame]) -> str:
    """The model's keypoint set (a frame without people carries none of its own)."""
    return next((f.keypoint_set for f in frames if f.native is not None), "goliath308")


def pose_arrays(frames: list[PoseFrame]) -> dict[str, np.ndarray]:
    """Frames padded to the most people in any frame (track id -1 and NaN mark padding)."""
    n, p = len(frames), max([len(f.track_ids) for f in frames] or [0])
    out = {
        "frame": np.array([f.frame for f in frames], np.int64),
        "time_s": np.array([f.time_s for f in frames], np.float64),
        "track_ids": np.full((n, p), -1, np.int32),
        "boxes": np.full((n, p, 4), np.nan, np.float32),
        "keypoints": np.full((n, p, 308, 2), np.nan, np.float32),
        "keypoints_raw": np.full((n, p, 308, 2), np.nan, np.float32),
        "scores": np.full((n, p, 308), np.nan, np.float32),
    }
    own = next((f.native for f in frames if f.native is not None), None)
    if own is not None:  # a v1 17 / 133 model: its own points too, padded alike
        count = own[1].shape[-1]
        out["native_keypoints"] = np.full((n, p, count, 2), np.nan, np.float32)
        out["native_scores"] = np.full((n, p, count), np.nan, np.float32)
        out["keypoint_set"] = np.array(own_set(frames))
    for i, f in enumerate(frames):
        k = len(f.track_ids)
        out["track_ids"][i, :k] = f.track_ids
        out["boxes"][i, :k], out["scores"][i, :k] = f.boxes, f.scores
        out["keypoints"][i, :k], out["keypoints_raw"][i, :k] = f.keypoints, f.keypoints_raw
        if own is not None and f.native is not None:
            out["native_keypoints"][i, :k], out["native_scores"][i, :k] = f.native
    return out
