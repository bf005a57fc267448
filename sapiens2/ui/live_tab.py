"""The Live tab: the visitor's webcam through a task, frame after frame (``sapiens2.serving.live``),
carried by Gradio's webcam streaming (``gr.Image(streaming=True)`` and its ``.stream`` event). Gradio
keeps one pending frame per event, so a slow handler never builds a backlog; :class:`StreamPosts`,
an ASGI middleware installed at launch, counts the frames Gradio replaced (shown as dropped) and
starts the latency clock. docs/LIVE.md ("Never a backlog") has how Gradio's stream route behaves
and what was measured; on ZeroGPU the tab is a notice instead.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import gradio as gr
from gradio.context import LocalContext

from ..errors import Sapiens2Error
from ..serving.frame_cost import served_frame_macs
from ..serving.live import (
    INPUTS,
    RESTART_AFTER_S,
    LiveOptions,
    LiveSession,
    cpu_seconds_per_frame,
    input_label,
    live_setup,
    live_size,
    model_label,
)
from ..zerogpu import zero_gpu_enabled
from .error_board import reported
from .inputs import data_url_bytes, photo_input
from .page_runner import Runner
from .video_tab import _task_name, default_task, task_choices
from .widgets import checked_by_package, size_dropdown

#: Seconds between two frames the page sends (the most it sends: 20 a second).
STREAM_EVERY = 0.05
#: Seconds one stream may run; press the camera's button again to go on.
LIVE_SECONDS = 60
#: Under the readout: what its figures mean.
READOUT_INFO = (
    "dropped: frames the camera sent while the previous one was still in the model. They are "
    "skipped, never queued, so the picture shows the newest frame and never falls behind."
)
#: Streams that run at once on this server (one GPU serves one viewer at full speed).
LIVE_STREAMS = 1
#: What the camera asks the browser for: 640x480 is plenty for the network's input.
CAMERA = {"video": {"width": {"ideal": 640}, "height": {"ideal": 480}}}
ZERO_GPU_NOTICE = (
    "**Live needs a dedicated GPU.** On ZeroGPU every GPU call is an admission billed in whole "
    "seconds of your daily quota, so a stream of frames would spend the quota in seconds. Run the "
    "app on your own GPU (`python app.py`, see docs/LIVE.md) or duplicate this Space on dedicated "
    "GPU hardware; the photo tabs and Video work here."
)


# ----------------------------------------------------------------------------- the post counter

_EVENT = re.compile(r"/stream/([0-9a-fA-F]{8,64})/?$")
#: how many streams' post counts are kept (each a few bytes; the oldest go first)
_KEEP_EVENTS = 4096


class StreamPosts:
    """ASGI middleware: counts the frames posted to each streaming event and keeps when the
    latest arrived (``time.perf_counter()``); :meth:`latest` reads them."""

    posts: OrderedDict[str, tuple[int, float]] = OrderedDict()
    lock = threading.Lock()
    installed = False  # set once an app runs with it

    def __init__(self, app: Any) -> None:
        self.app = app
        StreamPosts.installed = True

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") == "http" and scope.get("method") == "POST":
            found = _EVENT.search(scope.get("path") or "")
            if found is not None:
                self.arrived(found.group(1), time.perf_counter())
        await self.app(scope, receive, send)

    @classmethod
    def arrived(cls, event: str, at: float) -> None:
        with cls.lock:
            n, _ = cls.posts.pop(event, (0, 0.0))
            cls.posts[event] = (n + 1, at)
            while len(cls.posts) > _KEEP_EVENTS:
                cls.posts.popitem(last=False)

    @classmethod
    def latest(cls, event: str | None) -> tuple[int, float | None]:
        """(frames posted to ``event`` so far, arrival of the latest or None)."""
        with cls.lock:
            n, at = cls.posts.get(event or "", (0, 0.0))
        return n, at if n else None


def middleware() -> Any:
    """The post counter as one entry of the served app's middlewares (``app.app_kwargs``)."""
    from starlette.middleware import Middleware

    return Middleware(StreamPosts)


# ----------------------------------------------------------------------------- the stream


class Viewer:
    """One page's live state (a ``gr.State``): its session, its stream, the frames it took from
    the stream's posts and the drops counted so far."""

    def __init__(self, session: LiveSession) -> None:
        self.session = session
        self.event: str | None = None
        self.taken = 0  # frames taken from posts (the join's frame is not a post)
        self.counted = 0  # drops reported so far
        self.started: float | None = None  # the stream's first frame (perf_counter)
        self.last: float | None = None  # the latest frame's arrival
        self.readout = ""  # the latest frame's readout

    def over(self, now: float) -> bool:
        """Whether this stream ran past :data:`LIVE_SECONDS`. A stream starts at the first frame
        after a Stop or after a pause of ``RESTART_AFTER_S`` (the camera was off): the page may
        open a new streaming event at once when Gradio's ``time_limit`` ends one, so the event
        alone does not say that a visitor started again."""
        if self.started is None or self.last is None or now - self.last > RESTART_AFTER_S:
            self.started = now
        self.last = now
        return now - self.started > LIVE_SECONDS

    def stop(self) -> str:
        """The readout once the page's stream ended (Stop, or Gradio's time limit): "Stopped" and
        why, then the last figures. A stream past the limit stays stopped until the camera pauses."""
        said = over_limit() if self.last is not None and self.over(self.last) else "Stopped."
        return f"{said} {self.readout}" if self.readout else said

    def dropped(self, event: str | None) -> tuple[int, float]:
        """Change in the frames dropped since the previous frame, and when this one arrived.
        ``event``: Gradio's event id, set for the call that starts a stream (its frame came with
        the join request) and None for the frames posted after it (their bodies carry no id).

        Drops so far = posts counted - frames taken. A post that lands between Gradio taking a
        frame and this count is counted one frame early (it is still pending); the next frame
        takes it back, so the change can be -1 and the total is exact."""
        now = time.perf_counter()
        if event is not None and event != self.event:  # a new stream
            self.event, self.taken, self.counted = event, 0, 0
            return 0, now
        posts, at = StreamPosts.latest(self.event)
        self.taken += 1
        total = max(0, posts - self.taken)
        change, self.counted = total - self.counted, total
        return change, at if at is not None else now


def over_limit() -> str:
    """The readout once a stream ran past :data:`LIVE_SECONDS` (the page may still be sending)."""
    return f"Stopped: a stream runs at most {LIVE_SECONDS} s. Press Stop, then Record to start again."


def camera_input() -> gr.Image:
    """The webcam, streaming. It takes a data URL's bytes only (what the page sends), so the
    package reads the frame with its own checks (size, pixels); any path a caller names is
    refused before anything opens it."""
    camera = gr.Image(
        sources=["webcam"], streaming=True, type="numpy", label="Camera", elem_id="live-camera",
        webcam_options=gr.WebcamOptions(mirror=False, constraints=CAMERA), height=320,
    )  # fmt: skip

    def preprocess(payload: Any) -> Any:
        if payload is None:
            return None
        url = str(getattr(payload, "url", "") or "")
        if not url.startswith("data:"):
            raise gr.Error("Live takes camera frames as data URLs only.", title="Image problem")
        return data_url_bytes(url)

    camera.preprocess = preprocess  # type: ignore[method-assign]
    return camera


def live_frame(run: Runner) -> Callable[..., tuple[Any, str, Viewer]]:
    """The stream handler: one frame in, the rendering, the readout and the viewer state out.
    Its units of device work go through the app's GPU entry, like every request's."""
    manager, tasks = run.manager, run.manager.video_tasks()

    def live(
        frame: Any,
        task: str,
        size: str | None,
        network_input: str,
        flip_test: bool,
        background_color: str | None,
        background_image: Any,
        viewer: Viewer | None,
    ) -> tuple[Any, str, Viewer]:
        viewer = viewer if isinstance(viewer, Viewer) else Viewer(LiveSession(manager, run.requests.device))
        if frame is None:
            return gr.skip(), "Waiting for the camera.", viewer
        dropped, arrived = viewer.dropped(LocalContext.event_id.get(None))
        if viewer.over(time.perf_counter()):  # no model work past the limit, whatever the page sends
            return gr.skip(), f"{over_limit()} {viewer.readout}", viewer
        with reported(manager):
            options = LiveOptions(
                tasks[_task_name(task, tasks)], size or None, network_input, False if flip_test is None else flip_test,
                {"background_color": background_color, "background_image": background_image},
            )  # fmt: skip
            out = viewer.session.step(frame, options, captured_at=arrived, dropped=dropped)
        readout = out.readout
        if not StreamPosts.installed:
            readout += " (dropped frames are not counted: the app runs without its post counter)"
        viewer.readout = readout
        return out.image, readout, viewer

    return live


def expectation(run: Runner, task: str, size: str | None, network_input: str, flip_test: bool = False) -> str:
    """What to expect before starting: on a CPU, seconds a frame from the model's size (and
    pose's flip test, which doubles its forwards)."""
    tasks = run.manager.video_tasks()
    try:
        decl = tasks[_task_name(task, tasks)]
        setup = live_setup(run.manager, LiveOptions(decl, size or None, network_input, bool(flip_test)))
    except Sapiens2Error as err:  # a bad choice says so here; the stream reports it too
        return f"Cannot run this choice: {err}"
    where = f"this server's GPU ({run.manager.device})" if run.manager.cuda else "this CPU"
    # the size is "custom" for a --checkpoint model; a Sapiens v1 model adds its generation and licence
    head = f"**{model_label(setup)}**, input {setup.input_note}, on {where}."
    if run.manager.cuda:
        return f"{head} The readout shows the frames/s and latency measured on it."
    # the Video tab's figure for the same model (one source): a loaded custom checkpoint has one
    seconds = cpu_seconds_per_frame(decl, setup.size, setup.hw, setup.infer_opts, run.manager)
    if seconds is None:
        _, why = served_frame_macs(run.manager, decl, setup.size, setup.infer_opts, setup.hw)
        return f"{head} No time estimate yet ({why}); the readout shows the measured rate."
    return (
        f"{head} A CPU is slow for live video: expect about **{seconds:.2g} s a frame** (from the "
        "model's size at a rate measured on a 2-core machine; more cores are faster). The smallest "
        "input is the fastest; the readout shows the measured rate."
    )


def live_tab(run: Runner) -> None:
    """The Live tab (a notice on ZeroGPU): camera, task, size, input, flip test and background on
    the left; the rendering and the readout on the right."""
    with gr.Tab("Live", id="live", elem_id="live-tab"):
        if zero_gpu_enabled():
            gr.Markdown(ZERO_GPU_NOTICE, elem_id="live-notice")
            return
        tasks = run.manager.video_tasks()
        first = default_task(tasks)
        with gr.Row():
            with gr.Column(scale=1):
                camera = camera_input()
                task = checked_by_package(gr.Radio(task_choices(tasks), value=first, label="Task"))
                chosen = live_size(run.manager, tasks[first])
                size = size_dropdown(run.manager.sizes(tasks[first]), chosen)
                network_input = checked_by_package(
                    gr.Radio([(input_label(k), k) for k in INPUTS], value="release", label="Network input")
                )
                flip = gr.Checkbox(False, label="Flip test (pose: twice the forwards, a bit more accurate)")
                with gr.Accordion("Virtual background (matting)", open=False):
                    color = gr.ColorPicker("#00b140", label="Background colour")
                    picture = photo_input(label="Background picture (instead of the colour)",
                                          sources=["upload", "clipboard"], height=140)  # fmt: skip
                expect = gr.Markdown(expectation(run, first, chosen, "release"), elem_id="live-expect")
            with gr.Column(scale=2):
                result = gr.Image(
                    label="Live result", elem_id="live-result", format="jpeg", interactive=False
                )
                readout = gr.Textbox(
                    label="Readout", info=READOUT_INFO, elem_id="live-readout", interactive=False, max_lines=2
                )
        viewer = gr.State(None)

    def sizes(task_value: str) -> Any:
        chosen = tasks[_task_name(task_value, tasks)]
        return gr.Dropdown(choices=list(run.manager.sizes(chosen)), value=live_size(run.manager, chosen))

    task.change(sizes, inputs=task, outputs=size, api_visibility="private")
    gr.on(
        [task.change, size.change, network_input.change, flip.change],
        lambda t, s, i, f: expectation(run, t, s, i, f),
        inputs=[task, size, network_input, flip],
        outputs=expect,
        api_visibility="private",
    )
    stream = camera.stream(
        live_frame(run),
        inputs=[camera, task, size, network_input, flip, color, picture, viewer],
        outputs=[result, readout, viewer],
        stream_every=STREAM_EVERY,
        time_limit=LIVE_SECONDS,
        concurrency_limit=LIVE_STREAMS,
        concurrency_id="live",
        show_progress="hidden",
        api_name="live",
        api_visibility="private",  # a browser's stream, not an API call (raw REST reaches it all the same)
    )
    # the stream ended (Stop, or Gradio's time limit): say so, with the last figures
    stream.then(stopped, inputs=viewer, outputs=[readout, viewer], api_visibility="private", queue=False)


def stopped(viewer: Any) -> tuple[Any, Any]:
    if not isinstance(viewer, Viewer):
        return gr.skip(), gr.skip()
    return viewer.stop(), viewer


__all__ = ["LIVE_SECONDS", "STREAM_EVERY", "StreamPosts", "live_tab", "middleware"]
