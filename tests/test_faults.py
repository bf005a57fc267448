"""Faults while serving: concurrent first loads, missing or unreachable or corrupt weights, GPU out of
memory, and where output files go. Each fault gives a clear error, nothing bad is cached, and the
next request succeeds once the cause is gone.

Requests go through the serving layer and the app's request runner (``sapiens2.ui.page_runner.Runner``, the code
behind every endpoint) with the tiny checkpoints; no server is started here.
"""

from __future__ import annotations

import io
import re
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import huggingface_hub
import huggingface_hub.constants as hf_constants
import numpy as np
import pytest
import torch
from PIL import Image
from registry_helpers import task as T
from tiny_checkpoints import place_hf_cache, place_release_layout

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import one_request  # noqa: E402

import sapiens2.models.loading  # noqa: E402
import sapiens2.models.weights  # noqa: E402
from sapiens2 import serving  # noqa: E402
from sapiens2.errors import CheckpointError, OutOfMemoryError, WeightsUnavailableError  # noqa: E402
from sapiens2.runtime import heap  # noqa: E402
from sapiens2.tasks import pipeline  # noqa: E402

SMALL = (256, 192)


def photo(h: int = 40, w: int = 30) -> np.ndarray:
    img = np.zeros((h, w, 3), np.uint8)
    img[:] = np.linspace(30, 220, w, dtype=np.uint8)[None, :, None]
    img[h // 4 : 3 * h // 4, w // 3 : 2 * w // 3] = (200, 40, 90)
    return img


def shrink(pipe: Any) -> Any:
    pipe.input_hw = SMALL
    return pipe


def quick_factory(task: str, size: str | None, **kwargs: Any) -> Any:
    """The default factory (real loading), quarter-size input for speed."""
    kwargs.pop("seg", None)
    return shrink(pipeline(task, size, **kwargs))


def resolving_factory(task: str, size: str | None, **kwargs: Any) -> Any:
    """Finds the weights the way production does ($SAPIENS2_CHECKPOINTS, then the Hub cache or a
    download) but loads whatever tiny model it finds there, whatever size was asked for."""
    path = sapiens2.models.loading.resolve_checkpoint(task, size)
    return quick_factory(task, None, **{**kwargs, "checkpoint": path})


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Offline Hub with an empty cache, and an empty $SAPIENS2_CHECKPOINTS root."""
    cache, root = tmp_path / "hf_cache", tmp_path / "root"
    cache.mkdir()
    root.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("SAPIENS2_CHECKPOINTS", str(root))
    return {"cache": cache, "root": root}


@pytest.fixture(scope="module")
def app_module():
    import app

    return app


def runner(app_module, manager: serving.ModelManager, tmp_path: Path):
    return app_module.Runner(manager, serving.RequestFolders(tmp_path / "requests"))


# ----------------------------------------------------------------------------- loading once


def test_concurrent_first_requests_load_the_model_once(tiny_checkpoints, monkeypatch) -> None:
    calls: list[float] = []
    real = sapiens2.models.loading.load_model

    def slow_load(*args: Any, **kwargs: Any) -> Any:
        calls.append(time.perf_counter())
        time.sleep(0.3)  # a real load takes seconds: every request arrives while it runs
        return real(*args, **kwargs)

    monkeypatch.setattr(sapiens2.models.loading, "load_model", slow_load)
    manager = serving.ModelManager(
        device="cpu", checkpoints={"seg": tiny_checkpoints["seg"]}, factory=quick_factory
    )
    start = threading.Barrier(4)
    results: list[Any] = []
    errors: list[BaseException] = []

    def request() -> None:
        start.wait()
        try:
            results.append(one_request.infer(manager, "seg", photo()))
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=request) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(results) == 4
    assert len(calls) == 1 and manager.loads == 1 and manager.failures == 0
    assert all(np.array_equal(r.labels, results[0].labels) for r in results)


def test_a_failed_load_is_not_cached_even_under_concurrency(tiny_checkpoints, tmp_path) -> None:
    good = tiny_checkpoints["seg"] / "model.safetensors"
    ckpt = tmp_path / "seg.safetensors"
    ckpt.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")  # a broken header
    manager = serving.ModelManager(device="cpu", checkpoints={"seg": ckpt}, factory=quick_factory)
    errors: list[BaseException] = []

    def request() -> None:
        try:
            one_request.infer(manager, "seg", photo())
        except CheckpointError as err:
            errors.append(err)

    threads = [threading.Thread(target=request) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    # every waiting request tried again itself (no cached failure), and each says why
    assert len(errors) == 3 and manager.failures == 3 and manager.loaded() == []
    assert all("is not a valid safetensors file" in str(e) for e in errors)
    shutil.copyfile(good, ckpt)  # the cause is gone
    assert one_request.infer(manager, "seg", photo()).labels.shape == (40, 30)
    assert manager.loads == 1


# ----------------------------------------------------------------------------- weights


def test_weights_unavailable_then_available(tiny_checkpoints, offline, app_module, tmp_path) -> None:
    manager = serving.ModelManager(device="cpu", factory=resolving_factory)
    run = runner(app_module, manager, tmp_path)
    with pytest.raises(app_module.gr.Error) as err:
        run(T("seg"), photo(), "0.8b")
    assert err.value.title == "Weights unavailable"
    # the visitor gets one plain sentence; the operator's details (the log, a local page's fold)
    # name the repository, the setting and the exact place to put the file
    assert (
        err.value.message.startswith("This model's weights are not") and "SAPIENS2" not in err.value.message
    )
    text = err.value.details
    assert "facebook/sapiens2-seg-0.8b" in text and "SAPIENS2_CHECKPOINTS" in text
    assert str(offline["root"] / "seg" / "sapiens2_0.8b_seg.safetensors") in text
    assert manager.loaded() == [] and manager.failures == 1
    # The user drops the file where the message said: the very next request works.
    place_release_layout(tiny_checkpoints["seg"], offline["root"], "seg", "0.8b")
    assert run(T("seg"), photo(), "0.8b").after.shape == (40, 30, 3)
    assert manager.loaded() == [("seg", "0.8b")]


HUB_CALLS: list[dict[str, Any]] = []


def _timeout_like_huggingface_hub(repo_id: str, filename: str, **kwargs: Any) -> str:
    """What hf_hub_download raises when the Hub does not answer: a LocalEntryNotFoundError whose
    cause is the HTTP client's timeout (see huggingface_hub.file_download._raise_on_head_call_error)."""
    import httpx2

    HUB_CALLS.append({"filename": filename, **kwargs})
    try:
        raise httpx2.ReadTimeout("The read operation timed out")
    except httpx2.ReadTimeout as cause:
        raise huggingface_hub.errors.LocalEntryNotFoundError(
            "An error happened while trying to locate the file on the Hub and we cannot find the "
            "requested files in the local cache. Please check your connection and try again or make "
            "sure your Internet connection is on."
        ) from cause


def test_hub_timeout_is_a_clear_error_and_the_next_request_succeeds(
    tiny_checkpoints, monkeypatch, tmp_path
) -> None:
    monkeypatch.delenv("SAPIENS2_CHECKPOINTS", raising=False)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", _timeout_like_huggingface_hub)
    # the Hub answers sapiens2's quick probe, then times out on the download itself
    monkeypatch.setattr(sapiens2.models.weights, "hub_unreachable", lambda *a, **k: None)
    manager = serving.ModelManager(device="cpu", factory=resolving_factory)
    HUB_CALLS.clear()
    with pytest.raises(WeightsUnavailableError) as err:
        one_request.infer(manager, "matting", photo())
    # the network is asked once; the other file name is only looked up in the cache (no 2nd timeout):
    # counted, since the stand-in's timeout is instant and a clock could not tell them apart
    assert [c.get("local_files_only") for c in HUB_CALLS] == [False, True]
    text = str(err.value)
    assert "facebook/sapiens2-matting-1b" in text and "LocalEntryNotFoundError" in text
    assert "cause: ReadTimeout: The read operation timed out" in text
    assert "did not answer in time" in text and "SAPIENS2_CHECKPOINTS" in text
    assert manager.loaded() == []

    # The Hub answers again: hf_hub_download returns the downloaded file.
    fetched = tmp_path / "sapiens2_1b_matting.safetensors"
    shutil.copyfile(tiny_checkpoints["matting"] / "model.safetensors", fetched)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: str(fetched))
    assert one_request.infer(manager, "matting", photo()).alpha.shape == (40, 30)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda data: b"\xff" * 8 + data[8:], r"is not a valid safetensors file \(bad header length\)"),
        (lambda data: data[:8] + b"#" + data[9:], r"is not a valid safetensors file"),
        (
            lambda data: data[: len(data) // 2],
            r"Could not read the tensors of .*Delete it and download it again",
        ),
    ],
    ids=["length", "json", "cut"],
)
def test_corrupted_cached_file_is_named_and_replacing_it_fixes_the_next_request(
    tiny_checkpoints, offline, app_module, tmp_path, damage, message
) -> None:
    snap = place_hf_cache(tiny_checkpoints["normal"], offline["cache"], "normal", "0.4b", "model.safetensors")
    blob = snap.resolve()
    good = blob.read_bytes()
    blob.write_bytes(damage(good))

    manager = serving.ModelManager(device="cpu", factory=resolving_factory)
    run = runner(app_module, manager, tmp_path)
    with pytest.raises(app_module.gr.Error) as err:
        run(T("normal"), photo(), "0.4b")
    assert err.value.title == "Unusable checkpoint" and "cannot be used" in err.value.message
    assert re.search(message, err.value.details) and str(snap.parent) in err.value.details  # the operator's
    assert manager.loaded() == [] and manager.failures == 1
    blob.write_bytes(good)  # e.g. `hf cache delete` and a fresh download
    assert run(T("normal"), photo(), "0.4b").after.shape == (40, 30, 3)


# ----------------------------------------------------------------------------- out of memory


class OomOnForward(torch.nn.Module):
    """Stands in for a model too large for the GPU: every forward raises CUDA's OOM error."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.calls = 0

    def forward(self, x: torch.Tensor) -> Any:
        self.calls += 1
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 18.00 GiB")


def oom_factory(tiny_checkpoints: dict[str, Path], large: str = "5b"):
    def factory(task: str, size: str | None, **kw: Any) -> Any:
        kw.pop("seg", None)
        pipe = shrink(pipeline(task, None, **{**kw, "checkpoint": tiny_checkpoints[task]}))
        if size == large:
            pipe.model = OomOnForward(pipe.model)
        return pipe

    return factory


@pytest.mark.slow
def test_out_of_memory_on_a_large_size_advises_trims_and_recovers(
    tiny_checkpoints, app_module, tmp_path
) -> None:
    manager = serving.ModelManager(device="cpu", factory=oom_factory(tiny_checkpoints))
    run = runner(app_module, manager, tmp_path)
    run(T("normal"), photo(), "0.4b")
    run(T("pose"), photo(), "0.4b")
    assert len(manager.loaded()) == 2
    with pytest.raises(app_module.gr.Error) as err:
        run(T("seg"), photo(), "5b")
    assert err.value.title == "Out of GPU memory"
    assert re.search(r"Out of GPU memory running seg 5b.*smaller size \(0\.4b, 0\.8b, 1b\)", str(err.value))
    assert manager.loaded() == [("seg", "5b")]  # the cache was trimmed to the model in use
    shown = run(T("seg"), photo(), "0.4b")  # the next request, at the advised size, works
    assert shown.after.shape == (40, 30, 3) and ("seg", "0.4b") in manager.loaded()
    # the same through the package API
    with pytest.raises(OutOfMemoryError, match=r"smaller size \(0\.4b, 0\.8b, 1b\)"):
        one_request.infer(manager, "pose", photo(), "5b")


@pytest.mark.slow
def test_out_of_memory_in_all_tasks_skips_that_task_and_trims(tiny_checkpoints, app_module, tmp_path) -> None:
    manager = serving.ModelManager(device="cpu", factory=oom_factory(tiny_checkpoints, large="1b"))
    run = runner(app_module, manager, tmp_path)
    jobs = [
        (T("pose"), "0.4b", {}),
        (T("seg"), "0.4b", {}),
        (T("matting"), "1b", {}),  # matting only has 1b: out of memory there
        (T("features"), "0.1b", {}),
    ]
    shown, status = run.run_all(photo(), jobs)
    assert status.startswith("3 of 4 tasks (skipped: Matting): done in"), status
    assert isinstance(shown["matting"], OutOfMemoryError)  # errors travel as objects
    assert re.match(r"Out of GPU memory running matting 1b.*smaller photo", str(shown["matting"]))
    assert all(isinstance(shown[t], serving.Presented) for t in ("pose", "seg", "features"))
    assert len(manager.loaded()) == 1  # trimmed after the failure
    assert run(T("seg"), photo(), "0.4b").after.shape == (40, 30, 3)


# ----------------------------------------------------------------------------- output files


class Named(io.BytesIO):
    """An upload stream carrying a hostile client-side file name."""

    def __init__(self, data: bytes, name: str) -> None:
        super().__init__(data)
        self.name = name


def png_bytes() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(photo()).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize(
    "name",
    [
        "../../etc/x.png",
        "..\\..\\windows\\x.png",
        "/etc/passwd",
        "~/.ssh/id_rsa.png",
        "a/../../b.png",
        "-rf .png",
        "..",
        "",
    ],
)
def test_user_supplied_names_never_become_paths(tiny_checkpoints, app_module, tmp_path, name: str) -> None:
    manager = serving.ModelManager(device="cpu", checkpoints={"pose": tiny_checkpoints["pose"]},
                                   factory=lambda t, s, **kw: shrink(pipeline(t, s, **kw, detector=None)))  # fmt: skip
    run = runner(app_module, manager, tmp_path)
    first = run(T("pose"), Named(png_bytes(), name), None)
    second = run(T("pose"), Named(png_bytes(), name), None)
    requests = tmp_path / "requests"
    for shown in (first, second):
        folder = shown.files[0].parent
        assert folder.parent == requests and folder.name.startswith("req-")
        for p in shown.files:
            assert p.parent == folder and p.resolve().is_relative_to(requests.resolve())
            assert re.fullmatch(
                r"[A-Za-z0-9_-]+_(pose|coco17|coco_wholebody|openpose_body25|openpose_coco18|openpose|keypoints)"
                r"\.(json|png|csv)",
                p.name,
            ), p.name
    assert first.files[0].parent != second.files[0].parent  # each request has its own folder
    everything = [p for p in tmp_path.rglob("*") if p.is_file()]
    previews = [p for shown in (first, second) for p in shown.previews]  # fixed names, beside the files
    assert all(
        p.parent == shown.files[0].parent / "preview" for shown in (first, second) for p in shown.previews
    )
    assert sorted(everything) == sorted(first.files + second.files + previews)  # nothing anywhere else


def test_a_result_renamed_to_a_path_still_saves_inside_its_folder(tiny_checkpoints, tmp_path) -> None:
    pipe = shrink(pipeline("seg", checkpoint=tiny_checkpoints["seg"], device="cpu"))
    result = pipe(photo())
    result.name = "../../../tmp/escape"
    out = tmp_path / "req"
    paths = result.save(out)
    assert paths and all(p.parent == out for p in paths)
    assert [p for p in tmp_path.rglob("*") if p.is_file() and p.parent != out] == []


# ----------------------------------------------------------------------------- memory


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(heap._malloc_trim() is None, reason="glibc only (malloc_trim)")
def test_release_memory_gives_freed_request_buffers_back() -> None:
    kept: list[np.ndarray] = []

    def request() -> None:  # like a request on a server thread: many buffers, a few outlive it
        buffers = [np.ones(8000) for _ in range(2000)]  # 64 kB each: from this thread's malloc arena
        kept.extend(buffers[::50])

    worker = threading.Thread(target=request)
    worker.start()
    worker.join()
    before = _rss_mb()
    serving.release_memory(keep_bytes=0)
    assert before - _rss_mb() > 50  # ~120 MB of freed pages go back; without the trim they stay
    assert len(kept) == 40


def test_release_memory_keeps_a_warm_heap_up_to_its_budget(monkeypatch) -> None:
    """The trim waits until the free heap has grown by ``keep_bytes`` since the last trim: up to
    that much stays mapped for the next request. The growth decides, not the total: after a trim
    the free blocks are still counted as free, so one very large request must not make every
    later request trim."""
    from sapiens2.runtime import heap as memory

    gib = 1 << 30
    free = [0]
    trims: list[int] = []

    def trim(pad: int) -> int:
        trims.append(pad)
        free[0] -= gib // 4  # the top of the heap goes back; the blocks inside stay counted free
        return 1

    monkeypatch.setattr(memory, "_malloc_trim", lambda: trim)
    monkeypatch.setattr(memory, "heap_free_bytes", lambda: free[0])
    monkeypatch.setattr(memory, "_free_after_trim", 0)
    for now, trimmed in [
        (gib // 2, False),  # a 12 MP request left 0.5 GiB free: kept warm
        (gib // 2, False),  # the next one reused it
        (3 * gib, True),  # a 48 MP request: 3 GiB free, past the budget -> trim (2.75 GiB left counted)
        (3 * gib - gib // 4, False),  # later 12 MP requests reuse those blocks: no trim each time
        (3 * gib, False),
        (4 * gib, True),  # 1.25 GiB more than after the last trim
    ]:
        free[0] = now
        before = len(trims)
        memory.release_memory()
        assert (len(trims) > before) is trimmed, (now / gib, trims)
    assert memory.KEEP_FREE_BYTES == gib  # the server's budget (docs/PERFORMANCE.md)
    memory.release_memory(keep_bytes=0)  # 0: always
    assert len(trims) == 3


def test_every_app_request_releases_memory_even_when_it_fails(
    tiny_checkpoints, app_module, tmp_path, monkeypatch
):
    calls: list[int] = []
    teams: list[int] = []
    monkeypatch.setattr(serving, "release_memory", lambda: calls.append(1))
    monkeypatch.setattr(serving, "release_cpu_threads", lambda: teams.append(1))
    manager = serving.ModelManager(
        device="cpu", checkpoints={"seg": tiny_checkpoints["seg"]}, factory=quick_factory
    )
    run = runner(app_module, manager, tmp_path)
    run(T("seg"), photo(), None)
    with pytest.raises(app_module.gr.Error, match="No photo given"):
        run(T("seg"), None, None)
    assert len(calls) == 2
    assert len(teams) == 2  # the OpenMP workers of the request's thread are let go either way
