"""``--runtime onnxruntime``: each model exported to ONNX the first time it is used, then cached.

The files live beside the Hugging Face Hub cache (``<HF home>/sapiens2-onnx/``, or
``$SAPIENS2_ONNX_CACHE``), one folder per export, named by task, size and precision and keyed by
the weights file (its path, size and modification time), the task, size, precision and the
package version: a new checkpoint or a new package version exports again, nothing else does.
An export is written into a temporary folder and renamed into place, so a half-written file is
never used and two processes exporting the same model at once both end with a whole one.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

from ..errors import OptionError
from .zoo import get_task

log = logging.getLogger(__name__)

CACHE_ENV = "SAPIENS2_ONNX_CACHE"
#: runtime name -> precision of the cached file ("torch": no ONNX at all)
RUNTIMES: dict[str, str | None] = {"torch": None, "onnxruntime": "fp32", "onnxruntime-int8": "int8"}


def check_runtime(runtime: str | None) -> str:
    """``runtime`` (None = torch) checked; OptionError names the choices."""
    name = runtime or "torch"
    if name not in RUNTIMES:
        raise OptionError(f"Unknown runtime {runtime!r}; choose one of: {', '.join(RUNTIMES)}.")
    return name


def cache_dir() -> Path:
    """Where exports are kept: ``$SAPIENS2_ONNX_CACHE``, else ``sapiens2-onnx`` beside the Hub cache."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE).expanduser().parent / "sapiens2-onnx"


def _key(weights: Path, task: str, size: str | None, precision: str, version: str) -> str:
    stat = weights.stat()
    ident = f"{weights.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{task}|{size}|{precision}|{version}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def cached_onnx(
    task: str,
    size: str | None = None,
    checkpoint: str | os.PathLike | None = None,
    *,
    runtime: str = "onnxruntime",
    fp16: bool = False,
) -> Path:
    """The ONNX file of ``task`` / ``size`` / ``checkpoint`` for ``runtime``, exported now when
    the cache has none (the weights are found, and downloaded when needed, as ``load_model`` does)."""
    from .loading import resolve_checkpoint
    from .onnx_export import _version, export_onnx

    precision = RUNTIMES[check_runtime(runtime)]
    if precision is None:
        raise OptionError("The torch runtime uses no ONNX file.")
    precision = "fp16" if fp16 and precision == "fp32" else precision
    spec = get_task(task)
    if size is None and checkpoint is None:
        size = spec.default_size(cuda=False)
    weights = resolve_checkpoint(task, size, checkpoint)
    name = f"{task}-{size or 'custom'}-{precision}-{_key(weights, task, size, precision, _version())}"
    folder = cache_dir() / name
    path = folder / "model.onnx"
    if path.is_file():
        return path
    cache_dir().mkdir(parents=True, exist_ok=True)
    log.warning("Exporting %s %s to ONNX (%s), once: %s", task, size or "custom", precision, folder)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache_dir()))
    try:
        export_onnx(
            task,
            tmp / "model.onnx",
            size=size,
            checkpoint=weights,
            int8=precision == "int8",
            fp16=precision == "fp16",
        )
        try:
            tmp.rename(folder)
        except OSError:  # another process finished the same export first: keep its file
            if not path.is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path
