"""Issue 11 through the public REST API, the way any visitor of a public Space can call it.

The real app (``app.build_demo`` on the tiny checkpoints) is served on 127.0.0.1 and called with
raw HTTP: ``POST /gradio_api/call/<api>`` then the SSE stream of ``GET .../<event_id>``, and
``POST /gradio_api/upload`` for genuine uploads (gradio_client would upload every file for us,
which is exactly what a hostile caller does not do). Plus the batch CLI on a FIFO and a device.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # app.py lives at the top level

pytest.importorskip("gradio")
import app  # noqa: E402
from sapiens2 import serving  # noqa: E402
from sapiens2.inputs.limits import MAX_FILE_BYTES  # noqa: E402
from sapiens2.ui.inputs import EXPIRED, NOT_UPLOADED, NOT_UPLOADED_CLIP  # noqa: E402

EXAMPLE = ROOT / "assets" / "pexels-cc0-jockey-horse-racing.jpg"  # small: 640x426
META = {"_type": "gradio.FileData"}
SECRET = "root:"  # the start of /etc/passwd: must never come back in an answer
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")


class Server:
    """The served app, its Blocks and the folder its requests write into."""

    def __init__(self, url: str, demo: Any, requests_root: Path) -> None:
        self.url, self.demo, self.requests_root = url, demo, requests_root

    def submit(self, api: str, data: list) -> str:
        req = urllib.request.Request(
            f"{self.url}gradio_api/call/{api}",
            data=json.dumps({"data": data}).encode(),
            headers={"Content-Type": "application/json"},
        )
        return json.loads(urllib.request.urlopen(req, timeout=30).read())["event_id"]

    def result(self, api: str, event_id: str, timeout: float = 120) -> tuple[str, Any, str]:
        """(event, data, raw SSE text) of a submitted call."""
        url = f"{self.url}gradio_api/call/{api}/{event_id}"
        text = urllib.request.urlopen(url, timeout=timeout).read().decode()
        events = re.findall(r"^event: (\w+)\ndata: (.*)$", text, re.M)
        event, data = events[-1]
        return event, json.loads(data), text

    def call(self, api: str, data: list, timeout: float = 120) -> tuple[str, Any, str]:
        return self.result(api, self.submit(api, data), timeout)

    def upload(self, path: Path, filename: str | None = None) -> str:
        """POST the file to Gradio's upload route; the server path it was stored at."""
        boundary = uuid.uuid4().hex
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="files"; '
            f'filename="{filename or path.name}"\r\nContent-Type: application/octet-stream\r\n\r\n'
        )
        body = head.encode() + path.read_bytes() + f"\r\n--{boundary}--\r\n".encode()
        req = urllib.request.Request(
            f"{self.url}gradio_api/upload",
            data=body,
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        )
        return json.loads(urllib.request.urlopen(req, timeout=60).read())[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served_app(checkpoints: dict[str, Path], tmp: Path) -> Iterator[Server]:
    """The real app on the tiny checkpoints, served on 127.0.0.1 until the block ends."""
    mp = pytest.MonkeyPatch()
    mp.setenv("GRADIO_EXAMPLES_CACHE", str(tmp / "examples"))
    mp.setenv("HF_HUB_OFFLINE", "1")
    manager = serving.ModelManager(device="cpu", checkpoints=checkpoints)
    demo = app.build_demo(manager, folders=serving.RequestFolders(tmp / "requests"))
    _, url, _ = app.launch(demo, host="127.0.0.1", port=free_port(), prevent_thread_lock=True, quiet=True)
    try:
        yield Server(url, demo, tmp / "requests")
    finally:
        demo.close()
        mp.undo()


@pytest.fixture(scope="module")
def server(space_checkpoints, tmp_path_factory) -> Iterator[Server]:
    with served_app(space_checkpoints, tmp_path_factory.mktemp("api_security")) as srv:
        yield srv


@pytest.fixture(scope="module")
def uploaded(server: Server) -> str:
    return server.upload(EXAMPLE)


def seg_args(photo: Any) -> list:
    return [photo, "0.4b", 0.5, []]


PHOTO_REFUSAL = (NOT_UPLOADED, "Image problem")
CLIP_REFUSAL = (NOT_UPLOADED_CLIP, "Video problem")  # the Video tab's clip input: same rule, its words


def assert_refused(event: str, data: Any, text: str, refusal: tuple[str, str] = PHOTO_REFUSAL) -> None:
    """The one refusal: our words, no file, nothing of the file's content."""
    assert event == "error", text[:300]
    assert (data["error"], data["title"]) == refusal
    assert SECRET not in text and "gradio_api/file=" not in text


def assert_good_seg(server: Server, photo: Any) -> None:
    event, data, text = server.call("seg", seg_args(photo))
    assert event == "complete", text[:300]
    assert data[-1].startswith("Body parts (")


# ----------------------------------------------------------------------------- paths a caller names


def hostile_paths(tmp: Path, uploaded_output: str) -> dict[str, str]:
    """Every kind of path a caller might send instead of an upload."""
    outside = tmp / "server_photo.jpg"
    shutil.copy(EXAMPLE, outside)  # a readable image the server has, never uploaded
    folder = tmp / "a_folder"
    folder.mkdir(exist_ok=True)
    big = tmp / "big.jpg"  # sparse: over the byte budget without writing 40 MB
    with open(big, "wb") as fh:
        fh.write(b"\xff\xd8\xff")
        fh.truncate(MAX_FILE_BYTES + 1)
    return {
        "server image": str(outside),
        "example photo in place": str(EXAMPLE),  # served by allowed_paths, still not an upload
        "system text file": "/etc/passwd",
        "missing": str(tmp / "missing.png"),
        "folder": str(folder),
        "server file over the byte budget": str(big),
        "traversal out of the upload folder": str(
            Path(uploaded_output).parent / ".." / ".." / "etc" / "passwd"
        ),
        "another request's output in Gradio's cache": uploaded_output,
        "relative": "assets/" + EXAMPLE.name,
        "url": "http://127.0.0.1:1/x.png",
        "NUL byte": "/tmp/x\x00.png",
    }


@pytest.mark.slow
def test_every_path_not_uploaded_gets_the_same_answer(server: Server, uploaded: str, tmp_path: Path) -> None:
    event, data, _ = server.call("seg", seg_args({"path": uploaded, "meta": META}))
    assert event == "complete"
    before_image = data[0][0]["path"]  # the "before" picture Gradio cached for that answer
    answers = set()
    for kind, path in hostile_paths(tmp_path, before_image).items():
        for payload in ({"path": path, "meta": META}, {"path": path}, path, [path]):  # any shape
            event, data, text = server.call("seg", seg_args(payload))
            assert_refused(event, data, f"{kind}: {text}")
            answers.add(text.split("data: ", 1)[1])
    assert len(answers) == 1, answers  # byte for byte one answer: no oracle on the server's files
    assert_good_seg(server, {"path": uploaded, "meta": META})  # still up


@pytest.mark.slow
@needs_fifo
def test_a_fifo_never_stalls_the_queue(server: Server, uploaded: str, tmp_path: Path) -> None:
    fifo = tmp_path / "photo.png"
    os.mkfifo(fifo)
    # A FIFO's blocking open never returns, so each result's timeout is the bound (wide, for a
    # busy machine: a tiny seg takes about 1 s on an idle one).
    first = server.submit("seg", seg_args({"path": str(fifo), "meta": META}))
    second = server.submit("seg", seg_args({"path": uploaded, "meta": META}))  # waits behind it (limit 1)
    assert_refused(*server.result("seg", first, timeout=60))
    event, data, _ = server.result("seg", second, timeout=60)
    assert event == "complete"
    # Even a FIFO in the upload folder and the upload record (a hole in the path check) cannot
    # block: the intake opens without blocking and refuses anything but a regular file.
    from gradio.utils import get_upload_folder

    planted = Path(get_upload_folder()) / uuid.uuid4().hex
    planted.mkdir(parents=True)
    fifo = planted / "photo.png"
    os.mkfifo(fifo)
    server.demo.upload_file_set.add(str(fifo))
    try:
        first = server.submit("seg", seg_args({"path": str(fifo), "meta": META}))
        second = server.submit("seg", seg_args({"path": uploaded, "meta": META}))
        event, data, _ = server.result("seg", first, timeout=60)
        assert event == "error" and "is a FIFO (named pipe), not an image file" in data["error"]
        assert server.result("seg", second, timeout=60)[0] == "complete"
    finally:
        server.demo.upload_file_set.discard(str(fifo))
        shutil.rmtree(planted)


def test_an_upload_that_expired_while_waiting_is_told_to_upload_again(server: Server, tmp_path: Path) -> None:
    """Gradio deletes uploads after a while (the app's delete_cache): one that expired in a long
    queue is told so, and to upload again. Told from the path's text alone: a path in the upload
    folder gets the one answer whether a file is there or not, so it reveals nothing."""
    from gradio.utils import get_upload_folder

    photo = tmp_path / "expiring.png"
    Image.open(EXAMPLE).resize((48, 64)).save(photo)  # its own content: its own upload folder
    path = server.upload(photo)
    assert server.call("seg", seg_args({"path": path, "meta": META}))[0] == "complete"
    server.demo.upload_file_set.discard(path)  # what delete_cache does, with the file
    answers = set()
    for gone in (path, str(Path(get_upload_folder()) / uuid.uuid4().hex / "photo.png")):
        event, data, text = server.call("seg", seg_args({"path": gone, "meta": META}))
        assert_refused(event, data, text, (EXPIRED.format(what="photo"), "Image problem"))
        answers.add(text.split("data: ", 1)[1])
    assert len(answers) == 1 and "expired" in data["error"] and "Upload the photo again" in data["error"]


def test_every_file_input_follows_the_rule(server: Server, uploaded: str) -> None:
    photo = {"path": uploaded, "meta": META}
    for api, args in {
        "matting": [photo, "1b", "#00b140", {"path": "/etc/passwd", "meta": META}],
        "similarity": [photo, {"path": "/etc/passwd"}, "0.1b"],
        "all": [{"path": "/etc/passwd"}],
    }.items():
        assert_refused(*server.call(api, args))
    event, data, _ = server.call("matting", [photo, "1b", "#00b140", photo])  # uploaded background
    assert event == "complete" and data[-1].startswith("Matting (")
    event, data, _ = server.call("similarity", [photo, photo, "0.1b"])
    assert event == "complete" and data[0] == pytest.approx(1.0, abs=1e-4)


#: Gradio component types that take a file from a caller.
FILE_TYPES = {
    "image", "imageeditor", "imageslider", "simpleimage", "video", "audio", "file", "uploadbutton",
    "model3d", "gallery", "multimodaltextbox",
}  # fmt: skip


def public_file_inputs(server: Server) -> list[tuple[str, int, int]]:
    """(api name, input position, number of inputs) of every file input of every public event,
    read from the served page's config (inputs added later are found too)."""
    config = json.loads(urllib.request.urlopen(f"{server.url}config", timeout=30).read())
    types = {c["id"]: c["type"] for c in config["components"]}
    return [
        (dep["api_name"], i, len(dep["inputs"]))
        for dep in config["dependencies"]
        if dep.get("api_name") and dep.get("api_visibility", "public") == "public"
        for i, block in enumerate(dep["inputs"])
        if types[block] in FILE_TYPES
    ]


@pytest.mark.slow
def test_every_file_input_of_every_endpoint_refuses_a_path_not_uploaded(server: Server) -> None:
    """Found from the config, so a file input added later (a clip, a second image) is checked
    too: a server path, tagged or not, gets the one refusal and nothing of the file."""
    found = public_file_inputs(server)
    apis = {api for api, _, _ in found}
    assert {"pose", "matting", "similarity", "all", "video", "video_plan", "motion"} <= apis
    assert sum(api == "matting" for api, _, _ in found) == 2  # the photo and the background
    for api, position, count in found:
        refusal = CLIP_REFUSAL if api in ("video", "video_plan", "motion") else PHOTO_REFUSAL
        for payload in ({"path": "/etc/passwd", "meta": META}, {"path": "/etc/passwd"}):
            data: list[Any] = [None] * count
            data[position] = payload
            assert_refused(*server.call(api, data), refusal)


@pytest.mark.slow
def test_uploads_and_data_urls_work_and_outputs_stay_in_their_folder(server: Server, tmp_path: Path) -> None:
    import base64

    photo = tmp_path / "p.png"
    Image.open(EXAMPLE).resize((96, 64)).save(photo)
    before = set(server.requests_root.rglob("*"))
    path = server.upload(photo, filename="../../etc/evil name.png")  # the name is only a name
    event, data, _ = server.call("seg", seg_args({"path": path, "meta": META, "orig_name": "../../x.png"}))
    assert event == "complete"
    url = "data:image/png;base64," + base64.b64encode(photo.read_bytes()).decode()
    event, data, _ = server.call("seg", seg_args({"url": url, "meta": META}))
    assert event == "complete"
    new = [p for p in set(server.requests_root.rglob("*")) - before if p.is_file()]
    previews = [p for p in new if p.parent.name == "preview"]  # the page's small pictures
    assert sorted(p.name for p in previews) == [  # named after the photo (the page's download button)
        "evil_name_preview.jpg", "evil_name_seg_preview.jpg", "image_preview.jpg", "image_seg_preview.jpg",
    ]  # fmt: skip
    written = [p for p in new if p not in previews]
    folders = {p.parent for p in written}
    assert {p.parent.parent for p in previews} == folders
    assert len(written) == 8 and len(folders) == 2  # one fresh folder per request, nothing else
    for folder in folders:
        assert folder.parent == server.requests_root and folder.name.startswith("req-")
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+\.(png|npy)", p.name) for p in written), written


def test_the_mesh_endpoint_takes_only_a_result_of_this_server(server: Server, uploaded: str) -> None:
    """/pointmap_mesh names an earlier result by a string: only a ``req-<hex>`` folder of this
    server's root can come of it, whatever else the caller puts around it or instead of it."""
    event, data, text = server.call("pointmap", [{"path": uploaded, "meta": META}, "0.4b", False])
    assert event == "complete", text[:300]
    url = data[2][0]["url"]
    folder = server.requests_root / re.search(r"req-[0-9a-f]{32}", url).group(0)
    hostile: list[Any] = [
        "/etc/passwd", "../../../etc/passwd", f"{url}/../../../../etc/passwd/req-{'0' * 32}",
        {"path": "/etc/passwd", "meta": META}, ["/etc/passwd"], 12, None, "", "req-" + "f" * 32,
        "x" * 100_000, f"{folder}/../req-{'1' * 32}", str(folder).replace("req-", "req-../"),
    ]  # fmt: skip
    for ref in hostile:
        event, data, text = server.call("pointmap_mesh", [ref])
        assert event == "error", (ref, text[:300])
        assert SECRET not in text and "gradio_api/file=" not in text
        if isinstance(ref, dict):  # a file where a string goes: Gradio refuses it before we see it
            continue
        assert data["title"] == "Result not found", (ref, data)
    assert sorted(
        p.name.split("_", 1)[-1] for p in folder.iterdir() if p.name.endswith((".glb", ".ply"))
    ) == ["mesh_preview.glb", "pointcloud.glb"]  # nothing was made by the refused calls
    event, data, text = server.call("pointmap_mesh", [url])
    assert event == "complete", text[:300]
    made = sorted(Path(f["path"]).name.split("_", 1)[-1] for f in data[0])
    assert made == ["mesh.glb", "mesh.ply", "pointcloud.ply"]
    assert all(Path(f["path"]).parent == folder for f in data[0])


def test_files_over_the_byte_budget_are_refused(server: Server, tmp_path: Path) -> None:
    import base64

    big = tmp_path / "big.jpg"
    big.write_bytes(b"\xff\xd8\xff" + b"\0" * MAX_FILE_BYTES)  # one budget + 3 bytes
    with pytest.raises(urllib.error.HTTPError) as err:
        server.upload(big)  # Gradio's upload route: max_file_size comes from the same constant
    assert err.value.code == 413
    url = "data:image/jpeg;base64," + base64.b64encode(big.read_bytes()).decode()  # data URLs skip it
    event, data, text = server.call("seg", seg_args({"url": url, "meta": META}))
    assert event == "error" and "above the limit of 40.0 MB for one image" in data["error"]
    assert "gradio_api/file=" not in text


# ----------------------------------------------------------------------------- the example photos


def example_dataset(server: Server) -> tuple[dict, int]:
    """The seg tab's example gallery (as the page gets it) and the queued event that runs one."""
    config = json.loads(urllib.request.urlopen(f"{server.url}config", timeout=30).read())
    datasets = [c for c in config["components"] if c.get("type") == "dataset"]
    dataset = next((d for d in datasets if d["props"].get("elem_id") == "seg-examples"), datasets[0])
    runs = [
        i
        for i, dep in enumerate(config["dependencies"])
        if dep["inputs"] == [dataset["id"]]
        and dep.get("queue") is not False
        and dep.get("trigger_after") is not None
    ]
    return dataset, runs[0]


@pytest.mark.slow
def test_example_photos_still_run_from_the_page(server: Server) -> None:
    dataset, fn_index = example_dataset(server)
    sample = dataset["props"]["samples"][0]
    # what the page sends when a visitor clicks an example, then presses "Run": Gradio's copy
    assert_good_seg(server, sample[0])
    # the lazily cached example run (the event the gallery click queues)
    session = uuid.uuid4().hex
    req = urllib.request.Request(
        f"{server.url}gradio_api/queue/join",
        data=json.dumps(
            {
                "data": [0],  # the index of the clicked example
                "fn_index": fn_index,
                "session_hash": session,
                "trigger_id": dataset["id"],
            }
        ).encode(),
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=30).read()
    stream = urllib.request.urlopen(f"{server.url}gradio_api/queue/data?session_hash={session}", timeout=120)
    for line in stream:
        message = json.loads(line.decode()[len("data: ") :]) if line.startswith(b"data: ") else {}
        if message.get("msg") == "process_completed":
            break
    assert message.get("success"), message
    assert message["output"]["data"][-1].startswith("Body parts (")


def test_the_served_examples_folder_serves_nothing_beside_it(server: Server) -> None:
    ok = urllib.request.urlopen(f"{server.url}gradio_api/file={EXAMPLE}", timeout=30)
    assert ok.status == 200 and ok.read()[:3] == b"\xff\xd8\xff"
    for path in ("/etc/passwd", str(ROOT / "app.py"), f"{EXAMPLE.parent}/../app.py"):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{server.url}gradio_api/file={path}", timeout=30)
        assert err.value.code in (403, 404)


# ----------------------------------------------------------------------------- the batch CLI


@needs_fifo
def test_the_cli_names_a_fifo_and_a_device_and_goes_on(tiny_checkpoints, tmp_path: Path, capsys) -> None:
    import threading

    from sapiens2.cli import main

    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    good = tmp_path / "good.png"
    Image.fromarray(np.full((30, 40, 3), 120, np.uint8)).save(good)
    inputs = [str(fifo), "/dev/zero", str(good)] if Path("/dev/zero").exists() else [str(fifo), str(good)]
    argv = ["seg", *inputs, "--checkpoint", str(tiny_checkpoints["seg"]), "--device", "cpu"]
    codes: list[int] = []
    worker = threading.Thread(target=lambda: codes.append(main([*argv, "--out", str(tmp_path / "out")])))
    worker.daemon = True  # a regression that blocks fails here instead of hanging the suite
    worker.start()
    worker.join(120)
    assert not worker.is_alive(), "the CLI blocked on a FIFO or a device"
    err = capsys.readouterr().err
    assert codes == [0]
    assert f"skipped {fifo}: InputImageError: 'pipe.jpg' is a FIFO (named pipe), not an image file" in err
    if "/dev/zero" in inputs:
        assert "'zero' is a character device, not an image file" in err
    assert (tmp_path / "out" / "good" / "good_seg_labels.npy").is_file()
