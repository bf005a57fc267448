"""The serving layer: model cache (lock, failures, LRU, trim), option checks, OOM path, folders."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import one_request
import pytest
import torch
from forking import expect_child_success
from registry_helpers import task as T

from sapiens2 import serving
from sapiens2.errors import InputImageError, OptionError, OutOfMemoryError, WeightsUnavailableError
from sapiens2.models import cost
from sapiens2.models.checkpoints import CHECKPOINTS_ENV, Checkpoints
from sapiens2.outputs.render import parse_color
from sapiens2.serving import ModelManager
from sapiens2.serving.cache import CUSTOM
from sapiens2.serving.request_runner import read_photo

ASSETS = Path(__file__).resolve().parents[1] / "assets"


class CountingFactory:
    """Builds stand-in pipelines and records every build (optionally slow, optionally failing)."""

    def __init__(self, delay: float = 0.0, fail_first: int = 0) -> None:
        self.calls: list[tuple[str, str | None]] = []
        self.delay = delay
        self.fail_first = fail_first
        self._lock = threading.Lock()

    def __call__(self, task: str, size: str | None, **kwargs):
        with self._lock:
            self.calls.append((task, size))
            n = len(self.calls)
        time.sleep(self.delay)
        if n <= self.fail_first:
            raise WeightsUnavailableError(f"simulated: weights for {task} {size} missing")
        return object()


# ----------------------------------------------------------------------------- cache


def test_two_threads_needing_the_same_model_load_it_once() -> None:
    factory = CountingFactory(delay=0.3)
    manager = ModelManager(device="cpu", factory=factory)
    start = threading.Barrier(3)
    got: list[object] = []

    def worker() -> None:
        start.wait()
        got.append(manager.get(T("seg"), "0.4b"))

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert factory.calls == [("seg", "0.4b")]
    assert len(got) == 3 and got[0] is got[1] is got[2]
    assert manager.loads == 1


def test_different_models_load_in_parallel() -> None:
    # one lock per key: a slow load of one model must not serialise another model's load. Each
    # load waits until all three are under way, so serialised loads never meet: the barrier times
    # out in the first and is broken for the rest (counted, not timed: a busy machine cannot fail it)
    meet = threading.Barrier(3, timeout=30)
    met: list[str] = []

    def factory(task: str, size: str | None, **kwargs: object) -> object:
        meet.wait()
        met.append(task)
        return object()

    manager = ModelManager(device="cpu", factory=factory)
    threads = [threading.Thread(target=manager.get, args=(T(t), None)) for t in ("seg", "normal", "matting")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(met) == ["matting", "normal", "seg"] and manager.loads == 3


def test_failed_load_is_not_cached_and_the_next_request_retries() -> None:
    factory = CountingFactory(fail_first=1)
    manager = ModelManager(device="cpu", factory=factory)
    with pytest.raises(WeightsUnavailableError, match="simulated"):
        manager.get(T("pose"), "0.4b")
    assert manager.loaded() == [] and manager.failures == 1
    pipe = manager.get(T("pose"), "0.4b")
    assert pipe is not None and manager.loaded() == [("pose", "0.4b")]
    assert len(factory.calls) == 2


def test_missing_checkpoint_error_then_success_once_the_file_exists(tmp_path, tiny_checkpoints) -> None:
    # real loader: a checkpoint that appears after a failure is picked up by the next request
    target = tmp_path / "late_seg"
    manager = ModelManager(device="cpu", checkpoints={"seg": target})
    with pytest.raises(WeightsUnavailableError, match="late_seg"):
        manager.get(T("seg"))
    assert manager.loaded() == []
    shutil.copytree(tiny_checkpoints["seg"], target)
    pipe = manager.get(T("seg"))
    assert type(pipe).__name__ == "SegPipeline"
    assert manager.loaded() == [("seg", CUSTOM)]
    assert manager.get(T("seg"), "5b") is pipe  # an explicit checkpoint serves every size


@pytest.mark.slow
def test_lru_bound_evicts_least_recently_used() -> None:
    manager = ModelManager(device="cpu", max_models=2, factory=CountingFactory())
    manager.get(T("seg"), "0.4b")
    manager.get(T("seg"), "0.8b")
    manager.get(T("seg"), "0.4b")  # now the most recent
    manager.get(T("seg"), "1b")
    assert manager.loaded() == [("seg", "0.4b"), ("seg", "1b")]
    manager.get(T("seg"), "0.8b")  # evicted before, so it loads again
    assert manager.loads == 4
    assert len(manager.loaded()) == 2


@pytest.mark.slow
def test_pinned_models_are_not_evicted_and_preload_reports_failures() -> None:
    factory = CountingFactory()
    manager = ModelManager(device="cpu", max_models=1, factory=factory)
    assert manager.preload([T("pose"), T("seg")]) == {}
    manager.get(T("normal"), "0.4b")
    manager.get(T("normal"), "1b")
    assert set(manager.loaded()) == {("pose", "0.4b"), ("seg", "0.4b"), ("normal", "1b")}

    failing = ModelManager(device="cpu", factory=CountingFactory(fail_first=5))
    failed = failing.preload([T("pose"), T("matting")])  # never raises: the app must start without weights
    assert set(failed) == {"pose", "matting"} and "simulated" in failed["pose"]


def test_preload_by_default_leaves_sapiens_v1_defaults_to_their_first_use() -> None:
    """As the Space card's preload_from_hub: depth (a v1 default) is not loaded at launch, so its
    weights do not lengthen every ZeroGPU call's start; every other task shown is."""
    manager = ModelManager(device="cpu", factory=CountingFactory())
    assert manager.preload() == {}
    shown = set(manager.tasks())
    assert "depth" in shown and {task for task, _ in manager.loaded()} == shown - {"depth"}


@pytest.mark.slow
def test_trim_keeps_the_most_recent_and_clear_drops_all() -> None:
    manager = ModelManager(device="cpu", factory=CountingFactory())
    for task in ("pose", "seg", "normal"):
        manager.get(T(task))
    manager.get(T("seg"))
    dropped = manager.trim()
    assert set(dropped) == {("pose", "0.4b"), ("normal", "0.4b")}
    assert manager.loaded() == [("seg", "0.4b")]
    manager.clear()
    assert manager.loaded() == []


@pytest.mark.slow
def test_trim_keeps_pinned_models_and_clear_drops_them() -> None:
    # On ZeroGPU the preloaded (pinned) models are packed at launch; an OOM trim must keep them.
    manager = ModelManager(device="cpu", factory=CountingFactory())
    assert manager.preload([T("pose"), T("matting")]) == {}
    for size in ("0.4b", "0.8b", "1b"):
        manager.get(T("seg"), size)
    dropped = manager.trim()
    assert dropped == [("seg", "0.4b"), ("seg", "0.8b")]
    assert manager.loaded() == [("pose", "0.4b"), ("matting", "1b"), ("seg", "1b")]
    assert manager.trim(keep=0) == [("seg", "1b")]
    assert manager.loaded() == [("pose", "0.4b"), ("matting", "1b")]
    manager.clear()
    assert manager.loaded() == [] and manager._pinned == set()


@pytest.mark.slow
def test_a_pinning_request_that_waited_for_another_threads_load_pins_it() -> None:
    factory = CountingFactory(delay=0.4)
    manager = ModelManager(device="cpu", factory=factory)
    plain = threading.Thread(target=lambda: manager.get(T("seg"), "0.4b"))
    plain.start()
    deadline = time.monotonic() + 5
    while not factory.calls and time.monotonic() < deadline:  # the plain load is under way
        time.sleep(0.01)
    manager.get(T("seg"), "0.4b", pin=True)  # waits on the per-key lock, then finds it cached
    plain.join(10)
    assert factory.calls == [("seg", "0.4b")]
    assert manager.trim(keep=0) == [] and manager.loaded() == [("seg", "0.4b")]


def test_pose_requests_warm_the_detector_on_the_managers_device(monkeypatch) -> None:
    from sapiens2.models import detector as detect

    devices: list[object] = []
    monkeypatch.setattr(detect, "_auto_detector", lambda device=None: devices.append(device))
    manager = ModelManager(device="cpu", factory=CountingFactory())
    manager.prepare(T("pose"))
    manager.preload([T("pose")])
    assert devices == ["cpu", "cpu"]


def test_normal_and_pointmap_borrow_the_managers_seg_model(tiny_checkpoints) -> None:
    manager = ModelManager(device="cpu", checkpoints=tiny_checkpoints)
    manager.prepare(T("normal"), None, remove_background=True)
    assert set(manager.loaded()) == {("normal", CUSTOM), ("seg", CUSTOM)}
    normal = manager.get(T("normal"))
    assert normal.seg.get() is manager.get(T("seg"))  # one seg model shared with the Body parts tab
    manager.prepare(T("pointmap"), None, use_segmentation=False)
    assert ("pointmap", CUSTOM) in manager.loaded()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_worker_can_use_the_cache_even_if_a_lock_was_held_at_fork() -> None:
    # ZeroGPU runs GPU functions in a process forked from the server, possibly while another
    # request thread holds the cache's lock; the child must not inherit a lock held forever.
    manager = ModelManager(device="cpu", factory=CountingFactory())
    pipe = manager.get(T("seg"))
    with manager._guard:  # as if another thread were inside the cache at fork time
        pid = os.fork()
        if pid == 0:  # child: exit 0 only if the cached pipeline is reachable
            os._exit(0 if manager.get(T("seg")) is pipe else 1)
    expect_child_success(pid, "the model cache's lock")


# ----------------------------------------------------------------------------- sizes and options


def test_default_sizes_follow_the_device_and_the_override() -> None:
    cpu = ModelManager(device="cpu", factory=CountingFactory())
    gpu = ModelManager(device="cuda", factory=CountingFactory())
    assert [cpu.default_size(T(t)) for t in ("pose", "matting", "features")] == ["0.4b", "1b", "0.1b"]
    assert [gpu.default_size(T(t)) for t in ("pose", "matting", "features")] == ["1b", "1b", "0.1b"]
    small = ModelManager(device="cuda", size="0.8b", factory=CountingFactory())
    assert [small.default_size(T(t)) for t in ("pose", "matting", "features")] == ["0.8b", "1b", "0.8b"]


def test_size_not_offered_names_the_sizes() -> None:
    manager = ModelManager(device="cpu", factory=CountingFactory())
    with pytest.raises(OptionError, match=r"'7b'.*0\.4b, 0\.8b, 1b, 5b"):
        manager.get(T("pose"), "7b")
    with pytest.raises(OptionError, match=r"choose one of: 1b"):
        manager.resolve_size(T("matting"), "0.4b")
    with pytest.raises(OptionError, match="pose, seg, normal"):
        manager.get(T("height"))
    assert manager.loads == 0


@pytest.mark.parametrize(
    ("task", "options", "message"),
    [
        ("pose", {"threshold": 1.5}, r"'threshold' must be a number from 0 to 1; got 1\.5"),
        ("pose", {"threshold": float("nan")}, r"from 0 to 1"),
        ("pose", {"max_people": 0}, r"'max_people' must be a number from 1 to 50"),
        ("pose", {"max_people": 2.5}, r"whole number from 1 to 50"),
        ("pose", {"flip_test": "maybe"}, r"'flip_test' must be true or false"),
        (
            "pose",
            {"tresh": 0.2},
            r"Unknown pose option 'tresh'; allowed: flip_test, max_people, keypoints_3d, threshold",
        ),
        ("seg", {"classes": ["left hand", "wings"]}, r"'wings'.*Face_Neck.*Left_Hand"),
        ("seg", {"opacity": -0.1}, r"'opacity' must be a number from 0 to 1"),
        ("normal", {"background": "white"}, r"must be one of: black, photo; got 'white'"),
        ("matting", {"background_color": "green"}, r"'#rrggbb'"),
        ("features", {"threshold": 0.3}, r"Unknown features option 'threshold'; allowed: per_person\."),
    ],
)
def test_option_validation_messages(task: str, options: dict, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        one_request.split_options(task, options)


def test_options_split_into_inference_and_rendering_with_defaults() -> None:
    infer_opts, render_opts = one_request.split_options("pose", {"threshold": "0.5", "flip_test": True})
    assert infer_opts == {"flip_test": True, "max_people": 20, "keypoints_3d": False}
    assert render_opts == {"threshold": 0.5, "show_face": True, "body_only": False, "show_boxes": True}
    _, seg = one_request.split_options("seg", {"classes": ["left hand", "Face_Neck"]})
    assert seg["classes"] == [3, 6] and seg["opacity"] == 0.5
    _, seg_all = one_request.split_options("seg", {"classes": []})
    assert seg_all["classes"] is None
    _, mat = one_request.split_options("matting", {"background_color": "rgba(255, 0, 10, 1)"})
    assert mat["background_color"] == (255, 0, 10)
    assert parse_color("#00B140") == (0, 177, 64)


def test_colour_options_take_the_renderers_forms_and_name_the_option() -> None:
    for value, rgb in [("#fff", (255, 255, 255)), ("#00b140ff", (0, 177, 64)), ("rgb(1, 2, 3)", (1, 2, 3))]:
        assert one_request.split_options("matting", {"background_color": value})[1]["background_color"] == rgb
    with pytest.raises(OptionError, match=r"^The matting option 'background_color': Colour 'sky' is not"):
        one_request.split_options("matting", {"background_color": "sky"})


def test_checkpoint_specs_from_cli_and_env(monkeypatch, tmp_path) -> None:
    specs = Checkpoints.parse(["pose=/ckpt/p.safetensors", "features=~/f"])
    assert specs == {"pose": Path("/ckpt/p.safetensors"), "features": Path("~/f").expanduser()}
    monkeypatch.setenv(CHECKPOINTS_ENV, f"seg={tmp_path}, normal={tmp_path}/n")
    assert Checkpoints.from_env() == {"seg": tmp_path, "normal": tmp_path / "n"}
    assert (Checkpoints.from_env() | specs)["pose"] == Path("/ckpt/p.safetensors")  # both, merged
    with pytest.raises(OptionError, match=r"TASK=PATH with TASK one of: pose, seg"):
        Checkpoints.parse(["pose"])
    with pytest.raises(OptionError, match=r"Unknown task 'hands'"):
        Checkpoints.parse("hands=/x")
    with pytest.raises(OptionError, match=r"Unknown task 'pretrain'"):  # one name per task
        Checkpoints.parse("pretrain=/x")


# ----------------------------------------------------------------------------- requests


class _OomPipeline:
    """Follows the pipeline contract (prepare / infer / finish); its device work runs out of memory."""

    def prepare(self, intake, **kwargs):
        return intake

    def infer(self, batch, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")


@pytest.mark.slow
def test_out_of_memory_trims_the_cache_and_advises_a_smaller_size() -> None:
    manager = ModelManager(device="cpu", factory=lambda task, size, **kw: _OomPipeline())
    manager.get(T("seg"), "0.4b")
    manager.get(T("normal"), "0.4b")
    with pytest.raises(OutOfMemoryError, match=r"pose 5b.*smaller size \(0\.4b, 0\.8b, 1b\)"):
        one_request.infer(manager, "pose", np.zeros((8, 8, 3), np.uint8), "5b")
    assert manager.loaded() == [("pose", "5b")]  # the others were dropped
    with pytest.raises(OutOfMemoryError, match="use a smaller photo"):
        one_request.infer(manager, "pose", np.zeros((8, 8, 3), np.uint8), "0.4b")
    assert serving.is_out_of_memory(RuntimeError("CUDA error: out of memory"))
    assert not serving.is_out_of_memory(RuntimeError("shape mismatch"))


def test_read_photo_errors_are_clear(tmp_path) -> None:
    with pytest.raises(InputImageError, match="No photo given"):
        read_photo(None)
    fake = tmp_path / "notes.jpg"
    fake.write_text("this is not a picture")
    with pytest.raises(InputImageError) as err:
        read_photo(str(fake))
    assert "text" in str(err.value).lower()
    intake = read_photo(str(ASSETS / "nasa-eileen-collins-portrait.png"))
    assert intake.rgb.shape == (512, 512, 3) and intake.name == "nasa-eileen-collins-portrait"


def _photo_reservation(task: str, size: str, pixels: int, **opts: Any) -> int:
    """The one reservation of a one-photo call with the request's own models resident (the work
    does not depend on the photo's pixels: the network input is the same size)."""
    from sapiens2.serving.request_runner import Job, call_seconds

    return call_seconds([Job(T(task), size, [None], opts, {})], 0)


def test_reservations_scale_with_work_and_stay_bounded() -> None:
    small = _photo_reservation("seg", "0.4b", 512 * 512)
    big = _photo_reservation("seg", "5b", 512 * 512)
    # the floor is a bare worker start (durations now count the resident weights; issue 13)
    assert cost.MIN_CALL_S <= small < big <= cost.MAX_CALL_S
    assert _photo_reservation("pose", "1b", 0, flip_test=True) > _photo_reservation("pose", "1b", 0)
    assert _photo_reservation("normal", "1b", 0, remove_background=True) > _photo_reservation(
        "normal", "1b", 0
    )
    assert _photo_reservation("features", "1b-4k", 10**8) <= 120


def test_request_folders_are_unique_and_old_ones_pruned(tmp_path) -> None:
    folders = serving.RequestFolders(tmp_path, max_age_s=60)
    a, b = folders.new(), folders.new()
    assert a != b and a.parent == b.parent == tmp_path and a.is_dir()
    (a / "x.png").write_bytes(b"1")
    old = time.time() - 3600
    os.utime(a, (old, old))
    assert folders.prune(force=True) == 1
    assert not a.exists() and b.exists()


def _matting_result():
    from sapiens2.tasks.base import RunInfo
    from sapiens2.tasks.matting import MattingResult

    h, w = 40, 30
    alpha = np.zeros((h, w), np.float32)
    alpha[10:30, 5:25] = 1.0
    return MattingResult(
        image=np.full((h, w, 3), 200, np.uint8),
        info=RunInfo("matting", "1b", "cpu", "float32"),
        name="photo",
        foreground=np.dstack([alpha, alpha * 0, alpha * 0]),  # red person, premultiplied
        alpha=alpha,
    )


def test_present_matting_over_a_background_image_of_another_size(tmp_path) -> None:
    bg = tmp_path / "beach.png"
    from PIL import Image

    Image.new("RGB", (300, 17), (0, 0, 255)).save(bg)
    _, render_opts = one_request.split_options("matting", {"background_image": str(bg)})
    shown = serving.present(T("matting"), _matting_result(), tmp_path / "out", **render_opts)
    assert shown.after.shape == (40, 30, 3)
    assert tuple(shown.after[0, 0]) == (0, 0, 255) and tuple(shown.after[20, 15]) == (255, 0, 0)
    assert {p.name for p in shown.files} >= {"photo_cutout.png", "photo_alpha.png", "photo_composite.png"}
    assert all(p.parent == tmp_path / "out" for p in shown.files)


def test_present_saves_the_rendering_it_shows_without_rendering_twice(tmp_path) -> None:
    from PIL import Image

    result = _matting_result()
    calls: list[dict] = []
    render = result.render
    result.render = lambda **kw: calls.append(kw) or render(**kw)  # type: ignore[method-assign]
    _, render_opts = one_request.split_options("matting", {"background_color": "#fff"})
    shown = serving.present(T("matting"), result, tmp_path, **render_opts)
    saved = np.asarray(Image.open(tmp_path / "photo_composite.png").convert("RGB"))
    assert len(calls) == 1 and np.array_equal(saved, shown.after)
    assert tuple(saved[0, 0]) == (255, 255, 255)


def _normal_result(h: int = 300, w: int = 400):
    from sapiens2.tasks.base import RunInfo
    from sapiens2.tasks.normal import NormalResult

    rng = np.random.default_rng(3)
    n = rng.standard_normal((h, w, 3)).astype(np.float32)
    return NormalResult(
        image=rng.integers(0, 256, (h, w, 3), dtype=np.uint8),
        info=RunInfo("normal", "0.4b", "cpu", "float32"),
        name="photo",
        normals=n / np.linalg.norm(n, axis=2, keepdims=True),
        mask=rng.random((h, w)) > 0.5,
    )


@pytest.mark.parametrize("make", [_normal_result, _matting_result])
def test_present_writes_side_by_side_the_files_a_sequential_save_writes(tmp_path, monkeypatch, make) -> None:
    import cv2

    encoders: set[str] = set()
    imencode = cv2.imencode
    monkeypatch.setattr(
        cv2,
        "imencode",
        lambda *a, **k: encoders.add(threading.current_thread().name) or imencode(*a, **k),
    )
    result = make()
    shown = serving.present(T(result.info.task), result, tmp_path / "out", preview_side=64)
    assert encoders and all(name.startswith("sapiens2-write") for name in encoders)  # on the pool
    sequential = result.save(tmp_path / "seq", rendered=shown.after)  # no pool: one after another
    assert [p.name for p in shown.files] == [p.name for p in sequential]
    for a, b in zip(sequential, shown.files, strict=True):
        assert b.read_bytes() == a.read_bytes(), b.name
    from sapiens2.tasks import registry

    task = registry.get(result.info.task).api_name
    assert [p.name for p in shown.previews] == [
        f"{result.name}_preview.jpg",
        f"{result.name}_{task}_preview.jpg",
    ]
    assert all(p.is_file() for p in shown.previews)
    assert list(shown.stages.seconds) == ["render", "downloads", "previews", "views"]


def test_present_fails_as_a_sequential_save_does_when_a_write_fails(tmp_path) -> None:
    (tmp_path / "photo_normal.png").mkdir(parents=True)  # where the picture should go: a folder
    with pytest.raises(IsADirectoryError) as raised:
        serving.present(T("normal"), _normal_result(), tmp_path, preview_side=64)
    assert Path(raised.value.filename).name == "photo_normal.png"
    assert (tmp_path / "photo_normal.npy").is_file()  # the writes started before are finished


def test_present_names_a_bad_background_image(tmp_path) -> None:
    bad = tmp_path / "bg.jpg"
    bad.write_bytes(b"")
    with pytest.raises(InputImageError, match=r"^Background image: .*empty"):
        serving.present(T("matting"), _matting_result(), tmp_path, background_image=str(bad))


def test_compile_switch_on_cpu_loads_eager_and_says_why(tiny_checkpoints) -> None:
    """--compile is safe everywhere: off CUDA the model stays eager and the report says why."""
    manager = ModelManager(device="cpu", checkpoints={"matting": tiny_checkpoints["matting"]}, compile=True)
    pipe = manager.get(T("matting"))
    [(key, report)] = manager.compile_reports.items()
    assert key[0] == "matting"
    assert not report.applied and "CUDA" in report.reason
    assert pipe.model._compiled_call_impl is None  # still the eager forward


def test_units_of_device_work_are_typed_and_picklable(tmp_path) -> None:
    """What one GPU call runs crosses to a ZeroGPU worker pickled: each unit keeps its task object
    (pickled by name), its seconds, and runs the same after the trip."""
    import pickle

    from sapiens2.serving.device import AllTasks, Batch, Clip, Feed, OneTask

    prep = np.zeros((4, 4, 3), np.uint8)
    one = OneTask(Batch(T("seg"), "0.4b", (prep,), {}), 9)
    every = AllTasks((one.batch, Batch(T("pose"), "1b", (prep,), {"flip_test": True})), 30)
    clip = Clip(("pose", "pointmap"), (one.batch,), Feed(), budget_s=None, seconds=40)
    for unit, what in ((one, "seg"), (every, "all tasks"), (clip, "pose + pointmap")):
        back = pickle.loads(pickle.dumps(unit))
        assert type(back) is type(unit) and back.seconds == unit.seconds and back.what == what
    back = pickle.loads(pickle.dumps(every))
    assert [b.task for b in back.batches] == [T("seg"), T("pose")]  # the same declarations
    assert back.batches[1].options == {"flip_test": True} and np.array_equal(back.batches[0].preps[0], prep)
    manager = ModelManager(device="cpu", factory=lambda task, size, **kw: StubInvert())
    manager.get(T("seg"), "0.4b")
    assert [list(r) for r in pickle.loads(pickle.dumps(one)).run(manager)] == [["inverted"]]
    manager.get(T("pose"), "1b")
    assert [i for i, _ in back.run(manager)] == [0, 1]  # every task's raws, by index


class StubInvert:
    """A pipeline whose device step answers one word per prepared input."""

    def infer(self, preps, **opts):
        return ["inverted" for _ in preps]
