"""Out of memory in a server: recognising the error, the one trim of the model cache after it,
and the message that names a smaller size."""

from __future__ import annotations

from typing import Any

from ..errors import OutOfMemoryError
from ..models.zoo import TaskSpec, is_v1


def is_out_of_memory(err: BaseException) -> bool:
    """True for a CUDA/accelerator out-of-memory error (torch's type, or its message)."""
    if isinstance(err, MemoryError):  # ours (OutOfMemoryError) is one too
        return True
    import torch

    if isinstance(err, torch.cuda.OutOfMemoryError):
        return True
    # other backends and older builds raise a RuntimeError that only says so in its message
    text = f"{type(err).__name__} {err}".lower()
    return "out of memory" in text or "outofmemoryerror" in text


def out_of_memory(spec: TaskSpec, size: str) -> OutOfMemoryError:
    """The error for an out-of-memory run of a task (its zoo row), advising a smaller size when one
    exists."""
    sizes = spec.sizes
    # the sizes listed before it, of its own generation (Sapiens2's, or Sapiens v1's ``v1-*``)
    smaller = [s for s in sizes[: sizes.index(size)] if is_v1(s) == is_v1(size)] if size in sizes else []
    advice = f"choose a smaller size ({', '.join(smaller)})" if smaller else "use a smaller photo"
    return OutOfMemoryError(
        f"Out of GPU memory running {spec.name} {size}. The model cache was trimmed; try again, or {advice}."
    )


def trim_after_out_of_memory(manager: Any, err: BaseException) -> bool:
    """Trim ``manager``'s model cache when ``err`` is an out-of-memory error (True then): the
    models it drops make room for the next request, in this process as in a GPU worker."""
    if not is_out_of_memory(err):
        return False
    manager.trim()
    return True
