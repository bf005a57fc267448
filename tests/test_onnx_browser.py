"""Issue 42, part 3: the Features tab's "Compute in my browser" in a real browser: Debian's
chromium, headless, driven by Playwright, with onnxruntime-web's WebAssembly backend.

One server for the module, on the tiny features checkpoint. onnxruntime-web comes from npm
(``npm pack``, into a temporary folder; never committed) and the server serves it itself
($SAPIENS2_ORT_WEB names that folder). The server exports the tiny model when the page first asks
for it. The browser's embeddings and similarity are compared with the server's pipeline on the
same photos, and its pre-processing with the package's, byte for byte.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import shutil
import socket
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chromium import CHROMIUM, playwright_or_skip  # noqa: E402

sync_api = playwright_or_skip()
expect = sync_api.expect
pytest.importorskip("onnx", reason="onnx is not installed (the export needs it)")

import app  # noqa: E402
from sapiens2 import serving  # noqa: E402
from sapiens2.inputs.intake import load_image  # noqa: E402
from sapiens2.models import onnx_cache  # noqa: E402
from sapiens2.models.checkpoints import Checkpoints  # noqa: E402
from sapiens2.tasks import registry  # noqa: E402
from sapiens2.tasks.features import FeaturesPipeline, cosine_similarity  # noqa: E402
from sapiens2.ui import browser_compare  # noqa: E402

pytestmark = pytest.mark.browser

ORT_WEB = f"onnxruntime-web@{browser_compare.ORT_WEB_VERSION}"
#: what the WebAssembly backend loads (the bundle holds the glue code; the .wasm is fetched)
ORT_FILES = ("ort.wasm.bundle.min.mjs", "ort-wasm-simd-threaded.wasm", "ort-wasm-simd-threaded.mjs")
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


@pytest.fixture(scope="session")
def ort_dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """onnxruntime-web's WebAssembly files, from npm's tarball (npm's own cache makes a rerun quick)."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed: onnxruntime-web cannot be fetched for the browser test")
    folder = tmp_path_factory.mktemp("ort_web")
    done = subprocess.run(
        [npm, "pack", "--silent", ORT_WEB], cwd=folder, capture_output=True, text=True, timeout=300
    )
    tgz = folder / done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout else None
    if tgz is None or not tgz.is_file():
        pytest.skip(f"npm pack {ORT_WEB} failed (offline?): {done.stderr.strip()[-300:]}")
    dist = folder / "dist"
    dist.mkdir()
    with tarfile.open(tgz) as tar:
        for name in ORT_FILES:
            member = tar.getmember(f"package/dist/{name}")
            (dist / name).write_bytes(tar.extractfile(member).read())
    tgz.unlink()
    return dist


@pytest.fixture(scope="module")
def served(tiny_checkpoints, ort_dist, tmp_path_factory) -> Iterator[dict[str, Any]]:
    mp = pytest.MonkeyPatch()
    tmp = tmp_path_factory.mktemp("onnx_browser")
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("SAPIENS2_CHECKPOINTS", str(tmp / "no_weights"))
    mp.setenv("GRADIO_EXAMPLES_CACHE", str(tmp / "examples"))
    mp.setenv(browser_compare.ORT_WEB_ENV, str(ort_dist))
    mp.setenv(onnx_cache.CACHE_ENV, str(tmp / "onnx_cache"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = serving.ModelManager(device="cpu", checkpoints={"features": tiny_checkpoints["features"]})
    demo = app.build_demo(manager, folders=serving.RequestFolders(tmp / "requests"))
    _, url, _ = app.launch(demo, host="127.0.0.1", port=port, prevent_thread_lock=True, quiet=True)
    yield {"url": url, "port": port, "cache": tmp / "onnx_cache"}
    demo.close()
    mp.undo()


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> dict[str, Path]:
    """Two PNGs (lossless: the browser's and Pillow's decoders agree): a small portrait, shown
    larger to the network, and a 4400 px wide strip, which the package first shrinks to its
    4096 px working copy (INTER_AREA) and then stretches (INTER_LINEAR)."""
    folder = tmp_path_factory.mktemp("browser_photos")
    with Image.open(ROOT / "assets" / "nasa-eileen-collins-portrait.png") as im:
        im.convert("RGB").resize((300, 400)).save(folder / "portrait.png")
    with Image.open(ROOT / "assets" / "pexels-cc0-soccer-three-players-motion.jpg") as im:
        im.convert("RGB").resize((4400, 500)).save(folder / "strip.png")
    return {p.stem: p for p in folder.iterdir()}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=BROWSER_ARGS)
        try:
            yield launched
        finally:
            launched.close()


def features_page(context: Any, url: str) -> Any:
    page = context.new_page()
    page.goto(url, wait_until="domcontentloaded", timeout=60_000)
    page.get_by_role("tab", name="Features", exact=True).click()
    page.get_by_text("Compute in my browser (no upload, no GPU quota)").click()
    expect(page.locator('[data-role="run"]')).to_be_visible(timeout=30_000)
    return page


def block(page: Any, role: str) -> Any:
    return page.locator(f'.sapiens2-browser [data-role="{role}"]')


def compute(page: Any, files: list[Path], dtype: str = "fp32") -> str:
    """Choose the photos, press the button; the status once it ended (done or error)."""
    for role, path in zip(("photo-a", "photo-b"), files, strict=False):
        block(page, role).set_input_files(str(path))
    block(page, "dtype").select_option(dtype)
    block(page, "run").click()
    status = block(page, "status")
    expect(status).to_have_attribute("data-kind", re.compile("done|error"), timeout=120_000)
    return status.inner_text()


PIXELS_JS = """async ([hw]) => {
  const host = document.querySelector('.sapiens2-browser').parentElement;
  const out = [];
  for (const role of ['photo-a', 'photo-b']) {
    const file = host.querySelector(`[data-role="${role}"]`).files[0];
    const px = host.sapiens2.networkPixels(await host.sapiens2.decode(file), {height: hw[0], width: hw[1]});
    let s = '';
    for (let i = 0; i < px.length; i += 0x8000) s += String.fromCharCode.apply(null, px.subarray(i, i + 0x8000));
    out.push(btoa(s));
  }
  return out;
}"""


def test_the_browser_computes_the_servers_embeddings_and_similarity_without_uploading(
    served: dict[str, Any], browser: Any, photos: dict[str, Path], tiny_checkpoints: dict[str, Path]
) -> None:
    """fp32 on WebAssembly: each photo's network input equals the package's byte for byte, its
    CLS embedding the server pipeline's (cosine >= 0.999), the similarity the server's; nothing
    is posted to the server; a second page takes the file from the browser's cache."""
    pipe = FeaturesPipeline(checkpoint=tiny_checkpoints["features"], device="cpu")
    files = [photos["portrait"], photos["strip"]]
    server = [pipe(str(p)) for p in files]
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = features_page(context, served["url"])
        posts: list[str] = []
        page.on("request", lambda r: posts.append(r.url) if r.method != "GET" else None)
        status = compute(page, files)
        assert "Done in this browser (wasm" in status and "Nothing was uploaded" in status, status
        assert posts == [], posts  # no upload, no queue call: the photos stayed in the page
        result = json.loads(page.locator(".sapiens2-browser").locator("..").get_attribute("data-result"))
        assert result["backend"] == "wasm" and result["dtype"] == "fp32"
        # a random tiny model's embeddings of any two photos are close (similarity ~0.9997):
        # each must be far closer to its own photo's server embedding than to the other's
        apart = np.abs(server[0].embedding - server[1].embedding).max()
        for mine, theirs in zip(result["embeddings"], server, strict=True):
            assert cosine_similarity(np.array(mine), theirs) >= 0.999
            off = np.abs(np.array(mine) - theirs.embedding).max()
            assert off < apart / 100, (off, apart)
            np.testing.assert_allclose(mine, theirs.embedding, rtol=1e-3, atol=1e-4)
        assert abs(result["similarity"] - cosine_similarity(*server)) < 1e-4
        assert block(page, "score").inner_text().startswith("Similarity (computed in this browser): ")

        hw = pipe.network_hw
        for encoded, path in zip(page.evaluate(PIXELS_JS, [list(hw)]), files, strict=True):
            mine = np.frombuffer(base64.b64decode(encoded), np.uint8).reshape(*hw, 3)
            theirs = pipe.prepare(load_image(str(path))).pixels
            assert np.array_equal(mine, theirs), (path.name, int(np.abs(mine.astype(int) - theirs).max()))

        exported = sorted(served["cache"].glob("features-*-fp32-*/model.onnx"))
        assert len(exported) == 1  # made once, on the first request
        fetched: list[str] = []
        again = features_page(context, served["url"])  # a later visit in the same browser
        again.on("request", lambda r: fetched.append(r.url) if r.url.endswith(".onnx") else None)
        assert "model kept in this browser" in compute(again, files[:1])
        assert fetched == []
    finally:
        context.close()


def test_without_onnxruntime_web_or_weights_the_page_says_so_at_once(
    served: dict[str, Any], browser: Any
) -> None:
    """onnxruntime-web that cannot load (blocked) is a message, not a hang; so is a server with no
    weights for the model (its manifest answers 503 with the reason)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = features_page(context, served["url"])
        page.route("**/sapiens2-browser/ort/**", lambda route: route.abort())
        with Image.new("RGB", (64, 64), "red") as im:
            path = served["cache"].parent / "red.png"
            im.save(path)
        status = compute(page, [path])
        assert "onnxruntime-web could not be loaded" in status, status
        assert block(page, "status").get_attribute("data-kind") == "error"
        assert not block(page, "run").is_disabled()
    finally:
        context.close()

    no_weights = browser_compare.publish(registry.get("features"), Checkpoints({}), None)
    status, body = get(served["port"], f"{browser_compare.PREFIX}{no_weights.token}/int8.json")
    assert status == 503, body
    assert "cannot make the features model file" in body["error"] and "weights" in body["error"], body
    assert "SAPIENS2" not in body["error"]  # the visitor's sentence, not the operator's details


def get(port: int, path: str, method: str = "GET") -> tuple[int, Any]:
    """A raw request (http.client sends the path as written: no ``..`` folding)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(method, path)
        reply = conn.getresponse()
        data = reply.read()
        kind = reply.getheader("Content-Type") or ""
        return reply.status, json.loads(data) if "json" in kind else (kind, len(data))
    finally:
        conn.close()


def test_the_routes_open_only_their_own_files(served: dict[str, Any], ort_dist: Path) -> None:
    """The ort/ route serves the named dist files with script and wasm types; nothing else, by
    any spelling, reaches a file: the model route finds exported files by exact name only."""
    port, prefix = served["port"], browser_compare.PREFIX
    assert get(port, f"{prefix}ort/ort.wasm.bundle.min.mjs") == (
        200,
        ("text/javascript; charset=utf-8", (ort_dist / "ort.wasm.bundle.min.mjs").stat().st_size),
    )
    assert get(port, f"{prefix}ort/ort-wasm-simd-threaded.wasm")[1][0] == "application/wasm"
    (ort_dist.parent / "secret.mjs").write_text("export const x = 1;")
    token = browser_compare.publish(registry.get("features"), Checkpoints({}), None).token
    for path in (
        f"{prefix}ort/../secret.mjs",
        f"{prefix}ort/..%2Fsecret.mjs",
        f"{prefix}ort/%2e%2e/secret.mjs",
        f"{prefix}ort//etc/passwd",
        f"{prefix}ort/notes.txt",
        f"{prefix}{token}/../../etc/passwd",
        f"{prefix}{token}/..%2F..%2Fetc%2Fpasswd",
        f"{prefix}{token}/features-0.1b-int8-0000000000000000.onnx",
        f"{prefix}nobody/int8.json",
        f"{prefix}{token}/int4.json",
    ):
        status, body = get(port, path)
        assert status == 404, (path, body)
    assert get(port, f"{prefix}ort/ort.wasm.bundle.min.mjs", "POST")[0] == 405
