"""The app in a real browser: Debian's chromium driven by Playwright, headless, one session.

Opens the page, visits every tab (screenshot each into a temporary folder), runs one example
and waits for its result image, and fails on any uncaught page error.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chromium import CHROMIUM, playwright_or_skip  # noqa: E402

sync_api = playwright_or_skip()

import app  # noqa: E402
from sapiens2 import serving  # noqa: E402

pytestmark = pytest.mark.browser

BROWSER_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# (tab label, the tab's run button, elem_id prefix of its widgets)
TABS = [
    ("Pose", "Run pose", "pose"),
    ("Body parts", "Run body parts", "seg"),
    ("Normals", "Run normals", "normal"),
    ("Pointmap / 3D", "Run pointmap", "pointmap"),
    ("Matting", "Run matting", "matting"),
    ("Features", "Run features", "features"),
]


@pytest.fixture(scope="module")
def app_url(space_checkpoints, tmp_path_factory) -> Iterator[str]:
    mp = pytest.MonkeyPatch()
    tmp = tmp_path_factory.mktemp("browser_app")
    mp.setenv("GRADIO_EXAMPLES_CACHE", str(tmp / "examples"))
    mp.setenv("HF_HUB_OFFLINE", "1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = serving.ModelManager(device="cpu", checkpoints=space_checkpoints)
    demo = app.build_demo(manager, folders=serving.RequestFolders(tmp / "requests"))
    _, url, _ = app.launch(demo, host="127.0.0.1", port=port, prevent_thread_lock=True, quiet=True)
    yield url
    demo.close()
    mp.undo()


def test_every_tab_renders_and_an_example_runs(app_url: str, tmp_path_factory) -> None:
    shots = Path(os.environ.get("SAPIENS2_BROWSER_ARTIFACTS") or tmp_path_factory.mktemp("screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    page_errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=BROWSER_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.on("pageerror", lambda err: page_errors.append(str(err)))
            page.goto(app_url, wait_until="domcontentloaded", timeout=60_000)
            page.get_by_text("Sapiens2: human vision in one place").wait_for(timeout=60_000)

            # one example, on the first tab: the result image must appear with its run info
            page.locator("#pose-examples .gallery-item").first.click()
            page.locator("#pose-result img").first.wait_for(state="visible", timeout=120_000)
            info = page.locator("#pose-info textarea")
            sync_api.expect(info).to_have_value(lambda_prefix("Pose ("), timeout=30_000)

            for label, button, key in TABS:
                page.get_by_role("tab", name=label, exact=True).click()
                page.get_by_role("button", name=button, exact=True).wait_for(state="visible", timeout=30_000)
                assert page.locator(f"#{key}-examples .gallery-item").first.is_visible()
                path = shots / f"tab-{key}.png"
                page.screenshot(path=str(path), full_page=True)
                assert path.stat().st_size > 10_000, f"blank screenshot of the {label} tab?"
        finally:
            browser.close()
    print(f"screenshots in {shots}")
    assert not page_errors, f"uncaught page errors: {page_errors}"


def test_the_pointmap_tab_makes_the_full_resolution_mesh_on_request(app_url: str, tmp_path_factory) -> None:
    """A visitor's path: an example runs pointmap, then the tab's button makes the full-resolution
    files (mesh GLB + PLY, point cloud PLY) of that result (the hidden id follows the downloads) and lists them with their run info."""
    shots = Path(os.environ.get("SAPIENS2_BROWSER_ARTIFACTS") or tmp_path_factory.mktemp("screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=BROWSER_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1400})
            page.goto(app_url, wait_until="domcontentloaded", timeout=60_000)
            page.get_by_role("tab", name="Pointmap / 3D", exact=True).click()
            button = page.locator("#pointmap_mesh-button")
            assert button.is_disabled()  # no result yet
            page.locator("#pointmap-examples .gallery-item").first.click()
            # an example shows stored copies of its files: the mesh needs a run of the visitor's own
            mesh_info = page.locator("#pointmap_mesh-info textarea")
            sync_api.expect(mesh_info).to_have_value(lambda_prefix("Press “Run pointmap”"), timeout=120_000)
            assert button.is_disabled()
            page.get_by_role("button", name="Run pointmap", exact=True).click()
            sync_api.expect(mesh_info).to_have_value("", timeout=120_000)
            sync_api.expect(button).to_be_enabled(timeout=30_000)
            button.click()
            sync_api.expect(page.locator("#pointmap_mesh-info textarea")).to_have_value(
                lambda_prefix("pointmap: Full-resolution mesh and point cloud"), timeout=120_000
            )
            listed = "".join(page.locator("#pointmap_mesh-files").inner_text().split())  # names wrap
            assert all(f"_{name}" in listed for name in ("mesh.glb", "mesh.ply", "pointcloud.ply")), listed
            page.screenshot(path=str(shots / "pointmap-mesh-on-request.png"), full_page=True)
        finally:
            browser.close()


def lambda_prefix(prefix: str):
    """A regex for expect(...).to_have_value: the value starts with ``prefix``."""
    import re

    return re.compile("^" + re.escape(prefix))
