"""One command-line syntax: ``--checkpoint`` as PATH or TASK=PATH in every command (one help text),
one list of tasks in every help and error, advice a command-line user can follow, and quiet runs
(issue 44: items 2, 7, 8, 9 and 10)."""

from __future__ import annotations

import argparse
import logging
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sapiens2.cli import build_parser, main
from sapiens2.cli.tasks import task_names
from sapiens2.errors import OptionError, WeightsUnavailableError
from sapiens2.models.checkpoints import CHECKPOINT_HELP, Checkpoints
from sapiens2.tasks import registry


@pytest.fixture(autouse=True)
def small_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny models at a quarter of the native input: same code paths, fast on a CPU."""
    from sapiens2.tasks import albedo, seg

    for cls in (seg.SegPipeline, albedo.AlbedoPipeline):
        monkeypatch.setattr(cls, "input_hw", (256, 192))


def photo(path: Path) -> Path:
    img = np.zeros((30, 40, 3), np.uint8)
    img[:, :20] = (200, 120, 80)
    Image.fromarray(img).save(path)
    return path


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def flat(text: str) -> str:
    return " ".join(text.split())


# ------------------------------------------------------------------ item 2: one --checkpoint syntax


def test_the_albedo_advice_works_when_followed(tiny_checkpoints, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("SAPIENS2_CHECKPOINTS", raising=False)
    img, out = photo(tmp_path / "p.png"), str(tmp_path / "o")
    assert main(["albedo", str(img), "--out", out, "--device", "cpu", "--size", "0.4b"]) == 1
    advice = re.search(r"--checkpoint albedo=PATH", capsys.readouterr().err)
    assert advice  # what the error says to do, done:
    for spec in (f"albedo={tiny_checkpoints['albedo']}", str(tiny_checkpoints["albedo"])):
        assert main(["albedo", str(img), "--out", out, "--device", "cpu", "--checkpoint", spec]) == 0, (
            capsys.readouterr()
        )
    assert (tmp_path / "o" / "p" / "p_albedo.png").is_file()


def test_a_checkpoint_for_another_task_or_two_of_them_are_refused(
    tiny_checkpoints, tmp_path: Path, capsys
) -> None:
    img, seg = str(photo(tmp_path / "p.png")), str(tiny_checkpoints["seg"])
    assert main(["albedo", img, "--checkpoint", f"seg={seg}"]) == 1
    assert "a seg checkpoint, and this command runs albedo" in capsys.readouterr().err
    assert main(["seg", img, "--checkpoint", seg, "--checkpoint", f"seg={seg}"]) == 1
    assert "seg takes one --checkpoint; got 2" in capsys.readouterr().err


def test_a_plain_path_belongs_to_the_task_its_file_holds(tiny_checkpoints, tmp_path: Path) -> None:
    pointmap, seg = tiny_checkpoints["pointmap"], tiny_checkpoints["seg"]
    motion = ["pose", "pointmap", "seg"]
    assert dict(Checkpoints.parse([str(pointmap), f"seg={seg}"], motion)) == {
        "pointmap": pointmap,
        "seg": seg,
    }
    assert dict(Checkpoints.parse([str(seg)], ["seg"])) == {"seg": seg}  # one task: no header read
    assert dict(Checkpoints.parse(str(pointmap))) == {"pointmap": pointmap}  # the app: any task
    with pytest.raises(OptionError, match="a pointmap checkpoint, and this command runs pose, seg"):
        Checkpoints.parse([str(pointmap)], ["pose", "seg"])  # batch pose seg: the header says pointmap
    with pytest.raises(OptionError, match=f"Unknown task 'posex'; choose one of: {task_names()}"):
        Checkpoints.parse(["posex=/x"], motion)
    with pytest.raises(OptionError, match="no such file or folder. Give an existing PATH, or TASK=PATH"):
        Checkpoints.parse([str(tmp_path / "missing.safetensors")], motion)
    odd = tmp_path / "run=3"  # a folder whose name holds "=" is a path
    odd.mkdir()
    assert dict(Checkpoints.parse([str(odd)], ["seg"])) == {"seg": odd}


def test_motion_batch_and_the_app_take_a_plain_path(tiny_checkpoints, tmp_path: Path, capsys) -> None:
    import app
    from sapiens2.cli.batch import build_job

    batch = build_parser().parse_args(
        [
            "batch",
            "seg",
            str(tmp_path),
            "--out",
            str(tmp_path / "o"),
            "--checkpoint",
            str(tiny_checkpoints["seg"]),
        ]
    )
    [plan] = build_job(batch)[0].plans
    assert Path(plan.model.checkpoint) == tiny_checkpoints["seg"]
    manager = app.manager_from_args(app.parse_args(["--checkpoint", str(tiny_checkpoints["albedo"])]))
    assert "albedo" in manager.tasks()  # the file's own task, shown
    assert main(["motion", str(tmp_path / "none.mp4"), "--checkpoint", str(tmp_path / "nope")]) == 1
    assert "nope: no such file or folder" in capsys.readouterr().err  # motion reads the plain path


def test_every_checkpoint_flag_has_the_one_help_text() -> None:
    import app

    commands = subparsers(build_parser())
    helps = {name: p.format_help() for name, p in commands.items()}
    helps["app"] = app_help = flat(_help(app))
    without = {name for name, text in helps.items() if "--checkpoint" not in text}
    assert without == {"search"}  # search embeds its query with the models its index recorded
    for name, text in helps.items():
        if name in without:
            continue
        assert flat(CHECKPOINT_HELP) in flat(text), name
        assert "[TASK=]PATH" in text, name
    assert f"TASK: {task_names()}" in app_help  # item 8: the names the app's flag takes
    assert "weights dtype (default auto: bfloat16 on a GPU, float32 on a CPU)" in app_help


def _help(app_module) -> str:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
        app_module.parse_args(["--help"])
    return buf.getvalue()


# ------------------------------------------------------------------ item 9: one task list


def test_every_task_list_is_the_declared_one(tmp_path: Path, capsys) -> None:
    names = list(registry.declared())
    assert "albedo" in names and task_names() == ", ".join(names)
    top = build_parser().format_help()
    listed = re.findall(r"^    (\w+)\s", top, re.M)
    others = ["batch", "motion", "export", "index", "search"]
    assert listed == [*names, *others]  # albedo too, saying what it needs
    assert "Needs --checkpoint (not on the Hub)" in flat(top) or registry.get("albedo").available()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["posex"])
    choices = re.search(r"choose from (.*)\)", capsys.readouterr().err).group(1)
    assert [c.strip(" '") for c in choices.split(",")] == [*names, *others]
    assert f"what to compute: {task_names()}" in flat(subparsers(build_parser())["batch"].format_help())
    assert main(["batch", "posex", str(tmp_path), "--out", str(tmp_path / "o")]) == 1
    assert f"choose one of: {task_names()}." in capsys.readouterr().err


# ------------------------------------------------------------------ item 10: advice for this reader


def test_a_wrong_checkpoint_is_explained_without_python(tiny_checkpoints, tmp_path: Path, capsys) -> None:
    img = str(photo(tmp_path / "p.png"))
    assert main(["seg", img, "--checkpoint", str(tiny_checkpoints["pose"])]) == 1
    err = capsys.readouterr().err
    assert "not a seg checkpoint: use it as the pose checkpoint, or give a seg file" in err
    assert "load_model(" not in err


# ------------------------------------------------------------------ item 7: quiet runs


def test_writing_a_webm_prints_no_opencv_tag_warning(tmp_path: Path, capfd) -> None:
    from sapiens2.outputs.webm_writer import VideoWriter

    with VideoWriter(tmp_path / "c.webm", 10) as out:
        for k in range(3):
            out.write(np.full((32, 48, 3), 40 * k, np.uint8))
    err = capfd.readouterr().err
    assert "is not supported with codec id" not in err and "VP80" not in err
    assert (tmp_path / "c.webm").stat().st_size > 0


def test_a_quick_load_leaves_no_progress_line(tiny_checkpoints, capfd) -> None:
    import sapiens2

    sapiens2.load_model("seg", checkpoint=tiny_checkpoints["seg"], device="cpu")
    assert "Loading" not in capfd.readouterr().err


def test_per_frame_values_make_one_notice(tmp_path: Path) -> None:
    from sapiens2.tasks.clip_frames import FrameHandler

    handler = FrameHandler({}, raw_cap=0)
    for scale in (-0.193, -0.144, -0.206):
        handler.note(f"The model's scale output ({scale}) is unusable; the pointmap is in canonical units.")
        handler.note("Person detection is off: the whole image is used as one person box.")
    assert handler.notices == [
        "The model's scale output (-0.193) is unusable; the pointmap is in canonical units. "
        "(and on 2 more frame(s), with other values)",
        "Person detection is off: the whole image is used as one person box.",
    ]


def test_an_unavailable_borrowed_model_is_tried_and_logged_once(
    tiny_checkpoints, monkeypatch, caplog
) -> None:
    from sapiens2.tasks import borrowed_seg
    from sapiens2.tasks.normal import NormalPipeline

    tries = []

    class Missing(borrowed_seg.SegPipeline):
        def __init__(self, *args, **kwargs) -> None:
            tries.append(1)
            raise WeightsUnavailableError("Weights for facebook/sapiens2-seg-0.4b are not available here.")

    monkeypatch.setattr(borrowed_seg, "SegPipeline", Missing)
    pipe = NormalPipeline(checkpoint=tiny_checkpoints["normal"], device="cpu")
    pipe.size = "0.4b"
    with caplog.at_level(logging.WARNING, logger="sapiens2.tasks.borrowed_seg"):
        for _ in range(3):
            with pytest.raises(WeightsUnavailableError):
                pipe.seg.get()
    assert len(tries) == 1 and len(caplog.records) == 1
    monkeypatch.setattr(borrowed_seg, "RETRY_AFTER_S", 0.0)  # later: tried again
    with pytest.raises(WeightsUnavailableError):
        pipe.seg.get()
    assert len(tries) == 2


# ------------------------------------------------------------------ item 8: the page's weights line


def test_the_page_says_where_the_weights_come_from(tiny_checkpoints, monkeypatch) -> None:
    from huggingface_hub import constants

    import app
    from sapiens2 import serving

    monkeypatch.delenv("SAPIENS2_CHECKPOINTS", raising=False)
    every = serving.ModelManager(device="cpu", checkpoints=tiny_checkpoints)
    assert app.weights_note(every) == "Weights: this server's local checkpoints."
    some = serving.ModelManager(device="cpu", checkpoints={"seg": tiny_checkpoints["seg"]})
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert app.weights_note(some).startswith("Weights download from the Hub on first use (Body parts: local")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert "from the Hub" not in app.weights_note(some) and app.weights_note(some).startswith("Offline")
