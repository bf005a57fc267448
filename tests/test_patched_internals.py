"""The Gradio internals the app patches or reads (docs/DESIGN.md, "Patched internals"): one test
per entry, failing with a message that names the entry when Gradio changes the shape the app
relies on. Behaviour is tested elsewhere (tests/test_api_security.py, tests/test_app_gpu.py,
tests/test_page_browser.py); these say *which* assumption broke after an upgrade.

Also: every patched package is pinned in requirements.txt and pyproject.toml to the version
these tests ran on, and docs/DESIGN.md names that version.
"""

from __future__ import annotations

import inspect
import re
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

gr = pytest.importorskip("gradio")
from gradio.block_function import BlockFunction  # noqa: E402
from gradio.blocks import Blocks  # noqa: E402
from gradio.context import Context, LocalContext, get_blocks_context  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DESIGN = ROOT / "docs" / "DESIGN.md"


def changed(entry: str, what: str) -> str:
    """The failure message: which entry, what changed, where to look."""
    return (
        f"Gradio {gr.__version__} changed {what}. Patched internal '{entry}' (docs/DESIGN.md, 'Patched "
        "internals') needs checking before the gradio pin moves."
    )


def params(fn: object) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_component_preprocess_and_postprocess_are_looked_up_on_the_instance() -> None:
    """Entries 1-3 and 5: instance overrides of ``preprocess`` / ``postprocess`` (photo_input,
    clip_input, checked_by_package) only work while Gradio calls them through the instance."""
    entry = "component preprocess/postprocess overrides"
    for cls in (gr.Image, gr.File, gr.Slider, gr.Radio):
        assert params(cls.preprocess) == ["self", "payload"], changed(
            entry, f"{cls.__name__}.preprocess's signature"
        )
    assert params(gr.Image.postprocess) == ["self", "value"], changed(entry, "Image.postprocess's signature")
    pre = inspect.getsource(Blocks.preprocess_data)
    assert "block.preprocess," in pre or "block.preprocess(" in pre, changed(
        entry, "how preprocess is called"
    )
    post = inspect.getsource(Blocks.postprocess_data)
    assert "block.postprocess," in post or "block.postprocess(" in post, changed(
        entry, "how postprocess is called"
    )
    from gradio.helpers import Examples

    examples = inspect.getsource(Examples)
    assert ".postprocess(" in examples, changed(entry, "how examples are processed")
    # an instance attribute set on a component still wins over the class's method
    image = gr.Image(type="filepath")
    image.preprocess = lambda payload: ("ours", payload)  # type: ignore[method-assign]
    assert image.preprocess(1) == ("ours", 1), changed(entry, "attribute lookup on components")


def test_blocks_preprocess_data_is_the_first_step_and_takes_the_inputs_as_a_list() -> None:
    """Entry 4: the wrapper of ``Blocks.preprocess_data`` (ui/inputs.py) sees every input payload
    before Gradio moves files, and replaces refused ones."""
    entry = "Blocks.preprocess_data wrapper"
    assert inspect.iscoroutinefunction(Blocks.preprocess_data), changed(
        entry, "preprocess_data (no longer async)"
    )
    assert params(Blocks.preprocess_data)[:4] == ["self", "block_fn", "inputs", "state"], changed(
        entry, "preprocess_data's signature"
    )
    source = inspect.getsource(Blocks.process_api)
    assert "self.preprocess_data(" in source, changed(entry, "how process_api calls preprocess_data")
    body = inspect.getsource(Blocks.preprocess_data)
    assert "async_move_files_to_cache" in body and "processed_input" in body, changed(
        entry, "what preprocess_data does (file moves, a list of processed inputs)"
    )
    assert "inputs" in params(BlockFunction.__init__), changed(entry, "BlockFunction.inputs")


def test_the_upload_record_and_the_request_context() -> None:
    """Entries 1-4: which files Gradio's upload route wrote (``Blocks.upload_file_set``), the app
    serving a request (``LocalContext.blocks``), Gradio's upload folder, static files."""
    entry = "upload record and request context"
    with gr.Blocks() as demo:
        gr.Markdown("x")
    assert isinstance(getattr(demo, "upload_file_set", None), set), changed(entry, "Blocks.upload_file_set")
    assert LocalContext.blocks.get(None) is None, changed(entry, "LocalContext.blocks")
    routes = inspect.getsource(__import__("gradio.routes", fromlist=["x"]))
    assert "upload_file_set.update(" in routes, changed(entry, "how the upload route records files")
    from gradio.utils import get_upload_folder, is_static_file

    assert isinstance(get_upload_folder(), str) and callable(is_static_file), changed(entry, "gradio.utils")
    assert hasattr(gr.Image(), "move_resource_to_block_cache"), changed(entry, "move_resource_to_block_cache")
    assert hasattr(Context, "root_block"), changed(entry, "Context.root_block")


def test_the_examples_cache_event_can_join_the_models_concurrency_group() -> None:
    """Entry 6: ``share_model_slots`` sets the concurrency group of the examples' lazy-cache run
    on its ``BlockFunction``, found by the dependency's id in the Blocks being built."""
    from gradio.helpers import Examples

    from sapiens2.ui.layout import MODELS, share_model_slots

    entry = "examples' concurrency group"
    assert "cache_mode" in params(Examples.__init__), changed(entry, "gradio.helpers.Examples")
    assert "concurrency_id" not in params(Examples.__init__), (
        "gr.Examples now takes concurrency_id: pass it and drop share_model_slots (docs/DESIGN.md, "
        "'Patched internals', entry 6)."
    )
    with gr.Blocks() as demo:
        image = gr.Image(type="filepath")
        out = gr.Textbox()
        ex = gr.Examples([[str(ROOT / "assets" / "nasa-eileen-collins-portrait.png")]], [image], [out],
                         fn=lambda p: p, cache_examples=True, cache_mode="lazy")  # fmt: skip
        assert get_blocks_context() is not None, changed(entry, "get_blocks_context()")
        assert ex.cache_event is not None and "id" in ex.cache_event, changed(entry, "Examples.cache_event")
        share_model_slots(ex.cache_event)
    fn = demo.fns[ex.cache_event["id"]]
    assert isinstance(fn, BlockFunction) and fn.concurrency_id == MODELS, changed(entry, "Blocks.fns")


def test_the_remove_button_of_file_lists_is_named_as_the_page_css_expects() -> None:
    """Entry 7: the page's CSS hides the remove button Gradio's file list shows on every row of an
    output list; it finds the button by its accessible name."""
    from sapiens2.ui.widgets import PAGE_CSS

    assets = Path(gr.__file__).parent / "templates" / "frontend" / "assets"
    found = [
        p for p in assets.glob("*.js") if 'aria-label="Remove this file"' in p.read_text(errors="ignore")
    ]
    assert found, changed("file list remove button (page CSS)", "the file list's remove button")
    assert 'button[aria-label="Remove this file"]' in PAGE_CSS


def test_the_stream_route_keeps_one_pending_frame_and_names_its_event() -> None:
    """Entry 8: the Live tab counts the POSTs to ``/stream/{event_id}`` (a route that replaces the
    event's pending data) and learns its stream from ``LocalContext.event_id``."""
    from sapiens2.ui.live_tab import _EVENT

    entry = "Live tab's stream route and event id"
    routes = inspect.getsource(__import__("gradio.routes", fromlist=["x"]))
    assert '"/stream/{event_id}"' in routes, changed(entry, "the stream route's path")
    assert "event.data = " in routes, changed(entry, "how the stream route keeps a posted frame")
    assert LocalContext.event_id.get(None) is None, changed(entry, "LocalContext.event_id")
    assert _EVENT.search("/gradio_api/stream/" + "ab" * 16) is not None


def test_gradio_request_carries_the_starlette_request() -> None:
    """Not a patch (public API), listed for the run info's queue stage (ui/arrival.py): an event
    function's ``gr.Request`` holds the Starlette request whose scope the middleware stamped."""
    from starlette.requests import Request

    from sapiens2.ui.arrival import ARRIVED, waited

    raw = Request({"type": "http", "method": "POST", "path": "/", "headers": [], "state": {ARRIVED: 0.0}})
    wrapped = gr.Request(request=raw)
    assert wrapped.request is raw and waited(wrapped) is not None and waited(gr.Request()) is None


# ----------------------------------------------------------------------------- the pins


def _requirement(path: Path, name: str) -> Requirement:
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and Requirement(line).name == name:
            return Requirement(line)
    raise AssertionError(f"{name} is not in {path}")


@pytest.mark.parametrize("name", ["gradio", "spaces"])
def test_patched_packages_are_pinned_to_the_version_checked(name: str) -> None:
    """A rebuild of the Space never picks up a release no test has checked: each patched package
    is pinned to the installed version (the one this suite ran on), in both requirement files,
    and docs/DESIGN.md names it."""
    installed = version(name)
    pyproject = (ROOT / "pyproject.toml").read_text()
    app_extra = re.search(r"^app = \[(.*)\]$", pyproject, re.M)
    assert app_extra, "pyproject.toml has no app extra"
    listed = [Requirement(r.strip().strip('"')) for r in app_extra.group(1).split(",")]
    for req in (_requirement(ROOT / "requirements.txt", name), next(r for r in listed if r.name == name)):
        assert str(req.specifier) == f"=={installed}", (
            f"{name} is {req.specifier} but the tests ran on {installed}: pin the version the patched "
            "internals were checked on (docs/DESIGN.md, 'Patched internals', how to move a pin)"
        )
    if name == "gradio":
        assert f"gradio {installed}" in DESIGN.read_text(), (
            f"docs/DESIGN.md must say it was checked on gradio {installed}"
        )
