"""Video is a declared capability of a task (``Task.video``): a toy task registered here, and
albedo once its checkpoint is found, run in Video (plan, estimate, one device call, downloads and
the CLI) with no other code; and no module outside a task's own module compares task names."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from registry_helpers import unregister
from test_registry import TOY, InvertPipeline
from video_clips import count_frames, write_clip

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sapiens2 import serving  # noqa: E402
from sapiens2.cli import main  # noqa: E402
from sapiens2.errors import OptionError  # noqa: E402
from sapiens2.models import cost  # noqa: E402
from sapiens2.serving.video import VideoRequests  # noqa: E402
from sapiens2.tasks import registry  # noqa: E402
from sapiens2.tasks.result_record import ResultArray  # noqa: E402
from sapiens2.ui import video_tab  # noqa: E402

FRAMES, FPS = 5, 10.0


class SeeingInvert(InvertPipeline):
    """The toy pipeline, keeping every network input it was given (to check the video's NPZ)."""

    seen: list[np.ndarray] = []

    def infer(self, batch: list[np.ndarray], **opts: Any) -> list[np.ndarray]:
        SeeingInvert.seen.extend(batch)
        return super().infer(batch, **opts)


VIDEO_TOY = replace(
    TOY,
    pipeline=SeeingInvert,
    video=registry.Video(),
    arrays=(ResultArray("inverted", "uint8", "the inverted photo"),),
)


@pytest.fixture
def toy_video() -> Iterator[registry.Task]:
    registry.register(VIDEO_TOY)
    SeeingInvert.seen = []
    try:
        yield VIDEO_TOY
    finally:
        unregister(VIDEO_TOY)
    assert "invert" not in registry.video_tasks()


def test_a_registered_task_with_video_runs_in_video_with_no_other_code(toy_video, tmp_path: Path) -> None:
    clip = write_clip(tmp_path / "c.mp4", n=FRAMES, fps=FPS)
    assert list(registry.video_tasks())[-1] == "invert"  # after the built-ins
    shown = registry.video_tasks()
    assert ("Invert", "invert") in video_tab.task_choices(shown)
    assert video_tab._task_name("Invert", shown) == "invert"  # the radio's label, as the UI sends it
    assert video_tab.default_task(shown) == video_tab.task_choices(shown)[0][1]  # the first, not a name

    manager = serving.ModelManager(device="cpu")
    requests = VideoRequests(manager, serving.RequestFolders(tmp_path / "req"))
    job = requests.job(registry.get("invert"), str(clip), options={"strength": 0.5})
    assert job.frames == FRAMES and job.render_opts == {"strength": 0.5}
    estimate = requests.estimate(job)  # a model of no published size: no CPU figure, no crash
    assert estimate.frames == FRAMES and estimate.calls == 1 and estimate.cpu_s is None
    assert "measured rate" in estimate.basis
    assert 1 <= requests.clip_seconds(job) <= cost.MAX_CALL_S

    result = requests.run(job)
    assert result.task == "invert" and result.frames == FRAMES
    n, fps, _ = count_frames(result.video)
    assert n == FRAMES and fps == pytest.approx(FPS) and result.video.name.endswith("_invert.webm")
    [npz] = [p for p in result.files if p.name.endswith("_invert_frames.npz")]
    with np.load(npz) as data:
        inverted = data["inverted"]
    assert inverted.dtype == np.uint8 and len(inverted) == len(SeeingInvert.seen) == FRAMES
    assert np.array_equal(inverted, 255 - np.stack(SeeingInvert.seen))  # the raw field, per frame
    # estimates after a run use the run's own rate
    assert requests.estimate(job).cpu_s is not None

    # the CLI takes clips for it too
    code = main(["invert", str(clip), "--device", "cpu", "--out", str(tmp_path / "cli")])
    assert code == 0
    assert count_frames(tmp_path / "cli" / "c" / "c_invert.webm")[0] == FRAMES


def test_a_task_without_video_is_refused_by_video(toy, tmp_path: Path) -> None:
    clip = write_clip(tmp_path / "c.mp4", n=2, fps=FPS)
    requests = VideoRequests(serving.ModelManager(device="cpu"), serving.RequestFolders(tmp_path / "r"))
    shown = registry.video_tasks()
    with pytest.raises(OptionError, match=f"Video runs the tasks {', '.join(shown)}; got 'invert'"):
        requests.job(registry.get("invert"), str(clip))
    assert "invert" not in shown and ("Invert", "invert") not in video_tab.task_choices(shown)
    with pytest.raises(OptionError, match="Video runs the tasks"):
        video_tab._task_name("invert", shown)


@pytest.fixture
def toy() -> Iterator[registry.Task]:  # the toy task without video
    registry.register(TOY)
    try:
        yield TOY
    finally:
        unregister(TOY)


@pytest.mark.slow
def test_albedo_runs_in_video_once_its_checkpoint_is_found(tiny_checkpoints, monkeypatch, tmp_path) -> None:
    path = tiny_checkpoints["albedo"] / "model.safetensors"
    monkeypatch.setenv("SAPIENS2_CHECKPOINTS", str(tmp_path / "empty"))
    clip = write_clip(tmp_path / "c.mp4", n=3, fps=FPS)
    assert "albedo" not in registry.video_tasks()  # no checkpoint: no dead choice
    with pytest.raises(OptionError, match="Video runs the tasks"):
        video_tab._task_name("albedo", registry.video_tasks())

    manager = serving.ModelManager(device="cpu", checkpoints={"albedo": path, "seg": tiny_checkpoints["seg"]})
    requests = VideoRequests(manager, serving.RequestFolders(tmp_path / "req"))
    shown = manager.video_tasks()  # the server's checkpoint shows it
    assert "albedo" in shown and ("Albedo", "albedo") in video_tab.task_choices(shown)
    albedo = shown[video_tab._task_name("Albedo", shown)]  # the radio's label, as the UI sends it
    job = requests.job(albedo, str(clip))  # borrows seg for the background
    assert job.infer_opts["use_segmentation"] is True
    result = requests.run(job)
    assert result.frames == 3 and count_frames(result.video)[0] == 3
    [npz] = [p for p in result.files if p.name.endswith("_albedo_frames.npz")]
    with np.load(npz) as data:
        albedo, mask = data["albedo"], data["mask"]
    assert albedo.dtype == np.float16 and albedo.shape[0] == 3 and albedo.shape[-1] == 3
    assert mask.shape == albedo.shape[:3] and 0.0 <= float(albedo.min()) <= float(albedo.max()) <= 1.0


# ----------------------------------------------------------------------------- no name branches


def task_names() -> set[str]:
    return {n for t in registry.declared().values() for n in (t.name, t.api_name)}


def name_comparisons(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every comparison (==, !=, in, not in, match/case) against a task name: a
    string constant, or one inside a tuple, list, set or dict literal compared with."""

    def named(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Constant) and node.value in names:
            return [node.value]
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return [v for e in node.elts for v in named(e)]
        if isinstance(node, ast.Dict):
            return [v for k in node.keys if k is not None for v in named(k)]
        return []

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            found += [(node.lineno, n) for side in (node.left, *node.comparators) for n in named(side)]
        elif isinstance(node, ast.MatchValue):
            found += [(node.lineno, n) for n in named(node.value)]
    return found


def test_the_name_checker_finds_comparisons() -> None:
    src = 'if task == "pose":\n    pass\nok = name in ("seg", "x")\nmatch t:\n    case "normal":\n        pass\n'
    assert name_comparisons(src, {"pose", "seg", "normal"}) == [(1, "pose"), (3, "seg"), (5, "normal")]
    assert name_comparisons('label = "pose"\nx = kind == "deconv"\n', {"pose"}) == []


def test_no_module_outside_a_task_s_own_compares_task_names() -> None:
    package = ROOT / "sapiens2"
    own = {p for m in registry.builtin_modules() for p in (package / "tasks" / m).rglob("*.py")}
    own |= {package / "zoo.py"}
    names = task_names()
    found = {
        f"{path.relative_to(ROOT)}:{line}: {name!r}": None
        for path in sorted(package.rglob("*.py"))
        if path not in own
        for line, name in name_comparisons(path.read_text(), names)
    }
    assert not found, "compare task names only in the task's own module:\n" + "\n".join(found)
