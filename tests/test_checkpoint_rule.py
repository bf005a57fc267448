"""One rule for an explicit checkpoint given with a size, the same in the Python API, the command
line and the app: the file decides the model and the size only checks it. A file of a published
size must be that size (and is the only size the app offers for its task); a file of no published
size (the tiny test models, other widths) takes any size and is labelled "custom".

Published-size files are header-only here (no tensor data): every check happens before a tensor
is read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from registry_helpers import task as T
from tiny_checkpoints import write_header_only, zoo_shapes

import sapiens2
from sapiens2 import serving
from sapiens2.cli import main
from sapiens2.errors import CheckpointError, OptionError
from sapiens2.models.loading import checkpoint_size_conflict
from sapiens2.serving.cache import CUSTOM


@pytest.fixture
def pose_04b(tmp_path: Path) -> Path:
    """A pose checkpoint whose shapes are the published 0.4b's (header only)."""
    return write_header_only(tmp_path / "my_pose.safetensors", zoo_shapes("pose", "0.4b"))


@pytest.fixture
def photo(tmp_path: Path) -> Path:
    img = np.zeros((30, 40, 3), np.uint8)
    img[:, :20] = (200, 120, 80)
    Image.fromarray(img).save(tmp_path / "p.png")
    return tmp_path / "p.png"


def test_the_rule() -> None:
    assert checkpoint_size_conflict("0.4b", None) is None  # no size: the file's own
    assert checkpoint_size_conflict("0.4b", "") is None
    assert checkpoint_size_conflict("0.4b", "0.4b") is None
    assert checkpoint_size_conflict(None, "1b") is None  # no published size: nothing to check
    advice = checkpoint_size_conflict("0.4b", "1b")
    assert advice is not None and "choose size 0.4b or no size" in advice and "a 1b file" in advice


# -- Python API -----------------------------------------------------------------------------


def test_api_custom_file_takes_any_size_and_is_labelled_custom(tiny_checkpoints, photo: Path) -> None:
    pipe = sapiens2.SegPipeline("0.4b", checkpoint=tiny_checkpoints["seg"], device="cpu")
    assert pipe.size is None  # the file's (custom) model, not a 0.4b
    result = pipe(photo)
    assert result.info.line().startswith("seg custom · cpu")


def test_api_published_file_must_be_its_size(pose_04b: Path) -> None:
    with pytest.raises(CheckpointError) as err:
        sapiens2.load_model("pose", "1b", checkpoint=pose_04b, device="cpu")
    msg = str(err.value)
    assert "size 0.4b (hidden 1024, 24 layers, 16 heads), not size 1b" in msg
    assert "choose size 0.4b or no size" in msg and "size=" not in msg  # no Python-only advice
    for size in ("0.4b", None):  # the size check passes; reading the (absent) tensors fails next
        with pytest.raises(CheckpointError, match="damaged or incomplete"):
            sapiens2.load_model("pose", size, checkpoint=pose_04b, device="cpu")


# -- command line -----------------------------------------------------------------------------


def test_cli_size_with_a_custom_checkpoint_runs(
    tiny_checkpoints, photo: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "out"
    code = main(["seg", str(photo), "--size", "0.4b", "--checkpoint", str(tiny_checkpoints["seg"]),
                 "--device", "cpu", "--out", str(out)])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "1 done, 0 failed" in captured.out and "Pass size" not in captured.err
    assert "has no published size; it runs as 'custom' (--size 0.4b is not checked)" in captured.err
    assert any((out / "p").iterdir())


def test_cli_size_against_a_published_checkpoint(pose_04b: Path, photo: Path, tmp_path: Path, capsys) -> None:
    code = main(["pose", str(photo), "--size", "1b", "--checkpoint", str(pose_04b), "--device", "cpu",
                 "--out", str(tmp_path / "o")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("error: ") and "not size 1b" in err and "choose size 0.4b or no size" in err
    assert "Traceback" not in err


# -- app (the model cache behind every endpoint) ------------------------------------------------


def test_app_offers_only_the_checkpoint_size(pose_04b: Path) -> None:
    manager = serving.ModelManager(device="cpu", checkpoints={"pose": pose_04b}, size="1b")
    assert manager.sizes(T("pose")) == ("0.4b",)  # the size menu
    assert manager.default_size(T("pose")) == "0.4b"  # the file wins over the server's --size
    assert manager.default_size(T("seg")) == "1b" and "5b" in manager.sizes(
        T("seg")
    )  # other tasks: as before
    assert manager.key(T("pose"), "0.4b") == manager.key(T("pose"), None) == ("pose", CUSTOM)
    with pytest.raises(OptionError) as err:
        manager.key(T("pose"), "1b")  # an API caller asking for another size: refused, not ignored
    msg = str(err.value)
    assert "checkpoint my_pose.safetensors, size 0.4b; size 1b is not offered" in msg
    assert "choose size 0.4b or no size" in msg
    with pytest.raises(OptionError, match="Size '7b' does not exist for pose"):
        manager.key(T("pose"), "7b")


def test_app_custom_checkpoint_takes_every_size(tiny_checkpoints) -> None:
    manager = serving.ModelManager(device="cpu", checkpoints={"seg": tiny_checkpoints["seg"]})
    assert manager.checkpoint_size(T("seg")) is None
    # issue 44 item 6: the menus offer what runs ("custom"), not sizes that all run the same file;
    # an API caller's published size is still taken (it only checks the file) and resolves to it
    assert manager.sizes(T("seg")) == (CUSTOM,) and manager.default_size(T("seg")) == CUSTOM
    assert {manager.resolve_size(T("seg"), s) for s in ("0.4b", "1b", None, CUSTOM)} == {CUSTOM}
    assert {manager.key(T("seg"), s) for s in ("0.4b", "1b", None, CUSTOM)} == {("seg", CUSTOM)}
    pipe = manager.get(T("seg"), "1b")
    assert pipe.run_info().line().startswith("seg custom")
    with pytest.raises(OptionError, match="Size 'huge' does not exist for seg"):
        manager.key(T("seg"), "huge")


@pytest.mark.slow
def test_app_endpoint_refuses_another_size_and_offers_the_files(
    pose_04b: Path, photo: Path, tmp_path: Path
) -> None:
    """Through the served app: the Pose size menu holds the file's size alone, and an API call for
    another size gets the rule's message (the app never runs the file as if it were that size)."""
    pytest.importorskip("gradio")
    from gradio_client import Client, handle_file
    from gradio_client.exceptions import AppError
    from test_api_security import served_app

    with served_app({"pose": pose_04b}, tmp_path) as server:
        menus = [
            c["props"]
            for c in server.demo.config["components"]
            if c.get("props", {}).get("label") == "Model size"
        ]
        assert [("0.4b", "0.4b")] in [list(map(tuple, m["choices"])) for m in menus]  # the Pose tab's menu
        client = Client(server.url, verbose=False)
        with pytest.raises(AppError) as err:
            client.predict(photo=handle_file(str(photo)), size="1b", api_name="/pose")
        msg = str(err.value)
        assert "checkpoint my_pose.safetensors, size 0.4b; size 1b is not offered" in msg
        assert "choose size 0.4b or no size" in msg
