"""From a task result to what a front end shows: the rendering, the files, the declared views."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..tasks import registry


@dataclass
class Presented:
    """One result ready to show (CPU data only; files already written)."""

    task: str
    before: np.ndarray  # the upright input photo
    after: np.ndarray  # the rendering (the same picture as the saved PNG)
    files: list[Path]
    line: str  # run info: model, device, dtype, model time, total time
    notices: list[str] = field(default_factory=list)
    views: list[Any] = field(default_factory=list)  # values of the task's declared views, in order


def accepted(fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The subset of ``kwargs`` that ``fn`` takes by name (all of them if it takes ``**kwargs``)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(kwargs)
    return {k: v for k, v in kwargs.items() if k in params}


def present(result: Any, out_dir: str | Path, **render_opts: Any) -> Presented:
    """Render ``result`` with the (validated) rendering options and write its exports into
    ``out_dir``; the saved picture is the one shown, so downloads match the screen."""
    task = registry.get(result.info.task)
    args = task.render_args(render_opts)
    after = result.render(**accepted(result.render, args))
    files = [Path(p) for p in result.save(Path(out_dir), rendered=after, **accepted(result.save, args))]
    return Presented(
        task=task.name,
        before=result.image,
        after=after,
        files=files,
        line=result.info.line(),
        notices=list(result.notices),
        views=[view.value(result, files) for view in task.views],
    )
