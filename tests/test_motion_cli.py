"""A clip to 3D motion on tiny models: ``sapiens2 motion`` and the Video tab's ``/motion``
(gradio_client, and raw REST with a path the server never received)."""

from __future__ import annotations

import csv
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from test_motion_files import check_structure, read_glb
from video_clips import write_clip

from sapiens2.cli import COMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parents[1]
FRAMES = 4


def checkpoint_flags(tiny: dict[str, Path]) -> list[str]:
    return [x for t in ("pose", "pointmap", "seg") for x in ("--checkpoint", f"{t}={tiny[t]}")]


def test_the_command_is_listed_with_its_help() -> None:
    assert "motion_cmd" in COMMANDS
    text = build_parser().format_help()
    assert "motion" in text and "3D motion from a clip" in text


@pytest.mark.slow
def test_motion_command_writes_the_files(tiny_checkpoints, tmp_path: Path, capsys) -> None:
    clip = write_clip(tmp_path / "walk.mp4", n=FRAMES, fps=10.0)
    out = tmp_path / "out"
    code = main(["motion", str(clip), "--out", str(out), "--no-detector", "--device", "cpu", "--batch", "2",
                 *checkpoint_flags(tiny_checkpoints)])  # fmt: skip
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert f"walk.mp4: {FRAMES} frames, 1 people" in printed.out
    folder = out / "walk"
    with np.load(folder / "walk_keypoints3d.npz") as z:
        assert z["points"].shape == (FRAMES, 1, 308, 3) and z["scores"].shape == (FRAMES, 1, 308)
        assert z["ids"].tolist() == [0] and float(z["fps"]) == pytest.approx(10.0)
        assert z["depth_factor"].shape == (FRAMES,) and z["present"].all()
        known = np.isfinite(z["points"]).all(-1)
    assert known.any()  # the tiny models' random depth still gives points on the mask
    with open(folder / "walk_keypoints3d.csv", newline="") as f:
        assert sum(1 for _ in csv.reader(f)) == 1 + FRAMES * 308
    doc, binary = read_glb(folder / "walk_motion.glb")
    check_structure(doc, binary)
    [anim] = doc["animations"]
    assert {doc["accessors"][s["input"]]["count"] for s in anim["samplers"]} == {FRAMES}
    assert (folder / "walk_motion.bvh").read_text().count("\n") > FRAMES
    assert (folder / "walk_pose.webm").is_file() and (folder / "walk_pointmap.webm").is_file()
    assert not (folder / "walk_lifted.npz").exists()  # the passes' hand-over, not a download


def test_a_bad_clip_is_skipped_with_a_message(tiny_checkpoints, tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"not a video at all")
    code = main(["motion", str(bad), str(tmp_path / "missing.mp4"), "--out", str(tmp_path / "o"),
                 "--no-detector", "--device", "cpu", *checkpoint_flags(tiny_checkpoints)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1 and "skipped" in err and "missing.mp4" in err
    assert main(["motion", str(bad), "--checkpoint", "nonsense"]) == 1  # a malformed TASK=PATH
    assert "TASK=PATH" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the app


@pytest.fixture(scope="module")
def server(tiny_checkpoints, tmp_path_factory) -> Iterator[object]:
    pytest.importorskip("gradio")
    sys.path.insert(0, str(ROOT))
    from test_api_security import served_app

    with served_app(tiny_checkpoints, tmp_path_factory.mktemp("motion_app")) as srv:
        yield srv


@pytest.mark.slow
def test_motion_endpoint_through_gradio_client(server, tmp_path: Path) -> None:
    from gradio_client import Client, handle_file

    clip = write_clip(tmp_path / "two boxes.mp4", n=6, fps=10.0)
    client = Client(server.url, download_files=str(tmp_path / "dl"), verbose=False)
    source, result, files, summary, line, glb = client.predict(
        handle_file(str(clip)), None, 2, None, 2, True, api_name="/motion"
    )
    assert Path(source).suffix == Path(result).suffix == ".webm"
    names = [Path(p).name for p in files]
    assert names[:4] == [
        f"two_boxes_{s}" for s in ("motion.glb", "keypoints3d.npz", "keypoints3d.csv", "motion.bvh")
    ]
    assert (
        summary["task"] == "motion"
        and summary["frames"] == 3
        and line.startswith("3D motion (custom models on the CPU), 3 frames, ")
    )
    assert summary["depth_alignment"]["frames"] == 3
    doc, binary = read_glb(Path(glb))
    check_structure(doc, binary)


def test_motion_refuses_a_path_it_never_received(server) -> None:
    from test_api_security import CLIP_REFUSAL, META, assert_refused

    event, data, text = server.call("motion", [{"path": "/etc/passwd", "meta": META}, None, 1, None, 5, True])
    assert_refused(event, data, text, CLIP_REFUSAL)
    event, data, text = server.call("motion", [None, None, 1, None, 5, True])
    assert event == "error" and "clip" in data["error"].lower()


def test_the_pointmap_pass_handler_crosses_a_process_boundary() -> None:
    """On ZeroGPU the clip's spec (with the motion's handler) is pickled into the GPU worker."""
    import pickle

    from sapiens2.video.clip_motion import MotionDepth, MotionOptions

    pose = {"frame": np.arange(3), "track_ids": np.zeros((3, 1), np.int32),
            "boxes": np.zeros((3, 1, 4), np.float32), "keypoints_raw": np.zeros((3, 1, 308, 2), np.float32)}  # fmt: skip
    back = pickle.loads(pickle.dumps(MotionDepth(pose, MotionOptions(max_gap=2))))
    assert back.options.max_gap == 2 and back.pose["keypoints_raw"].shape == (3, 1, 308, 2)
