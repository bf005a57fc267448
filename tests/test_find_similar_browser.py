"""The Features tab's "Find similar" in a real browser (Debian's chromium, headless): what fits
is said up front; a set of files and a zip gives a gallery of the most similar with scores, the
query's twin first; "Group" gives one row per group; a non-photo in the set gives its message."""

from __future__ import annotations

import io
import re
import socket
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chromium import CHROMIUM, playwright_or_skip  # noqa: E402

sync_api = playwright_or_skip()
expect = sync_api.expect

import app  # noqa: E402
from sapiens2 import serving  # noqa: E402

pytestmark = pytest.mark.browser

BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


@pytest.fixture(scope="module")
def app_url(tiny_checkpoints, tmp_path_factory) -> Iterator[str]:
    mp = pytest.MonkeyPatch()
    tmp = tmp_path_factory.mktemp("similar_browser")
    mp.setenv("GRADIO_EXAMPLES_CACHE", str(tmp / "examples"))
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("SAPIENS2_CHECKPOINTS", str(tmp / "no_weights"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    checkpoints = {t: tiny_checkpoints[t] for t in ("features", "pose")}
    manager = serving.ModelManager(device="cpu", checkpoints=checkpoints)
    demo = app.build_demo(manager, folders=serving.RequestFolders(tmp / "requests"))
    _, url, _ = app.launch(demo, host="127.0.0.1", port=port, prevent_thread_lock=True, quiet=True)
    yield url
    demo.close()
    mp.undo()


def picture(path: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    Image.fromarray((rng.random((40, 48, 3)) * 255).astype(np.uint8)).save(path)
    return path


def test_find_similar_and_group_in_the_features_tab(app_url, tmp_path):
    photos = [picture(tmp_path / f"p{i}.png", i) for i in range(3)]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("more/z.png", photos[0].read_bytes())
    (tmp_path / "more.zip").write_bytes(buf.getvalue())
    (tmp_path / "notes.txt").write_text("not a photo")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=BROWSER_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(app_url, wait_until="domcontentloaded", timeout=60_000)
            page.get_by_text("Sapiens2: human vision in one place").wait_for(timeout=60_000)
            page.locator("input[type=file]").first.set_input_files(str(photos[1]))  # the query
            page.get_by_role("tab", name="Features", exact=True).click()
            page.get_by_text("Find similar", exact=True).first.click()  # open the fold
            # the tiny (custom) checkpoint is priced as the largest backbone, plus the person
            # detector per photo (appearance is per person): 24 fit one call
            expect(page.locator("#find-similar-fit")).to_contain_text("Add up to 24 photos", timeout=10_000)
            files = page.locator("#find-similar-set input[type=file]")
            files.set_input_files([str(p) for p in photos] + [str(tmp_path / "more.zip")])
            info = page.locator("#find-similar-info textarea")
            page.locator("#find-similar-button").click()
            expect(info).to_have_value(re.compile(r"4 most similar of 4 people in 4 photos"), timeout=120_000)
            gallery = page.locator("#find-similar-gallery")
            expect(gallery.locator("img")).to_have_count(4, timeout=30_000)
            expect(gallery).to_contain_text("1. 1.000 · p1.png · whole photo")
            page.locator("#group-set-button").click()
            expect(info).to_have_value(re.compile(r"4 people by appearance in \d groups"), timeout=60_000)
            expect(gallery).to_contain_text("Group 1 (")
            files.set_input_files([str(photos[0]), str(tmp_path / "notes.txt")])
            page.locator("#find-similar-button").click()
            expect(info).to_have_value(re.compile(r"notes.txt is not a photo"), timeout=60_000)
        finally:
            browser.close()
