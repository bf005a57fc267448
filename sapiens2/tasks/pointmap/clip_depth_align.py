"""Depth that holds still over a clip: one scale factor per frame against a running reference.

The pointmap is divided by the model's scale output, and that output jitters from frame to frame
(the Sapiens2 maintainers confirm it and recommend aligning afterwards): the whole frame's
points grow or shrink together, so a wall that does not move seems to. Since the error is one
factor per frame, one factor per frame undoes it:

1. Each frame's depth is read on a coarse grid (about :data:`GRID_SIDE` cells on the long side)
   as log depth.
2. **Stable pixels**: valid depth, not on a person (the segmentation's mask, when the pointmap
   ran with it), and known in the running reference.
3. **Fit**: ``log f = median(ref - log z)`` over the stable pixels, refined by a few Huber
   reweighting steps (threshold 1.345 robust sigmas), so pixels that moved (a person the mask
   missed, a door) count little. A factor more than :data:`MAX_STEP` (log) from the previous
   frame's is not scale jitter (a cut, a camera move): that frame falls back as in 5.
4. **Reference**: the aligned log depth of the stable pixels, smoothed over time (an exponential
   average with weight :data:`REFERENCE_RATE`); a pixel disagreeing with it by more than
   :data:`GATE` is not averaged in, and is replaced after :data:`REPLACE_AFTER` disagreeing
   frames in a row (something came to rest there).
5. With too few stable pixels (:data:`MIN_STABLE`: a close-up filled by the person, or a
   moving camera), the frame falls back to the model's scale output (pointmap = canonical /
   scale): its factor is the latest known frame's times ``scale_t / scale_latest``; with no
   scale either, the latest factor is kept.

The factors are relative to the first frame; :meth:`DepthAligner.factors` divides them by their
median over the clip, so the clip's absolute scale is that of a typical frame, not of the
first one. Multiply a frame's pointmap and depth by its factor. The camera is assumed still:
with a moving camera few pixels pass the gate and the scale fallback takes over.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

GRID_SIDE = 160
MIN_STABLE = 200
GATE = 0.05  # log-depth: 5 %
REFERENCE_RATE = 0.2
REPLACE_AFTER = 10
HUBER_STEPS = 4
MAX_STEP = 0.4  # log factor: a frame-to-frame change beyond ~50% is not taken from the depth


@dataclass
class FrameFit:
    """How one frame's factor was found."""

    log_factor: float  # relative to the first frame
    stable: int  # stable pixels used (grid cells)
    method: str  # "reference" | "scale" | "none"


@dataclass
class DepthAligner:
    """Per-frame depth factors of a clip (see the module docstring); feed frames in order."""

    grid_side: int = GRID_SIDE
    fits: list[FrameFit] = field(default_factory=list)
    _ref: np.ndarray | None = None  # (h, w) float32 log depth, NaN where unknown
    _misses: np.ndarray | None = None  # (h, w) int16 disagreeing frames in a row
    _step: int = 0
    _last_scale: tuple[float, float] | None = None  # (log scale, log factor) of the latest frame with both

    def _grid(self, arr: np.ndarray) -> np.ndarray:
        if not self._step:
            self._step = max(1, math.ceil(max(arr.shape[:2]) / self.grid_side))
        return arr[:: self._step, :: self._step]

    def update(
        self, depth: np.ndarray, person: np.ndarray | None = None, scale: float | None = None
    ) -> float:
        """Add the next frame: ``depth`` (H, W) metres (NaN / <= 0: none), ``person`` (H, W)
        bool where people are (None: unknown), ``scale`` the model's scale output (None:
        unknown). Returns the frame's log factor relative to the first frame."""
        z = np.asarray(self._grid(np.asarray(depth)), np.float32)
        with np.errstate(invalid="ignore", divide="ignore"):
            valid = np.isfinite(z) & (z > 0)
            logz = np.where(valid, np.log(np.where(valid, z, 1.0)), np.nan).astype(np.float32)
        still = valid if person is None else valid & ~np.asarray(self._grid(np.asarray(person)), bool)
        if self._ref is None or self._ref.shape != logz.shape:
            self._ref = np.where(still, logz, np.nan).astype(np.float32)
            self._misses = np.zeros(logz.shape, np.int16)
            fit = FrameFit(0.0, int(still.sum()), "reference" if still.any() else "none")
        else:
            stable = still & np.isfinite(self._ref)
            fit = None
            if int(stable.sum()) >= MIN_STABLE:
                log_f = _huber_location(self._ref[stable] - logz[stable])
                if abs(log_f - self.fits[-1].log_factor) <= MAX_STEP:  # else: a cut or a camera move
                    fit = FrameFit(log_f, int(stable.sum()), "reference")
            if fit is None:
                fit = self._from_scale(scale, int(stable.sum()))
        if _usable(scale):
            self._last_scale = (math.log(float(scale)), fit.log_factor)
        self._learn(logz + fit.log_factor, still)
        self.fits.append(fit)
        return fit.log_factor

    def _from_scale(self, scale: float | None, stable: int) -> FrameFit:
        """The fallback: the scale output against the latest frame's (pointmap = canonical / scale)."""
        if not _usable(scale) or self._last_scale is None:
            return FrameFit(self.fits[-1].log_factor if self.fits else 0.0, stable, "none")
        log_scale, log_factor = self._last_scale
        return FrameFit(log_factor + math.log(float(scale)) - log_scale, stable, "scale")

    def _learn(self, aligned: np.ndarray, still: np.ndarray) -> None:
        """Fold the aligned frame into the reference (the time smoothing), gated per pixel."""
        ref, misses = self._ref, self._misses
        assert ref is not None and misses is not None
        known = np.isfinite(ref)
        with np.errstate(invalid="ignore"):
            agree = still & known & (np.abs(aligned - ref) <= GATE)
        disagree = still & known & ~agree
        ref[agree] += REFERENCE_RATE * (aligned[agree] - ref[agree])
        misses[agree] = 0
        misses[disagree] += 1
        replace = (still & ~known) | (disagree & (misses >= REPLACE_AFTER))
        ref[replace] = aligned[replace]
        misses[replace] = 0

    def factors(self) -> np.ndarray:
        """(frames,) float64: multiply frame t's pointmap and depth by ``factors()[t]``; their
        median over the clip is 1 (the clip keeps the scale of a typical frame)."""
        logs = np.array([f.log_factor for f in self.fits], np.float64)
        return np.exp(logs - np.median(logs)) if len(logs) else logs

    def summary(self) -> dict:
        """JSON-friendly: method counts and the factors' range."""
        f = self.factors()
        methods = {m: sum(1 for x in self.fits if x.method == m) for m in ("reference", "scale", "none")}
        return {
            "frames": len(f),
            "methods": methods,
            "factor_min": round(float(f.min()), 4) if len(f) else None,
            "factor_max": round(float(f.max()), 4) if len(f) else None,
        }


def _usable(scale: float | None) -> bool:
    return scale is not None and bool(np.isfinite(scale)) and scale > 0


def _huber_location(d: np.ndarray) -> float:
    """Robust location of ``d``: the median, then Huber-weighted means (k = 1.345 robust sigmas)."""
    d = d.astype(np.float64)
    mu = float(np.median(d))
    sigma = 1.4826 * float(np.median(np.abs(d - mu))) or 1e-6
    k = 1.345 * sigma
    for _ in range(HUBER_STEPS):
        r = np.abs(d - mu)
        w = np.where(r <= k, 1.0, k / np.maximum(r, 1e-12))
        mu = float((w * d).sum() / w.sum())
    return mu


__all__ = ["DepthAligner", "FrameFit"]
