"""The motion GLB plays in the page's 3D viewer (Gradio's Model3D, Babylon.js) in Debian's Chromium
(Playwright, headless, WebGL on SwiftShader): the canvas changes between two moments while the
animation runs; the same skeleton without animation stays still (the negative control, which
shows the check can fail). Then the Video tab's motion button in the real app (tiny models)
fills its viewer. ``$SAPIENS2_SCREENSHOT_DIR``: also save the screenshots there."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from chromium import CHROMIUM, playwright_or_skip  # noqa: E402
from motion_synth import walker
from video_clips import write_clip

sync_api = playwright_or_skip()
gr = pytest.importorskip("gradio")

from sapiens2.tasks.pose.motion_files import write_motion_glb  # noqa: E402
from sapiens2.tasks.pose.skeleton3d import write_skeleton_cloud_glb  # noqa: E402

pytestmark = pytest.mark.browser

#: WebGL in headless Chromium without a GPU: SwiftShader through ANGLE
ARGS = ["--no-sandbox", "--use-angle=swiftshader", "--enable-unsafe-swiftshader", "--ignore-gpu-blocklist",
        "--disable-background-networking", "--disable-component-update", "--no-first-run"]  # fmt: skip
FRAMES, FPS = 40, 10.0


def changed(a: bytes, b: bytes) -> float:
    """Share of pixels that differ clearly between two PNG screenshots."""
    import io

    from PIL import Image

    x = np.asarray(Image.open(io.BytesIO(a)).convert("RGB"), np.int16)
    y = np.asarray(Image.open(io.BytesIO(b)).convert("RGB"), np.int16)
    return float((np.abs(x - y).sum(-1) > 30).mean())


def shots(
    page, selector: str, settle: float = 6.0, gaps: tuple[float, ...] = (0.25, 0.3, 0.35)
) -> list[bytes]:
    """A screenshot after ``settle`` s, then one after each gap. The walker strides at 1 Hz, so a
    whole-second gap lands on the same pose; these gaps fall a quarter to a half stride apart."""
    canvas = page.locator(f"{selector} canvas")
    canvas.wait_for(state="visible", timeout=120_000)
    time.sleep(settle)  # the model loads and the camera settles
    out = [canvas.screenshot()]
    for gap in gaps:
        time.sleep(gap)
        out.append(canvas.screenshot())
    return out


def save(name: str, png: bytes) -> None:
    folder = os.environ.get("SAPIENS2_SCREENSHOT_DIR")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / name).write_bytes(png)


@pytest.fixture(scope="module")
def two_files(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("glb")
    pts = np.stack([walker(FRAMES, FPS, x0=-0.5), walker(FRAMES, FPS, x0=0.5, phase=1.5)], 1)
    moving = write_motion_glb(
        folder / "walk.glb", pts, np.ones((FRAMES, 2), bool), np.arange(FRAMES) / FPS, np.array([0, 1])
    )
    still = write_skeleton_cloud_glb(folder / "still.glb", np.zeros((0, 3)), np.zeros((0, 3)), pts[0])
    return moving, still


def test_the_motion_plays_in_model3d_and_a_still_skeleton_does_not(two_files) -> None:
    moving, still = two_files
    with gr.Blocks() as demo:
        gr.Model3D(value=str(moving), elem_id="moving", height=420, display_mode="solid")
        gr.Model3D(value=str(still), elem_id="still", height=420, display_mode="solid")
    _, url, _ = demo.launch(prevent_thread_lock=True, quiet=True, allowed_paths=[str(moving.parent)])
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
            try:
                page = browser.new_page(viewport={"width": 900, "height": 1000})
                page.goto(url, wait_until="domcontentloaded", timeout=60_000)
                moving_shots = shots(page, "#moving")
                still_shots = shots(page, "#still", settle=1.0)
            finally:
                browser.close()
    finally:
        demo.close()
    a, c = moving_shots[0], still_shots[0]
    save("motion-model3d.png", a)
    moved = max(changed(a, b) for b in moving_shots[1:])
    assert moved > 0.005, f"the skeleton did not move ({moved:.4f})"  # the animation runs
    still = max(changed(c, d) for d in still_shots[1:])
    assert still < 0.001, f"a still skeleton changed ({still:.4f})"  # negative control
    assert changed(a, c) > 0.005  # and both drew something different from each other


def test_the_video_tab_motion_button_fills_its_viewer(tiny_checkpoints, tmp_path: Path, monkeypatch) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import app
    from sapiens2 import serving

    monkeypatch.setenv("GRADIO_EXAMPLES_CACHE", str(tmp_path / "examples"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    clip = write_clip(tmp_path / "walk.mp4", n=3, fps=10.0)  # 3 frames: the flow, not the models
    manager = serving.ModelManager(device="cpu", checkpoints=tiny_checkpoints)
    demo = app.build_demo(manager, folders=serving.RequestFolders(tmp_path / "requests"))
    _, url, _ = app.launch(demo, host="127.0.0.1", prevent_thread_lock=True, quiet=True)
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1600})
                page.goto(url, wait_until="domcontentloaded", timeout=60_000)
                page.get_by_role("tab", name="Video", exact=True).click(timeout=60_000)
                page.locator("#video-clip input[type=file]").set_input_files(str(clip))
                plan = page.locator("#video-plan textarea")
                sync_api.expect(plan).to_have_value(re.compile(r"^96x64 at 10 fps"), timeout=60_000)
                page.locator("#video-motion-button").click()
                info = page.locator("#video-info textarea")
                sync_api.expect(info).to_have_value(
                    re.compile(r"^3D motion \(custom models on the CPU\), 3 frames"), timeout=600_000
                )
                # issue 44 item 4: the pose pass's downloads stay beside the motion files
                listed = page.locator("#video-files a[download]")
                sync_api.expect(listed.first).to_be_attached(timeout=30_000)
                names = {a.get_attribute("download") for a in listed.all()}
                canvas = page.locator("#video-motion canvas")
                canvas.wait_for(state="visible", timeout=60_000)
                time.sleep(5)
                save("motion-video-tab.png", page.locator("#video-motion").screenshot())
                loaded = page.evaluate("() => document.querySelector('#video-motion canvas').width > 0")
            finally:
                browser.close()
    finally:
        demo.close()
    assert loaded
    for kept in ("walk_motion.glb", "walk_keypoints3d.npz", "walk_pose_tracks.json", "walk_coco17.json",
                 "walk_keypoints.csv", "walk_pose_frames.npz", "walk_pose.webm"):  # fmt: skip
        assert kept in names, sorted(names)
