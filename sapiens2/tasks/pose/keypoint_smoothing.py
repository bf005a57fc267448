"""Keypoint smoothing over time: the One-Euro filter (Casiez, Roussel, Vogel, CHI 2012).

A first-order low-pass filter whose cutoff rises with the point's speed: slow points are
smoothed hard (little jitter), fast points lightly (little lag). Per point and frame, with ``dt``
the time since the point's previous frame in seconds (frame index / the clip's fps, so a frame
stride or a gap is accounted for)::

    speed  = low-pass((x - x_prev_smoothed) / dt, cutoff=d_cutoff)     # px/s, 2-D vector
    cutoff = min_cutoff + beta * |speed|                               # Hz
    x_smoothed = low-pass(x, cutoff)        with alpha(fc) = 1 / (1 + 1 / (2 pi fc dt))

Parameters, in pixel units of the frames the pose was found on:

* ``min_cutoff`` (Hz): cutoff of a still point. Lower = steadier, more lag on slow motion.
* ``beta`` (1/px = Hz per px/s): how fast the cutoff grows with speed. Higher = less lag on fast
  motion, more jitter let through. It multiplies a speed in pixels per second, so a clip
  downscaled by 2 needs twice the beta for the same behaviour.
* ``d_cutoff`` (Hz): cutoff of the speed estimate itself (1 Hz as in the paper).

Defaults (min_cutoff 1.0 Hz, beta 0.05 /px, d_cutoff 1.0 Hz) were chosen on synthetic noisy
tracks (``python bench/video.py --smoothing``; the table is in docs/VIDEO.md): jitter of a still
point -77%, of a point moving at up to 314 px/s -34% with its error vs the truth +5%.

Low-score points (score < ``score_threshold``, or not finite) are passed through unchanged and
reset that point's filter, so a point that reappears starts fresh instead of being dragged from
where it was last seen.
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import OptionError


def _alpha(cutoff: np.ndarray | float, dt: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + 1.0 / (2.0 * math.pi * np.asarray(cutoff) * dt))


class OneEuroFilter:
    """One-Euro filter over K points of dimension D, with a validity mask per point."""

    def __init__(self, *, min_cutoff: float = 1.0, beta: float = 0.05, d_cutoff: float = 1.0) -> None:
        for name, value, positive in (
            ("min_cutoff", min_cutoff, True),
            ("beta", beta, False),
            ("d_cutoff", d_cutoff, True),
        ):
            ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
            if not ok or value < 0 or (positive and value == 0):
                raise OptionError(
                    f"One-Euro {name} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}."
                )
        self.min_cutoff, self.beta, self.d_cutoff = float(min_cutoff), float(beta), float(d_cutoff)
        self._x: np.ndarray | None = None  # (K, D) smoothed values
        self._dx: np.ndarray | None = None  # (K, D) smoothed speed
        self._t: np.ndarray | None = None  # (K,) time of each point's last sample; NaN: no state

    def __call__(self, t: float, x: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
        """The smoothed (K, D) values at time ``t`` (seconds, increasing) for samples ``x``."""
        x = np.asarray(x, np.float64)
        valid = (
            np.isfinite(x).all(axis=1)
            if valid is None
            else np.asarray(valid, bool) & np.isfinite(x).all(axis=1)
        )
        if self._x is None or self._x.shape != x.shape:
            self._x, self._dx = x.copy(), np.zeros_like(x)
            self._t = np.full(x.shape[0], np.nan)
        out = x.copy()
        dt = t - self._t
        run = valid & np.isfinite(dt) & (dt > 0)
        if run.any():
            d = dt[run, None]
            speed = (x[run] - self._x[run]) / d
            dx = self._dx[run] + _alpha(self.d_cutoff, d) * (speed - self._dx[run])
            cutoff = self.min_cutoff + self.beta * np.linalg.norm(dx, axis=1, keepdims=True)
            out[run] = self._x[run] + _alpha(np.maximum(cutoff, 1e-6), d) * (x[run] - self._x[run])
            self._dx[run] = dx
        start = valid & ~run
        self._dx[start] = 0.0
        self._x[valid] = out[valid]
        self._t[valid] = t
        self._t[~valid] = np.nan  # reset: the next good sample starts the point afresh
        return out


class KeypointSmoother:
    """One One-Euro filter per track id; ``enabled=False`` returns the keypoints unchanged."""

    def __init__(
        self,
        *,
        enabled: bool = True,
        min_cutoff: float = 1.0,
        beta: float = 0.05,
        d_cutoff: float = 1.0,
        score_threshold: float = 0.3,
    ) -> None:
        OneEuroFilter(min_cutoff=min_cutoff, beta=beta, d_cutoff=d_cutoff)  # checks the parameters now
        self.enabled = bool(enabled)
        self.params = {"min_cutoff": min_cutoff, "beta": beta, "d_cutoff": d_cutoff}
        self.score_threshold = float(score_threshold)
        self._filters: dict[int, OneEuroFilter] = {}

    def keep(self, track_ids: set[int]) -> None:
        """Forget the filters of every other track (ids are never reused: a retired track's
        filter would only hold memory for as long as the stream runs)."""
        for tid in [t for t in self._filters if t not in track_ids]:
            del self._filters[tid]

    def __call__(self, t: float, track_id: int, keypoints: np.ndarray, scores: np.ndarray) -> np.ndarray:
        """(K, 2) keypoints of one person at time ``t`` (s), smoothed along their track."""
        if not self.enabled:
            return np.asarray(keypoints, np.float32)
        f = self._filters.setdefault(track_id, OneEuroFilter(**self.params))
        sc = np.asarray(scores, np.float64)
        valid = np.isfinite(sc) & (sc >= self.score_threshold)
        return f(t, keypoints, valid).astype(np.float32)
