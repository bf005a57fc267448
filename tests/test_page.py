"""The page's pieces without a browser (issue 32): the run info's line for people, errors kept per
page session, options enabled by a switch, the legend as text, the arrival stamp, plain words for
visitors. The browser side is tests/test_page_browser.py."""

from __future__ import annotations

import dataclasses
import pickle
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

gr = pytest.importorskip("gradio")

from sapiens2.errors import (  # noqa: E402
    CheckpointError,
    DiskFullError,
    OptionError,
    WeightsUnavailableError,
    for_visitor,
)
from sapiens2.serving.present import Stages, run_info, what_ran  # noqa: E402
from sapiens2.tasks import registry  # noqa: E402
from sapiens2.tasks.options import Option  # noqa: E402
from sapiens2.tasks.seg.seg_render import segmentation_legend_html  # noqa: E402
from sapiens2.ui import arrival  # noqa: E402
from sapiens2.ui.error_board import ErrorBoard, user_error  # noqa: E402


def test_the_run_info_leads_with_one_line_for_people() -> None:
    stages = Stages()
    stages.add("read", 0.25)
    stages.add("device", 1.0)
    info = SimpleNamespace(size="1b", device="cuda:0")
    text = run_info(what_ran("Pose", info), stages, ["Downscaled to 4096 px."], "pose 1b · cuda:0 · bfloat16")
    first, seconds, details = text.splitlines()
    assert first == "Pose (1b model on the GPU): done in 1.25 s. Note: Downscaled to 4096 px."
    assert seconds == "Seconds: read 0.25 · device 1.00" and details.startswith("pose 1b")
    assert (
        what_ran("Matting", SimpleNamespace(size=None, device="cpu")) == "Matting (custom model on the CPU)"
    )


def test_errors_are_kept_per_session_and_event_until_taken() -> None:
    board = ErrorBoard(size=2)
    alice, bob = SimpleNamespace(session_hash="a"), SimpleNamespace(session_hash="b")
    for who, event in ((alice, "pose"), (bob, "pose")):
        with pytest.raises(gr.Error), board.catching(who, event, "Pose"):
            raise gr.Error("No photo given.", title="Image problem")
    assert board.take(alice, "seg") is None  # another tab's run did not fail
    shown = board.take(alice, "pose")
    assert shown is not None and shown.text == "Pose did not run. Image problem: No photo given."
    assert board.take(alice, "pose") is None  # taken once: the next failure sets it again
    with pytest.raises(gr.Error), board.catching(None, "pose", "Pose"):  # no session: not kept
        raise gr.Error("x")
    for event in ("a", "b", "c"):  # API callers never take theirs: the oldest go
        with pytest.raises(gr.Error), board.catching(alice, event, "X"):
            raise gr.Error("x")
    assert board.take(bob, "pose") is None and board.take(alice, "c") is not None


def test_a_visitor_reads_one_plain_sentence_and_the_operator_the_details(caplog) -> None:
    err = WeightsUnavailableError("Weights for facebook/x are not here: set SAPIENS2_CHECKPOINTS=/root.")
    assert for_visitor(err).startswith("This model's weights are not") and "SAPIENS2" not in for_visitor(err)
    assert "SAPIENS2_CHECKPOINTS" in str(err)  # the library, the CLI, the log keep the whole message
    again = pickle.loads(pickle.dumps(WeightsUnavailableError("details", plain="Plain.")))
    assert (str(again), again.plain) == ("details", "Plain.")  # crosses the GPU worker intact
    assert "disk is full" in for_visitor(DiskFullError("ENOSPC in /data"))
    assert "cannot be used" in for_visitor(CheckpointError("bad keys in /x.safetensors"))
    assert for_visitor(OptionError("The pose option 'threshold' must be ...")).startswith("The pose option")
    with caplog.at_level("WARNING", logger="sapiens2.app"):
        shown = user_error(err)
    assert shown.title == "Weights unavailable" and shown.message == for_visitor(err)
    assert shown.details == str(err) and "SAPIENS2_CHECKPOINTS" in caplog.text  # the server log
    assert user_error(OptionError("bad")).details == ""  # nothing more to say: no fold


def test_an_option_is_enabled_by_an_on_off_option_of_its_task() -> None:
    normal = registry.get("normal")
    background = next(o for o in normal.options if o.name == "background")
    assert background.enabled_by == "remove_background"
    assert background.describe().endswith("; only with remove_background.")
    albedo = registry.get("albedo")
    assert next(o for o in albedo.options if o.name == "background").enabled_by == "use_segmentation"
    # a declaration naming no on/off option is refused when the task is declared
    broken = dataclasses.replace(background, enabled_by="background")
    with pytest.raises(OptionError, match="enabled by 'background', which is not one of its on/off options"):
        dataclasses.replace(normal, options=(*normal.options[:-1], broken))
    assert isinstance(background, Option)


def test_the_legend_is_text_with_names_for_people() -> None:
    text = segmentation_legend_html([22, 3, 21], {22: 0.5, 3: 0.25, 21: 0.0})
    assert "Torso: 50.0%" in text and "Face and neck: 25.0%" in text
    assert "Right upper leg" not in text  # 0.0%: left out, as in the picture
    assert "_" not in re.sub(r"<[^>]*>", "", text) and text.count('aria-hidden="true"') == 2
    assert segmentation_legend_html([], {}) == "<p>No body part found.</p>"


def test_the_arrival_stamp_gives_the_wait_before_the_function() -> None:
    import asyncio
    import time

    seen: dict = {}

    async def app(scope, receive, send):  # the app behind the middleware
        seen.update(scope)

    asyncio.run(arrival.StampArrival(app)({"type": "http"}, None, None))
    stamped = seen["state"][arrival.ARRIVED]
    assert abs(stamped - time.monotonic()) < 60
    request = SimpleNamespace(request=SimpleNamespace(scope=seen))
    assert arrival.waited(request) >= 0.0
    assert arrival.waited(None) is None and arrival.waited(SimpleNamespace(request=None)) is None
    assert arrival.app_kwargs()["middleware"][0].cls is arrival.StampArrival


def test_the_failure_step_gives_one_value_per_output() -> None:
    """The ``.failure`` step's values: the run info alone (a public server, or a one-output event)
    or the run info, the operator's fold and its text (a local launch)."""
    from sapiens2.ui.error_board import BOARD, shown_error

    visitor = SimpleNamespace(session_hash="s")
    for operator in (False, True):
        with pytest.raises(gr.Error), BOARD.catching(visitor, "seg", "Body parts"):
            raise user_error(WeightsUnavailableError("No file at /data/seg: set SAPIENS2_CHECKPOINTS."))
        values = shown_error("seg", operator)(visitor)
        if not operator:
            assert isinstance(values, str) and values.startswith(
                "Body parts did not run. Weights unavailable: "
            )
            continue
        text, fold, details = values
        assert text.startswith("Body parts did not run.") and "SAPIENS2" not in text
        assert fold.visible is True and "SAPIENS2_CHECKPOINTS" in details
    assert shown_error("seg", False)(visitor).startswith("The run stopped with an error")  # nothing kept
