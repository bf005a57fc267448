"""The app's file inputs: a file reaches ``sapiens2.inputs.intake`` only if this server received it.

The rule (issue 11): a file input takes (a) a file Gradio's upload route wrote for this app
(``POST /gradio_api/upload``; the page uploads this way too), (b) a file this server itself gave
the component (an example photo), or (c) the bytes of a data URL. Any other path a caller sends
is refused with :data:`NOT_UPLOADED`, the same words whatever the path names (an image, a text
file, a folder, a FIFO, nothing at all), before anything opens it (a path in Gradio's upload
folder gets :data:`EXPIRED` instead, below). The video clip input
(:func:`clip_input`) follows the same rule without (c), refused with :data:`NOT_UPLOADED_CLIP`.

Why the preprocess override does the check rather than Gradio (6.31, read in its source):

* Gradio's own check (``processing_utils.async_move_files_to_cache(check_in_upload_folder=True)``,
  before preprocess) only looks at payloads tagged ``"meta": {"_type": "gradio.FileData"}``. An
  untagged ``{"path": ...}`` skips it, still validates as ``ImageData``, and ``gr.Image``'s own
  preprocess opens that path: the arbitrary file read of issue 11.
* Where it runs, it accepts any file under the upload folder (``GRADIO_TEMP_DIR``), which also
  holds every output this app (and any other Gradio app on the machine) has produced.
* ``allowed_paths`` / ``blocked_paths`` govern what the server may serve or move, not what a
  caller may name as an input; the example photos are served from ``assets/`` through them.

So every path is checked here against ``Blocks.upload_file_set`` (what the upload route wrote for
this app; ``delete_cache`` removes entries with their files) and the files this server handed the
component through ``postprocess`` (the examples' copies). The check runs twice: first in a wrapper
of the app's ``Blocks.preprocess_data``, before Gradio touches the payload (Gradio would answer a
tagged outside path with an error whose text it hides, ``{"error": null}``, and would download an
``http(s)`` path, SSRF-protected but still a fetch a caller chose), so every path gets the one
answer; then in the component's preprocess, which holds even where the wrapper is missing (the
app rendered inside another Blocks). A refused file reaches the event's function as a
:class:`Refused` value, never as a path: the function raises its error (:func:`refuse`), so the
error is the function's own and the page can keep it in view (``error_board.ErrorBoard``).

A path inside Gradio's upload folder that is not (or no longer) an upload gets
:data:`EXPIRED`: Gradio deletes uploads after a while (the app's ``delete_cache``), so an upload
that waited too long in a queue ends here. The choice reads only the path's text, not the disk.

Uploads are not tied to a session: Gradio's upload route records none. An upload's folder name
is a SHA-256 of its bytes salted with a secret made once per Gradio installation, so naming
another visitor's upload needs that photo in the first place.
"""

from __future__ import annotations

import base64
import functools
import os
import urllib.parse
import weakref
from collections.abc import Collection
from typing import Any

import gradio as gr
from gradio.context import Context, LocalContext
from gradio.utils import get_upload_folder, is_static_file
from gradio_client.utils import is_http_url_like

from ..errors import InputImageError
from ..inputs.intake import probe

NOT_UPLOADED = (
    "This file was not uploaded to this app. Upload the photo (API callers: POST it to "
    "/gradio_api/upload and pass the path that returns) or send it as a data URL."
)
ERROR_TITLE = "Image problem"
NOT_UPLOADED_CLIP = (
    "This file was not uploaded to this app. Upload the clip (API callers: POST it to "
    "/gradio_api/upload and pass the path that returns)."
)
#: a path in Gradio's upload folder that is not an upload (any more): an expired upload, most likely
EXPIRED = (
    "This upload has expired: the server keeps uploads for a limited time, and this one waited too "
    "long (e.g. in a long queue). Upload the {what} again."
)
CLIP_ERROR_TITLE = "Video problem"
#: what the clip input's file picker offers (the reader checks the content, not the name)
CLIP_TYPES = [".mp4", ".webm", ".mov", ".gif"]

#: each file input -> the real paths of the files this server gave it (see photo_input)
_SERVED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
#: each clip input (see clip_input): refused with the clip's words
_CLIPS: weakref.WeakSet[Any] = weakref.WeakSet()
#: the inputs made by photo_set_input (a list of files, each checked as a photo is)
_SETS: weakref.WeakSet[Any] = weakref.WeakSet()


class Refused:
    """A file input's value when its file was refused: the message and title the event's function
    raises (:func:`refuse`). Never a path: anything that read it as one would refuse it too."""

    def __init__(self, message: str, title: str) -> None:
        self.message, self.title = message, title

    def error(self) -> gr.Error:
        return gr.Error(self.message, title=self.title, print_exception=False)

    def __repr__(self) -> str:
        return f"Refused({self.message!r})"


def refuse(*values: Any) -> None:
    """Raise the error of the first refused file among ``values`` (an event function's inputs)."""
    for value in values:
        if isinstance(value, Refused):
            raise value.error()


def photo_input(**kwargs: Any) -> gr.Image:
    """A gr.Image (filepath) whose upload reaches ``sapiens2.inputs.intake`` untouched, if it is one.

    Use it for every file input of the app (the photo, the matting background, the second photo
    of similarity): only then does the rule in the module docstring hold for that input.

    gr.Image would open the file with Pillow first, so a corrupt file or a decompression bomb
    would fail inside Gradio with a message nobody can act on; here the package reads it. Data
    URLs (webcam, API callers) become their raw bytes for the same reason: Gradio would decode and
    re-encode them (4 s and a 90-megapixel WebP in its cache for a 90 MP PNG) before any size check.
    (Instance overrides, not a subclass: Gradio writes a .pyi stub next to any component subclass.)
    """
    image = gr.Image(type="filepath", image_mode=None, **kwargs)
    served: set[str] = set()  # real paths of the files this server gave the component
    gradio_postprocess = image.postprocess

    def postprocess(value: Any) -> Any:
        # Only the server calls this (examples, a handler's output): what it returns is ours.
        data = gradio_postprocess(value)
        path = getattr(data, "path", None)
        if path and not is_http_url_like(path):  # the path Gradio sends the page: the file or its copy
            sent = path if is_static_file(path) else image.move_resource_to_block_cache(path) or path
            served.add(os.path.realpath(sent))
        return data

    def preprocess(payload: Any) -> Any:
        if payload is None:
            return None
        url = str(payload.url or "")
        if url.startswith("data:"):
            return data_url_bytes(url)
        return received(payload.path, served, photo=True)

    image.postprocess = postprocess  # type: ignore[method-assign]
    image.preprocess = preprocess  # type: ignore[method-assign]
    _SERVED[image] = served
    _check_paths_before_gradio(Context.root_block)  # the app being built
    return image


def say_on_arrival(image: gr.Image, status: Any = None) -> None:
    """When a file arrives in ``image`` (upload, paste, example), check at once that it is an image
    the package can read, and say what is wrong in ``status`` (a gr.Markdown, kept until the next
    file) or, without one, in a pop-up. The run would refuse the file with the same words."""

    def check(value: Any) -> Any:
        text = arrival_problem(value)
        if status is None:
            if text:
                gr.Warning(text, title=ERROR_TITLE)
            return None
        return f"⚠ {text}" if text else ""

    image.change(check, image, status, api_visibility="private", queue=False, show_progress="hidden")


def arrival_problem(value: Any) -> str:
    """What is wrong with a photo input's value, or "" (nothing, or nothing known yet)."""
    if isinstance(value, Refused):
        return value.message
    if not isinstance(value, str):  # None, or a data URL's bytes (read when the run starts)
        return ""
    try:
        probe(value)
    except InputImageError as err:
        return str(err)
    return ""


def clip_input(**kwargs: Any) -> gr.File:
    """A file input for a video clip under the same rule as :func:`photo_input`: an upload to
    this app, or nothing. Data URLs are refused too (they would bypass the upload size limit).

    A gr.File rather than a gr.Video: the Video upload widget offers only ``video/*`` (no GIF),
    and its preprocess would run FFmpeg on the file before the package checked it.
    """
    clip = gr.File(file_types=CLIP_TYPES, file_count="single", type="filepath", **kwargs)

    def preprocess(payload: Any) -> Any:
        if payload is None:
            return None
        return received(payload.path, (), photo=False)

    clip.preprocess = preprocess  # type: ignore[method-assign]
    _SERVED[clip] = set()
    _CLIPS.add(clip)
    _check_paths_before_gradio(Context.root_block)
    return clip


def photo_set_input(**kwargs: Any) -> gr.File:
    """A multi-file input (a set of photos or zips) under the same rule as :func:`photo_input`:
    each file an upload to this app, else the set's value holds its :class:`Refused`."""
    files = gr.File(file_count="multiple", type="filepath", **kwargs)

    def preprocess(payload: Any) -> Any:
        if payload is None:
            return None
        items = payload.root if hasattr(payload, "root") else [payload]
        return [received(item.path, (), photo=True) for item in items]

    files.preprocess = preprocess  # type: ignore[method-assign]
    _SERVED[files] = set()
    _SETS.add(files)
    _check_paths_before_gradio(Context.root_block)
    return files


def received(path: object, served: Collection[str] = (), photo: bool = True) -> str | Refused:
    """``path`` (resolved) if Gradio's upload route wrote it for the running app or it is in
    ``served``; otherwise its :class:`Refused` value (:func:`refusal`). Nothing here opens the file."""
    blocks = LocalContext.blocks.get(None)  # the app serving this request (set by Gradio)
    # one copy made in C (atomic under the GIL): the upload route and delete_cache change the set
    uploads = list(getattr(blocks, "upload_file_set", ()))
    try:
        real = (
            os.path.realpath(path) if isinstance(path, str) and path and not is_http_url_like(path) else None
        )
    except (OSError, ValueError):  # e.g. a NUL byte in the path
        real = None
    if real is not None and (real in served or real in {os.path.realpath(p) for p in uploads}):
        return real
    return refusal(path, photo)


def refusal(path: object, photo: bool = True) -> Refused:
    """Why a path is refused: :data:`EXPIRED` when its text names a place in Gradio's upload
    folder (the disk is not consulted: the answer says nothing about the server's files),
    otherwise :data:`NOT_UPLOADED` (or the clip's words)."""
    title = ERROR_TITLE if photo else CLIP_ERROR_TITLE
    if _in_upload_folder(path):
        return Refused(EXPIRED.format(what="photo" if photo else "clip"), title)
    return Refused(NOT_UPLOADED if photo else NOT_UPLOADED_CLIP, title)


def _in_upload_folder(path: object) -> bool:
    if not isinstance(path, str) or "\0" in path or not os.path.isabs(path):
        return False
    folder = os.path.normpath(os.path.abspath(get_upload_folder()))
    named = os.path.normpath(path)  # "..": resolved in the text only
    return os.path.commonpath([folder, named]) == folder and named != folder


def _check_paths_before_gradio(blocks: gr.Blocks | None) -> None:
    """Wrap ``blocks.preprocess_data`` (where Gradio moves file payloads into its cache, before
    any preprocess) so every path sent to a photo or clip input is checked first. A refused
    input is withheld from Gradio (it gets None) and reaches the function as :class:`Refused`."""
    if blocks is None or getattr(blocks.preprocess_data, "checks_paths_first", False):
        return
    gradio_preprocess_data = blocks.preprocess_data

    @functools.wraps(gradio_preprocess_data)
    async def preprocess_data(block_fn: Any, inputs: list[Any], *args: Any, **kwargs: Any) -> Any:
        refused: dict[int, Refused] = {}
        for i, (block, value) in enumerate(zip(block_fn.inputs, inputs, strict=False)):  # extras ignored
            served = _SERVED.get(block)
            if served is None or value is None:
                continue
            photo = block not in _CLIPS
            if block in _SETS and isinstance(value, list):  # a set: every file an upload
                checks = (received(v.get("path") if isinstance(v, dict) else None, served) for v in value)
                bad = next((c for c in checks if isinstance(c, Refused)), None)
                if bad is not None:
                    refused[i] = bad
            elif not isinstance(value, dict):  # a bare path string, a list...: never an upload
                refused[i] = refusal(value if isinstance(value, str) else None, photo)
            elif value.get("path") is not None or not photo:  # a clip comes only by path
                checked = received(value.get("path"), served, photo)
                if isinstance(checked, Refused):
                    refused[i] = checked
        if refused and len(inputs) != len(block_fn.inputs):  # Gradio would refuse the count first
            raise next(iter(refused.values())).error()
        if refused:
            inputs = [None if i in refused else v for i, v in enumerate(inputs)]
        processed = await gradio_preprocess_data(block_fn, inputs, *args, **kwargs)
        for i, marker in refused.items():
            processed[i] = marker
        return processed

    preprocess_data.checks_paths_first = True  # type: ignore[attr-defined]
    blocks.preprocess_data = preprocess_data  # type: ignore[method-assign]


def data_url_bytes(url: str) -> bytes:
    """The bytes of a ``data:[<type>][;base64],<data>`` URL (the package then reads them)."""
    header, sep, data = url.partition(",")
    try:
        if not sep:
            raise ValueError("no comma")
        if header.endswith(";base64"):
            return base64.b64decode(data, validate=True)
        return urllib.parse.unquote_to_bytes(data)
    except ValueError:  # binascii.Error is a ValueError
        raise gr.Error(
            "The pasted image is not a valid data URL (expected data:image/...;base64,...). Upload the file instead.",
            title=ERROR_TITLE,
            print_exception=False,
        ) from None
