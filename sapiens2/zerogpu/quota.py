"""What ZeroGPU allows and charges: the duration a call requests, what a visitor's daily quota is
charged for it once the node's duration factor is applied (:func:`gpu_request`), what to tell a
visitor before a large run (:func:`cost_notice`), spaces' refusals as package errors
(:func:`gpu_unavailable`), and the GPU memory of a slice (:func:`cache_budget_bytes`).

Facts come from ``spaces`` 0.51.3 (read from its source) and the Hub's ZeroGPU docs; see
docs/ZEROGPU.md. The seconds of work a call needs are :mod:`sapiens2.models.cost`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from .. import zerogpu
from ..errors import GpuUnavailableError
from .internals import REFUSAL_ASKED_LEFT, REFUSAL_WAIT, node_configs

GpuSize = Literal["large", "xlarge"]

#: torch versions ZeroGPU lists as supported (Hub docs "Supported Versions", with 2.12.1 and 2.13.0
#: added by huggingface/hub-docs PR #2763); the Space pins one of them exactly.
SUPPORTED_TORCH: tuple[str, ...] = ("2.8.0", "2.9.1", "2.10.0", "2.11.0", "2.12.1", "2.13.0")
#: Python versions ZeroGPU lists as supported (Hub docs "Supported Versions").
SUPPORTED_PYTHON: tuple[str, ...] = ("3.10.13", "3.12.12")
#: Included daily GPU quota per visitor type, in seconds (Hub docs, "Usage Tiers").
DAILY_QUOTA_S: dict[str, int] = {
    "anonymous": 120,
    "free": 300,
    "pro": 2400,
    "team": 2400,
    "enterprise": 3600,
}
#: GPU memory of one call per ``spaces.GPU(size=...)``, bytes (Hub docs: half / full RTX Pro 6000).
SLICE_BYTES: dict[str, int] = {"large": 48 * 10**9, "xlarge": 96 * 10**9}
#: Device memory a CUDA context takes before any tensor (spaces' zero/torch/static.py).
CUDA_CONTEXT_BYTES = 309_002_240
#: GPU memory kept free for one request's activations beside the resident weights: pointmap 5b
#: and pose with 8 crops a forward are the largest (docs/ZEROGPU.md).
ACTIVATION_HEADROOM_BYTES = 5 * 10**9
#: ``duration_factor`` of the slowest node in spaces 0.51.3's node table, used if it cannot be read.
FALLBACK_DURATION_FACTOR = 1.5
#: A call charged at least this many seconds (a quarter of a visitor's daily quota without an
#: account) is announced to the visitor before it starts: every 5b run on the Space is.
ANNOUNCE_CHARGED_S = 30


def duration_factor() -> float:
    """The largest ``duration_factor`` among ZeroGPU's nodes (the worst node a call may land on).

    spaces multiplies a ``large`` call's requested seconds by its node's factor before it asks the
    scheduler, and the scheduler checks that product against the visitor's remaining quota.
    """
    factors = [float(c["duration_factor"]) for c in node_configs() if "duration_factor" in c]
    return max(factors, default=FALLBACK_DURATION_FACTOR)


@dataclass(frozen=True)
class GpuRequest:
    """One GPU call as the scheduler sees it."""

    duration_s: int  # what to give @spaces.GPU (it keeps whole seconds only, so this is rounded up)
    charged_s: int  # what is checked against the visitor's remaining quota on the worst node
    gpu_size: GpuSize = "large"

    def fits(self, visitor: str = "anonymous") -> bool:
        """Whether a visitor with a full daily quota may start this call."""
        return self.charged_s <= DAILY_QUOTA_S[visitor]


def gpu_request(estimate_s: float, *, gpu_size: GpuSize = "large", factor: float | None = None) -> GpuRequest:
    """The duration to request for ``estimate_s`` seconds of GPU work, and what it is charged.

    ``large`` calls are charged ``round(duration * factor)`` (spaces' client.py); ``xlarge`` calls
    skip the factor but cost twice the quota (Hub docs). The factor also lengthens the allowance on
    slow nodes, so requesting the estimate itself is enough everywhere.
    """
    if not isinstance(estimate_s, (int, float)) or not math.isfinite(estimate_s) or estimate_s < 0:
        raise ValueError(f"A GPU time estimate must be a finite number of seconds >= 0; got {estimate_s!r}.")
    if gpu_size not in SLICE_BYTES:
        raise ValueError(f"gpu_size must be 'large' or 'xlarge'; got {gpu_size!r}.")
    duration = max(1, math.ceil(estimate_s))
    if gpu_size == "xlarge":
        return GpuRequest(duration, 2 * duration, gpu_size)
    factor = duration_factor() if factor is None else float(factor)
    return GpuRequest(duration, round(duration * factor), gpu_size)


def cost_notice(estimate_s: float, what: str) -> str | None:
    """On ZeroGPU, a sentence saying what ``what`` costs of a visitor's daily quota when that is
    large (at least :data:`ANNOUNCE_CHARGED_S`); None elsewhere and for small runs."""
    if not zerogpu.zero_gpu_enabled():
        return None
    charged = gpu_request(estimate_s).charged_s
    if charged < ANNOUNCE_CHARGED_S:
        return None
    q = DAILY_QUOTA_S
    return (
        f"{what} reserves up to {charged} s of ZeroGPU time (daily quota: {q['anonymous']} s without an "
        f"account, {q['free']} s with a free account, {q['pro']} s with PRO). Smaller sizes cost less."
    )


def gpu_unavailable(title: str, message: str) -> GpuUnavailableError:
    """A package error for spaces' refusal ``title``/``message``: what happened, with the seconds
    requested and left when spaces gives them, and what helps."""
    asked_left = REFUSAL_ASKED_LEFT.search(message)
    wait = REFUSAL_WAIT.search(message)
    q = DAILY_QUOTA_S
    helps = (
        f"Log in for a larger daily quota ({q['free']} s with a free account, {q['pro']} s with PRO), "
        f"wait for your quota to refill{f' (in {wait.group(1)})' if wait else ''}, or choose a smaller "
        "size, fewer tasks or fewer frames."
    )
    if asked_left:
        asked, left = int(asked_left.group(1)), int(asked_left.group(2))
        why = f"ZeroGPU quota: {asked} s requested vs. {left} s left."
        return GpuUnavailableError(f"{why} {helps}", requested_s=asked, left_s=left,
                                   wait=wait.group(1) if wait else None, quota=True)  # fmt: skip
    quota = "quota" in title.lower() or "limit" in message.lower()
    why = f"ZeroGPU: {message.strip() or title}".rstrip(". ") + "."
    return GpuUnavailableError(f"{why} {helps if quota else 'Try again in a moment.'}", quota=quota)


# ----------------------------------------------------------------------------- memory


def model_bytes(module: Any) -> int:
    """Bytes of a model's parameters and buffers as they sit on the device (works on ZeroGPU's
    emulated CUDA tensors, whose shapes and dtypes are real)."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def cache_budget_bytes(pinned_bytes: int, headroom_bytes: int, gpu_size: GpuSize = "large") -> int:
    """GPU bytes the model cache may fill besides the pinned (packed at start-up) models.

    Every fresh worker moves *all* resident weights onto its slice, so the resident set, the CUDA
    context and the activations of the largest request (``headroom_bytes``) must fit one slice.
    """
    return max(0, SLICE_BYTES[gpu_size] - CUDA_CONTEXT_BYTES - int(pinned_bytes) - int(headroom_bytes))


__all__ = [
    "ACTIVATION_HEADROOM_BYTES",
    "DAILY_QUOTA_S",
    "GpuRequest",
    "cache_budget_bytes",
    "cost_notice",
    "duration_factor",
    "gpu_request",
    "gpu_unavailable",
    "model_bytes",
]
