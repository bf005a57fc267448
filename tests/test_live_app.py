"""The Live tab served (``sapiens2.ui.live_tab``), driven through Gradio's streaming protocol with
raw HTTP, the way the page drives it: join the queue with the first frame, post more frames to
``/gradio_api/stream/{event_id}``, read the rendered frames from the SSE stream, close the stream.
Frames posted while the handler works replace each other (one pending frame per session) and
come back counted as dropped; closing ends the work; hostile payloads get clear errors; on
ZeroGPU the tab is a notice and no stream exists."""

from __future__ import annotations

import base64
import io
import json
import queue
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import gradio as gr
import numpy as np
import pytest
from PIL import Image
from test_api_security import Server, served_app
from video_clips import frame_at

from sapiens2.ui import live_tab


@pytest.fixture(scope="module")
def server(tiny_checkpoints, tmp_path_factory) -> Iterator[Server]:
    with served_app(tiny_checkpoints, tmp_path_factory.mktemp("live_app")) as srv:
        yield srv


def data_url(i: int = 0) -> dict[str, Any]:
    data = io.BytesIO()
    Image.fromarray(frame_at(i, 160, 120)).save(data, format="JPEG")
    return {"url": "data:image/jpeg;base64," + base64.b64encode(data.getvalue()).decode()}


def live_index(server: Server) -> int:
    config = json.loads(urllib.request.urlopen(f"{server.url}config", timeout=30).read())
    return next(d["id"] for d in config["dependencies"] if d.get("api_name") == "live")


def post(url: str, body: dict[str, Any] | None = None) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body or {}).encode(), headers={"Content-Type": "application/json"}
    )
    return json.loads(urllib.request.urlopen(req, timeout=30).read() or b"null")


class Stream:
    """One page's stream: join with a frame, then post frames and read the SSE messages."""

    def __init__(self, server: Server, inputs: list[Any]) -> None:
        self.server, self.inputs = server, inputs
        self.session = uuid.uuid4().hex
        self.fn = live_index(server)
        self.messages: queue.Queue[dict[str, Any]] = queue.Queue()
        joined = post(
            f"{server.url}gradio_api/queue/join",
            {"data": inputs, "fn_index": self.fn, "session_hash": self.session, "trigger_id": None},
        )
        self.event = joined["event_id"]
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        url = f"{self.server.url}gradio_api/queue/data?session_hash={self.session}"
        for line in urllib.request.urlopen(url, timeout=120):
            if line.startswith(b"data: "):
                message = json.loads(line[len(b"data: ") :])
                self.messages.put(message)
                if message.get("msg") == "process_completed":
                    return

    def send(self, frame: dict[str, Any]) -> None:
        body = {"data": [frame, *self.inputs[1:]], "fn_index": self.fn, "session_hash": self.session}
        post(f"{self.server.url}gradio_api/stream/{self.event}", body)

    def next(self, kinds: tuple[str, ...] = ("process_streaming", "process_completed")) -> dict[str, Any]:
        while True:
            message = self.messages.get(timeout=120)
            if message.get("msg") in kinds:
                return message

    def close(self) -> None:
        post(f"{self.server.url}gradio_api/stream/{self.event}/close")


def inputs(frame: dict[str, Any], task: str = "seg", **kw: Any) -> list[Any]:
    """The stream's inputs in order: camera, task, size, input, flip test, colour, picture, state."""
    values = {"size": None, "input": "512x384", "flip": False, "color": "#00b140", "picture": None, **kw}
    return [
        frame,
        task,
        values["size"],
        values["input"],
        values["flip"],
        values["color"],
        values["picture"],
        None,
    ]


def counts(readout: str) -> tuple[int, int]:
    """(frames, dropped) from a readout's "... · N frames, D dropped"."""
    frames, rest = readout.rsplit(" · ", 1)[1].split(" frames, ")
    return int(frames), int(rest.split(" dropped")[0])


@pytest.mark.slow
def test_frames_stream_back_rendered_and_frames_posted_meanwhile_are_dropped_and_counted(
    server, monkeypatch
) -> None:
    """The join frame, then two bursts of five frames posted while the handler works (each frame
    takes at least 0.3 s here): every frame is either rendered or counted as dropped, and most of
    each burst is dropped."""
    step = live_tab.LiveSession.step

    def slow(self: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.3)
        return step(self, *args, **kwargs)

    monkeypatch.setattr(live_tab.LiveSession, "step", slow)
    stream = Stream(server, inputs(data_url(0)))
    first = stream.next()
    assert first["msg"] == "process_streaming", first
    image, readout = first["output"]["data"][:2]
    assert image["url"] and readout.startswith("Body parts custom · input 512x384")
    assert counts(readout) == (1, 0)
    for burst in range(2):
        for i in range(5):
            stream.send(data_url(burst * 5 + i + 1))
        stream.next()
    while sum(counts(readout)) < 11:  # the last frame posted is always rendered
        message = stream.next()
        assert message["msg"] == "process_streaming", message
        readout = message["output"]["data"][1]
    frames, dropped = counts(readout)
    assert frames + dropped == 11 and dropped >= 6, readout
    stream.close()
    assert stream.next(("process_completed",))["success"]


def test_closing_the_stream_ends_the_work(server, monkeypatch) -> None:
    calls: list[float] = []
    session_step = live_tab.LiveSession.step

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(time.monotonic())
        return session_step(self, *args, **kwargs)

    monkeypatch.setattr(live_tab.LiveSession, "step", counted)
    stream = Stream(server, inputs(data_url(0)))
    stream.next()
    stream.send(data_url(1))
    stream.next()
    stream.close()
    assert stream.next(("process_completed",))["msg"] == "process_completed"
    seen = len(calls)
    try:  # a late frame: accepted or refused (404), it never runs
        stream.send(data_url(2))
    except urllib.error.HTTPError:
        pass
    time.sleep(1.0)
    assert len(calls) == seen == 2


@pytest.mark.parametrize(
    ("frame", "task", "title", "words"),
    [
        ({"path": "/etc/passwd"}, "seg", "Image problem", "data URLs only"),
        ({"url": "data:image/jpeg;base64,bm90IGFuIGltYWdl"}, "seg", "Image problem", "image"),
        ({"url": "data:image/jpeg;base64,%%%"}, "seg", "Image problem", "not a valid data URL"),
        (None, "features", "Invalid option", "Video runs the tasks"),
    ],
)
def test_hostile_frames_and_options_get_one_clear_error(server, frame, task, title, words) -> None:
    first = frame if frame is not None else data_url(0)
    stream = Stream(server, inputs(first, task))
    message = stream.next()
    assert message["msg"] == "process_completed" and not message["success"], message
    assert message["output"].get("title") == title and words in message["output"]["error"], message


def test_bad_knobs_end_the_stream_with_the_option_named(server) -> None:
    for kw, words in (({"input": "4096x4096"}, "live input must be one of"), ({"flip": "yes"}, "flip_test")):
        stream = Stream(server, inputs(data_url(0), "pose", **kw))
        message = stream.next()
        assert not message["success"] and words in message["output"]["error"], message


def test_on_zerogpu_the_tab_is_a_notice_and_no_stream(monkeypatch, tiny_checkpoints) -> None:
    from sapiens2 import serving
    from sapiens2.ui.page_runner import Runner

    monkeypatch.setattr(live_tab, "zero_gpu_enabled", lambda: True)
    with gr.Blocks() as demo:
        live_tab.live_tab(Runner(serving.ModelManager(device="cpu", checkpoints=tiny_checkpoints)))
    notes = [b for b in demo.blocks.values() if isinstance(b, gr.Markdown)]
    assert any("Live needs a dedicated GPU" in str(n.value) for n in notes)
    assert not [fn for fn in demo.fns.values() if fn.name == "live"]
    assert not [b for b in demo.blocks.values() if isinstance(b, gr.Image) and b.streaming]


def test_the_post_counter_numbers_each_stream_s_frames() -> None:
    seen: list[dict[str, Any]] = []

    async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope)

    import asyncio

    counter = live_tab.StreamPosts(inner)
    event = uuid.uuid4().hex
    for path in (
        f"/gradio_api/stream/{event}",
        f"/gradio_api/stream/{event}",
        f"/gradio_api/stream/{event}/close",
    ):
        asyncio.run(counter({"type": "http", "method": "POST", "path": path}, None, None))
    asyncio.run(counter({"type": "http", "method": "GET", "path": f"/gradio_api/stream/{event}"}, None, None))
    posts, at = live_tab.StreamPosts.latest(event)
    assert posts == 2 and at is not None and len(seen) == 4  # close and GET are not frames
    viewer = live_tab.Viewer(session=None)  # type: ignore[arg-type]
    assert viewer.dropped(event)[0] == 0  # the stream's first call (its join frame)
    for _ in range(3):
        live_tab.StreamPosts.arrived(event, time.perf_counter())
    assert viewer.dropped(None)[0] == 4  # posts 1..5 counted, this frame is the newest
    for _ in range(2):  # Gradio takes post 6, and post 7 lands before the count...
        live_tab.StreamPosts.arrived(event, time.perf_counter())
    assert viewer.dropped(None)[0] == 1  # ... so post 7 is counted as dropped one frame early
    assert viewer.dropped(None)[0] == -1  # the next frame is post 7: taken back
    assert viewer.counted == 4 and viewer.taken == 3  # 7 posts, 3 taken from them: 4 dropped
    assert live_tab.StreamPosts.latest("no-such-event") == (0, None)
    assert np.isfinite(viewer.dropped(None)[1])


def test_the_app_gives_gradio_the_post_counter_beside_the_arrival_stamp() -> None:
    import app
    from sapiens2.ui import arrival, browser_compare

    kwargs = app.app_kwargs()
    middleware = [m.cls for m in kwargs["middleware"]]
    assert middleware == [arrival.StampArrival, live_tab.StreamPosts, browser_compare.BrowserFiles]
    assert "lifespan" in kwargs  # one app_kwargs: the MCP lifespan is still there


def test_a_stream_past_its_limit_does_no_more_work_and_says_stopped() -> None:
    """Issue 44 item 3: the page may open a new streaming event as soon as Gradio's time limit
    ends one (a stream ran to 82 s), so the limit is the viewer's: past LIVE_SECONDS of frames
    without a pause, a frame does no model work and the readout says stopped and why; after a
    pause (the camera was off) a new stream starts. The readout's stop message keeps the figures."""
    from types import SimpleNamespace

    viewer = live_tab.Viewer(session=None)  # type: ignore[arg-type]  (no model work may happen)
    t = 1000.0
    for k in range(0, live_tab.LIVE_SECONDS + 1, 2):  # a frame every 2 s: no pause
        assert not viewer.over(t + k)
    assert viewer.over(t + live_tab.LIVE_SECONDS + 2)
    viewer.readout = "Normals custom · 3.0 frames/s · 90 frames, 12 dropped"
    assert viewer.stop() == f"{live_tab.over_limit()} {viewer.readout}"
    assert "at most 60 s" in live_tab.over_limit()

    stub = SimpleNamespace(manager=SimpleNamespace(video_tasks=lambda: {}), requests=None)
    handler = live_tab.live_frame(stub)  # type: ignore[arg-type]
    now = time.perf_counter()
    viewer.started, viewer.last = now - live_tab.LIVE_SECONDS - 1, now
    image, readout, kept = handler(
        np.zeros((8, 8, 3), np.uint8), "normal", None, "release", False, None, None, viewer
    )
    assert readout.startswith("Stopped: a stream runs at most 60 s.") and readout.endswith("12 dropped")
    assert kept is viewer and image == gr.skip()

    later = viewer.last + live_tab.RESTART_AFTER_S + 1  # the camera was off: a new stream
    assert not viewer.over(later) and viewer.started == later
    assert viewer.stop() == f"Stopped. {viewer.readout}"


def test_live_and_the_video_plan_estimate_a_custom_model_from_one_figure(tiny_checkpoints) -> None:
    """Issue 44 item 5: Live said "No estimate for this model" where the Video tab estimated the
    same custom model. Both now take the figure of the models the server runs
    (serving.frame_cost.served_frame_macs): none before the custom file is loaded, in the same
    words; its own weights' once loaded."""
    from types import SimpleNamespace

    from sapiens2 import serving
    from sapiens2.models.cost import CPU_MACS_PER_S
    from sapiens2.serving.frame_cost import served_frame_macs

    manager = serving.ModelManager(device="cpu", checkpoints={"seg": tiny_checkpoints["seg"]})
    seg = manager.tasks()["seg"]
    run = SimpleNamespace(manager=manager)
    before = live_tab.expectation(run, "seg", None, "release")  # type: ignore[arg-type]
    assert manager.sizes(seg) == ("custom",) and manager.default_size(seg) == "custom"  # item 6
    assert "No time estimate yet (a custom checkpoint whose size is known once loaded" in before, before
    manager.get(seg, None)
    macs, why = served_frame_macs(manager, seg, "custom", seg.defaults())
    assert macs and not why
    after = live_tab.expectation(run, "seg", None, "release")  # type: ignore[arg-type]
    assert f"expect about **{macs / CPU_MACS_PER_S:.2g} s a frame**" in after, after
