"""What one frame's forwards cost, for the CPU time estimates of the Video tab's plan and of Live's
expectation: one figure (:func:`served_frame_macs`) from the models this server runs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..errors import Sapiens2Error
from ..inputs.network import PATCH
from ..models.zoo import ARCHS
from ..tasks.registry import Task
from .cache import CUSTOM, ModelManager


def frame_macs(
    task: Task,
    size: str,
    infer_opts: Mapping[str, Any],
    hw: tuple[int, int] | None = None,
    forward: Callable[[Task, str, tuple[int, int] | None], float | None] | None = None,
) -> float | None:
    """Multiply-accumulates of one frame's forwards of ``task`` at ``size`` with ``infer_opts``:
    its own (``Task.work``: twice with pose's flip test) and the ones it borrows, each
    ``forward(task, size, hw)`` (default :func:`forward_macs`) at the network input ``hw`` (None:
    each model's own). None when a forward has no figure."""
    forward = forward or forward_macs
    models = [task] * task.work(infer_opts).forwards + list(task.needs(infer_opts))
    macs = [forward(t, size, hw) for t in models]
    return None if None in macs else sum(m for m in macs if m is not None)


def forward_macs(task: Task, size: str, hw: tuple[int, int] | None = None) -> float | None:
    """Parameters x tokens of one forward of ``task``'s published backbone at ``size`` (the
    task's CPU default where ``size`` is not one of its sizes) at the network input ``hw`` (None:
    the checkpoint's own input size); None for no published backbone."""
    own = size if size in task.spec.sizes else None
    arch = ARCHS.get(own or "") or ARCHS.get(task.spec.default_size(False))
    if arch is None:
        return None
    h, w = hw or task.spec.input_size(arch.size)
    return arch.params_b * 1e9 * (h // PATCH) * (w // PATCH)


def served_frame_macs(
    manager: ModelManager,
    task: Task,
    size: str,
    infer_opts: Mapping[str, Any],
    hw: tuple[int, int] | None = None,
) -> tuple[float | None, str]:
    """THE figure behind every CPU time estimate of a frame (the Video tab's plan, Live's
    expectation): (multiply-accumulates of one frame's forwards of the models this server runs,
    at the network input ``hw``, ""), or (None, why there is none). A loaded model counts its own
    weights; one not loaded counts its published backbone, and a custom checkpoint not yet loaded
    has no figure (its width is known once loaded)."""
    if manager.key(task, size)[1] == CUSTOM and manager.key(task, size) not in manager.loaded():
        return None, "a custom checkpoint whose size is known once loaded: run once for a measured rate"
    macs = frame_macs(
        task, size, infer_opts, hw, forward=lambda t, s, h: served_forward_macs(manager, t, s, h)
    )
    if macs is None:
        return None, "a model of no published size: run once for a measured rate"
    return macs, ""


def served_forward_macs(
    manager: ModelManager, task: Task, size: str, hw: tuple[int, int] | None = None
) -> float | None:
    """Parameters x tokens of one forward: of the loaded model when there is one, else
    :func:`forward_macs` of the published backbone."""
    size_arg = size if size in task.spec.sizes else None
    try:
        pipe = manager.get(task, size_arg, load=False)
        model = pipe.model  # an ONNX model's weights are in its file, not its parameters
        params = float(getattr(model, "parameter_count", None) or sum(p.numel() for p in model.parameters()))
        h, w = hw or pipe.network_hw
    except (Sapiens2Error, AttributeError):  # not loaded yet, or a pipeline without a model
        return forward_macs(task, size, hw)
    return params * (h // PATCH) * (w // PATCH)


__all__ = ["forward_macs", "frame_macs", "served_forward_macs", "served_frame_macs"]
