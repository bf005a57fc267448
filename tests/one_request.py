"""Test helpers: one task on one photo through the server's own request path, without Gradio.

These were ``serving.infer`` and ``serving.split_options``, which only tests called; the server
itself goes through ``RequestRunner`` (``sapiens2.serving.request_runner``)."""

from __future__ import annotations

from typing import Any

from sapiens2.serving import ModelManager, RequestRunner
from sapiens2.tasks import registry


def split_options(task: str, options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Request options -> (inference options, rendering options), checked, CPU defaults filled in."""
    return registry.get(task).split(options)


def infer(manager: ModelManager, task: str, image: Any, size: str | None = None, **infer_opts: Any) -> Any:
    """One task on one image in this process (read, load, prepare, infer, finish): its result."""
    runner = RequestRunner(manager)
    return runner.results(runner.job(registry.get(task), [image], size, infer_opts))[0]
