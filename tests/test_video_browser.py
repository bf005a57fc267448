"""The rendered clip plays in a real browser: Debian's chromium driven by Playwright, headless.

A page with a ``<video>`` element loads the runner's output; the test waits for readyState >= 2
(HAVE_CURRENT_DATA: a frame is decoded), plays it and checks that currentTime advances and that
the duration matches frames / fps. An MPEG-4 Part 2 MP4 (what OpenCV writes as 'mp4v') is the
negative control: Chromium must refuse it, which shows the check can fail.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from chromium import CHROMIUM, playwright_or_skip  # noqa: E402
from video_clips import write_clip

sync_api = playwright_or_skip()

from test_video_runner import FakeDense  # noqa: E402

from sapiens2.video import run_video  # noqa: E402

pytestmark = pytest.mark.browser

BROWSER_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--autoplay-policy=no-user-gesture-required",
]

_PLAY = """async () => {
  const v = document.getElementById("v");
  await new Promise((done) => {
    if (v.readyState >= 2 || v.error) return done();
    v.addEventListener("loadeddata", done); v.addEventListener("error", done); setTimeout(done, 60000);
  });
  const out = {ready: v.readyState, error: v.error ? v.error.code : null, duration: v.duration,
               width: v.videoWidth, height: v.videoHeight, start: v.currentTime, now: null,
               src: v.currentSrc};
  if (out.error !== null || out.ready < 2) return out;
  await v.play();
  // until playback moves (an event, not a fixed wait: a busy machine decodes late); capped
  await new Promise((done) => {
    const moved = () => { if (v.currentTime > out.start) done(); };
    v.addEventListener("timeupdate", moved); setTimeout(done, 60000); moved();
  });
  out.now = v.currentTime;
  return out;
}"""


def play_in_chromium(video: Path) -> dict[str, Any]:
    page_file = video.parent / "play.html"
    page_file.write_text(f'<video id="v" muted playsinline preload="auto" src="{video.name}"></video>')
    return _evaluate(page_file.as_uri(), _PLAY)


def _evaluate(url: str, script: str, wait_for: str | None = None) -> dict[str, Any]:
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=BROWSER_ARGS)
        try:
            page = browser.new_page()
            page.goto(url, wait_until="domcontentloaded", timeout=60_000)
            if wait_for:
                page.wait_for_selector(wait_for, state="attached", timeout=60_000)
            return page.evaluate(script)
        finally:
            browser.close()


def test_the_output_video_plays_in_chromium(tmp_path: Path) -> None:
    clip = write_clip(tmp_path / "clip.mp4", n=10, fps=12.5)
    result = run_video(FakeDense("seg"), clip, tmp_path / "out")
    state = play_in_chromium(result.video)
    assert state["error"] is None and state["ready"] >= 2, state
    assert (state["width"], state["height"]) == (96, 64)
    assert state["duration"] == pytest.approx(10 / 12.5, abs=0.05)  # frame rate kept: 10 frames at 12.5 fps
    assert state["now"] > state["start"], state  # playback advanced


def test_negative_control_chromium_refuses_mpeg4_part2(tmp_path: Path) -> None:
    clip = write_clip(tmp_path / "mp4v.mp4", n=10, fps=12.5)
    state = play_in_chromium(clip)
    assert state["ready"] < 2 and state["error"] is not None, state


def test_gradio_video_component_serves_it_unconverted_and_it_plays(tmp_path: Path) -> None:
    """gr.Video (format=None) hands the WebM to the page as it is, and Chromium plays it there.
    (With ffmpeg installed, as on Spaces, Gradio would also leave it: its video_is_playable
    accepts (.webm, vp8).)"""
    gr = pytest.importorskip("gradio")
    clip = write_clip(tmp_path / "clip.mp4", n=10, fps=12.5)
    result = run_video(FakeDense("seg"), clip, tmp_path / "out")
    with gr.Blocks() as demo:
        gr.Video(value=str(result.video), elem_id="out", autoplay=False)
    _, url, _ = demo.launch(prevent_thread_lock=True, quiet=True, allowed_paths=[str(tmp_path)])
    try:
        script = _PLAY.replace('document.getElementById("v")', 'document.querySelector("#out video")')
        state = _evaluate(url, script, wait_for="#out video")
    finally:
        demo.close()
    assert state["error"] is None and state["ready"] >= 2, state
    assert state["src"].endswith(".webm"), state
    assert state["duration"] == pytest.approx(10 / 12.5, abs=0.05)
    assert state["now"] > state["start"], state


def test_the_video_tab_plays_its_result_inside_the_app(
    space_checkpoints, tmp_path: Path, monkeypatch
) -> None:
    """The whole app (tiny checkpoints): upload a clip in the Video tab, run it, and both videos
    (the frames read and the result) play in their gr.Video players."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import app
    from sapiens2 import serving

    monkeypatch.setenv("GRADIO_EXAMPLES_CACHE", str(tmp_path / "examples"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    clip = write_clip(tmp_path / "walk.mp4", n=6, fps=10.0)
    manager = serving.ModelManager(device="cpu", checkpoints=space_checkpoints)
    demo = app.build_demo(manager, folders=serving.RequestFolders(tmp_path / "requests"))
    _, url, _ = app.launch(demo, host="127.0.0.1", prevent_thread_lock=True, quiet=True)
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=BROWSER_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1100})
                page.goto(url, wait_until="domcontentloaded", timeout=60_000)
                page.get_by_role("tab", name="Video", exact=True).click(timeout=60_000)
                page.locator("#video-clip input[type=file]").set_input_files(str(clip))
                plan = page.locator("#video-plan textarea")
                sync_api.expect(plan).to_have_value(re.compile(r"^96x64 at 10 fps"), timeout=60_000)
                page.get_by_role("button", name="Run on the clip", exact=True).click()
                info = page.locator("#video-info textarea")
                sync_api.expect(info).to_have_value(re.compile(r"^Pose \("), timeout=240_000)
                states = {
                    key: page.evaluate(
                        _PLAY.replace(
                            'document.getElementById("v")', f'document.querySelector("#video-{key} video")'
                        )
                    )
                    for key in ("result", "source")
                }
            finally:
                browser.close()
    finally:
        demo.close()
    for key, state in states.items():
        assert state["error"] is None and state["ready"] >= 2, (key, state)
        assert state["src"].endswith(".webm"), (key, state)
        assert state["duration"] == pytest.approx(6 / 10.0, abs=0.05), (key, state)
        assert state["now"] > state["start"], (key, state)  # playback advanced in the app's player
