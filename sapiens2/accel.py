"""Optional speed-ups, all off by default: CPU thread count, ``torch.compile`` for a local CUDA GPU,
and ZeroGPU's ahead-of-time (AoT) compilation through the ``spaces`` package.

Nothing here raises because the machine cannot do something: each compile helper returns a
:class:`CompileReport` saying what it did, why not, and what the compilation cost at startup
(compiling happens on the first call, so the helpers run that call themselves and time it).

* :func:`configure_cpu_threads` caps torch's threads at the CPUs this process may use (a container
  with a 2-CPU quota on a 64-core host would otherwise run 64 threads on 2 CPUs).
* :func:`compile_model` wraps ``nn.Module.compile`` (in place: parameter names, ``state_dict`` and
  the output dataclasses stay as they are) for a CUDA device outside ZeroGPU.
* :func:`aoti_compile` / :func:`aoti_apply` for ZeroGPU, where ``torch.compile`` does not work:
  export the model with ``torch.export`` and compile it with ``spaces.aoti_compile`` inside a
  ``@spaces.GPU`` function, then swap the model's forward for the compiled one outside it::

      @spaces.GPU(duration=600)
      def _compile():
          return accel.aoti_compile(pipe.model, accel.example_input(pipe.model), max_batch=40)

      compiled, report = _compile()
      if compiled is not None:
          accel.aoti_apply(compiled, pipe.model)
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .tasks.base import model_device_dtype
from .zoo import INPUT_SIZE

_THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
_threads_lock = threading.Lock()
_threads_done = False


# ----------------------------------------------------------------------------- CPU threads


def _cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs allowed by the container's cgroup quota (v2 ``cpu.max`` or v1 CFS files), else None."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError):
        return None


def available_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup CPU quota; at least 1."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS / Windows have no affinity call
        n = os.cpu_count() or 1
    limit = _cgroup_cpu_limit()
    if limit is not None:
        n = min(n, math.ceil(limit))  # a 1.5-CPU quota still runs two threads usefully
    return max(1, n)


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

    method: str  # "torch.compile" | "aoti"
    applied: bool
    seconds: float = 0.0
    reason: str = ""  # why it was skipped or undone; empty when applied

    def line(self) -> str:
        if self.applied:
            return f"{self.method}: on, startup {self.seconds:.1f} s"
        return f"{self.method}: off ({self.reason})"


def example_input(model: nn.Module, batch: int = 1, hw: tuple[int, int] = INPUT_SIZE) -> torch.Tensor:
    """A normalised-looking (batch, 3, H, W) input on the model's device and dtype, for warm-ups."""
    device, dtype = model_device_dtype(model)
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
        return "ZeroGPU does not support torch.compile; use accel.aoti_compile"
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
    device, _ = model_device_dtype(model)
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


# ----------------------------------------------------------------------------- ZeroGPU AoT


def aoti_support() -> str:
    """Empty when ``spaces``' AoT helpers can run here, else why not (checked without calling them:
    they crash on a CPU-only torch)."""
    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is a CPU-only build"
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        import spaces
    except Exception as err:  # ImportError, or spaces refusing an import order
        return f"the spaces package cannot be imported ({type(err).__name__}: {err})"
    missing = [n for n in ("aoti_compile", "aoti_apply") if not hasattr(spaces, n)]
    if missing:
        return f"this spaces version lacks {', '.join(missing)}; upgrade spaces"
    return ""


class _TensorOutputs(nn.Module):
    """The model with its output dataclass flattened to a tuple (what torch.export compiles)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(pixel_values)
        return tuple(getattr(out, f.name) for f in dataclasses.fields(out))


def export_model(
    model: nn.Module, example: torch.Tensor, *, max_batch: int | None = None
) -> torch.export.ExportedProgram:
    """``torch.export`` of the model's forward with outputs as a flat tuple (the dataclass fields in
    order). ``max_batch`` > 1 makes the batch size dynamic up to that many (pose: people x 2 for
    flip test); spatial sizes stay those of ``example``."""
    dynamic = None
    if max_batch is not None and max_batch > 1:
        dynamic = ({0: torch.export.Dim("batch", min=1, max=max_batch)},)
    with torch.no_grad():
        return torch.export.export(_TensorOutputs(model).eval(), (example,), dynamic_shapes=dynamic)


def aoti_compile(
    model: nn.Module, example: torch.Tensor, *, max_batch: int | None = None
) -> tuple[Any | None, CompileReport]:
    """Export ``model`` and AoT-compile it with ``spaces.aoti_compile``; call it inside a
    ``@spaces.GPU`` function. Returns ``(compiled, report)``; ``compiled`` is None (and the report
    says why) where AoT cannot run: CPU-only torch, no GPU, an old ``spaces``, an export or
    compile error."""
    why = aoti_support()
    if why:
        return None, CompileReport("aoti", False, reason=why)
    import spaces

    t0 = time.perf_counter()
    try:
        exported = export_model(model, example, max_batch=max_batch)
        compiled = spaces.aoti_compile(exported)
    except Exception as err:
        return None, CompileReport(
            "aoti", False, time.perf_counter() - t0, f"failed: {type(err).__name__}: {err}"
        )
    return compiled, CompileReport("aoti", True, time.perf_counter() - t0)


def use_compiled_forward(model: nn.Module, compiled: Callable[[torch.Tensor], Any]) -> None:
    """Make ``model(x)`` call ``compiled`` (which returns the flat tuple of :func:`export_model`)
    and rebuild the model's output dataclass from it, so pipelines see no difference."""
    out_type = _output_type(model)

    def forward(pixel_values: torch.Tensor) -> Any:
        return out_type(*compiled(pixel_values))

    model.forward = forward  # instance attribute: nn.Module.__call__ dispatches to it


def _output_type(model: nn.Module) -> type:
    from .nn import outputs

    if getattr(model, "task", None) == "pretrain":
        return outputs.FeaturesOutput
    kinds = {
        "pose": outputs.PoseOutput,
        "seg": outputs.SegOutput,
        "normal": outputs.NormalOutput,
        "pointmap": outputs.PointmapOutput,
        "matting": outputs.MattingOutput,
    }
    try:
        return kinds[model.task]
    except (AttributeError, KeyError):
        raise TypeError(f"not a Sapiens2 model (task {getattr(model, 'task', None)!r})") from None


def aoti_apply(compiled: Any, model: nn.Module) -> CompileReport:
    """Swap ``model``'s forward for an :func:`aoti_compile` result (outside the GPU function, as
    ZeroGPU expects). ``spaces.aoti_apply`` frees the eager weights (the compiled model holds its
    own copy), so the eager forward is gone afterwards."""
    why = aoti_support()
    if why or compiled is None:
        return CompileReport("aoti", False, reason=why or "nothing compiled")
    import spaces

    wrapper = _TensorOutputs(model)
    try:
        spaces.aoti_apply(compiled, wrapper)  # frees the weights (they are the model's)
        use_compiled_forward(model, compiled)
    except Exception as err:
        return CompileReport("aoti", False, reason=f"apply failed: {type(err).__name__}: {err}")
    return CompileReport("aoti", True)


__all__ = [
    "CompileReport",
    "aoti_apply",
    "aoti_compile",
    "aoti_support",
    "available_cpus",
    "compile_model",
    "configure_cpu_threads",
    "example_input",
    "export_model",
    "on_zero_gpu",
    "torch_compile_support",
    "use_compiled_forward",
]
