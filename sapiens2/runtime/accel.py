"""Optional speed-ups, all off by default: CPU thread count, ``torch.compile`` for a local CUDA GPU,
nothing on ZeroGPU (which supports neither).

Nothing here raises because the machine cannot do something: each compile helper returns a
:class:`CompileReport` saying what it did, why not, and what the compilation cost at startup
(compiling happens on the first call, so the helpers run that call themselves and time it).

* :func:`configure_cpu_threads` caps torch's threads at the CPUs this process may use (a container
  with a 2-CPU quota on a 64-core host would otherwise run 64 threads on 2 CPUs).
* :func:`compile_model` wraps ``nn.Module.compile`` (in place: parameter names, ``state_dict`` and
  the output dataclasses stay as they are) for a CUDA device outside ZeroGPU.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..models.zoo import INPUT_SIZE
from .cpus import available_cpus

_THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
_threads_lock = threading.Lock()
_threads_done = False


# ----------------------------------------------------------------------------- CPU threads


def _device_dtype(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    p = next(model.parameters())
    return p.device, p.dtype


@functools.cache
def openmp_function(name: str) -> Callable[[int], int] | None:
    """``name`` (one int argument, an int result: ``omp_set_num_threads``,
    ``omp_pause_resource_all``) from the OpenMP runtime torch was built with, None where the
    process has no such function (another runtime, or none)."""
    try:
        fn = getattr(ctypes.CDLL(None), name)  # torch, imported above, loaded the runtime
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    return fn


def configure_cpu_threads() -> int:
    """Once per process: lower torch's intra-op thread count to :func:`available_cpus` when it is
    higher. Never raises the count (a caller's ``torch.set_num_threads`` wins) and leaves it alone
    when ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` is set. Returns the count in effect."""
    global _threads_done
    with _threads_lock:
        if not _threads_done:
            _threads_done = True
            if not any(os.environ.get(name) for name in _THREAD_ENV):
                cpus = available_cpus()
                if torch.get_num_threads() > cpus:
                    torch.set_num_threads(cpus)
        return torch.get_num_threads()


# ----------------------------------------------------------------------------- reports


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


def on_zero_gpu() -> bool:
    """True on a Hugging Face ZeroGPU Space (where ``torch.compile`` is not supported)."""
    return os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------- torch.compile


def torch_compile_support(device: torch.device | str) -> str:
    """Empty when ``torch.compile`` can serve ``device``, else the reason it is not used."""
    device = torch.device(device)
    if on_zero_gpu():
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
    "available_cpus",
    "compile_model",
    "configure_cpu_threads",
    "example_input",
    "on_zero_gpu",
    "torch_compile_support",
]
