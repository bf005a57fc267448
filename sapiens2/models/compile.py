"""``torch.compile`` for a local CUDA GPU, off by default and never on ZeroGPU (which does not
support it).

Nothing here raises because the machine cannot do something: :func:`compile_model` returns a
:class:`CompileReport` saying what it did, why not, and what the compilation cost at start-up
(compiling happens on the first call, so it runs that call itself and times it). It wraps
``nn.Module.compile`` in place: parameter names, ``state_dict`` and the output dataclasses stay.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from .. import zerogpu
from .zoo import INPUT_SIZE


def _device_dtype(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    p = next(model.parameters())
    return p.device, p.dtype


@dataclass
class CompileReport:
    """What a compile helper did. ``seconds``: startup cost (compilation + first calls)."""

    method: str  # "torch.compile"
    applied: bool
    seconds: float = 0.0
    reason: str = ""  # why it was skipped or undone; empty when applied

    def line(self) -> str:
        if self.applied:
            return f"{self.method}: on, startup {self.seconds:.1f} s"
        return f"{self.method}: off ({self.reason})"


def example_input(model: nn.Module, batch: int = 1, hw: tuple[int, int] = INPUT_SIZE) -> torch.Tensor:
    """A normalised-looking (batch, 3, H, W) input on the model's device and dtype, for warm-ups."""
    device, dtype = _device_dtype(model)
    gen = torch.Generator().manual_seed(0)
    return torch.randn((batch, 3, *hw), generator=gen).to(device=device, dtype=dtype)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def torch_compile_support(device: torch.device | str) -> str:
    """Empty when ``torch.compile`` can serve ``device``, else the reason it is not used."""
    device = torch.device(device)
    if zerogpu.zero_gpu_enabled():
        return "ZeroGPU does not support torch.compile"
    if device.type != "cuda":
        return f"used only for a CUDA GPU; this model is on {device.type}"
    if not hasattr(nn.Module, "compile"):
        return f"torch {torch.__version__} has no nn.Module.compile"
    try:
        import triton  # noqa: F401  (inductor's GPU code generator)
    except ImportError:
        return "triton is not installed (pip install triton)"
    return ""


def compile_model(
    model: nn.Module,
    warmup_inputs: list[torch.Tensor] | None = None,
    *,
    mode: str | None = None,
    backend: str = "inductor",
    force: bool = False,
) -> CompileReport:
    """``torch.compile`` ``model`` in place for a local CUDA GPU and run ``warmup_inputs`` through
    it (default: one 1x3x1024x768 example) so that compilation happens now, not on a user's
    first request; the report's ``seconds`` is that startup cost.

    Skipped (with the reason) off CUDA, on ZeroGPU or without triton, unless ``force`` (tests use
    ``force=True, backend="eager"`` to check the model traces on a CPU). A compilation error
    undoes the compile and is reported, never raised. Each new batch size (pose: people x flip)
    costs one recompilation on first use; warm up the sizes you expect.
    """
    device, _ = _device_dtype(model)
    why = "" if force else torch_compile_support(device)
    if why:
        return CompileReport("torch.compile", False, reason=why)
    inputs = warmup_inputs if warmup_inputs is not None else [example_input(model)]
    t0 = time.perf_counter()
    try:
        model.compile(mode=mode, backend=backend)
        with torch.inference_mode():
            for x in inputs:
                model(x)
        _sync(device)
    except Exception as err:  # inductor/triton failures vary by version and GPU
        model._compiled_call_impl = None  # back to eager (what nn.Module.compile set)
        return CompileReport(
            "torch.compile",
            False,
            time.perf_counter() - t0,
            f"failed, eager kept: {type(err).__name__}: {err}",
        )
    return CompileReport("torch.compile", True, time.perf_counter() - t0)


__all__ = [
    "CompileReport",
    "compile_model",
    "example_input",
    "torch_compile_support",
]
