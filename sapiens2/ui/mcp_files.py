"""What the API docs and the MCP tools say a file parameter takes, so that a caller who follows
them succeeds.

The app takes a photo as a file uploaded to it or as a data URL, and fetches no URL a caller
names (``sapiens2.ui.inputs``). Gradio (6.31) writes every file parameter of an MCP tool as
``"format": "Gradio File Input - a http or https url to a file"`` and ends each such tool's
description by telling the agent to upload the file with an ``upload_file_to_gradio`` tool and
pass the path it returns; its MCP layer accepts only data URLs and http(s) URLs, so both of those
instructions lead to a refusal. A data URL works: Gradio's MCP layer saves it and uploads it to
the app. Gradio has no setting for these texts, so :func:`lifespan` replaces them on the app's
MCP server when the server starts (``app.launch`` passes it to Gradio as the FastAPI lifespan).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

log = logging.getLogger(__name__)

#: The API docs' words for a photo parameter (REST, gradio_client, and the MCP tool's description).
PHOTO_DOC = (
    "a data URL of the image file (data:image/jpeg;base64,...) or a file uploaded to this app "
    "(REST: the path POST /gradio_api/upload returns; gradio_client's handle_file uploads it); "
    "http(s) URLs are refused."
)
#: The MCP schema's ``format`` of every file parameter, instead of Gradio's "a http or https url".
MCP_FORMAT = "a data URL of the file: data:<mime type>;base64,<the file's bytes in base64>"
#: Ends each MCP tool description with a file parameter, instead of Gradio's upload instructions.
MCP_NOTE = (
    " Send each file as a data URL (data:image/jpeg;base64,... for a JPEG photo): this server fetches"
    " no http(s) URL, and MCP passes no file path."
)
_GRADIO_FORMAT = "Gradio File Input - a http or https url to a file"


def photo_doc(what: str = "the photo") -> str:
    """``what``, then how to send it: the description of a photo parameter."""
    return f"{what}: {PHOTO_DOC}"


@contextlib.asynccontextmanager
async def lifespan(app: Any) -> AsyncIterator[None]:
    """FastAPI lifespan: fix the file texts of the app's MCP server (if it has one) before it serves."""
    server = getattr(app.get_blocks(), "mcp_server_obj", None)
    if server is not None:
        describe_files(server)
    yield


def describe_files(server: Any) -> None:
    """Wrap the two methods of Gradio's ``GradioMCPServer`` that write the file texts (the tool
    list calls them on each request, on the instance)."""
    if not all(hasattr(server, name) for name in ("simplify_filedata_schema", "get_fn_description")):
        log.warning("Gradio's MCP server changed: its file parameters still say 'a http or https url'")
        return
    simplify, describe = server.simplify_filedata_schema, server.get_fn_description
    gradio_note = getattr(server, "_file_data_tool_description", "")

    def simplify_filedata_schema(schema: dict[str, Any]) -> tuple[dict[str, Any], list[list[str | int]]]:
        simplified, positions = simplify(schema)
        return _replace_format(simplified), positions

    def get_fn_description(block_fn: Any, tool_name: str) -> tuple[str, dict[str, str]]:
        description, parameters = describe(block_fn, tool_name)
        if gradio_note and gradio_note in description:
            description = description.replace(gradio_note, MCP_NOTE)
        return description, parameters

    server.simplify_filedata_schema = simplify_filedata_schema
    server.get_fn_description = get_fn_description


def _replace_format(node: Any) -> Any:
    if isinstance(node, dict):
        out = {key: _replace_format(value) for key, value in node.items()}
        if out.get("format") == _GRADIO_FORMAT:
            out["format"] = MCP_FORMAT
        return out
    if isinstance(node, list):
        return [_replace_format(item) for item in node]
    return node
