"""The Video tab's endpoints in the real app (tiny checkpoints), the video request runner's GPU
calls and estimates, and the command line on clips.

``/video`` is called through gradio_client (the documented way) and through raw REST (what a
hostile caller does: paths the server never received must be refused like for photos).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from registry_helpers import task as T
from video_clips import count_frames, write_clip

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # app.py lives at the top level

pytest.importorskip("gradio")
from gradio_client import Client, handle_file  # noqa: E402
from test_api_security import META, SECRET, Server, served_app  # noqa: E402

import app  # noqa: E402
from sapiens2 import serving  # noqa: E402
from sapiens2.cli import main  # noqa: E402
from sapiens2.cli.tasks import is_clip  # noqa: E402
from sapiens2.errors import ResidencyError  # noqa: E402
from sapiens2.models.cost import (  # noqa: E402
    CPU_FRAME_PIXEL_S,
    CPU_MACS_PER_S,
    CPU_NETWORK_PIXEL_S,
    MAX_CALL_S,
)
from sapiens2.serving.device import Batch, Clip, Feed, OneTask  # noqa: E402
from sapiens2.serving.video import VideoRequests  # noqa: E402
from sapiens2.ui.inputs import NOT_UPLOADED_CLIP  # noqa: E402
from sapiens2.ui.video_tab import APP_VIDEO_LIMITS  # noqa: E402
from sapiens2.video import TrackingOptions  # noqa: E402
from sapiens2.video.reader import sniff_video  # noqa: E402
from sapiens2.zerogpu.quota import DAILY_QUOTA_S, gpu_request  # noqa: E402

FRAMES, FPS = 6, 10.0  # the uploaded clip; runs use stride 2: 3 frames at 5 fps


@pytest.fixture(scope="module")
def server(space_checkpoints, tmp_path_factory) -> Iterator[Server]:
    with served_app(space_checkpoints, tmp_path_factory.mktemp("video_app")) as srv:
        yield srv


@pytest.fixture(scope="module")
def clip_file(tmp_path_factory) -> Path:
    return write_clip(tmp_path_factory.mktemp("clips") / "two boxes.mp4", n=FRAMES, fps=FPS)


@pytest.fixture(scope="module")
def uploaded(server: Server, clip_file: Path) -> dict[str, Any]:
    return {"path": server.upload(clip_file), "meta": META}


def video_args(clip: Any, task: str = "seg", stride: int = 2, max_frames: Any = None) -> list[Any]:
    return [clip, task, None, stride, max_frames, 2, True]


@pytest.mark.slow
def test_pose_clip_end_to_end_through_gradio_client(server: Server, clip_file: Path, tmp_path: Path) -> None:
    client = Client(server.url, download_files=str(tmp_path), verbose=False)
    source, result, files, summary, line = client.predict(
        handle_file(str(clip_file)), "pose", None, 2, None, 2, True, api_name="/video"
    )
    for video in (source, result):
        assert Path(video).suffix == ".webm"
        n, fps, size = count_frames(Path(video))
        assert (n, size) == (3, (96, 64)) and fps == pytest.approx(FPS / 2)
    assert summary["frames"] == 3 and summary["fps"] == pytest.approx(5.0)
    assert summary["source_fps"] == pytest.approx(FPS) and summary["codec"] == "VP80"
    names = sorted(Path(p).name for p in files)
    assert names[0].endswith("_coco17.json") and any(n.endswith("_pose.webm") for n in names)
    tracks = json.loads(next(Path(p) for p in files if p.endswith("_pose_tracks.json")).read_text())
    assert len(tracks["frames"]) == 3
    assert all("track_id" in person for f in tracks["frames"] for person in f["people"])
    # issue 44 item 5: the photo tabs' one line for people (what ran, how long, every notice)
    assert line.startswith("Pose (custom model on the CPU), 3 frames at 5 fps: done in "), line
    assert "Note: No person detector" in line and "\nSeconds: reading frames " in line, line


@pytest.mark.slow
def test_dense_task_and_the_plan_before_it(server: Server, uploaded: dict[str, Any]) -> None:
    event, data, text = server.call("video_plan", [uploaded, "seg", None, 2, None])
    assert event == "complete", text[:300]
    assert data[0].startswith("96x64 at 10 fps, 0.6 s; every 2 frame(s), output at 5 fps.")
    assert "Body parts" in data[0] and "3 frames on the CPU" in data[0]
    event, data, text = server.call("video", video_args(uploaded, "seg"))
    assert event == "complete", text[:300]
    assert data[3]["frames"] == 3 and data[4].startswith(
        "Body parts (custom model on the CPU), 3 frames at 5 fps: done in "
    )
    assert [f["path"].endswith("_seg_frames.npz") for f in data[2]] == [False, True]
    event, data, _ = server.call("video_plan", [uploaded, "seg", None, 2, None])
    assert "measured on this server" in data[0]  # the estimate now comes from the run just made


@pytest.mark.parametrize(
    ("args", "title", "words"),
    [
        (dict(stride=1, max_frames=5), "Video problem", "more than 5 frames to process at stride 1"),
        (dict(max_frames=APP_VIDEO_LIMITS.max_frames + 1), "Invalid option", "this server's limit"),
        (dict(stride=0), "Invalid option", "stride must be a whole number from 1 to 1000"),
        (dict(stride=1.5), "Invalid option", "stride must be a whole number"),
        (dict(task="features"), "Invalid option", "Video runs the tasks pose, seg, normal"),
    ],
)
def test_limits_and_bad_options_give_clear_errors(
    server: Server, uploaded: dict[str, Any], args: dict[str, Any], title: str, words: str
) -> None:
    event, data, text = server.call("video", video_args(uploaded, **args))
    assert event == "error", text[:300]
    assert data["title"] == title and words in data["error"], data


@pytest.mark.slow
def test_a_corrupt_clip_is_an_error_and_the_server_stays_up(
    server: Server, uploaded: dict[str, Any], tmp_path: Path
) -> None:
    bad = tmp_path / "broken.mp4"
    bad.write_bytes(b"\x00\x00\x00\x18ftypmp42" + np.random.default_rng(0).bytes(4000))
    not_video = tmp_path / "notes.mp4"
    not_video.write_text("#EXTM3U\nhttp://127.0.0.1:1/x.ts\n")  # a playlist named .mp4
    for path, words in ((bad, "could not be decoded"), (not_video, "not a video this app reads")):
        event, data, _ = server.call("video", video_args({"path": server.upload(path), "meta": META}))
        assert event == "error" and data["title"] == "Video problem" and words in data["error"], data
    event, data, _ = server.call("video", video_args(uploaded))
    assert event == "complete" and data[3]["frames"] == 3


@pytest.mark.slow
def test_a_path_the_server_never_received_is_refused(
    server: Server, uploaded: dict[str, Any], clip_file: Path
) -> None:
    answers = set()
    for path in (str(clip_file), "/etc/passwd", str(ROOT / "assets"), "http://127.0.0.1:1/x.mp4"):
        for payload in ({"path": path, "meta": META}, {"path": path}, path, [path]):
            for api, args in (
                ("video", video_args(payload)),
                ("video_plan", [payload, "seg", None, 2, None]),
            ):
                event, data, text = server.call(api, args)
                assert event == "error" and data["error"] == NOT_UPLOADED_CLIP, text[:300]
                assert data["title"] == "Video problem" and SECRET not in text
                answers.add(text.split("data: ", 1)[1])
    url = "data:video/mp4;base64," + "AAAAGGZ0eXBtcDQy"  # data URLs would skip the upload size limit
    event, data, _ = server.call("video", video_args({"url": url, "meta": META}))
    assert event == "error" and data["error"] == NOT_UPLOADED_CLIP
    assert len(answers) == 1, answers  # one answer whatever the path names
    assert server.call("video", video_args(uploaded))[0] == "complete"  # an upload still works


def test_the_endpoints_are_described_for_api_and_mcp_callers(server: Server) -> None:
    import urllib.request

    info = json.loads(urllib.request.urlopen(f"{server.url}gradio_api/info", timeout=30).read())
    video = info["named_endpoints"]["/video"]
    assert [p["parameter_name"] for p in video["parameters"]] == [
        "clip", "task", "size", "stride", "max_frames", "detect_every", "smoothing",
    ]  # fmt: skip
    assert "/video_plan" in info["named_endpoints"]
    if app._mcp_available():
        schema = urllib.request.urlopen(f"{server.url}gradio_api/mcp/schema", timeout=30).read().decode()
        tools = {t["name"]: t for t in json.loads(schema)}
        tool = next(t for name, t in tools.items() if name.endswith("video"))
        assert "every stride-th frame of a short clip" in tool["description"]


# ----------------------------------------------------------------------------- GPU calls and estimates


class CountingClips:
    """A device that records each unit it runs and runs it like the app's GPU entry does."""

    def __init__(self, manager: serving.ModelManager) -> None:
        self.manager = manager
        self.calls: list[tuple[str, int]] = []  # (task, seconds)

    def __call__(self, unit: Clip) -> Any:
        self.calls.append((unit.what, unit.seconds))
        return unit.run(self.manager)


@pytest.mark.slow
@pytest.mark.parametrize("task", ["pose", "seg"])
def test_one_device_call_per_clip_with_a_duration_that_fits_the_quota(
    tiny_checkpoints, tmp_path: Path, task: str
) -> None:
    clip = write_clip(tmp_path / "c.webm", n=7, fps=FPS)
    manager = serving.ModelManager(device="cpu", checkpoints=tiny_checkpoints)
    calls = CountingClips(manager)
    requests = VideoRequests(manager, serving.RequestFolders(tmp_path / "req"), device=calls)
    job = requests.job(T(task), str(clip), tracking=TrackingOptions(detect_every=2))
    seen: list[tuple[int, int | None]] = []
    result = requests.run(job, lambda done, planned: seen.append((done, planned)))
    assert result.frames == 7 and seen == [(7, 7)]  # progress per batch (one batch of 8 here)
    [(name, seconds)] = calls.calls  # the whole clip in one call
    assert name == task and seconds == requests.clip_seconds(job) <= MAX_CALL_S
    assert gpu_request(seconds, factor=1.5).charged_s <= DAILY_QUOTA_S["anonymous"]
    assert requests.estimate(job).calls == 1


def test_a_plan_that_would_not_fit_is_reduced_up_front(tmp_path: Path) -> None:
    """On a GPU with the Space's resident set, a 300-frame pose clip at 1b is reduced (stride
    first) so that its one call fits 120 s of quota; the plan says so and what it requests. A
    150-frame clip fits whole: the call holds only device work (no decode, render or encode)."""
    manager = serving.ModelManager(device="cpu")
    manager.resident_bytes = lambda: 15_600_000_000  # type: ignore[method-assign]
    requests = VideoRequests(manager, serving.RequestFolders(tmp_path / "r"))
    half = requests.job(T("pose"), str(write_clip(tmp_path / "h.mp4", n=150, fps=30.0)), "1b")
    assert requests.fitted(half) is half and requests.clip_seconds(half) <= MAX_CALL_S
    clip = write_clip(tmp_path / "c.mp4", n=300, fps=30.0)
    job = requests.job(T("pose"), str(clip), "1b")  # on this CPU: no reduction
    assert job.reduced is None and job.plan.frames == 300
    fitted = requests.fitted(job)
    assert fitted.plan.stride == 2 and fitted.plan.frames == 150 and "Reduced to 150 frames" in fitted.reduced
    seconds = requests.clip_seconds(fitted)
    assert seconds <= MAX_CALL_S and gpu_request(seconds, factor=1.5).charged_s <= 120
    line = requests.estimate(fitted).line(gpu=True)
    assert line.startswith("Reduced to 150") and f"requests {seconds} s of GPU" in line
    small = requests.fitted(job, quota_s=40)  # what is left after a refusal: fewer frames
    assert gpu_request(requests.clip_seconds(small), factor=1.5).charged_s <= 40 < 93
    assert 0 < small.frames < 150 and small.take == small.frames and "40 s left" in small.reduced


def test_the_gpu_step_never_loads(tiny_checkpoints, tmp_path: Path) -> None:
    manager = serving.ModelManager(device="cpu", checkpoints=tiny_checkpoints)
    with pytest.raises(ResidencyError):
        list(OneTask(Batch(T("seg"), "0.4b", (), {}), 5).run(manager))
    prep = np.zeros((8, 8, 3), np.uint8)
    clip = Clip(("pose",), (Batch(T("pose"), "0.4b", (prep,), {}),), Feed(), budget_s=None, seconds=5)
    with pytest.raises(ResidencyError):  # a clip's unit, without the server's preparation
        list(clip.run(manager))
    assert manager.loaded() == []


def test_cpu_estimate_before_and_after_a_run(tmp_path: Path) -> None:
    clip = write_clip(tmp_path / "c.mp4", n=8, fps=FPS)
    requests = VideoRequests(serving.ModelManager(device="cpu"), serving.RequestFolders(tmp_path / "r"))
    job = requests.job(T("pointmap"), str(clip), "0.4b", stride=2)  # pointmap + its seg model: 2 forwards
    estimate = requests.estimate(job)
    tokens = (1024 // 16) * (768 // 16)
    macs = 0.398e9 * tokens + 2 * 24 * tokens**2 * 1024  # parameters x tokens + 0.4b's attention
    per_forward = macs / CPU_MACS_PER_S + 1024 * 768 * CPU_NETWORK_PIXEL_S  # about 43 s on the 2-core CPU
    per_frame = 2 * per_forward + job.frame_pixels * CPU_FRAME_PIXEL_S  # + decode, render, encode
    assert estimate.frames == 4 and estimate.cpu_s == pytest.approx(4 * per_frame, rel=0.01)
    assert "about 5.7 min" in estimate.line(gpu=False)
    requests._measured[("pointmap", "0.4b")] = 2.5
    assert requests.estimate(job).cpu_s == 10.0 and "measured" in requests.estimate(job).basis


# ----------------------------------------------------------------------------- command line


def test_cli_runs_a_clip_and_an_image_from_one_folder(tiny_checkpoints, tmp_path: Path, capsys) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    write_clip(folder / "walk.webm", n=4, fps=FPS)
    Image.fromarray(np.full((64, 96, 3), 90, np.uint8)).save(folder / "still.png")
    out = tmp_path / "out"
    argv = ["pose", str(folder), "--checkpoint", str(tiny_checkpoints["pose"]), "--device", "cpu"]
    code = main([*argv, "--out", str(out), "--stride", "2", "--no-detector", "--no-smoothing"])
    assert code == 0
    n, fps, _ = count_frames(out / "walk" / "walk_pose.webm")
    assert (n, fps) == (2, pytest.approx(FPS / 2))
    assert (out / "walk" / "walk_pose_tracks.json").is_file() and (
        out / "walk" / "walk_coco17.json"
    ).is_file()
    assert any((out / "still").iterdir())  # the image went through the photo path
    err = capsys.readouterr().err
    assert "walk.webm: 2 frames at 5 fps" in err


def test_cli_reports_a_clip_over_the_limit_and_goes_on(tiny_checkpoints, tmp_path: Path, capsys) -> None:
    clip = write_clip(tmp_path / "long.mp4", n=6, fps=FPS)
    argv = ["seg", str(clip), "--checkpoint", str(tiny_checkpoints["seg"]), "--device", "cpu"]
    assert main([*argv, "--out", str(tmp_path / "o"), "--max-frames", "2"]) == 1
    captured = capsys.readouterr()
    assert "skipped" in captured.err and "more than 2 frames" in captured.err
    assert "0 done, 1 failed" in captured.out


def test_clips_are_told_from_images_by_their_bytes(tmp_path: Path) -> None:
    gif = write_clip(tmp_path / "anim.gif", n=3, fps=FPS)
    still = tmp_path / "still.gif"
    Image.new("RGB", (8, 8)).save(still)
    heic = tmp_path / "photo.mp4"  # an HEIF still named like a clip: its brand says image
    heic.write_bytes(b"\x00\x00\x00\x18ftypheic" + b"\0" * 32)
    renamed = write_clip(tmp_path / "c.mp4", n=2).rename(tmp_path / "clip.jpg")  # a clip named like a photo
    assert [is_clip(p) for p in (gif, still, heic, renamed)] == [True, False, False, True]
    assert sniff_video(tmp_path) is None  # a folder: never opened as a clip
