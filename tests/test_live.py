"""The live path without Gradio (``sapiens2.serving.live``): newest frame only, dropped frames
counted, bounded latency with a slow model, the release's input kept bit for bit, the smaller
inputs, pose tracks and smoothing, the slowly adapting depth scale, the virtual background,
restarts, and hostile frames and options. Tiny checkpoints; counts, not timings, decide, except
one latency bound with a wide margin."""

from __future__ import annotations

import dataclasses
import io
import pickle
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from video_clips import boxes_at, frame_at

from sapiens2 import serving
from sapiens2.errors import InputImageError, OptionError
from sapiens2.inputs.intake import load_image
from sapiens2.models import cost
from sapiens2.models.cost import Work
from sapiens2.serving.device import Batch, Detect, OneTask
from sapiens2.serving.frame_cost import attention_macs
from sapiens2.serving.live import (
    INPUTS,
    MAX_SIDE,
    LatestFrame,
    LiveOptions,
    LiveSession,
    cpu_seconds_per_frame,
    frame_seconds,
    input_label,
    live_setup,
    live_size,
)
from sapiens2.tasks import registry
from sapiens2.tasks.base import run_batch
from sapiens2.tasks.pointmap.frame_depth_colours import DepthScale, foreground_depth, global_depth_bounds
from sapiens2.tasks.pose.pose_tracking import TrackingOptions
from sapiens2.tasks.seg.seg_logits import SegLogits
from sapiens2.tasks.seg.seg_nearest import NearestLabels, nearest_index

FAST = "512x384"
T = registry.get  # tests name tasks; the package below the edges takes Task objects


@pytest.fixture(scope="module")
def manager(tiny_checkpoints) -> Iterator[serving.ModelManager]:
    """The tiny models; no Hub (the person detector's weights are missing: pose then takes the
    whole frame as one person, with a notice)."""
    from huggingface_hub import constants

    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setattr(constants, "HF_HUB_OFFLINE", True)
    yield serving.ModelManager(device="cpu", checkpoints=tiny_checkpoints)
    mp.undo()


def camera(i: int, w: int = 160, h: int = 120) -> np.ndarray:
    """A camera frame: the two moving boxes of the video tests, on a textured background."""
    img = frame_at(i, w, h)
    img[::7, ::5] = 90  # some texture for the models
    return img


# ----------------------------------------------------------------------------- the mailbox


def test_the_mailbox_keeps_only_the_newest_frame_and_counts_the_rest() -> None:
    box = LatestFrame()
    for i in range(3):
        box.put(np.full((2, 2, 3), i, np.uint8), at=float(i))
    frame, at = box.take(timeout=1)
    assert int(frame[0, 0, 0]) == 2 and at == 2.0
    assert box.dropped == 2 and box.put_count == 3
    assert box.take(timeout=0.05) is None  # nothing new: waits, then gives up
    box.put(np.zeros((2, 2, 3), np.uint8))
    box.close()
    assert box.take(timeout=1) is not None  # a frame put before closing is still taken
    assert box.take(timeout=5) is None and box.closed  # closed: returns at once


@pytest.mark.slow
def test_a_slow_model_builds_no_backlog_and_its_latency_stays_bounded(manager) -> None:
    """A camera putting a frame every 10 ms in front of a model taking 0.3 s a frame: the session
    always takes the newest frame, every other frame is counted as dropped, and no frame waits
    longer than the frame before it took (plus its own time)."""
    slow_s = 0.3

    def slow_device(unit: Any) -> Iterator[Any]:
        time.sleep(slow_s)
        return unit.run(manager)

    session = LiveSession(manager, device=slow_device)
    box = LatestFrame()
    shown: list[Any] = []
    stop = threading.Event()

    def camera_thread() -> None:
        i = 0
        while not stop.is_set():
            box.put(camera(i))
            i += 1
            time.sleep(0.01)
        box.close()

    feeder = threading.Thread(target=camera_thread)
    feeder.start()
    try:
        stats = session.run(
            box,
            LiveOptions(T("seg"), input=FAST),
            lambda f: (shown.append(f), len(shown) >= 6 and stop.set()),
        )
    finally:
        stop.set()
        feeder.join()
    assert len(shown) >= 6 and stats.frames == len(shown)
    waiting = 1 if box.take(timeout=0) is not None else 0
    assert stats.frames + stats.dropped + waiting == box.put_count  # every frame taken or dropped
    assert stats.dropped > 2 * stats.frames  # most frames were never processed
    for before, frame in zip(shown, shown[1:], strict=False):  # bounded: never more than two frames' time
        assert frame.latency_s <= before.step_s + frame.step_s + 1.0, (before.step_s, frame.latency_s)
    assert "dropped" in shown[-1].readout and f"{stats.frames} frames" in shown[-1].readout


def test_each_frame_s_device_work_is_a_priced_picklable_unit(manager) -> None:
    """The session hands its device units, as a request does: pose's person detection every
    K-th frame and each frame's forward (a OneTask each, of a Detect and of a Batch), each pickled across the way a GPU
    worker gets it and reserving what models/cost.py prices."""
    seen: list[Any] = []

    def device(unit: Any) -> Iterator[Any]:
        seen.append(pickle.loads(pickle.dumps(unit)))
        return seen[-1].run(manager)

    session = LiveSession(manager, device=device)
    options = LiveOptions(T("pose"), input=FAST, tracking=TrackingOptions(detect_every=2))
    for i in range(3):
        session.step(camera(i), options)
    assert all(type(u) is OneTask for u in seen)
    assert [type(u.batch) for u in seen] == [Detect, Batch, Batch, Detect, Batch]
    size = session._setup.size
    work = [u.batch for u in seen]
    assert all(w.task is T("pose") and w.size == size for w in work)  # a Task pickles by its name
    frame = [u for u in seen if isinstance(u.batch, Batch)][0]
    assert frame.batch.options["input_hw"] == INPUTS[FAST]
    assert frame.seconds == frame_seconds(manager, T("pose"), size, session._setup.infer_opts)
    assert frame.seconds >= cost.MIN_CALL_S and seen[0].seconds >= cost.MIN_CALL_S
    assert cost.frame_seconds("0.4b", Work(people=20)) == pytest.approx(
        cost.forward_seconds("0.4b", cost.VIDEO_PEOPLE)
    )
    with pytest.raises(OptionError, match="no person detection"):
        list(OneTask(Detect(T("seg"), size, (camera(0),), {}), 5).run(manager))


# ----------------------------------------------------------------------------- the release's input


@pytest.mark.slow
@pytest.mark.parametrize("task", ["seg", "normal", "matting", "pose", "pointmap"])
def test_input_hw_none_is_the_release_path_bit_for_bit(manager, task: str) -> None:
    """The stages with no ``input_hw``, with ``input_hw=None`` and with the checkpoint's own size
    give the same arrays as the photo call: the default keeps the release's path."""
    pipe = manager.get(T(task))
    intake = load_image(camera(1))
    opts = {"boxes": boxes_at(1)[:1] * 160 / 96} if task == "pose" else {}
    opts |= {"use_segmentation": False} if task == "pointmap" else {}  # one forward is enough here
    photo = pipe(intake, **opts)  # the photo call: run_batch(pipe, [intake], opts)
    same = [
        run_batch(pipe, [intake], {**o, **opts})[0]
        for o in ({"input_hw": None}, {"input_hw": pipe.network_hw})
    ]
    field = {
        "seg": "labels",
        "normal": "normals",
        "matting": "alpha",
        "pose": "keypoints",
        "pointmap": "pointmap",
    }[task]
    for result in same:
        np.testing.assert_array_equal(getattr(result, field), getattr(photo, field))


@pytest.mark.slow
@pytest.mark.parametrize("task", ["seg", "normal", "matting", "pose"])
def test_the_live_release_rendering_is_the_photo_s(manager, task: str) -> None:
    """Live at the release's input renders what the photo path renders (pose: the same keypoints
    through the tracker's first, unsmoothed frame; body parts: the photo's result with Live's
    labels, the network's argmax enlarged nearest-neighbour)."""
    decl = registry.get(task)
    frame = camera(2)
    session = LiveSession(manager)
    out = session.step(
        frame, LiveOptions(T(task), input="release", task_options={"background_color": "#ff0000"})
    )
    pipe = manager.get(T(task))
    if task == "pose":
        people = session._setup.people  # the whole frame is the person (no detector weights here)
        assert people.ids_issued == 1
        assert out.image.shape == frame.shape
        return
    _, render = decl.split({"background_color": "#ff0000"} if task == "matting" else {})
    photo = pipe(frame)
    if task == "seg":
        [exact] = pipe.infer([pipe.prepare(load_image(frame))])
        photo = dataclasses.replace(photo, labels=_enlarged(exact.logits.low, frame.shape[:2]))
    expected = photo.render(**decl.render_args(render))
    np.testing.assert_array_equal(out.image, expected)


def _enlarged(low: Any, hw: tuple[int, ...]) -> np.ndarray:
    """A network-resolution label map enlarged nearest-neighbour (tests/test_seg_nearest.py)."""
    return low.numpy().take(nearest_index(hw[0], low.shape[0]), 0).take(nearest_index(hw[1], low.shape[1]), 1)


def _spying(manager: serving.ModelManager, seen: list[Any]) -> Any:
    """A local device that records each unit's job options and outputs."""

    def device(unit: Any) -> Iterator[Any]:
        for out in unit.run(manager):
            seen.append((unit.batch.options, out))
            yield out

    return device


def test_live_body_parts_are_the_network_argmax_enlarged_nearest_neighbour(manager) -> None:
    """Only a uint8 label map at the network's resolution comes back from the device step; the
    frame's labels are it enlarged nearest-neighbour (the photo tab keeps its exact labels)."""
    seen: list[Any] = []
    session = LiveSession(manager, device=_spying(manager, seen))
    frame = camera(4)
    out = session.step(frame, LiveOptions(T("seg"), input=FAST))
    [(options, [raw])] = seen
    assert options["nearest_labels"] is True and isinstance(raw.logits, NearestLabels)
    pipe = manager.get(T("seg"))
    [exact] = pipe.infer([pipe.prepare(load_image(frame), input_hw=(512, 384))])
    assert isinstance(exact.logits, SegLogits) and torch.equal(raw.logits.low, exact.logits.low)
    labels = _enlarged(exact.logits.low, frame.shape[:2])
    photo = pipe(frame)
    np.testing.assert_array_equal(out.image, dataclasses.replace(photo, labels=labels).render())


@pytest.mark.slow
def test_live_depth_takes_its_foreground_from_the_nearest_enlarged_labels(manager) -> None:
    seen: list[Any] = []
    session = LiveSession(manager, device=_spying(manager, seen))
    session.step(camera(5), LiveOptions(T("pointmap")))
    [(options, [raw])] = seen
    assert options["nearest_labels"] is True and isinstance(raw.seg, NearestLabels)
    assert raw.seg.low.shape == (1024, 768)  # the borrowed model's own input


def test_a_smaller_input_runs_every_dense_task_and_is_labelled_as_not_the_release_s(manager) -> None:
    for task in ("seg", "normal", "matting"):
        pipe = manager.get(T(task))
        prep = pipe.prepare(load_image(camera(0)), input_hw=INPUTS[FAST])
        assert prep.pixels.shape[:2] == INPUTS[FAST]
        out = LiveSession(manager).step(camera(0), LiveOptions(T(task), input=FAST))
        assert out.image.shape == (120, 160, 3)
        assert f"input {input_label(FAST)}" in out.readout and "not the release's input" in out.readout
    assert "the release's input" in input_label("release") and "not" not in input_label("release")


def test_pose_takes_the_crop_size_and_pointmap_keeps_its_trained_input(manager) -> None:
    pose = manager.get(T("pose"))
    intake = load_image(camera(0, 640, 480))
    boxes = boxes_at(0) * 640 / 96
    prep = pose.prepare(intake, boxes=boxes, input_hw=(256, 192))
    [raw] = pose.infer([prep], input_hw=(256, 192))
    assert raw.keypoints.shape == (2, 308, 2) and np.isfinite(raw.keypoints).all()
    with pytest.raises(OptionError, match="multiples of 16"):
        pose.prepare(intake, boxes=boxes, input_hw=(250, 192))
    pointmap = manager.get(T("pointmap"))
    with pytest.raises(OptionError, match="only at its trained input 1024x768"):
        pointmap.prepare(intake, input_hw=(512, 384))
    options = LiveOptions(T("pointmap"), input=FAST, task_options={"use_segmentation": False})
    out = LiveSession(manager).step(camera(0), options)
    assert "1024x768 (Pointmap / 3D runs only at the release's input)" in out.readout


# ----------------------------------------------------------------------------- rendering per kind


def test_pose_live_tracks_ids_detects_every_k_frames_and_smooths(manager) -> None:
    """A detector that finds the two boxes: ids stay 0 and 1 while they move, the detector runs
    on frames 0 and 3 only (detect_every=3), and smoothing moves the drawn keypoints."""
    calls: list[int] = []
    pose = manager.get(T("pose"))
    before = pose.detector

    def detector(rgb: np.ndarray) -> np.ndarray:
        calls.append(1)
        from video_clips import find_boxes

        return np.array(list(find_boxes(rgb).values()))

    pose.detector = detector
    try:
        session = LiveSession(manager)
        options = LiveOptions(T("pose"), input=FAST, tracking=TrackingOptions(detect_every=3))
        for i in range(6):
            session.step(camera(i, 192, 128), options, captured_at=100.0 + 0.1 * i)
        people = session._setup.people
        assert len(calls) == 2  # frames 0 and 3
        assert people.ids_issued == 2
        assert sorted(t.track_id for t in people.tracker.tracks) == [0, 1]
        assert set(people.smoother._filters) == {0, 1}
    finally:
        pose.detector = before


def test_depth_uses_one_slowly_adapting_colour_scale() -> None:
    near = np.full((40, 40), 2.0, np.float32)
    near[:, :20] = 1.0
    far = near * 2
    scale = DepthScale(time_constant_s=2.0)
    first = scale.update(foreground_depth(near, None), 0.0)
    assert first == pytest.approx(global_depth_bounds([foreground_depth(near, None)]), rel=1e-6)
    moved = scale.update(foreground_depth(far, None), 1.0)  # 1 s later, everything twice as far
    a = 1 - np.exp(-0.5)
    expected_near = 1 / (1 / first[0] + a * (1 / (2 * first[0]) - 1 / first[0]))
    assert moved[0] == pytest.approx(expected_near, rel=1e-5)
    assert first[0] < moved[0] < 2 * first[0]  # part of the way, not the whole jump
    assert scale.update(np.full((40, 40), np.nan, np.float16), 2.0) == moved  # no foreground: kept
    for t in range(3, 40):
        settled = scale.update(foreground_depth(far, None), float(t))
    assert settled[0] == pytest.approx(2 * first[0], rel=1e-3)


def test_live_depth_renders_with_the_scale(manager) -> None:
    session = LiveSession(manager)
    options = LiveOptions(T("pointmap"), task_options={"use_segmentation": False})
    out = session.step(camera(0), options)
    assert out.image.shape == (120, 160, 3) and out.image.dtype == np.uint8
    assert session._setup.scale is not None and session._setup.scale.bounds is not None


def test_matting_is_a_live_virtual_background_colour_or_picture(manager) -> None:
    pipe = manager.get(T("matting"))
    frame = camera(1)
    [result] = run_batch(pipe, [load_image(frame)], {"input_hw": INPUTS[FAST]})
    picture = np.zeros((30, 50, 3), np.uint8)
    picture[:, :25] = (0, 0, 255)
    data = io.BytesIO()
    Image.fromarray(picture).save(data, format="PNG")
    session = LiveSession(manager)
    for given, background in (
        ({}, (0, 177, 64)),
        ({"background_color": "#ff0000"}, (255, 0, 0)),
        ({"background_color": "#ff0000", "background_image": data.getvalue()}, picture),
    ):
        out = session.step(frame, LiveOptions(T("matting"), input=FAST, task_options=given))
        np.testing.assert_array_equal(out.image, result.render(background=background))


# ----------------------------------------------------------------------------- stream life


def test_changing_the_task_or_pausing_starts_afresh_and_the_readout_names_the_model(manager) -> None:
    session = LiveSession(manager)
    for _ in range(3):
        out = session.step(camera(0), LiveOptions(T("seg"), input=FAST), dropped=2)
    assert "3 frames, 6 dropped" in out.readout
    assert out.readout.startswith("Body parts custom · input 512x384")
    out = session.step(camera(3), LiveOptions(T("normal"), input=FAST))
    assert "1 frames, 0 dropped" in out.readout and out.readout.startswith("Normals custom")
    session.step(camera(4), LiveOptions(T("normal"), input=FAST))
    late = time.perf_counter() + 10  # the camera was off for 10 s
    out = session.step(camera(5), LiveOptions(T("normal"), input=FAST), captured_at=late)
    assert "1 frames" in out.readout


def test_bad_frames_and_options_get_clear_errors_and_big_frames_are_downscaled(manager) -> None:
    session = LiveSession(manager)
    with pytest.raises(InputImageError):
        session.step(b"not an image", LiveOptions(T("seg"), input=FAST))
    with pytest.raises(OptionError, match="Live runs the tasks"):
        session.step(camera(0), LiveOptions(T("features")))
    with pytest.raises(OptionError, match="live input must be one of"):
        session.step(camera(0), LiveOptions(T("seg"), input="4096x4096"))
    with pytest.raises(OptionError, match="background_color"):
        session.step(camera(0), LiveOptions(T("matting"), task_options={"background_color": "not a colour"}))
    with pytest.raises(OptionError, match="Size"):
        session.step(camera(0), LiveOptions(T("seg"), size="9b"))
    big = np.zeros((1500, 2000, 3), np.uint8)
    out = session.step(big, LiveOptions(T("seg"), input=FAST))
    assert max(out.image.shape[:2]) == MAX_SIDE
    jpeg = io.BytesIO()
    Image.fromarray(camera(0)).save(jpeg, format="JPEG")
    assert session.step(jpeg.getvalue(), LiveOptions(T("seg"), input=FAST)).image.shape == (120, 160, 3)


def test_the_cpu_expectation_follows_the_model_and_the_input() -> None:
    full = cpu_seconds_per_frame(T("seg"), "0.4b", None)
    small = cpu_seconds_per_frame(T("seg"), "0.4b", (512, 384))
    attention = attention_macs(24, 1024, 3072) / cost.CPU_MACS_PER_S  # 0.4b's 24 layers of width 1024
    # parameters x tokens grows with the tokens (4x), the attention with their square (16x)
    assert full == pytest.approx(4 * (small - attention / 16) + attention) and 30 < full < 60
    assert cpu_seconds_per_frame(T("pointmap"), "0.4b", None) == pytest.approx(2 * full)  # + its seg
    assert cpu_seconds_per_frame(T("seg"), "custom", None) is None


def test_the_cpu_expectation_counts_the_flip_tests_forward() -> None:
    plain = cpu_seconds_per_frame(T("pose"), "0.4b", None, {"flip_test": False})
    assert cpu_seconds_per_frame(T("pose"), "0.4b", None, {"flip_test": True}) == pytest.approx(2 * plain)
    assert cpu_seconds_per_frame(T("pose"), "0.4b", None) == pytest.approx(plain)  # the CPU default: off


def test_one_rule_picks_the_live_size_and_the_fixed_input() -> None:
    published = serving.ModelManager(device="cpu")
    assert live_size(published, T("seg")) == "0.4b" and live_size(published, T("seg"), "1b") == "1b"
    if "0.4b" not in published.sizes(T("matting")):
        assert live_size(published, T("matting")) == published.default_size(T("matting"))
    with pytest.raises(OptionError):
        live_size(published, T("seg"), "9b")
    setup = live_setup(published, LiveOptions(T("pointmap"), input=FAST))
    assert setup.hw is None and "only at the release's input" in setup.input_note
    assert live_setup(published, LiveOptions(T("seg"), input=FAST)).hw == INPUTS[FAST]
