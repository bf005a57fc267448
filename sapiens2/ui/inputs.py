"""File inputs of the app: what a caller may send as a photo, and how it reaches the package."""

from __future__ import annotations

import base64
import urllib.parse
from typing import Any

import gradio as gr


def photo_input(**kwargs: Any) -> gr.Image:
    """A gr.Image (filepath) whose upload reaches ``sapiens2.imaging`` untouched.

    gr.Image would open the file with Pillow first, so a corrupt file or a decompression bomb
    would fail inside Gradio with a message nobody can act on; here the package reads it. Data
    URLs (webcam, API callers) become their raw bytes for the same reason: Gradio would decode and
    re-encode them (4 s and a 90-megapixel WebP in its cache for a 90 MP PNG) before any size check.
    (An instance override, not a subclass: Gradio writes a .pyi stub next to any component subclass.)
    """
    image = gr.Image(type="filepath", image_mode=None, **kwargs)
    gradio_preprocess = image.preprocess

    def preprocess(payload: Any) -> Any:
        if payload is None:
            return None
        url = str(payload.url or "")
        if url.startswith("data:"):
            return data_url_bytes(url)
        if payload.path:
            return str(payload.path)
        return gradio_preprocess(payload)

    image.preprocess = preprocess  # type: ignore[method-assign]
    return image


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
            title="Image problem",
            print_exception=False,
        ) from None
