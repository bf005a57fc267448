"""Depth over a clip: one colour scale for every frame, so the colours do not flicker.

Per photo, :func:`sapiens2.outputs.render.depth_to_turbo` stretches turbo between the 1st and 99th
percentile of that photo's foreground depth. Per frame that would re-scale the colours whenever
someone moves closer or a stray pixel appears. Here the bounds are the 1st/99th percentiles of
the foreground depth of the WHOLE clip (as the release's pointmap video demo fixes its colour
bounds across frames), and every frame is rendered with them by the same ``depth_to_turbo``.

Frames are kept until the end as float16 depth with NaN off the foreground (2 bytes a pixel:
about 1.8 MB a frame at 1280x720); percentiles use at most ``max_samples`` foreground values,
a seeded random subset (no aliasing with the image grid) when the clip has more.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..outputs.render import depth_to_turbo

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
