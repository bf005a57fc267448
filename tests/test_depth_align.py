"""Depth that holds still: a synthetic clip whose scale jitters by +-10% per frame; after the
alignment a static surface moves at most 1% from frame to frame, with a person walking across
(masked, and not masked), and in the clip runner's depth handler."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from video_clips import write_clip

from sapiens2.tasks.pointmap.clip_depth_align import DepthAligner
from sapiens2.video import run_video

H, W, T = 90, 160, 30
WALL = (slice(0, 20), slice(0, W))  # the top rows: never crossed by the person


def synthetic_clip(seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """Per frame: depth (a tilted static wall and floor, a person box walking across at 2 m,
    0.3% pixel noise) times a scale jitter uniform in [0.9, 1.1]; the person's mask; the jitter."""
    rng = np.random.default_rng(seed)
    v, u = np.mgrid[0:H, 0:W]
    scene = (4.0 + 0.01 * u - 0.01 * v).astype(np.float32)
    jitter = rng.uniform(0.9, 1.1, T)
    depths, masks = [], []
    for t in range(T):
        z = scene.copy()
        person = np.zeros((H, W), bool)
        person[25:88, 5 + 4 * t : 35 + 4 * t] = True
        z[person] = 2.0 - 0.002 * t
        noise = 1 + 0.003 * rng.standard_normal((H, W))
        depths.append((z * jitter[t] * noise).astype(np.float32))
        masks.append(person)
    return depths, masks, jitter


def frame_to_frame(depths: list[np.ndarray], factors: np.ndarray) -> np.ndarray:
    """|relative change| of the static wall's median depth between consecutive frames."""
    wall = np.array([np.median(d[WALL] * f) for d, f in zip(depths, factors, strict=True)])
    return np.abs(np.diff(wall) / wall[:-1])


@pytest.mark.parametrize("use_mask", [True, False], ids=["person masked", "person not masked"])
def test_a_static_surface_holds_still_within_one_percent(use_mask: bool) -> None:
    depths, masks, jitter = synthetic_clip()
    aligner = DepthAligner()
    for d, m in zip(depths, masks, strict=True):
        aligner.update(d, m if use_mask else None)
    before = frame_to_frame(depths, np.ones(T))
    after = frame_to_frame(depths, aligner.factors())
    assert before.max() > 0.1  # the jitter is there: up to ~20% between frames
    assert after.max() <= 0.01, (before.max(), after.max())
    assert {f.method for f in aligner.fits} == {"reference"}
    # the factors undo the jitter: jitter x factor is one constant (the typical frame's scale)
    kept = jitter * aligner.factors()
    assert kept.std() / kept.mean() < 0.005 and np.median(aligner.factors()) == pytest.approx(1.0, abs=0.01)


def test_without_still_pixels_the_scale_output_takes_over() -> None:
    """A close-up: the person covers the frame. The model's scale output (pointmap = canonical /
    scale) then sets the factor."""
    rng = np.random.default_rng(3)
    jitter = rng.uniform(0.9, 1.1, 12)
    aligner = DepthAligner()
    everywhere = np.ones((H, W), bool)
    for j in jitter:
        aligner.update(np.full((H, W), 2.0 * j, np.float32), everywhere, scale=1.0 / j)
    assert [f.method for f in aligner.fits][1:] == ["scale"] * 11
    held = 2.0 * jitter * aligner.factors()
    assert np.abs(np.diff(held) / held[:-1]).max() < 1e-6
    # no scale either: the factor is kept, never invented
    blind = DepthAligner()
    for j in jitter[:3]:
        blind.update(np.full((H, W), 2.0 * j, np.float32), everywhere, scale=None)
    assert [f.method for f in blind.fits] == ["none", "none", "none"] and (blind.factors() == 1).all()


class JitteryPointmap:
    """A pointmap pipeline per the contract: a static scene (a wall at 4 m) whose scale jitters by
    +-10% per frame, the clip's red/green boxes as people at 2 m."""

    task = "pointmap"

    def __init__(self) -> None:
        self.rng = np.random.default_rng(5)
        self.jitter: list[float] = []

    def prepare(self, intake: Any, **_: Any) -> np.ndarray:
        return intake.rgb

    def infer(self, preps: list[np.ndarray], **_: Any) -> list[np.ndarray]:
        return preps

    def finish(self, rgb: np.ndarray, intake: Any, **_: Any) -> Any:
        j = float(self.rng.uniform(0.9, 1.1))
        self.jitter.append(j)
        people = (rgb[:, :, 0] > 120) | (rgb[:, :, 1] > 120)
        depth = np.where(people, 2.0, 4.0).astype(np.float32) * j
        return SimpleNamespace(depth=depth, mask=people, scale=1.0 / j, notices=[])


def test_the_clip_depth_handler_aligns_video_and_npz(tmp_path: Path) -> None:
    clip = write_clip(tmp_path / "clip.mp4", n=10, fps=10.0)
    pipe = JitteryPointmap()
    result = run_video(pipe, clip, tmp_path / "out", task="pointmap")
    with np.load(next(p for p in result.files if p.name.endswith("_pointmap_frames.npz"))) as z:
        depth, mask = z["depth"], z["mask"]
    wall = np.array([np.median(d[:8]) for d in depth])  # the top rows: background
    assert np.abs(np.diff(wall) / wall[:-1]).max() <= 0.01
    raw = 4.0 * np.array(pipe.jitter)
    assert np.abs(np.diff(raw) / raw[:-1]).max() > 0.05  # it did jitter
    people = np.array([np.median(d[m]) for d, m in zip(depth, mask, strict=True)])
    assert np.abs(people / wall - 0.5).max() < 0.01  # the people are scaled with their frame
    summary = result.details["depth_alignment"]
    assert summary["frames"] == 10 and summary["methods"]["reference"] == 10
