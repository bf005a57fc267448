"""ZeroGPU: how this package runs on a Hugging Face ZeroGPU Space, and nothing else does.

``quota`` (what a call may request and what a visitor's daily quota is charged), ``entry`` (the
one GPU entry: ``spaces.GPU`` with a fresh worker whenever the server's models change),
``loadguard`` (no weights load where only resident models may be used) and ``internals`` (the
parts of ``spaces`` used without a public API, listed in docs/DESIGN.md, "Patched internals").
"""

from __future__ import annotations

import os


def zero_gpu_enabled() -> bool:
    """Whether ``spaces`` runs GPU functions in ZeroGPU workers here. The one place this is
    decided: ``SPACES_ZERO_GPU``, read as spaces reads it, without importing spaces (its import
    patches torch when the variable is set)."""
    return os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")


__all__ = ["zero_gpu_enabled"]
