""" "Compute in my browser": a task whose comparison a browser can make (features: the cosine of
two CLS embeddings) gets a block where the visitor's browser runs the task's ONNX file with
onnxruntime-web (WebGPU, else WebAssembly): no upload, no GPU quota (docs/ONNX_BROWSER.md).

The server exports the file on its first request and keeps it on disk; the page keeps it in the
browser's Cache Storage. Both are served by :class:`BrowserFiles`, an ASGI middleware the app
installs at launch (``app.app_kwargs``), under :data:`PREFIX`:

* ``<model>/<dtype>.json``: the manifest (the file's URL and bytes), exported first if needed;
* ``<model>/<file>``: that file, found by its exact name in what this process exported;
* ``ort/<file>``: onnxruntime-web's own files, when :data:`ORT_WEB_ENV` names a local folder.

No text of a request is joined onto a folder except an ``ort/`` name, which must be a plain file
name listed in that folder.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr

from ..errors import Sapiens2Error, for_visitor
from ..inputs.intake import DEFAULT_MAX_SIDE
from ..inputs.limits import MAX_FILE_BYTES
from ..models.checkpoints import Checkpoints
from ..tasks.registry import Task

log = logging.getLogger(__name__)

#: onnxruntime-web's release the page loads, and where from by default (a CDN).
ORT_WEB_VERSION = "1.30.0"
ORT_WEB_CDN = f"https://cdn.jsdelivr.net/npm/onnxruntime-web@{ORT_WEB_VERSION}/dist/"
#: An http(s) URL of onnxruntime-web's ``dist/`` folder, or a local folder holding it (served here).
ORT_WEB_ENV = "SAPIENS2_ORT_WEB"
#: Where the server keeps the files it exported for browsers (default: beside the Hub cache).
CACHE_ENV = "SAPIENS2_BROWSER_ONNX_CACHE"
#: The paths the middleware answers.
PREFIX = "/sapiens2-browser/"
#: The model files a browser may ask for: int8 (a quarter of the bytes) and fp32 (exact).
DTYPES = ("int8", "fp32")
#: The zoo size a browser runs when the server has no checkpoint of its own for the task.
BROWSER_SIZE = "0.1b"
_ORT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\.(mjs|wasm)$")
_TYPES = {".mjs": "text/javascript", ".wasm": "application/wasm", ".onnx": "application/octet-stream"}
_SCRIPT = Path(__file__).with_name("static") / "browser_compare.js"


def cache_dir() -> Path:
    """The server's folder of exported browser files: $SAPIENS2_BROWSER_ONNX_CACHE, else
    ``sapiens2-browser-onnx`` in the Hugging Face home."""
    own = os.environ.get(CACHE_ENV)
    if own:
        return Path(own).expanduser()
    from huggingface_hub import constants

    return Path(constants.HF_HOME) / "sapiens2-browser-onnx"


@dataclass
class BrowserModel:
    """A task's network as a browser gets it: exported from the server's own weights for the task
    (its checkpoint, else the zoo's :data:`BROWSER_SIZE` from the Hub), once per dtype."""

    task: Task
    size: str  # the zoo size, or the checkpoint's (``custom`` when unknown)
    checkpoint: Path | None
    token: str = ""
    files: dict[str, Path] = field(default_factory=dict)  # dtype -> the exported file
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        # stable across restarts: a browser's kept file stays valid while the weights do
        source = f"{self.task.name}|{self.size}|{self.checkpoint or 'hub'}"
        self.token = f"{self.task.name}-{hashlib.sha256(source.encode()).hexdigest()[:12]}"

    def key(self, dtype: str) -> str:
        """What the exported file depends on: weights, size, dtype and the package's version."""
        from .. import __version__

        weights = "hub"
        if self.checkpoint is not None:
            stat = self.checkpoint.stat() if self.checkpoint.exists() else None
            weights = (
                f"{self.checkpoint.resolve()}|{stat.st_size if stat else 0}|{stat.st_mtime_ns if stat else 0}"
            )
        text = f"{self.task.name}|{self.size}|{weights}|{dtype}|{__version__}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def family(self, dtype: str) -> str:
        return f"{self.task.name}-{self.size}-{dtype}-"

    def file(self, dtype: str) -> Path:
        """The exported file for ``dtype``: from the disk cache, else exported now (one export
        at a time; a concurrent request waits for it)."""
        with self.lock:
            known = self.files.get(dtype)
            if known is not None and known.is_file():
                return known
            folder = cache_dir()
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{self.family(dtype)}{self.key(dtype)}.onnx"
            if not path.is_file():
                self._export(path, dtype)
            self.files[dtype] = path
            return path

    def _export(self, path: Path, dtype: str) -> None:
        from ..models.onnx_export import export_onnx

        partial = path.with_name(f"{path.stem}.partial-{os.getpid()}.onnx")
        log.info("exporting %s %s %s for browsers to %s", self.task.name, self.size, dtype, path)
        try:
            size = None if self.checkpoint is not None else self.size
            export_onnx(self.task.name, partial, size=size, checkpoint=self.checkpoint, int8=dtype == "int8")
            if partial.with_name(partial.name + ".data").exists():  # external data: not one file
                raise RuntimeError(f"The {self.size} {self.task.name} model is too large for a browser.")
            os.replace(partial, path)
        finally:
            for stale in (partial, partial.with_name(partial.name + ".data")):
                stale.unlink(missing_ok=True)

    def manifest(self, dtype: str) -> dict[str, Any]:
        path = self.file(dtype)
        return {
            "url": f"{PREFIX}{self.token}/{path.name}",
            "bytes": path.stat().st_size,
            "size": self.size,
            "dtype": dtype,
            "family": self.family(dtype),
        }

    def served(self, name: str) -> Path | None:
        """The exported file named exactly ``name``, or None (nothing else is ever opened)."""
        return next((p for p in list(self.files.values()) if p.name == name and p.is_file()), None)


#: token -> model, for every page built in this process (a page's block names its token).
_PUBLISHED: dict[str, BrowserModel] = {}
_PUBLISHED_LOCK = threading.Lock()


def publish(task: Task, checkpoints: Checkpoints, checkpoint_size: str | None) -> BrowserModel:
    """The browser model of ``task`` with a server's checkpoints (one per source per process)."""
    path = checkpoints[task.name] if task.name in checkpoints else None
    size = (checkpoint_size or "custom") if path is not None else BROWSER_SIZE
    model = BrowserModel(task, size, Path(path) if path is not None else None)
    with _PUBLISHED_LOCK:
        return _PUBLISHED.setdefault(model.token, model)


def ort_source() -> tuple[str, str | None, Path | None]:
    """(the page's onnxruntime-web base URL, why it cannot load or None, the local folder served)."""
    value = os.environ.get(ORT_WEB_ENV, "").strip() or ORT_WEB_CDN
    if re.match(r"^https?://", value):
        return value.rstrip("/") + "/", None, None
    folder = Path(value).expanduser()
    if not (folder / "ort.wasm.bundle.min.mjs").is_file():
        why = f"${ORT_WEB_ENV} names {folder}, which holds no onnxruntime-web dist files (ort.wasm.bundle.min.mjs)."
        log.warning(why)
        return (
            f"{PREFIX}ort/",
            "This server's copy of onnxruntime-web is missing, so the page cannot load it.",
            None,
        )
    return f"{PREFIX}ort/", None, folder.resolve()


# ----------------------------------------------------------------------------- serving


def _error(status: int, message: str) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse({"error": message}, status_code=status, headers={"Cache-Control": "no-store"})


def _file(path: Path, *, immutable: bool) -> Any:
    from starlette.responses import FileResponse

    cache = "public, max-age=31536000, immutable" if immutable else "no-cache"
    return FileResponse(path, media_type=_TYPES[path.suffix], headers={"Cache-Control": cache})


def _ort_file(name: str) -> Any:
    _, why, folder = ort_source()
    if folder is None or not _ORT_NAME.match(name):
        return _error(404, why or "Not found.")
    path = folder / name
    if path.parent.resolve() != folder or path.is_symlink() or not path.is_file():
        return _error(404, "Not found.")
    return _file(path, immutable=False)


def _manifest(model: BrowserModel, dtype: str) -> Any:
    from starlette.responses import JSONResponse

    try:
        body = model.manifest(dtype)
    except Sapiens2Error as err:
        log.warning("browser model %s %s: %s", model.token, dtype, err)
        return _error(
            503, f"The server cannot make the {model.task.tab.lower()} model file: {for_visitor(err)}"
        )
    except (ImportError, OSError, RuntimeError) as err:
        log.exception("browser model %s %s", model.token, dtype)
        return _error(
            503, f"The server cannot make the {model.task.tab.lower()} model file ({type(err).__name__})."
        )
    return JSONResponse(body, headers={"Cache-Control": "no-store"})


def respond(method: str, rest: str) -> Any:
    """The response to ``method`` on ``PREFIX + rest`` (blocking: an export may run)."""
    if method not in ("GET", "HEAD"):
        return _error(405, "Only GET and HEAD.")
    parts = rest.split("/")
    if len(parts) != 2:
        return _error(404, "Not found.")
    head, name = parts
    if head == "ort":
        return _ort_file(name)
    model = _PUBLISHED.get(head)
    if model is None:
        return _error(404, "Not found.")
    if name.endswith(".json") and name[: -len(".json")] in DTYPES:
        return _manifest(model, name[: -len(".json")])
    path = model.served(name)
    return _file(path, immutable=True) if path is not None else _error(404, "Not found.")


class BrowserFiles:
    """ASGI middleware answering :data:`PREFIX` paths; everything else goes on to the app."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path") or ""
        if scope.get("type") != "http" or not path.startswith(PREFIX):
            await self.app(scope, receive, send)
            return
        from starlette.concurrency import run_in_threadpool

        response = await run_in_threadpool(respond, scope.get("method", "GET"), path[len(PREFIX) :])
        await response(scope, receive, send)


def middleware() -> Any:
    """The browser files as one entry of the served app's middlewares (``app.app_kwargs``)."""
    from starlette.middleware import Middleware

    return Middleware(BrowserFiles)


# ----------------------------------------------------------------------------- the block

_TEMPLATE = """
<div class="sapiens2-browser">
  <p>Your browser computes each photo's embedding with onnxruntime-web (WebGPU, else WebAssembly):
  the photos are not uploaded and no GPU quota is used. The first time, it downloads the model
  file (about 116 MB as int8, 458 MB as fp32 for 0.1b) and keeps it in this browser.</p>
  <label>First photo <input type="file" accept="image/*" data-role="photo-a"></label>
  <label>Second photo <input type="file" accept="image/*" data-role="photo-b"></label>
  <label>Model file <select data-role="dtype">
    <option value="int8">int8 (smaller, approximate)</option>
    <option value="fp32">fp32 (as the server)</option>
  </select></label>
  <div class="sapiens2-browser-buttons">
    <button type="button" data-role="run">Compute in my browser</button>
    <button type="button" data-role="forget">Remove the kept model file</button>
  </div>
  <p data-role="status" role="status" aria-live="polite"></p>
  <p data-role="score" class="sapiens2-browser-score"></p>
  <a data-role="download" hidden>Download the embeddings (JSON)</a>
</div>
"""

_CSS = """
.sapiens2-browser label { display: block; margin: 0.4em 0; }
.sapiens2-browser button { margin: 0.3em 0.5em 0.3em 0; padding: 0.3em 0.8em; border: 1px solid; border-radius: 6px; }
.sapiens2-browser [data-kind="error"] { color: #b42318; }
.sapiens2-browser-score { font-size: 1.2em; font-weight: 600; }
"""


def browser_config(model: BrowserModel, output: str) -> dict[str, Any]:
    """What the page's script is told: where onnxruntime-web and the manifests are, the output."""
    base, why, _ = ort_source()
    return {
        "ort_base": base,
        "ort_error": why,
        "manifest": {d: f"{PREFIX}{model.token}/{d}.json" for d in DTYPES},
        "output": output,
        "max_bytes": MAX_FILE_BYTES,
        "max_side": DEFAULT_MAX_SIDE,
    }


def browser_block(task: Task, checkpoints: Checkpoints, checkpoint_size: str | None) -> gr.HTML | None:
    """The tab's "Compute in my browser" fold, for a task whose ``compare`` names the output a
    browser scores (``Compare.browser_output``); None for any other task."""
    output = task.compare.browser_output if task.compare is not None else None
    if output is None:
        return None
    model = publish(task, checkpoints, checkpoint_size)
    with gr.Accordion("Compute in my browser (no upload, no GPU quota)", open=False):
        return gr.HTML(
            "",
            html_template=_TEMPLATE,
            css_template=_CSS,
            js_on_load=_SCRIPT.read_text(encoding="utf-8"),
            elem_id=f"{task.name}-browser",
            config=browser_config(model, output),
        )


__all__ = ["BrowserFiles", "browser_block", "cache_dir", "middleware", "ort_source", "publish", "respond"]
