""" "Compute in my browser": a task whose comparison a browser can make (features: the cosine of
two CLS embeddings) gets a block where the visitor's browser runs the task's ONNX file with
onnxruntime-web (WebGPU, else WebAssembly): no upload, no GPU quota (docs/ONNX_BROWSER.md).

The server exports the file on its first request into the package's ONNX cache
(``models.onnx_cache``, shared with ``--runtime onnxruntime``); the page keeps it in the
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
#: The paths the middleware answers.
PREFIX = "/sapiens2-browser/"
#: The model files a browser may ask for: int8 (a quarter of the bytes) and fp32 (exact).
DTYPES = ("int8", "fp32")
#: The zoo size a browser runs when the server has no checkpoint of its own for the task.
BROWSER_SIZE = "0.1b"
_ORT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\.(mjs|wasm)$")
_TYPES = {".mjs": "text/javascript", ".wasm": "application/wasm", ".onnx": "application/octet-stream"}
#: The page's script, in order: the metadata and photo readers, then the block's behaviour.
_SCRIPTS = tuple(Path(__file__).with_name("static") / n for n in ("browser_input.js", "browser_compare.js"))


@dataclass
class BrowserModel:
    """A task's network as a browser gets it: exported from the server's own weights for the task
    (its checkpoint, else the zoo's :data:`BROWSER_SIZE` from the Hub), once per dtype."""

    task: Task
    size: str  # the zoo size, or the checkpoint's (``custom`` when unknown)
    checkpoint: Path | None
    token: str = ""
    files: dict[str, tuple[str, Path]] = field(default_factory=dict)  # dtype -> (served name, file)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        # stable across restarts: a browser's kept file stays valid while the weights do
        source = f"{self.task.name}|{self.size}|{self.checkpoint or 'hub'}"
        self.token = f"{self.task.name}-{hashlib.sha256(source.encode()).hexdigest()[:12]}"

    def file(self, dtype: str) -> tuple[str, Path]:
        """(served name, path) of the file for ``dtype``: the server's own ``.onnx`` checkpoint as
        it is, else an export from the package's ONNX cache (``models.onnx_cache``: keyed by the
        weights, size, dtype and package version; its folder's name is the served name), exported
        now when it has none. One export at a time; a concurrent request waits for it."""
        from ..models.onnx_cache import cached_onnx

        with self.lock:
            known = self.files.get(dtype)
            if known is not None and known[1].is_file():
                return known
            if self.checkpoint is not None and self.checkpoint.suffix.lower() == ".onnx":
                stat = self.checkpoint.stat()
                ident = f"{self.checkpoint.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
                path = self.checkpoint
                name = f"{self.task.name}-{self.size}-onnx-{hashlib.sha256(ident.encode()).hexdigest()[:16]}"
            else:
                size = None if self.checkpoint is not None else self.size
                runtime = "onnxruntime-int8" if dtype == "int8" else "onnxruntime"
                path = cached_onnx(self.task.name, size, self.checkpoint, runtime=runtime)
                name = path.parent.name
            if any(p != path for p in path.parent.iterdir() if p.name.startswith(path.name)):
                raise RuntimeError(f"The {self.size} {self.task.name} model is too large for a browser.")
            self.files[dtype] = (f"{name}.onnx", path)
            return self.files[dtype]

    def manifest(self, dtype: str) -> dict[str, Any]:
        """What the page fetches first: the file's URL (its name carries the key, so a new file
        is a new URL), its bytes, and the URL's prefix shared by the file's older versions."""
        name, path = self.file(dtype)
        return {
            "url": f"{PREFIX}{self.token}/{name}",
            "family": f"{PREFIX}{self.token}/{name.rsplit('-', 1)[0]}-",
            "bytes": path.stat().st_size,
            "size": self.size,
            "dtype": dtype,
        }

    def served(self, name: str) -> Path | None:
        """The file served as exactly ``name``, or None (nothing else is ever opened)."""
        return next((p for n, p in list(self.files.values()) if n == name and p.is_file()), None)


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
            js_on_load="\n".join(p.read_text(encoding="utf-8") for p in _SCRIPTS),
            elem_id=f"{task.name}-browser",
            config=browser_config(model, output),
        )


__all__ = ["BrowserFiles", "browser_block", "middleware", "ort_source", "publish", "respond"]
