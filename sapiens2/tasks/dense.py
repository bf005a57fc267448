"""The three stages as the dense tasks (seg, normal, pointmap, matting) run them.

* ``prepare`` (server, CPU): the network input made exactly as the release makes it, as a
  uint8 (h, w, 3) array (2.4 MB at 1024x768; the float tensor would be 9.4 MB), plus the
  letterbox geometry.
* ``infer`` (device; on ZeroGPU its arguments and return value are pickled across a process
  boundary): normalise, one forward per chunk of inputs (``pipe.forward_chunk()``: as many as the
  device's free memory holds), and return network-resolution float32
  outputs (letterbox padding already cut off, which is exact) -- never photo-sized arrays.
* ``finish`` (server, CPU): every resize, blur, normalisation and argmax back to the photo.

``pipe(image, **options)`` is ``finish(infer([prepare(intake)]))`` (``Pipeline.run_stages``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..inputs.intake import Intake
from ..inputs.network import PadInfo, network_batch
from .base import Pipeline, RunInfo


@dataclass
class Timing:
    """What the device part reports per item: its share of the forwards' time."""

    model_s: float = 0.0
    forward_started: float | None = None

    def add(self, info: RunInfo, items: int) -> None:
        self.model_s += info.model_s / items
        if self.forward_started is None:
            self.forward_started = info.forward_started


@dataclass
class DenseRaw:
    """Base of what ``infer`` returns per item: timing and notices gathered on the device."""

    timing: Timing = field(default_factory=Timing)
    notices: list[str] = field(default_factory=list)


@dataclass
class DensePrep:
    """What ``prepare`` hands to ``infer``: small, picklable, made on the CPU."""

    pixels: np.ndarray  # (h, w, 3) uint8 network input, the release's resize (and padding)
    pad: PadInfo | None = None  # letterbox geometry (normal, pointmap)
    seg: np.ndarray | None = None  # the borrowed segmentation's own input (normal, pointmap)
    photo: np.ndarray | None = None  # the working copy, only when the device must see it (detector)
    notices: list[str] = field(default_factory=list)


def chunked_forward(
    pipe: Pipeline, images: list[np.ndarray], timings: list[Timing]
) -> Iterator[tuple[int, Any]]:
    """Run ``pipe.model`` over prepared uint8 inputs (all one size), ``pipe.forward_chunk()`` at a
    time: yields (index of the chunk's first item, model output), so the caller reduces each
    chunk's outputs before the next forward (only one chunk's outputs live on the device); adds
    each item's share of the time to ``timings``."""
    step = pipe.forward_chunk(images[0].shape[:2]) if images else 1  # at the inputs' own size
    for a in range(0, len(images), step):
        part = images[a : a + step]
        info = pipe.run_info()
        out = pipe.timed_forward(info, network_batch(part, pipe.device, pipe.dtype))
        for t in timings[a : a + step]:
            t.add(info, len(part))
        yield a, out


def to_cpu32(t: torch.Tensor) -> np.ndarray:
    """A device tensor as a contiguous float32 numpy array (what crosses the boundary)."""
    return np.ascontiguousarray(t.detach().float().cpu().numpy())


def start_result(pipe: Pipeline, intake: Intake, raw: DenseRaw) -> tuple[RunInfo, list[str]]:
    """The RunInfo (device time from ``raw``) and the notices (intake's, then the device's)."""
    info = pipe.run_info()
    info.model_s = raw.timing.model_s
    info.forward_started = raw.timing.forward_started
    return info, [*intake.notices, *pipe.small_photo_notices(intake), *raw.notices]
