"""Issue 21: what the visitor waits for. Previews no larger than a screen needs, downloads at full
size, a run info that leads with one line for people (what ran, how long, the notices) and then
names every stage of the request, from its arrival at the server (issue 32), and the tour's
papercuts (notices said once, one comparison line, "Run all tasks" named alike). No timing
asserts: only that the stages are there and add up."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from registry_helpers import task as T

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client, handle_file  # noqa: E402
from test_api_security import Server, seg_args, served_app  # noqa: E402

from sapiens2 import serving  # noqa: E402
from sapiens2.serving.present import PREVIEW_SIDE, Stages, preview, run_info, write_preview  # noqa: E402
from sapiens2.ui import error_board  # noqa: E402

SERVER_STAGES = ["read", "load", "prepare", "device", "finish", "render", "downloads", "previews", "views"]
#: the wait before the function starts: Gradio's queue and input processing (sapiens2/ui/arrival.py)
PAGE_STAGES = ["queue"]


def stage_seconds(info: str) -> dict[str, float]:
    """The run info's ``Seconds: name 0.12 · name 0.03 ...`` line, as a dict."""
    [line] = [line for line in info.splitlines() if line.startswith("Seconds: ")]
    pairs = [item.rsplit(" ", 1) for item in line.removeprefix("Seconds: ").split(" · ")]
    return {name: float(s) for name, s in pairs}


def total_of(info: str) -> float:
    return float(re.search(r": done in ([0-9.]+) s\.", info.splitlines()[0]).group(1))


@pytest.fixture(scope="module")
def photo(tmp_path_factory) -> Path:
    """A 3000x2000 JPEG: bigger than a preview, small enough for a quick test."""
    path = tmp_path_factory.mktemp("photo") / "wide.jpg"
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (2000, 3000, 3), np.uint8)).save(path, quality=80)
    return path


@pytest.fixture(scope="module")
def server(space_checkpoints, tmp_path_factory) -> Iterator[Server]:
    with served_app(space_checkpoints, tmp_path_factory.mktemp("visitor_wait")) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: Server, tmp_path_factory) -> Client:
    return Client(server.url, download_files=str(tmp_path_factory.mktemp("downloads")), verbose=False)


# ----------------------------------------------------------------------------- previews


def test_preview_caps_the_long_side_and_keeps_small_pictures_as_they_are(tmp_path) -> None:
    big = np.zeros((3000, 5000, 3), np.uint8)
    small = preview(big)
    assert small.shape == (1229, PREVIEW_SIDE, 3)  # aspect kept: 3000 * 2048 / 5000 = 1228.8
    tall = preview(np.zeros((5000, 100, 3), np.uint8), 1000)
    assert tall.shape == (1000, 20, 3)
    fits = np.zeros((480, 640, 3), np.uint8)
    assert preview(fits) is fits  # no copy when nothing needs shrinking
    path = write_preview(tmp_path / "p.jpg", big)
    with Image.open(path) as im:
        assert im.format == "JPEG" and im.size == (PREVIEW_SIDE, 1229)


@pytest.mark.slow
def test_served_result_previews_are_capped_and_downloads_full_size(client: Client, photo: Path) -> None:
    out = client.predict(handle_file(str(photo)), api_name="/seg")
    before, after = out[0]
    for path in (before, after):
        with Image.open(path) as im:
            assert max(im.size) == PREVIEW_SIDE and im.size == (PREVIEW_SIDE, 1365), path
    pngs = [Path(p) for p in out[-2] if p.endswith(".png")]
    assert pngs, out[-2]
    for path in pngs:
        with Image.open(path) as im:
            assert im.size == (3000, 2000), path.name


@pytest.mark.slow
def test_downloads_are_served_from_the_request_folder_without_a_copy(server: Server, photo: Path) -> None:
    upload = {"path": server.upload(photo), "meta": {"_type": "gradio.FileData"}}
    event, data, text = server.call("seg", seg_args(upload))
    assert event == "complete", text[:300]
    files = data[-2]
    root = (server.requests_root).resolve()
    for f in files:
        path = Path(f["path"]).resolve()
        assert path.is_relative_to(root), path  # not a copy in Gradio's cache
        folder = path.relative_to(root).parts[0]
        assert re.fullmatch(r"req-[0-9a-f]{32}", folder)  # 128 random bits: not guessable
    # and the page can fetch them
    import urllib.request

    body = urllib.request.urlopen(f"{server.url}gradio_api/file={files[0]['path']}", timeout=30).read()
    assert body == Path(files[0]["path"]).read_bytes()


# ----------------------------------------------------------------------------- run info


@pytest.mark.slow
def test_runner_records_every_server_stage_in_order(tiny_checkpoints, tmp_path, photo: Path) -> None:
    manager = serving.ModelManager(device="cpu", checkpoints=tiny_checkpoints)
    started: list[str] = []
    runner = serving.RequestRunner(manager, serving.RequestFolders(tmp_path), preview_side=512)
    shown = runner.run(T("matting"), str(photo), stages=Stages(started.append))
    assert list(shown.stages.seconds) == SERVER_STAGES == started
    assert all(s >= 0 for s in shown.stages.seconds.values())
    assert shown.previews is not None and all(p.is_file() for p in shown.previews)
    first, second, details = shown.line.splitlines()
    assert first.startswith("Matting (") and details.startswith("matting ")
    assert total_of(shown.line) == pytest.approx(shown.stages.total(), abs=0.01)
    assert list(stage_seconds(shown.line)) == SERVER_STAGES


@pytest.mark.slow
def test_served_run_info_has_every_stage_and_an_end_to_end_total(client: Client, photo: Path) -> None:
    info = client.predict(handle_file(str(photo)), api_name="/normal")[-1]
    stages = stage_seconds(info)
    assert list(stages) == PAGE_STAGES + SERVER_STAGES, info
    assert info.splitlines()[0].startswith("Normals (")  # the line for people comes first
    # the total runs from the request's arrival to the function's return: at least the stages'
    # sum (less the rounding of each printed figure), and not far above it
    assert total_of(info) >= sum(stages.values()) - 0.005 * len(stages)
    assert total_of(info) <= sum(stages.values()) + 0.5 * max(1.0, sum(stages.values()))


@pytest.mark.slow
def test_all_tasks_status_carries_each_task_and_the_total(client: Client, photo: Path) -> None:
    out = client.predict(handle_file(str(photo)), api_name="/all")
    status = out[-1]
    assert status.startswith("7 of 7 tasks: done in"), status  # Sapiens v1's depth runs with the rest
    stages = stage_seconds(status)
    assert {"Pose", "Body parts", "Normals", "Matting", "Features", "Depth (v1)", "queue"} <= set(stages)
    assert total_of(status) >= sum(stages.values()) - 0.005 * len(stages)


# ----------------------------------------------------------------------------- papercuts


def test_a_notice_pops_up_once_and_stays_in_the_run_info(monkeypatch) -> None:
    shown: list[str] = []
    monkeypatch.setattr(error_board.gr, "Warning", lambda text, **_: shown.append(text))
    monkeypatch.setattr(error_board, "_TOLD", set())
    notice = "No person detector weights: pose uses the whole photo."
    for _ in range(3):
        error_board.warn([notice])
    assert shown == [notice]
    info = run_info(
        "Pose (1b model on the CPU)", Stages(), [notice], "pose 1b · cpu · float32 · model 0.10 s"
    )
    assert info.splitlines()[0] == f"Pose (1b model on the CPU): done in 0.00 s. Note: {notice}"


@pytest.mark.slow
def test_pose_without_detector_says_so_in_every_run_info(client: Client) -> None:
    photo = ROOT / "assets" / "pexels-cc0-jockey-horse-racing.jpg"
    infos = [client.predict(handle_file(str(photo)), api_name="/pose")[-1] for _ in range(2)]
    for info in infos:
        notes = info.splitlines()[0].split("Note: ")[1:]  # the notices are in the line for people
        assert any("detector" in n.lower() for n in notes), info


def test_comparison_run_info_is_one_line_not_the_same_line_twice(client: Client) -> None:
    photo = handle_file(str(ROOT / "assets" / "pexels-cc0-jockey-horse-racing.jpg"))
    score, info = client.predict(photo, photo, api_name="/similarity")
    first = info.splitlines()[0]
    assert first.startswith("Features (") and "both photos" in first
    assert info.count(" · model ") == 1 and "|" not in info
    assert score == pytest.approx(1.0, abs=1e-4)


def test_run_all_tasks_is_named_the_same_in_the_text_and_on_the_button(server: Server) -> None:
    config: dict[str, Any] = server.demo.get_config_file()
    props = [c.get("props", {}) for c in config["components"]]
    buttons = [
        p.get("value") for c, p in zip(config["components"], props, strict=True) if c["type"] == "button"
    ]
    text = " ".join(str(p.get("value", "")) for c, p in zip(config["components"], props, strict=True)
                    if c["type"] == "markdown")  # fmt: skip
    assert "Run all tasks" in buttons
    assert "**Run all tasks**" in text and "**All tasks**" not in text
