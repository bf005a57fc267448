"""Depth over time: one colour scale across frames, so the colours do not flicker.

Per photo, :func:`sapiens2.outputs.render.depth_to_turbo` stretches turbo between the 1st and 99th
percentile of that photo's foreground depth. Per frame that would re-scale the colours whenever
someone moves closer or a stray pixel appears. A clip uses the 1st/99th percentiles of the
foreground depth of the WHOLE clip (:func:`global_depth_bounds`, as the release's pointmap video
demo fixes its colour bounds across frames); a live stream, which has no end to wait for, uses a
scale that follows each frame's percentiles slowly (:class:`DepthScale`). Every frame is rendered
with its bounds by the same ``depth_to_turbo`` (:func:`render_depth_frame`).

Frames are kept until the end as float16 depth with NaN off the foreground (2 bytes a pixel:
about 1.8 MB a frame at 1280x720); percentiles use at most ``max_samples`` foreground values,
a seeded random subset (no aliasing with the image grid) when the clip has more.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ...outputs.render import depth_to_turbo

MAX_SAMPLES = 2_000_000


def foreground_depth(depth: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """(H, W) float16: depth where mask & finite & > 0, NaN elsewhere (what a clip keeps per frame)."""
    d = np.asarray(depth, np.float32)
    fg = np.isfinite(d) & (d > 0)
    if mask is not None:
        fg &= np.asarray(mask, bool)
    return np.where(fg, d, np.nan).astype(np.float16)


def global_depth_bounds(
    depths: Sequence[np.ndarray],
    percentiles: tuple[float, float] = (1.0, 99.0),
    max_samples: int = MAX_SAMPLES,
) -> tuple[float, float] | None:
    """(near, far) = the given percentiles of all frames' foreground depth; None when no frame
    has any foreground. ``depths`` are arrays from :func:`foreground_depth` (NaN = not foreground)."""
    total = sum(int(np.count_nonzero(np.isfinite(d))) for d in depths)
    if total == 0:
        return None
    keep = min(1.0, max_samples / total)  # each value kept with this chance (seeded: repeatable)
    rng = np.random.default_rng(0)
    parts = []
    for d in depths:
        vals = d[np.isfinite(d)].astype(np.float32)
        parts.append(vals if keep == 1.0 else vals[rng.random(len(vals)) < keep])
    sample = np.concatenate(parts)
    if sample.size == 0:  # a tiny max_samples drew nothing: use every value
        sample = np.concatenate([d[np.isfinite(d)].astype(np.float32) for d in depths])
    near, far = np.percentile(sample, percentiles)
    return float(near), float(far)


def render_depth_frame(depth: np.ndarray, bounds: tuple[float, float] | None) -> np.ndarray:
    """Turbo colours of one kept frame with the clip's bounds (grey where not foreground)."""
    d = depth.astype(np.float32)
    if bounds is None:  # no foreground anywhere in the clip: all background
        return depth_to_turbo(d, np.zeros(d.shape, bool))
    return depth_to_turbo(d, None, bounds=bounds)


class DepthScale:
    """A live stream's colour bounds: each frame's foreground percentiles (those of
    :func:`global_depth_bounds` on that frame alone), followed slowly. The bounds move towards
    the frame's by ``1 - exp(-dt / time_constant_s)`` of the way, in inverse depth (the quantity
    turbo is spread over), so a person stepping closer shifts the colours over a few seconds
    instead of at once, and one odd frame barely moves them. The first frame with foreground
    sets the bounds; a frame without foreground leaves them as they are."""

    def __init__(
        self,
        time_constant_s: float = 2.0,
        percentiles: tuple[float, float] = (1.0, 99.0),
        max_samples: int = 200_000,
    ) -> None:
        if (
            not (isinstance(time_constant_s, (int, float)) and math.isfinite(time_constant_s))
            or time_constant_s < 0
        ):
            raise ValueError(f"time_constant_s must be a finite number >= 0, got {time_constant_s!r}.")
        self.time_constant_s = float(time_constant_s)
        self.percentiles = percentiles
        self.max_samples = max_samples
        self.bounds: tuple[float, float] | None = None
        self._inverse: tuple[float, float] | None = None  # (1/near, 1/far) followed
        self._t: float | None = None

    def update(self, depth: np.ndarray, time_s: float) -> tuple[float, float] | None:
        """The bounds to colour the frame at ``time_s`` (seconds, increasing) with; ``depth``
        is the frame's :func:`foreground_depth` (NaN off the foreground)."""
        frame = global_depth_bounds([depth], self.percentiles, self.max_samples)
        if frame is None or not all(math.isfinite(v) and v > 0 for v in frame):
            return self.bounds
        target = (1.0 / frame[0], 1.0 / frame[1])
        if self._inverse is None or self._t is None or self.time_constant_s == 0:
            self._inverse = target
        else:
            dt = max(0.0, float(time_s) - self._t)
            a = 1.0 - math.exp(-dt / self.time_constant_s)
            self._inverse = tuple(o + a * (n - o) for o, n in zip(self._inverse, target, strict=True))
        self._t = float(time_s)
        near, far = 1.0 / self._inverse[0], 1.0 / self._inverse[1]
        self.bounds = (near, max(far, near))
        return self.bounds
