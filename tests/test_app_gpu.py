"""The served app around its GPU entry (issue 13): one concurrency group for every model run
(buttons and the examples' lazy cache), load progress relayed to the visitor, the cost of a large
run told before its device call, and a GPU function that refuses to load.

The real app (``app.build_demo`` on the tiny checkpoints, concurrency 1) is served on 127.0.0.1
and driven through Gradio's queue protocol with raw HTTP (``/gradio_api/queue/join`` and the SSE
stream of ``/gradio_api/queue/data``), the way the page does. The GPU entry
(``sapiens2.ui.gpu.run_on_gpu``) is a plain call off ZeroGPU; tests wrap its function to watch
the device calls. Under spaces' own ZeroGPU emulation: ``tests/test_zerogpu.py``.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_api_security import EXAMPLE, META, Server, free_port

import app
import sapiens2.zerogpu
from sapiens2 import serving
from sapiens2.errors import ResidencyError
from sapiens2.serving.cache import CUSTOM
from sapiens2.serving.device import Batch, OneTask
from sapiens2.tasks import registry
from sapiens2.ui import gpu
from sapiens2.ui.endpoints import all_parameters
from sapiens2.ui.layout import MODELS
from sapiens2.zerogpu import quota as zerogpu


@pytest.fixture(scope="module")
def served(space_checkpoints, tmp_path_factory) -> Iterator[tuple[Server, serving.ModelManager]]:
    mp = pytest.MonkeyPatch()
    tmp = tmp_path_factory.mktemp("app_gpu")
    mp.setenv("GRADIO_EXAMPLES_CACHE", str(tmp / "examples"))  # nothing cached yet
    mp.setenv("HF_HUB_OFFLINE", "1")
    manager = serving.ModelManager(device="cpu", checkpoints=space_checkpoints)
    demo = app.build_demo(manager, concurrency=1, folders=serving.RequestFolders(tmp / "requests"))
    _, url, _ = app.launch(demo, host="127.0.0.1", port=free_port(), prevent_thread_lock=True, quiet=True)
    yield Server(url, demo, tmp / "requests"), manager
    demo.close()
    mp.undo()


def config(server: Server) -> dict[str, Any]:
    return json.loads(urllib.request.urlopen(f"{server.url}config", timeout=30).read())


def fn_index(server: Server, api_name: str) -> int:
    return next(d["id"] for d in config(server)["dependencies"] if d.get("api_name") == api_name)


def example_run(server: Server, tab: str) -> tuple[int, int]:
    """(event id, dataset id) of the queued event a click on one of ``tab``'s examples runs."""
    cfg = config(server)
    dataset = next(c for c in cfg["components"] if c["props"].get("elem_id") == f"{tab}-examples")
    event = next(
        d["id"]
        for d in cfg["dependencies"]
        if d["inputs"] == [dataset["id"]]
        and d.get("queue") is not False
        and d.get("trigger_after") is not None
    )
    return event, dataset["id"]


def queue_run(
    server: Server,
    index: int,
    data: list,
    trigger: int | None = None,
    on_message: Callable[[dict], None] = lambda m: None,
) -> list[dict]:
    """Join the queue as the page does and read the event's messages until it completes."""
    session = uuid.uuid4().hex
    body = {"data": data, "fn_index": index, "session_hash": session, "trigger_id": trigger}
    req = urllib.request.Request(
        f"{server.url}gradio_api/queue/join",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=30).read()
    messages: list[dict] = []
    stream = urllib.request.urlopen(f"{server.url}gradio_api/queue/data?session_hash={session}", timeout=120)
    for line in stream:
        if line.startswith(b"data: "):
            message = json.loads(line[len(b"data: ") :])
            messages.append(message)
            on_message(message)
            if message.get("msg") == "process_completed":
                break
    return messages


def completed(messages: list[dict]) -> dict:
    last = messages[-1]
    assert last.get("msg") == "process_completed" and last.get("success"), last
    return last["output"]


class DeviceWatch:
    """Wraps the GPU entry's function: counts calls and the most running at once."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, before: Callable[[], None] = lambda: None) -> None:
        self.real = gpu.run_on_gpu.fn
        self.before = before
        self.lock = threading.Lock()
        self.calls: list[str] = []
        self.seconds: list[int] = []
        self.active = self.peak = 0
        monkeypatch.setattr(gpu.run_on_gpu, "fn", self)

    def __call__(self, *args: Any) -> Any:
        unit = args[1]  # (the model cache's key, the unit of device work)
        with self.lock:
            self.calls.append(unit.what)
            self.seconds.append(unit.seconds)  # what the call reserves (before ZeroGPU's factor)
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            self.before()
            time.sleep(0.3)  # long enough for any other admitted run to overlap
            outputs = self.real(*args)
        except BaseException:
            self.done()
            raise
        return self.stream(outputs)

    def stream(self, outputs: Any) -> Any:
        """The call's outputs as the entry streams them, lazily: a clip's call takes the server's
        next jobs while it runs, so reading it all first would wait for jobs never sent."""
        try:
            yield from outputs
        finally:
            self.done()

    def done(self) -> None:
        with self.lock:
            self.active -= 1


# ----------------------------------------------------------------------------- concurrency


def test_every_model_run_is_in_one_concurrency_group(served) -> None:
    """Every task's endpoint, /similarity, /all and each examples' lazy-cache run (the event a
    click on an example queues, which runs the task the first time) share MODELS."""
    server, _ = served
    apis = {t.api_name for t in registry.all_tasks().values()} | {"all_tasks", "similarity"}
    groups = {fn.name: fn.concurrency_id for fn in server.demo.fns.values() if fn.name in apis}
    assert set(groups) == apis and set(groups.values()) == {MODELS}, groups
    examples = [fn for fn in server.demo.fns.values() if fn.name == "load_example_output"]
    assert len(examples) == len(registry.all_tasks())  # one gallery per tab
    assert {fn.concurrency_id for fn in examples} == {MODELS}
    assert {fn.concurrency_limit for fn in [*examples]} == {"default"}  # the queue's limit applies


@pytest.mark.slow
def test_examples_and_buttons_never_run_more_models_at_once_than_the_limit(served, monkeypatch) -> None:
    """Two example clicks (lazy cache: the first click runs the task) and two button runs at once,
    with a concurrency limit of 1: one device call at a time, four in all."""
    server, _ = served
    watch = DeviceWatch(monkeypatch)
    photo = {"path": server.upload(EXAMPLE), "meta": META}
    jobs = [(example_run(server, "pose"), [0]), (example_run(server, "seg"), [0])]
    jobs += [((fn_index(server, "seg"), None), [photo, None, None, None])]
    jobs += [((fn_index(server, "features"), None), [photo, None, False])]  # per_person off
    outcomes: list[Any] = [None] * len(jobs)

    def run(i: int) -> None:
        (index, trigger), data = jobs[i]
        outcomes[i] = queue_run(server, index, data, trigger)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    for messages in outcomes:
        assert messages is not None
        completed(messages)
    assert sorted(watch.calls) == sorted(["pose", "seg", "seg", registry.get("features").name])
    assert watch.peak == 1


# ----------------------------------------------------------------------------- progress


def test_a_model_load_reports_its_progress_to_the_visitor(served, monkeypatch) -> None:
    """The first request of a task loads its model in the handler's thread, whose tqdm bar
    (gr.Progress(track_tqdm=True)) reaches the request's queue event; a cached model shows none."""
    server, manager = served
    updates: list[tuple[str, str, Any]] = []
    real = server.demo._queue.set_progress

    def record(event_id: str, iterables: Any) -> None:
        updates.extend((it.desc, it.unit, it.length) for it in iterables or [])
        real(event_id, iterables)

    monkeypatch.setattr(server.demo._queue, "set_progress", record)
    photo = {"path": server.upload(EXAMPLE), "meta": META}
    assert ("matting", CUSTOM) not in manager.loaded()
    completed(queue_run(server, fn_index(server, "matting"), [photo, None, None, None]))
    loads = [u for u in updates if u[0] == "Loading model.safetensors"]
    assert loads and all(unit == "B" and length and length > 0 for _, unit, length in loads)
    updates.clear()
    completed(queue_run(server, fn_index(server, "matting"), [photo, None, None, None]))
    assert not [u for u in updates if u[0] == "Loading model.safetensors"]


def test_the_cli_shows_load_progress(tiny_checkpoints, tmp_path: Path, capsys, monkeypatch) -> None:
    """A load that lasts past half a second shows its bar (a quicker one leaves none behind, so
    the tiny checkpoint's first tensor is made slow: the bar's first update comes after 0.5 s)."""
    from sapiens2.cli import main
    from sapiens2.models import loading

    read, slowed = loading._read_tensor, []

    def slow_read(*args: Any) -> Any:
        if not slowed:
            slowed.append(time.sleep(0.6))
        return read(*args)

    monkeypatch.setattr(loading, "_read_tensor", slow_read)
    argv = ["seg", str(EXAMPLE), "--checkpoint", str(tiny_checkpoints["seg"]), "--device", "cpu"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 0
    assert "Loading model.safetensors" in capsys.readouterr().err


# ----------------------------------------------------------------------------- cost of a run


def announced_before_the_device_call(
    server: Server, monkeypatch: pytest.MonkeyPatch, api: str, data: list
) -> tuple[list[str], DeviceWatch, list[bool]]:
    """Run ``api`` as on ZeroGPU (cost notices on); each device call waits for the visitor to
    have received an info message. Returns the info texts, the watch and what each call saw."""
    monkeypatch.setattr(sapiens2.zerogpu, "zero_gpu_enabled", lambda: True)
    told = threading.Event()
    saw: list[bool] = []
    watch = DeviceWatch(monkeypatch, before=lambda: saw.append(told.wait(20)))
    infos: list[str] = []

    def on_message(message: dict) -> None:
        if message.get("msg") == "log" and message.get("level") == "info":
            infos.append(message["log"])
            told.set()

    completed(queue_run(server, fn_index(server, api), data, on_message=on_message))
    return infos, watch, saw


def test_a_large_run_tells_its_cost_before_the_gpu_call(served, monkeypatch) -> None:
    server, _ = served
    photo = {"path": server.upload(EXAMPLE), "meta": META}
    pose = [photo, "5b", None, True, None, None, None, 50, None]  # flip test, up to 50 people
    infos, watch, saw = announced_before_the_device_call(server, monkeypatch, "pose", pose)
    assert watch.calls == ["pose"] and saw == [True]
    # the tiny file is of no published size: it runs whatever size is asked, as "custom" (the file
    # decides, issue 44), priced as the costliest backbone, so the run is still a large one
    assert len(infos) == 1 and infos[0].startswith("This pose custom run reserves up to ")
    assert "120 s without an account" in infos[0]


@pytest.mark.slow
def test_all_tasks_at_5b_tell_the_total_before_the_first_gpu_call(served, monkeypatch) -> None:
    server, _ = served
    tasks = registry.all_tasks()
    values = {
        name: ("5b" if opt is None and "5b" in task.spec.sizes else None)
        for task, name, opt in all_parameters(tasks)
    }
    data = [{"path": server.upload(EXAMPLE), "meta": META}, *values.values()]
    infos, watch, saw = announced_before_the_device_call(server, monkeypatch, "all", data)
    assert watch.calls == ["all tasks"]  # one GPU call (one AllTasks unit) for every task
    assert saw and all(saw)
    assert infos[0].startswith("Running all tasks reserves up to ")
    # the total is what the one call reserves (capped at what an anonymous visitor can start)
    charged = int(infos[0].split("reserves up to ")[1].split()[0])
    assert charged == zerogpu.gpu_request(sum(watch.seconds)).charged_s
    assert all(zerogpu.gpu_request(s).fits("anonymous") for s in watch.seconds)  # the call is startable


# ----------------------------------------------------------------------------- residency


@pytest.mark.slow
def test_the_gpu_function_refuses_to_load_through_the_app(served, monkeypatch, tiny_checkpoints) -> None:
    """The app's device call (the one GPU entry) never loads: a model missing when it runs
    (here: dropped between the server's preparation and the call) is a ResidencyError that
    reaches the visitor, and nothing was loaded in the call."""
    server, manager = served
    fresh = serving.ModelManager(device="cpu", checkpoints=tiny_checkpoints)
    with pytest.raises(ResidencyError, match="not resident"):
        list(gpu.gpu_device(fresh)(OneTask(Batch(registry.get("seg"), "1b", (None,), {}), 5)))
    assert fresh.loads == 0 and fresh.loaded() == []

    loads: list[int] = []
    watch = DeviceWatch(monkeypatch, before=lambda: (manager.clear(), loads.append(manager.loads)))
    photo = {"path": server.upload(EXAMPLE), "meta": META}
    event, data, _ = server.call("seg", [photo, None, None, None])
    assert watch.calls == ["seg"]
    # the visitor's plain sentence ("not resident" and the bug report go to the server log)
    assert event == "error" and data["title"] == "Server error" and "not ready" in data["error"]
    assert manager.loads == loads[0] and ("seg", CUSTOM) not in manager.loaded()
    monkeypatch.undo()
    assert server.call("seg", [photo, None, None, None])[0] == "complete"  # loads again, runs


# ----------------------------------------------------------------------------- video


@pytest.mark.slow
def test_a_clip_goes_through_the_gpu_entry_once(served, monkeypatch, tmp_path: Path) -> None:
    """/video in the app: the whole clip (detections, every batch's forward) is ONE call of the
    app's GPU entry, reserving a duration an anonymous visitor can start."""
    from video_clips import write_clip

    from sapiens2.serving import video as video_serving

    server, _ = served
    monkeypatch.setattr(video_serving, "MAX_BATCH", 2)
    watch = DeviceWatch(monkeypatch)
    clip = {"path": server.upload(write_clip(tmp_path / "c.mp4", n=5, fps=10.0)), "meta": META}
    event, data, text = server.call("video", [clip, "pose", None, 1, None, 2, True])
    assert event == "complete", text[:300]
    assert data[3]["frames"] == 5
    assert watch.calls == ["pose"]  # one admission for the clip, batches of 2 inside
    assert all(zerogpu.gpu_request(s).fits("anonymous") for s in watch.seconds)
    assert {fn.concurrency_id for fn in server.demo.fns.values() if fn.name == "video"} == {MODELS}
