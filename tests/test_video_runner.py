"""The batch runner: contract stages per batch, pose tracks and exports, dense tasks, limits.

Fake pipelines follow the pipeline contract (prepare / infer(list) / finish) with known outputs,
so counts, ids and colours can be checked exactly; the last tests run the real tiny pipelines
through the one-call-per-frame adapter.
"""

from __future__ import annotations

import csv
import json
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from video_clips import W, count_frames, find_boxes, write_clip

from sapiens2.errors import InputVideoError, OptionError
from sapiens2.inputs.intake import Intake
from sapiens2.models.detector import Detections
from sapiens2.video import TrackingOptions, VideoLimits, plan_video, run_video
from sapiens2.video.clip_steps import OneCallPerFrame, staged


def grid_keypoints(box: np.ndarray) -> np.ndarray:
    """308 points spread inside a box (what a pose model would find on a person there)."""
    x1, y1, x2, y2 = box
    u = np.linspace(0.1, 0.9, 308)
    return np.stack([x1 + u * (x2 - x1), y1 + u[::-1] * (y2 - y1)], 1).astype(np.float32)


def person_in(rgb: np.ndarray, box: np.ndarray) -> np.ndarray:
    """Where the coloured box is inside the pose crop (the box widened by 25%, as the pose
    pipeline crops): a pose model finds the person there even when the box lags behind."""
    cx, cy, w, h = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2, box[2] - box[0], box[3] - box[1]
    x1, x2 = int(max(0, cx - 0.625 * w)), int(min(rgb.shape[1], cx + 0.625 * w))
    y1, y2 = int(max(0, cy - 0.625 * h)), int(min(rgb.shape[0], cy + 0.625 * h))
    found = find_boxes(rgb[y1:y2, x1:x2])
    if not found:
        return box
    best = max(found.values(), key=lambda b: (b[2] - b[0]) * (b[3] - b[1]))
    return best + [x1, y1, x1, y1]


class FakePose:
    """Pose per the contract: prep keeps the frame's boxes, infer is one call per batch."""

    task = "pose"

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.seen_options: list[dict[str, Any]] = []

    def prepare(self, intake: Intake, *, boxes: Any = None, **opts: Any) -> dict[str, Any]:
        self.seen_options.append(opts)
        assert boxes is not None, "video always passes boxes"
        return {"boxes": np.asarray(boxes, np.float32), "rgb": intake.rgb}

    def infer(self, preps: list[dict[str, Any]], **opts: Any) -> list[dict[str, Any]]:
        assert "boxes" not in opts  # per-frame boxes travel in the preps
        self.batches.append(len(preps))
        return [{"kp": np.stack([grid_keypoints(person_in(p["rgb"], b)) for b in p["boxes"]])} for p in preps]

    def finish(self, raw: dict[str, Any], intake: Intake, **opts: Any) -> Any:
        kp = raw["kp"]
        return SimpleNamespace(
            keypoints=kp,
            scores=np.full(kp.shape[:2], 0.9, np.float32),
            notices=[],
            info=SimpleNamespace(model_s=0.01),
        )


def colour_detector(calls: list[int]) -> Any:
    """Finds the red and green boxes; lists them in a different order on every call."""

    def detect(rgb: np.ndarray) -> Detections:
        calls.append(1)
        found = find_boxes(rgb)
        names = ["red", "green"] if len(calls) % 2 else ["green", "red"]
        boxes = np.array([found[n] for n in names if n in found], np.float32)
        return Detections(boxes, np.full(len(boxes), 0.95, np.float32), "detector", len(boxes))

    return detect


class FakeDense:
    """seg / pointmap per the contract; pointmap depth 2 m on the red box, 3 m on the green."""

    def __init__(self, task: str) -> None:
        self.task = task
        self.batches: list[int] = []

    def prepare(self, intake: Intake, **opts: Any) -> np.ndarray:
        return intake.rgb

    def infer(self, preps: list[np.ndarray], **opts: Any) -> list[np.ndarray]:
        self.batches.append(len(preps))
        return preps

    def finish(self, rgb: np.ndarray, intake: Intake, **opts: Any) -> Any:
        red = (rgb[:, :, 0] > 120) & (rgb[:, :, 1] < 100)
        green = (rgb[:, :, 1] > 120) & (rgb[:, :, 0] < 100)
        if self.task == "seg":
            labels = (red * 14 + green * 22).astype(np.uint8)
            return SimpleNamespace(labels=labels, render=lambda **o: np.repeat(labels[:, :, None] * 10, 3, 2))
        depth = np.where(red, 2.0, np.where(green, 3.0, np.nan)).astype(np.float32)
        return SimpleNamespace(depth=depth, mask=red | green, notices=[])


def test_pose_clip_batches_tracks_and_exports(tmp_path: Path) -> None:
    clip = write_clip(tmp_path / "walk.mp4", n=8, fps=10.0)
    pipe, calls, progress = FakePose(), [], []
    result = run_video(
        pipe, clip, tmp_path / "out", batch_size=3, options={"flip_test": False},
        tracking=TrackingOptions(detect_every=3), detect=colour_detector(calls),
        progress=lambda done, total: progress.append((done, total)),
    )  # fmt: skip
    assert pipe.batches == [3, 3, 2]  # one infer per batch, every frame of the batch in it
    assert all(o == {"flip_test": False} for o in pipe.seen_options)
    assert len(calls) == 3  # detector on frames 0, 3, 6 only
    assert progress == [(3, 8), (6, 8), (8, 8)]
    assert (result.frames, result.fps, result.codec) == (8, 10.0, "VP80")
    n, fps, size = count_frames(result.video)
    assert (n, size) == (8, (96, 64)) and fps == pytest.approx(10.0)
    assert [p.name for p in result.files] == [
        "walk_pose.webm", "walk_pose_tracks.json", "walk_coco17.json", "walk_coco_wholebody.json",
        "walk_openpose_body25.zip", "walk_openpose_coco18.zip", "walk_keypoints.csv", "walk_openpose.webm",
        "walk_pose_frames.npz",
    ]  # fmt: skip
    doc = json.loads((tmp_path / "out/walk_pose_tracks.json").read_text())
    assert doc["format"] == "sapiens2-308-video" and doc["fps"] == 10.0 and len(doc["frames"]) == 8
    for fr in doc["frames"]:  # the left (red) box keeps id 0, the right (green) one id 1
        people = sorted(fr["people"], key=lambda p: p["box"][0])
        assert [p["track_id"] for p in people] == [0, 1]
        assert len(people[0]["keypoints"]) == 308
    carried = doc["frames"][1]["people"][0]
    assert carried["box_score"] is None  # carried, not detected, on frame 1
    coco = json.loads((tmp_path / "out/walk_coco17.json").read_text())
    assert len(coco["images"]) == 8 and len(coco["annotations"]) == 16
    assert {a["track_id"] for a in coco["annotations"]} == {0, 1}
    with zipfile.ZipFile(tmp_path / "out/walk_openpose_body25.zip") as z:
        names = z.namelist()  # OpenPose's one file per frame, frame index in 12 digits
        assert names == [f"walk_{k:012d}_keypoints.json" for k in range(8)]
        doc25 = json.loads(z.read(names[5]))
        people = doc25["people"]
        assert {p["person_id"][0] for p in people} == {0, 1}
        assert (doc25["canvas_width"], doc25["canvas_height"]) == (96, 64)  # as the COCO-18 files have it
        assert [(len(p["hand_right_keypoints_2d"]), len(p["face_keypoints_2d"])) for p in people] == [
            (63, 210)
        ] * 2
    wholebody = json.loads((tmp_path / "out/walk_coco_wholebody.json").read_text())
    assert len(wholebody) == 16 and sorted({p["image_id"] for p in wholebody}) == list(range(8))
    assert {p["track_id"] for p in wholebody} == {0, 1} and wholebody[2]["time_s"] == pytest.approx(0.1)
    with open(tmp_path / "out/walk_keypoints.csv", newline="") as f:
        rows = list(csv.DictReader(f))  # the whole clip: a row per frame, person and keypoint
    assert len(rows) == 8 * 2 * 308 and list(rows[0])[:4] == ["image", "frame", "time_s", "person"]
    assert rows[-1]["frame"] == "7" and float(rows[-1]["time_s"]) == pytest.approx(0.7)
    assert {r["person"] for r in rows} == {"0", "1"} and rows[-1]["name"] == "r_border_of_pupil_midpoint_2"
    with zipfile.ZipFile(tmp_path / "out/walk_openpose_coco18.zip") as z:
        doc18 = json.loads(z.read(z.namelist()[5]))
        assert len(z.namelist()) == 8 and (doc18["canvas_width"], doc18["canvas_height"]) == (96, 64)
        assert [len(p["pose_keypoints_2d"]) for p in doc18["people"]] == [54, 54]
    n, fps, size = count_frames(tmp_path / "out/walk_openpose.webm")  # the conditioning video
    assert (n, size) == (8, (96, 64)) and fps == pytest.approx(10.0)
    npz = np.load(tmp_path / "out/walk_pose_frames.npz")
    assert npz["keypoints"].shape == (8, 2, 308, 2) and float(npz["fps"]) == 10.0
    assert result.details == {"tracks": 2, "people_max": 2}
    assert not any("no sound" in n for n in result.notices)  # the clip has no audio track: nothing lost


def test_batched_detection_gives_the_same_tracks_and_a_playable_source_video(tmp_path: Path) -> None:
    clip = write_clip(tmp_path / "walk.mp4", n=8, fps=10.0)
    per_frame, batched, many = [], [], []
    one = colour_detector(per_frame)
    detect = colour_detector(batched)

    def detect_many(rgbs: list[np.ndarray]) -> list[Detections]:
        many.append(len(rgbs))
        return [detect(rgb) for rgb in rgbs]

    kw = dict(batch_size=3, tracking=TrackingOptions(detect_every=2))
    a = run_video(FakePose(), clip, tmp_path / "a", detect=one, **kw)
    b = run_video(
        FakePose(), clip, tmp_path / "b", detect=one, detect_many=detect_many, source_video=True, **kw
    )
    assert many == [2, 1, 1]  # detection frames 0 2 | 4 | 6: one call per batch holding any
    assert len(per_frame) == 4  # only run a's; b's went through detect_many
    tracks = [
        json.loads((d / "walk_pose_tracks.json").read_text())["frames"]
        for d in (tmp_path / "a", tmp_path / "b")
    ]
    assert tracks[0] == tracks[1]
    assert a.source_video is None and b.source_video.name == "walk_source.webm"
    assert b.source_video not in b.files  # a preview, not a download
    n, fps, size = count_frames(b.source_video)
    assert (n, size) == (8, (96, 64)) and fps == pytest.approx(10.0)
    assert find_boxes(first_frame(b.source_video)).keys() == {"red", "green"}  # the frames as read


def first_frame(video: Path) -> np.ndarray:
    import cv2

    cap = cv2.VideoCapture(str(video), cv2.CAP_FFMPEG)
    ok, bgr = cap.read()
    cap.release()
    assert ok
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def test_stride_keeps_the_duration(tmp_path: Path) -> None:
    clip = write_clip(tmp_path / "c.webm", n=8, fps=10.0)
    result = run_video(FakeDense("seg"), clip, tmp_path / "o", stride=3, batch_size=8)
    assert result.frames == 3 and result.fps == pytest.approx(10.0 / 3)
    n, fps, _ = count_frames(result.video)
    assert n == 3 and fps == pytest.approx(10.0 / 3, rel=1e-3)
    labels = np.load(result.files[1])["labels"]
    assert labels.shape == (3, 64, 96) and labels.dtype == np.uint8
    assert any("One frame in 3 was processed" in n for n in result.notices)


def test_pointmap_uses_one_colour_scale_for_the_clip(tmp_path: Path) -> None:
    clip = write_clip(tmp_path / "c.mp4", n=5)
    pipe = FakeDense("pointmap")
    result = run_video(pipe, clip, tmp_path / "o", batch_size=2)
    assert pipe.batches == [2, 2, 1]
    assert result.details["depth_bounds_m"] == [pytest.approx(2.0, abs=1e-3), pytest.approx(3.0, abs=1e-3)]
    arrays = np.load(result.files[1])
    assert arrays["depth"].shape == (5, 64, 96) and arrays["mask"].dtype == bool
    assert count_frames(result.video)[0] == 5


def test_raw_arrays_over_the_cap_are_not_written_and_the_user_is_told(tmp_path: Path) -> None:
    clip = write_clip(tmp_path / "c.mp4", n=4)
    result = run_video(FakeDense("seg"), clip, tmp_path / "o", raw_cap_bytes=10_000)
    assert [p.suffix for p in result.files] == [".webm"]
    assert any("above the 0 MB download cap" in n for n in result.notices)


def test_limits_and_options_give_clear_errors_and_leave_no_video(tmp_path: Path) -> None:
    clip = write_clip(tmp_path / "c.mp4", n=8)
    with pytest.raises(InputVideoError, match="more than 3 frames"):
        run_video(FakeDense("seg"), clip, tmp_path / "o", limits=VideoLimits(max_frames=3))
    with pytest.raises(InputVideoError, match="stride"):
        plan_video(clip, stride=2, limits=VideoLimits(max_frames=3))
    assert plan_video(clip, stride=3, limits=VideoLimits(max_frames=3)).frames == 3
    with pytest.raises(OptionError, match="tasks"):
        run_video(FakeDense("features"), clip, tmp_path / "o")
    with pytest.raises(OptionError, match="batch_size"):
        run_video(FakeDense("seg"), clip, tmp_path / "o", batch_size=0)
    with pytest.raises(OptionError, match="boxes"):
        run_video(FakePose(), clip, tmp_path / "o", options={"boxes": [[0, 0, 5, 5]]})
    with pytest.raises(OptionError, match="detect_every"):
        TrackingOptions(detect_every=0)
    with pytest.raises(OptionError, match="render option"):
        run_video(FakePose(), clip, tmp_path / "o", render_options={"colour": 1}, detect=colour_detector([]))

    class Broken(FakeDense):
        def infer(self, preps: list[np.ndarray], **opts: Any) -> list[np.ndarray]:
            if self.batches:
                raise RuntimeError("device lost")
            return super().infer(preps, **opts)

    class BrokenAtOnce(FakeDense):
        def infer(self, preps: list[np.ndarray], **opts: Any) -> list[np.ndarray]:
            raise RuntimeError("device lost")

    with pytest.raises(RuntimeError, match="device lost"):  # nothing done: nothing to keep
        run_video(BrokenAtOnce("seg"), clip, tmp_path / "o", batch_size=2)
    assert not list((tmp_path / "o").glob("*.webm"))  # the half-written video was removed
    partial = run_video(Broken("seg"), clip, tmp_path / "p", batch_size=2)  # fails on the 2nd batch
    assert partial.frames == 2 and count_frames(partial.video)[0] == 2  # the frames done, playable
    assert "device lost" in partial.notices[0] and "Only the first 2" in partial.notices[0]


def test_an_infer_hook_replaces_the_device_step(tmp_path: Path) -> None:
    """How a ZeroGPU app runs only the batch's device work in its GPU function."""
    clip = write_clip(tmp_path / "c.mp4", n=5)
    pipe, seen = FakeDense("seg"), []

    def gpu_infer(preps: list[np.ndarray], **opts: Any) -> list[np.ndarray]:
        seen.append(len(preps))
        return [p.copy() for p in preps]

    assert run_video(pipe, clip, tmp_path / "o", batch_size=2, infer=gpu_infer).frames == 5
    assert seen == [2, 2, 1] and pipe.batches == []  # the pipeline's own infer never ran
    with pytest.raises(OptionError, match="returned 1 results for 2 inputs"):
        run_video(pipe, clip, tmp_path / "o2", batch_size=2, infer=lambda preps, **o: preps[:1])


def test_single_call_pipelines_are_adapted() -> None:
    class Single:
        def __call__(self, intake: Any, **opts: Any) -> tuple[Any, dict]:
            return intake, opts

    adapted = staged(Single())
    assert isinstance(adapted, OneCallPerFrame)
    prep = adapted.prepare("frame", boxes=1)
    assert adapted.finish(adapted.infer([prep])[0], "frame") == ("frame", {"boxes": 1})
    fake = FakePose()
    assert staged(fake) is fake


# ---------------------------------------------------------------- real tiny pipelines


def test_real_tiny_pose_seg_and_matting_pipelines_run_on_a_clip(
    tiny_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    from sapiens2.tasks.matting import MattingPipeline
    from sapiens2.tasks.pose import PosePipeline
    from sapiens2.tasks.seg import SegPipeline

    clip = write_clip(tmp_path / "c.gif", n=3, fps=10.0)
    pose = PosePipeline(checkpoint=tiny_checkpoints["pose"], device="cpu", detector=None)
    seg = SegPipeline(checkpoint=tiny_checkpoints["seg"], device="cpu")
    pose.input_hw = seg.input_hw = (128, 96)
    r = run_video(pose, clip, tmp_path / "pose", batch_size=2)
    assert r.frames == 3 and r.details["tracks"] == 1  # detector off: the whole frame, one track
    frames = json.loads(r.files[1].read_text())["frames"]
    assert [len(f["people"]) for f in frames] == [1, 1, 1]
    assert all(np.isfinite([k["x"] for k in f["people"][0]["keypoints"]]).all() for f in frames)
    assert any("whole image" in n for n in r.notices)
    r = run_video(seg, clip, tmp_path / "seg", render_options={"opacity": 0.7})
    assert count_frames(r.video)[:2] == (3, pytest.approx(10.0)) and r.size == (W, 64)
    assert np.load(r.files[1])["labels"].shape == (3, 64, 96)
    matting = MattingPipeline(checkpoint=tiny_checkpoints["matting"], device="cpu")
    matting.input_hw = (128, 96)
    r = run_video(matting, clip, tmp_path / "matting", render_options={"background": "#ffffff"})
    alpha = np.load(r.files[1])["alpha"]
    assert alpha.shape == (3, 64, 96) and alpha.dtype == np.float16 and count_frames(r.video)[0] == 3


def test_no_sound_notice_only_for_clips_with_audio(tmp_path) -> None:
    from sapiens2.video.clip_plan import has_audio

    silent = tmp_path / "silent.mp4"
    silent.write_bytes(b"\x00\x00\x00\x18ftypisom" + b"hdlr" + b"\x00" * 8 + b"vide" + b"\x00" * 64)
    sound = tmp_path / "sound.mp4"
    sound.write_bytes(silent.read_bytes() + b"hdlr" + b"\x00" * 8 + b"soun")
    webm = tmp_path / "a.webm"
    webm.write_bytes(b"\x1aE\xdf\xa3" + b"V_VP8" + b"A_OPUS")
    assert not has_audio(silent) and has_audio(sound) and has_audio(webm)
    assert not has_audio(tmp_path / "missing.mp4")
