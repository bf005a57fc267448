"""A clip's GPU call holds device work only (issue 36, item 4): the server decodes, prepares,
tracks, finishes, renders and encodes; the call runs the forwards and pose's detections, fed
batch by batch, and streams the raws out. Recorded by which functions run while the unit's
generator is advancing; and the unit's feed crossing a fork as it does to a ZeroGPU worker."""

from __future__ import annotations

import multiprocessing
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from video_clips import write_clip

from sapiens2 import serving
from sapiens2.outputs import webm_writer as writer
from sapiens2.serving import clip_call, device
from sapiens2.serving.device import READY, Batch, Clip, Feed, Stopped
from sapiens2.serving.motion_requests import MotionRequests
from sapiens2.serving.video import VideoRequests
from sapiens2.tasks import registry
from sapiens2.tasks.clip_frames import DenseFrames
from sapiens2.tasks.pointmap.pointmap_clip import DepthFrames
from sapiens2.tasks.pose.pose_clip import PoseFrames
from sapiens2.video import TrackingOptions, clip_motion, clip_runner, clip_steps

T = registry.get

#: What the server does and a GPU call must not: (module or class, attribute, kind).
HOST = [
    (clip_runner, "iter_frames", "decode"),
    (clip_runner, "load_image", "intake"),
    (clip_runner, "prepare_batch", "prepare"),
    (clip_runner, "finish_batch", "finish"),
    (PoseFrames, "options_for", "track"),
    (PoseFrames, "consume", "render"),
    (DenseFrames, "consume", "render"),
    (DepthFrames, "consume", "render"),
    (DepthFrames, "deferred", "render"),
    (clip_motion.MotionDepth, "consume", "lift"),
    (writer.VideoWriter, "write", "encode"),
]
DEVICE = [(device.Batch, "infer", "forward"), (device.Detect, "infer", "detect")]


class Recorder:
    """A device that runs each unit here and records which functions run inside its call."""

    def __init__(self, manager: serving.ModelManager, monkeypatch: pytest.MonkeyPatch) -> None:
        self.manager, self.inside, self.units = manager, False, []
        self.seen: dict[tuple[str, bool], int] = {}
        for owner, name, kind in HOST + DEVICE:
            monkeypatch.setattr(owner, name, self._wrap(getattr(owner, name), kind))

    def _wrap(self, fn: Any, kind: str) -> Any:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            key = (kind, self.inside)
            self.seen[key] = self.seen.get(key, 0) + 1
            return fn(*args, **kwargs)

        return recorded

    def __call__(self, unit: Clip) -> Iterator[Any]:
        self.units.append(unit)
        gen = unit.run(self.manager)
        while True:
            self.inside = True
            try:
                item = next(gen)
            except StopIteration:
                return
            finally:
                self.inside = False
            yield item

    def kinds(self, inside: bool) -> set[str]:
        return {k for (k, i) in self.seen if i == inside}


@pytest.fixture
def recorder(tiny_checkpoints, monkeypatch) -> Recorder:
    manager = serving.ModelManager(device="cpu", checkpoints=tiny_checkpoints)
    return Recorder(manager, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("task", ["pose", "pointmap"])
def test_a_clips_call_runs_only_forwards_and_detections(
    recorder: Recorder, tmp_path: Path, task: str
) -> None:
    clip = write_clip(tmp_path / "c.mp4", n=11, fps=10.0)
    requests = VideoRequests(recorder.manager, serving.RequestFolders(tmp_path / "r"), device=recorder)
    job = requests.job(T(task), str(clip), tracking=TrackingOptions(detect_every=3))
    seen: list[tuple[int, int | None]] = []
    result = requests.run(job, lambda done, planned: seen.append((done, planned)))
    assert result.frames == 11 and seen == [(8, 11), (11, 11)]  # progress per batch of 8
    [unit] = recorder.units  # one call for the clip
    inside = recorder.kinds(True)
    assert inside == ({"forward", "detect"} if task == "pose" else {"forward"})
    assert {"decode", "prepare", "finish", "render", "encode"} <= recorder.kinds(False)
    if task == "pointmap":  # every batch known before the call: its first jobs, preps only
        assert [len(j.preps) for j in unit.first] == [8, 3]
        assert all(isinstance(j, Batch) and type(j.preps[0]).__name__ == "DensePrep" for j in unit.first)
    else:  # pose's boxes follow its keypoints: the first detection opens the call, the rest is fed
        assert [type(j).__name__ for j in unit.first] == ["Detect"]


@pytest.mark.slow
def test_motion_is_one_call_with_only_device_work(recorder: Recorder, tmp_path: Path) -> None:
    clip = write_clip(tmp_path / "c.mp4", n=11, fps=10.0)
    video = VideoRequests(recorder.manager, serving.RequestFolders(tmp_path / "r"), device=recorder)
    seen: list[tuple[int, int | None]] = []
    result = MotionRequests(video).run(str(clip), tracking=TrackingOptions(detect_every=3),
                                       progress=lambda d, p: seen.append((d, p)))  # fmt: skip
    [unit] = recorder.units  # pose and pointmap: one admission
    assert unit.what == "pose + pointmap" and result.details["gpu_calls"] == 1
    assert recorder.kinds(True) == {"forward", "detect"}
    assert {"decode", "render", "encode", "lift", "track"} <= recorder.kinds(False)
    assert seen == [(8, 22), (11, 22), (19, 22), (22, 22)] and result.frames == 11


@pytest.mark.slow
def test_motion_decodes_the_clip_once(recorder: Recorder, tmp_path: Path) -> None:
    """The pointmap pass takes the pose pass's decoded frames: one decode for both."""
    clip = write_clip(tmp_path / "c.mp4", n=5, fps=10.0)
    video = VideoRequests(recorder.manager, serving.RequestFolders(tmp_path / "r"), device=recorder)
    result = MotionRequests(video).run(str(clip), tracking=TrackingOptions(detect_every=3))
    assert recorder.seen[("decode", False)] == 1 and ("decode", True) not in recorder.seen
    assert result.frames == 5


@pytest.mark.slow
def test_motion_after_a_quota_refusal_runs_the_frames_that_fit_as_a_video_does(
    recorder: Recorder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ZeroGPU refuses the motion's call for quota: both passes run again on the frames whose
    call fits the seconds left, the reduction is announced, and the result says so, as
    VideoRequests.run does for a clip (one rule, VideoRequests.refitted / refused)."""
    from sapiens2.errors import GpuUnavailableError

    clip = write_clip(tmp_path / "c.mp4", n=11, fps=10.0)
    said: list[str] = []
    video = VideoRequests(recorder.manager, serving.RequestFolders(tmp_path / "r"), device=recorder,
                          announce=said.append)  # fmt: skip
    requests = MotionRequests(video)
    tracking = TrackingOptions(detect_every=3)
    pose, pm = requests.jobs(str(clip), None, stride=1, max_frames=None, tracking=tracking)
    left = next(s for s in range(1, 10_000) if video._fits(pose, 5, s, also=(pm,)))  # 5 frames fit
    assert not video._fits(pose, 11, left, also=(pm,))
    refusal = GpuUnavailableError("Your quota is short.", requested_s=99, left_s=left, quota=True)
    real, runs = MotionRequests._run, []

    def refused_once(self, pose_job, pm_job, *rest):
        runs.append((pose_job.frames, pm_job.frames))
        if len(runs) == 1:
            raise refusal
        return real(self, pose_job, pm_job, *rest)

    monkeypatch.setattr(MotionRequests, "_run", refused_once)
    result = requests.run(str(clip), tracking=tracking)
    assert runs[0] == (11, 11) and runs[1][0] == runs[1][1] and 5 <= runs[1][0] < 11
    assert result.frames == runs[1][0] and result.details["gpu_refused"] == str(refusal)
    assert result.notices[0].startswith(f"Only {result.frames} of 11 frames were processed.")
    assert any("quota has" in s for s in said)  # the reduction, announced before the rerun
    monkeypatch.setattr(MotionRequests, "_run", lambda *a: (_ for _ in ()).throw(
        GpuUnavailableError("No GPU is free.", quota=False)))  # fmt: skip
    with pytest.raises(GpuUnavailableError, match="No GPU is free"):  # not a quota refusal: as it is
        requests.run(str(clip))


class Doubler:
    def infer(self, preps: list[Any], **_: Any) -> list[Any]:
        return [2 * p for p in preps]


def _worker(unit_bytes: bytes, out: Any) -> None:
    """A forked worker as ZeroGPU's: the unit arrives pickled, its outputs go back pickled."""
    manager = serving.ModelManager(device="cpu", factory=lambda task, size, **kw: Doubler())
    manager.get(T("seg"), "0.4b")
    unit = pickle.loads(unit_bytes)
    for item in unit.run(manager):
        out.put(item)
    out.put("end")


def test_the_feed_crosses_to_a_forked_worker(tmp_path: Path) -> None:
    """The unit's feed, pickled, becomes the worker's end of a pipe: jobs sent after the call
    started reach it, the end of the feed ends the call."""
    ctx = multiprocessing.get_context("fork")
    out = ctx.SimpleQueue()
    feed = Feed()
    first = (Batch(T("seg"), "0.4b", (1, 2), {}),)
    proc = ctx.Process(target=_worker, args=(pickle.dumps(Clip(("seg",), first, feed, None, 5)), out))
    proc.start()
    try:
        assert out.get() == READY and out.get() == [2, 4]
        feed.put((Batch(T("seg"), "0.4b", (np.arange(3),), {}),))
        assert out.get()[0].tolist() == [0, 2, 4]
        feed.put(None)
        assert out.get() == "end"
    finally:
        proc.join(30)
        feed.close()
    assert proc.exitcode == 0


def test_the_call_stops_before_its_reservation_runs_out() -> None:
    manager = serving.ModelManager(device="cpu", factory=lambda task, size, **kw: Doubler())
    manager.get(T("seg"), "0.4b")
    jobs = tuple(Batch(T("seg"), "0.4b", (i,), {}) for i in range(3))
    items = list(Clip(("seg",), jobs, Feed(), budget_s=0.0, seconds=5, idle_s=1).run(manager))
    assert items[:2] == [READY, [0]] and isinstance(items[2], Stopped) and len(items) == 3
    call = clip_call.ClipCall(device.local_device(manager), ("seg",), 5, budget_s=0.0)
    steps = call.steps(T("seg"), "0.4b")
    raws = steps.stream([[1], [2]], {}, last=True)
    assert next(raws) == [2]
    with pytest.raises(clip_steps.ClipStopped):
        next(raws)
    call.close()
