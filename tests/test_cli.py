"""The batch command line (``python -m sapiens2``), offline on tiny checkpoints."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sapiens2.cli import main
from sapiens2.cli.tasks import find_images, unique_folder


@pytest.fixture(autouse=True)
def small_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny models at a quarter of the native input: same code paths, fast on a CPU."""
    from sapiens2.tasks import matting, normal, seg

    for cls in (seg.SegPipeline, normal.NormalPipeline, matting.MattingPipeline):
        monkeypatch.setattr(cls, "input_hw", (256, 192))


SUMMARY = re.compile(r"^(\d+) done, (\d+) failed in [\d.]+ s", re.M)


def write_photo(path: Path, w: int = 40, h: int = 30) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    img = np.zeros((h, w, 3), np.uint8)
    img[:, : w // 2] = (200, 120, 80)
    Image.fromarray(img).save(path)
    return path


def summary(out: str) -> tuple[int, int]:
    found = SUMMARY.search(out)
    assert found, f"no summary line in {out!r}"
    return int(found.group(1)), int(found.group(2))


def test_folder_with_a_good_and_a_bad_file(tiny_checkpoints, tmp_path, capsys):
    src = tmp_path / "in"
    write_photo(src / "good.png")
    (src / "bad.jpg").write_text("this is not a picture")
    (src / "notes.txt").write_text("ignored: not an image extension")
    out = tmp_path / "out"
    code = main(
        ["seg", str(src), "--checkpoint", str(tiny_checkpoints["seg"]), "--device", "cpu", "--out", str(out)]
    )
    cap = capsys.readouterr()
    assert code == 0
    assert summary(cap.out) == (1, 1)
    assert "skipped" in cap.err and "bad.jpg" in cap.err and "not an image" in cap.err
    assert "Traceback" not in cap.err
    files = sorted(p.name for p in (out / "good").iterdir())
    assert files == ["good_seg.png", "good_seg_color.png", "good_seg_labels.npy", "good_seg_labels.png"]
    assert np.load(out / "good" / "good_seg_labels.npy").shape == (30, 40)
    assert not (out / "bad").exists()


def test_same_names_get_separate_folders(tiny_checkpoints, tmp_path, capsys):
    a = write_photo(tmp_path / "a" / "x.png")
    b = write_photo(tmp_path / "b" / "x.png", w=20)
    out = tmp_path / "out"
    code = main(["matting", str(a), str(b), "--checkpoint", str(tiny_checkpoints["matting"]),
                 "--device", "cpu", "--out", str(out), "--background", "#ff0000"])  # fmt: skip
    assert code == 0 and summary(capsys.readouterr().out) == (2, 0)
    assert sorted(p.name for p in out.iterdir()) == ["x", "x-2"]
    assert np.asarray(Image.open(out / "x-2" / "x_alpha.png")).shape == (30, 20)
    assert np.asarray(Image.open(out / "x" / "x_cutout.png")).shape == (30, 40, 4)


def test_only_bad_inputs_exit_1(tiny_checkpoints, tmp_path, capsys):
    bad = tmp_path / "empty.png"
    bad.write_bytes(b"")
    code = main(["normal", str(bad), str(tmp_path / "missing.jpg"),
                 "--checkpoint", str(tiny_checkpoints["normal"]), "--out", str(tmp_path / "o")])  # fmt: skip
    cap = capsys.readouterr()
    assert code == 1
    assert summary(cap.out) == (0, 2)
    assert "missing.jpg: no such file or folder" in cap.err
    assert "empty (0 bytes)" in cap.err


def test_no_images_found(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    assert main(["seg", str(tmp_path / "in"), "--out", str(tmp_path / "o")]) == 1
    assert "no images found" in capsys.readouterr().out


def test_weights_error_is_reported_once_without_traceback(tmp_path, capsys):
    write_photo(tmp_path / "in" / "a.png")
    write_photo(tmp_path / "in" / "b.png")
    code = main(["pointmap", str(tmp_path / "in"), "--checkpoint", str(tmp_path / "nope.safetensors"),
                 "--out", str(tmp_path / "o")])  # fmt: skip
    cap = capsys.readouterr()
    assert code == 1
    assert cap.err.count("error:") == 1 and "nope.safetensors does not exist" in cap.err
    assert "Traceback" not in cap.err


def test_bad_background_option_is_explained(tmp_path, capsys):
    write_photo(tmp_path / "a.png")
    code = main(
        ["matting", str(tmp_path / "a.png"), "--background", "greenish", "--out", str(tmp_path / "o")]
    )
    assert code == 1
    assert "error: --background-color: Colour 'greenish'" in capsys.readouterr().err


def test_unknown_task_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["height", "x.png"])
    assert exc.value.code == 2
    assert "invalid choice: 'height'" in capsys.readouterr().err


def test_find_images_and_unique_folder(tmp_path):
    write_photo(tmp_path / "d" / "sub" / "B.PNG")
    write_photo(tmp_path / "d" / "a.jpg")
    (tmp_path / "d" / "readme.md").write_text("x")
    files, missing = find_images([str(tmp_path / "d"), str(tmp_path / "d" / "a.jpg"), "nowhere"])
    assert [f.name for f in files] == ["a.jpg", "B.PNG"]  # recursive, deduplicated
    assert missing == ["nowhere"]
    taken: set[str] = set()
    assert [unique_folder(s, taken) for s in ["x", "X", "x", "../evil name", "", "a.v1", "a.v2"]] == [
        "x", "X-2", "x-3", "evil_name", "image", "a_v1", "a_v2",
    ]  # fmt: skip


@pytest.mark.subprocess
def test_module_entry_point_reports_weights_error_cleanly(tmp_path):
    img = write_photo(tmp_path / "p.png")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sapiens2",
            "features",
            str(img),
            "--checkpoint",
            str(tmp_path / "none"),
            "--out",
            str(tmp_path / "o"),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[1],
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: Checkpoint") and "does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_features_batch(tiny_checkpoints, tmp_path, monkeypatch, capsys):
    from sapiens2.tasks.features import FeaturesPipeline

    monkeypatch.setattr(FeaturesPipeline, "input_hw", (256, 192))
    img = write_photo(tmp_path / "p.png")
    code = main(
        [
            "features",
            str(img),
            "--checkpoint",
            str(tiny_checkpoints["features"]),
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert code == 0 and summary(capsys.readouterr().out) == (1, 0)
    emb = np.load(tmp_path / "o" / "p" / "p_embedding.npy")
    assert emb.ndim == 1 and np.isfinite(emb).all()


def test_pose_batch_with_flip_and_threshold(tiny_checkpoints, tmp_path, capsys):
    img = write_photo(tmp_path / "p.png")
    args = ["pose", str(img), "--checkpoint", str(tiny_checkpoints["pose"]), "--out", str(tmp_path / "o")]
    assert main([*args, "--threshold", "2"]) == 1
    assert "--threshold must be a number from 0 to 1" in capsys.readouterr().err  # the schema's check
    assert main([*args, "--no-detector", "--flip", "--threshold", "0.5"]) == 0
    assert summary(capsys.readouterr().out) == (1, 0)
    people = json.loads((tmp_path / "o" / "p" / "p_pose.json").read_text())["people"]
    assert len(people) == 1 and len(people[0]["keypoints"]) == 308
    assert (tmp_path / "o" / "p" / "p_coco17.json").is_file()
