"""Sapiens v1 models under Live (``sapiens2.serving.live``) and the Live tab's handler: tiny
TorchScript and ExportedProgram files as tests/test_sapiens_v1.py writes them; v1's own
processing (the frame's rendering is the photo pipeline's), its keypoint set, the 29-class
names, the marking, and the release's input kept (a v1 graph runs only at the input it was
exported at)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from v1_models import save_v1
from video_clips import frame_at

from sapiens2 import serving
from sapiens2.errors import CheckpointError
from sapiens2.inputs.intake import load_image
from sapiens2.models.loading import load_model
from sapiens2.serving.live import LiveOptions, LiveSession, live_setup
from sapiens2.tasks import registry
from sapiens2.tasks.base import run_batch
from sapiens2.ui import live_tab

T = registry.get
FAST = "512x384"  # a faster Live input: a v1 model keeps its own 1024x768
MARK = "Sapiens v1 · custom · CC-BY-NC-4.0"  # the tiny files' width is no published size
FIXED = "input 1024x768 (a Sapiens v1 model runs only at the input it was exported at)"


#: the tiny files' kinds: (tests/v1_models.py kind, format, fixed batch)
KINDS = {"pose17": ("pose17", "torchscript", 1), "seg": ("seg", "torchscript", 1),
         "normal": ("normal", "torchscript", 1), "depth": ("depth", "torchscript", 1),
         "pose_ep": ("pose", "bfloat16", 2), "seg_ep": ("seg", "bfloat16", 1)}  # fmt: skip


@pytest.fixture(scope="module")
def v1_file(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """kind -> its tiny file, written on first use (a 308-point pose ExportedProgram exported with
    a fixed batch of 2, as a release file may be)."""
    folder, made = tmp_path_factory.mktemp("v1_live"), {}

    def get(kind: str) -> Path:
        if kind not in made:
            name, fmt, batch = KINDS[kind]
            (folder / kind).mkdir()
            made[kind] = save_v1(name, folder / kind, fmt, batch)
        return made[kind]

    return get


def v1_manager(v1_file: Callable[[str], Path], **kinds: str) -> serving.ModelManager:
    """A server whose checkpoints are v1 files: task -> kind (of :data:`KINDS`)."""
    return serving.ModelManager(
        device="cpu", checkpoints={task: v1_file(kind) for task, kind in kinds.items()}
    )


@pytest.fixture(scope="module")
def offline() -> Iterator[None]:
    """No Hub: the person detector's weights are missing, so pose takes the whole frame."""
    from huggingface_hub import constants

    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setattr(constants, "HF_HUB_OFFLINE", True)
    yield
    mp.undo()


def camera(i: int = 0) -> np.ndarray:
    img = frame_at(i, 160, 120)
    img[::7, ::5] = 90
    return img


@pytest.mark.slow
def test_v1_dense_tasks_run_live_with_v1_processing_and_are_marked(v1_file, offline) -> None:
    """Body parts, normals and depth (TorchScript; body parts as an ExportedProgram too): the
    faster input is refused in the readout's words, the frame is what the photo pipeline gives at
    the release's input, and the body parts are the 29-class ones without Eyeglass."""
    for kinds in ({"seg": "seg", "normal": "normal", "depth": "depth"}, {"seg": "seg_ep"}):
        manager = v1_manager(v1_file, **kinds)
        for task in kinds:
            session = LiveSession(manager)
            options = LiveOptions(T(task), input=FAST, task_options={"use_segmentation": True})
            out = session.step(camera(), options)
            assert out.readout.startswith(f"{T(task).tab} custom · {MARK} · {FIXED} · "), out.readout
            assert session._setup.hw is None  # the release's input, not 512x384
            pipe = manager.get(T(task))
            assert pipe.rules.generation == "Sapiens v1" and pipe.network_hw == (1024, 768)
            # Live's labels: the network argmax enlarged nearest-neighbour (docs/LIVE.md)
            [result] = run_batch(pipe, [load_image(camera())], {"nearest_labels": True})
            if task == "depth":  # the depth handler's colour scale, on the v1 depth's foreground
                assert session._setup.scale is not None and session._setup.scale.bounds is not None
                assert result.mask.any()
            else:
                np.testing.assert_array_equal(out.image, result.render())
            if task == "seg":
                assert result.labels.max() <= 28 and not (result.labels == 2).any()  # no Eyeglass


@pytest.mark.slow
def test_v1_pose_runs_live_with_its_keypoint_set_and_a_fixed_batch_graph(v1_file, offline) -> None:
    """A 17-point TorchScript model: drawn from its own points, the readout names its set. A
    308-point ExportedProgram exported with a batch of 2 runs Live's single frames padded, the
    flip test's pair too."""
    manager = v1_manager(v1_file, pose="pose17")
    session = LiveSession(manager)
    out = session.step(camera(), LiveOptions(T("pose"), input=FAST))
    assert out.readout.startswith(f"Pose custom · {MARK} · COCO-17 keypoints · {FIXED}"), out.readout
    [result] = run_batch(manager.get(T("pose")), [load_image(camera())], {})
    assert result.keypoint_set == "coco17" and np.count_nonzero(result.scores[0]) <= 17
    assert not np.array_equal(out.image, camera())  # the person's points are drawn

    exported = v1_manager(v1_file, pose="pose_ep")
    session = LiveSession(exported)
    for flip in (False, True):
        out = session.step(camera(1), LiveOptions(T("pose"), input=FAST, flip_test=flip))
        assert out.image.shape == (120, 160, 3)
        assert out.readout.startswith(f"Pose custom · {MARK} · {FIXED}"), out.readout  # 308: no set named
    assert exported.get(T("pose")).model.batch == 2


@pytest.mark.slow
def test_the_live_tab_handler_and_its_expectation_name_the_v1_model(v1_file, offline) -> None:
    """The server path the Live tab streams through (``live_tab.live_frame``) and the note before
    starting, with v1 checkpoints the operator gave."""
    manager = v1_manager(v1_file, seg="seg", depth="depth")
    run = SimpleNamespace(manager=manager, requests=SimpleNamespace(device=None))
    handler = live_tab.live_frame(run)  # type: ignore[arg-type]
    image, readout, viewer = handler(camera(), "Body parts", None, FAST, False, None, None, None)
    assert image.shape == (120, 160, 3) and readout.startswith(f"Body parts custom · {MARK} · {FIXED}")
    note = live_tab.expectation(run, "depth", None, FAST)  # type: ignore[arg-type]
    assert note.startswith(f"**Depth (v1) custom · {MARK}**, {FIXED}, on this CPU."), note


def test_a_v1_zoo_size_is_marked_and_keeps_its_input_before_it_loads() -> None:
    """What the Live tab says before starting, for the published sizes (the depth default is v1)."""
    published = serving.ModelManager(device="cpu")
    setup = live_setup(published, LiveOptions(T("depth"), input=FAST))
    assert setup.size == "v1-1b" and setup.hw is None
    assert setup.mark == "Sapiens v1 · 1b · CC-BY-NC-4.0" and published.loaded() == []
    bf16 = live_setup(published, LiveOptions(T("normal"), size="v1-2b-bf16", input=FAST))
    assert bf16.mark == "Sapiens v1 · 2b · CC-BY-NC-4.0" and bf16.hw is None
    plain = live_setup(published, LiveOptions(T("normal"), size="0.4b", input=FAST))
    assert plain.mark == "" and plain.hw == (512, 384)  # Sapiens2 keeps the faster input


@pytest.mark.slow
def test_an_exported_program_of_another_input_size_is_refused_in_one_sentence(tmp_path: Path) -> None:
    path = save_v1("seg", tmp_path, "bfloat16", hw=(512, 384))
    with pytest.raises(CheckpointError) as err:
        load_model("seg", checkpoint=path, device="cpu")
    assert str(err.value).endswith(
        "was exported for 512x384 inputs and runs at no other size; a Sapiens v1 seg model takes 1024x768."
    )
