"""The pointmap's clip handler: every frame's depth aligned to the clip, coloured at the end with
the clip's bounds (one colour scale for the whole clip)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..clip_frames import DenseFrames, FrameHandler
from ..registry import Task
from .clip_depth_align import DepthAligner
from .frame_depth_colours import foreground_depth, global_depth_bounds, render_depth_frame


class DepthFrames(DenseFrames):
    """The clip-wide depth hook (pointmap and depth): each result's ``depth`` and ``mask`` kept,
    every frame rendered at the end with the clip's 1st/99th percentiles. Every frame's depth is
    first aligned to the clip (:class:`sapiens2.tasks.pointmap.clip_depth_align.DepthAligner`: one factor per
    frame against a running reference on still pixels), so the model's per-frame scale jitter
    does not make a still scene breathe; the video and the NPZ hold the aligned depth."""

    @classmethod
    def build(
        cls, task: Task, pipe: Any, options: Mapping[str, Any], render: Mapping[str, Any], **kw: Any
    ) -> FrameHandler:
        return cls(task, render, kw["raw_cap"], kw["depth_percentiles"])

    @staticmethod
    def render_kwargs(task: Task, render_opts: Mapping[str, Any]) -> dict[str, Any]:
        return {}  # coloured with the clip's bounds: no options

    def __init__(
        self, task: Task, render_options: Mapping[str, Any], raw_cap: int, percentiles: tuple[float, float]
    ) -> None:
        super().__init__(task, render_options, raw_cap)
        self.percentiles = percentiles
        self.depths: list[np.ndarray] = []
        self.bounds: tuple[float, float] | None = None
        self.aligner = DepthAligner()
        self._raw_depths: list[np.ndarray] = []  # the NPZ's depth arrays, scaled once aligned
        self._aligned = False

    def keep_raw(self, result: Any) -> None:
        arrays = self.raw_arrays(result)
        depth = arrays.get("depth")  # the result's depth array (an NPZ field, not the task's name)
        if depth is not None:
            self._raw_depths.append(depth)
        if arrays:
            self.raw.add(arrays)

    def consume(self, k: int, frame: int, time_s: float, rgb: np.ndarray, result: Any) -> np.ndarray | None:
        self.keep_raw(result)
        for n in getattr(result, "notices", []):
            self.note(n)
        self.aligner.update(result.depth, people_mask(result), getattr(result, "scale", None))
        self.depths.append(foreground_depth(result.depth, result.mask))
        return None

    def align(self) -> np.ndarray:
        """Scale every kept frame by its factor (once); returns the factors."""
        factors = self.aligner.factors()
        if not self._aligned:
            for arrs in (self.depths, self._raw_depths):
                for d, f in zip(arrs, factors, strict=False):
                    d *= d.dtype.type(f)
            self._aligned = True
        return factors

    def deferred(self) -> Iterator[np.ndarray]:
        self.align()
        self.bounds = global_depth_bounds(self.depths, self.percentiles)
        if self.bounds is None:
            self.note("No frame has foreground depth: every frame is shown as background.")
        for i, depth in enumerate(self.depths):
            yield render_depth_frame(depth, self.bounds)
            self.depths[i] = depth[:0]  # rendered: release the frame's memory

    def exports(self, out_dir: Path, name: str, *, fps: float, size: tuple[int, int]) -> list[Path]:
        self.align()
        return super().exports(out_dir, name, fps=fps, size=size)

    def summary(self) -> dict[str, Any]:
        return {
            "depth_bounds_m": None if self.bounds is None else list(self.bounds),
            "depth_alignment": self.aligner.summary(),
        }


def people_mask(result: Any) -> np.ndarray | None:
    """Where a pointmap result's people are: its mask when the segmentation made it (smaller
    than the valid points), None when the mask is just every valid point (no segmentation)."""
    mask = getattr(result, "mask", None)
    if mask is None:
        return None
    with np.errstate(invalid="ignore"):
        valid = np.isfinite(result.depth) & (result.depth > 0)
    return mask if int(mask.sum()) < int(valid.sum()) else None
