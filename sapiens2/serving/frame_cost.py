"""What one frame's forwards cost, for the CPU time estimates of the Video tab's plan and of Live's
expectation: one figure (:func:`served_frame_macs`) from the models this server runs.

A forward's multiply-accumulates are its parameters x tokens (every projection and MLP once per
token) plus its attention (:func:`attention_macs`: per layer tokens^2 x width for the scores and as
much for mixing the values), which parameters x tokens misses: at 1024x768 (3072 tokens) it is a
quarter of a 0.4b forward and nearly all of a tiny test model's (docs/VIDEO.md, "The CPU estimate").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..errors import Sapiens2Error
from ..inputs.network import PATCH
from ..models.nn.backbone import BackboneConfig
from ..models.zoo import ARCHS, Arch
from ..tasks.registry import Task
from .cache import CUSTOM, ModelManager


def _frame_models(task: Task, infer_opts: Mapping[str, Any]) -> list[Task]:
    """The models one frame runs: the task's own forwards (twice with pose's flip test) and the
    ones it borrows."""
    return [task] * task.work(infer_opts).forwards + list(task.needs(infer_opts))


def frame_network_pixels(
    task: Task, size: str, infer_opts: Mapping[str, Any], hw: tuple[int, int] | None = None
) -> int:
    """Network-input pixels of one frame's forwards (the same forwards :func:`frame_macs` counts),
    for the part of their cost that follows pixels, not multiply-accumulates
    (:data:`~sapiens2.models.cost.CPU_NETWORK_PIXEL_S`)."""
    pixels = 0
    for t in _frame_models(task, infer_opts):
        own = size if size in t.spec.sizes else t.spec.default_size(False)
        h, w = hw or t.spec.input_size(own)
        pixels += h * w
    return pixels


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
    macs = [forward(t, size, hw) for t in _frame_models(task, infer_opts)]
    return None if None in macs else sum(m for m in macs if m is not None)


def attention_macs(layers: int, hidden: int, tokens: int) -> float:
    """Multiply-accumulates of a forward's attention beyond its weights: in each of ``layers``
    layers the scores (queries x keys) and the values' mix, ``tokens^2 x hidden`` each."""
    return 2.0 * layers * float(tokens) * float(tokens) * hidden


def _tokens(hw: tuple[int, int], stride: int = PATCH) -> int:
    return (hw[0] // stride) * (hw[1] // stride)


def _arch_macs(params: float, hw: tuple[int, int], shape: tuple[int, int, int] | None) -> float:
    """Parameters x patch tokens, plus the attention of ``shape`` = (layers, width, input pixels per
    encoder token: 16, or 64 behind the 4K window tokenizer) when known."""
    macs = params * _tokens(hw)
    if shape is not None:
        layers, hidden, stride = shape
        macs += attention_macs(layers, hidden, _tokens(hw, stride))
    return macs


def _published_shape(arch: Arch) -> tuple[int, int, int]:
    return arch.layers, arch.hidden, PATCH * (4 if arch.tokenizer_layers else 1)


def forward_macs(task: Task, size: str, hw: tuple[int, int] | None = None) -> float | None:
    """Multiply-accumulates of one forward of ``task``'s published backbone at ``size`` (the
    task's CPU default where ``size`` is not one of its sizes) at the network input ``hw`` (None:
    the checkpoint's own input size): parameters x tokens plus :func:`attention_macs`; None for
    no published backbone."""
    own = size if size in task.spec.sizes else None
    arch = ARCHS.get(own or "") or ARCHS.get(task.spec.default_size(False))
    if arch is None:
        return None
    hw = hw or task.spec.input_size(arch.size)
    return _arch_macs(arch.params_b * 1e9, hw, _published_shape(arch))


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
    """Multiply-accumulates of one forward: of the loaded model when there is one (its own
    parameters, and its encoder's layers and width from its configuration), else
    :func:`forward_macs` of the published backbone."""
    size_arg = size if size in task.spec.sizes else None
    try:
        pipe = manager.get(task, size_arg, load=False)
        model = pipe.model  # an ONNX model's weights are in its file, not its parameters
        params = float(getattr(model, "parameter_count", None) or sum(p.numel() for p in model.parameters()))
        hw = hw or pipe.network_hw
    except (Sapiens2Error, AttributeError):  # not loaded yet, or a pipeline without a model
        return forward_macs(task, size, hw)
    return _arch_macs(params, hw, _loaded_shape(model, size_arg))


def _loaded_shape(model: Any, size: str | None) -> tuple[int, int, int] | None:
    """(layers, width, pixels per token) of a loaded model's encoder: its configuration's (a
    Sapiens2 task model keeps it on ``backbone``, the bare backbone on itself), else the published
    size's (a v1 graph or an ONNX file carries no configuration); None when neither is known."""
    config = getattr(getattr(model, "backbone", model), "config", None)
    if isinstance(config, BackboneConfig):
        return config.layers, config.hidden, config.stride
    arch = ARCHS.get(size or "")
    return None if arch is None else _published_shape(arch)


__all__ = [
    "attention_macs",
    "forward_macs",
    "frame_macs",
    "frame_network_pixels",
    "served_forward_macs",
    "served_frame_macs",
]
