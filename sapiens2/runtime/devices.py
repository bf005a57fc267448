"""Which device a model runs on when the caller names none: the one rule for the whole package."""

from __future__ import annotations

import gc

import torch


def default_device() -> torch.device:
    """CUDA when this torch can use it (on ZeroGPU: its emulated CUDA), else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def canonical_device(device: torch.device | str | None) -> torch.device:
    """``device`` (None: :func:`default_device`) with CUDA's index made explicit, so "cuda" and
    "cuda:0" name one device."""
    dev = torch.device(device) if device is not None else default_device()
    return torch.device("cuda", 0) if dev.type == "cuda" and dev.index is None else dev


def free_accelerator_memory() -> None:
    """Collect garbage and empty torch's CUDA cache, where CUDA runs in this process."""
    gc.collect()
    # Only when CUDA really runs in this process (under ZeroGPU the main process only emulates it).
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


__all__ = ["canonical_device", "default_device", "free_accelerator_memory"]
