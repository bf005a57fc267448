"""The app's MCP tools through a real MCP client (the ``mcp`` package's streamable-HTTP client,
as an agent connects): every file parameter says what the server takes, a data URL, and a call
made the way the schema says succeeds; an http(s) URL is refused without being fetched.

The app runs on 127.0.0.1 with the tiny checkpoints (``test_api_security.served_app``)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

pytest.importorskip("mcp")
from mcp import ClientSession  # noqa: E402
from mcp.client.streamable_http import streamablehttp_client  # noqa: E402
from test_api_security import EXAMPLE, served_app  # noqa: E402

from sapiens2.ui.inputs import NOT_UPLOADED  # noqa: E402
from sapiens2.ui.mcp_files import MCP_FORMAT, MCP_NOTE, PHOTO_DOC  # noqa: E402


def jpeg_data_url(path: Path = EXAMPLE) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(path.read_bytes()).decode()


def gif_data_url() -> str:
    """A 4-frame 32x24 GIF clip."""
    frames = [Image.new("RGB", (32, 24), (60 * i, 90, 200 - 40 * i)) for i in range(4)]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    return "data:image/gif;base64," + base64.b64encode(buf.getvalue()).decode()


def mcp(url: str, work: Any) -> Any:
    """``await work(session)`` in one MCP session with the app at ``url``."""

    async def main() -> Any:
        async with streamablehttp_client(url + "gradio_api/mcp/") as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await work(session)

    return asyncio.run(main())


@pytest.fixture(scope="module")
def url(tiny_checkpoints, tmp_path_factory) -> Iterator[str]:
    with served_app(tiny_checkpoints, tmp_path_factory.mktemp("mcp")) as srv:
        yield srv.url


@pytest.fixture(scope="module")
def tools(url: str) -> dict[str, Any]:
    async def listed(session: ClientSession) -> dict[str, Any]:
        return {tool.name: tool for tool in (await session.list_tools()).tools}

    return mcp(url, listed)


def file_parameters(tool: Any) -> dict[str, dict[str, Any]]:
    return {name: p for name, p in tool.inputSchema["properties"].items() if "format" in p}


@pytest.mark.slow
def test_every_file_parameter_says_data_url_and_nothing_promises_a_web_url(tools: dict[str, Any]) -> None:
    with_files = {name: file_parameters(tool) for name, tool in tools.items() if file_parameters(tool)}
    assert {"pose", "seg", "similarity", "all_tasks", "video"} <= set(with_files)
    for name, params in with_files.items():
        assert all(p["format"] == MCP_FORMAT for p in params.values()), (name, params)
        assert tools[name].description.endswith(MCP_NOTE) or MCP_NOTE in tools[name].description
    text = json.dumps([(t.description, t.inputSchema) for t in tools.values()])
    for promise in ("http or https url", "upload_file_to_gradio", "returned path"):
        assert promise not in text, promise
    photo = tools["seg"].inputSchema["properties"]["photo"]
    assert photo["type"] == "string" and photo["description"] == f"the photo: {PHOTO_DOC}"
    assert "second photo" in tools["similarity"].inputSchema["properties"]["other_photo"]["description"]


def schema_size(tool: Any) -> str:
    """The size the tool's schema offers: the tiny checkpoints are custom (no published size), so the
    schema offers ``custom`` only, and a published size would be refused."""
    choices = tool.inputSchema["properties"]["size"]["enum"]
    assert choices == ["custom"], choices
    return choices[0]


@pytest.mark.slow
def test_a_call_made_as_the_schema_says_succeeds(url: str, tools: dict[str, Any]) -> None:
    seg_size, same_size, plan_size = (schema_size(tools[n]) for n in ("seg", "similarity", "video_plan"))

    async def calls(session: ClientSession) -> list[Any]:
        seg = await session.call_tool("seg", {"photo": jpeg_data_url(), "size": seg_size})
        same = await session.call_tool(
            "similarity", {"photo": jpeg_data_url(), "other_photo": jpeg_data_url(), "size": same_size}
        )
        plan = await session.call_tool(
            "video_plan", {"clip": gif_data_url(), "task": "seg", "size": plan_size}
        )
        return [seg, same, plan]

    seg, same, plan = mcp(url, calls)
    assert not seg.isError, seg.content
    # the result's files: the previews are named after the photo (the rendering's: <photo>_seg_preview.jpg)
    assert any("_seg_preview.jpg" in getattr(c, "text", "") for c in seg.content), seg.content
    assert not same.isError and same.content[0].text.startswith("[1.0,"), same.content  # a photo is itself
    assert not plan.isError and plan.content[0].text.startswith("32x24 at 10 fps"), plan.content
    assert "4 frames" in plan.content[0].text  # the clip came through whole


def test_a_web_url_is_refused_and_never_fetched(url: str) -> None:
    """An agent that sends an http URL anyway gets the app's one refusal; the listener named by
    the URL sees no connection (nothing fetched it: not Gradio, not the app)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.2)
    port, seen, stop = listener.getsockname()[1], [], threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                seen.append(listener.accept()[0])
            except TimeoutError:
                continue

    watcher = threading.Thread(target=accept, daemon=True)
    watcher.start()
    try:

        async def call(session: ClientSession) -> Any:
            return await session.call_tool("seg", {"photo": f"http://127.0.0.1:{port}/person.jpg"})

        refused = mcp(url, call)
    finally:
        stop.set()
        watcher.join(10)
        listener.close()
    assert refused.isError and NOT_UPLOADED in refused.content[0].text, refused.content
    assert seen == []
