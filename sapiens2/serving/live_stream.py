"""A live stream's frames: the mailbox of one (only the newest frame waits), the readout's
figures over the last frames, and one rendered frame."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Frames the readout's rates and percentiles are taken over.
WINDOW = 30


class LatestFrame:
    """A mailbox of one frame: :meth:`put` replaces a frame nobody took yet (counted in
    ``dropped``), :meth:`take` waits for the newest. Thread-safe; :meth:`close` ends a waiting
    :meth:`take` (it then returns None)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._item: tuple[np.ndarray, float] | None = None
        self._closed = False
        self.put_count = 0
        self.dropped = 0

    def put(self, frame: np.ndarray, at: float | None = None) -> None:
        """Offer ``frame`` (captured at ``at``, ``time.perf_counter()`` seconds; default now)."""
        with self._cond:
            if self._item is not None:
                self.dropped += 1
            self._item = (frame, time.perf_counter() if at is None else float(at))
            self.put_count += 1
            self._cond.notify()

    def take(self, timeout: float | None = None) -> tuple[np.ndarray, float] | None:
        """The newest frame and its capture time, or None when closed or after ``timeout`` s."""
        with self._cond:
            self._cond.wait_for(lambda: self._item is not None or self._closed, timeout)
            item, self._item = self._item, None
            return item

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed


def _percentile(values: deque[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


class LiveStats:
    """What the readout says: frames done and dropped since the stream (re)started, and over the
    last :data:`WINDOW` frames the rate, the latency (capture to rendered), the model's share and
    the rest (``overhead``: everything but the forward)."""

    def __init__(self, window: int = WINDOW) -> None:
        self.frames = 0
        self.dropped = 0
        self.done_at: deque[float] = deque(maxlen=window)
        self.latency_ms: deque[float] = deque(maxlen=window)
        self.model_ms: deque[float] = deque(maxlen=window)
        self.overhead_ms: deque[float] = deque(maxlen=window)

    def add(self, done_at: float, latency_s: float, model_s: float, step_s: float, dropped: int) -> None:
        self.frames += 1
        self.dropped = max(0, self.dropped + int(dropped))  # a caller may correct an early count (-1)
        self.done_at.append(done_at)
        self.latency_ms.append(1e3 * latency_s)
        self.model_ms.append(1e3 * model_s)
        self.overhead_ms.append(1e3 * max(0.0, step_s - model_s))

    @property
    def fps(self) -> float:
        """Frames per second over the window (NaN before two frames)."""
        if len(self.done_at) < 2 or self.done_at[-1] <= self.done_at[0]:
            return float("nan")
        return (len(self.done_at) - 1) / (self.done_at[-1] - self.done_at[0])

    def summary(self) -> dict[str, Any]:
        """JSON-friendly figures over the window, for a caller to log or store (docs/LIVE.md)."""
        return {
            "frames": self.frames,
            "dropped": self.dropped,
            "fps": round(self.fps, 3),
            "model_ms_p50": round(_percentile(self.model_ms, 50), 2),
            "overhead_ms_p50": round(_percentile(self.overhead_ms, 50), 2),
            "latency_ms_p50": round(_percentile(self.latency_ms, 50), 2),
            "latency_ms_p95": round(_percentile(self.latency_ms, 95), 2),
        }

    def line(self) -> str:
        fps = self.fps
        rate = "-" if fps != fps else f"{fps:.1f}"
        return (
            f"{rate} frames/s · latency {_percentile(self.latency_ms, 50):.0f} ms "
            f"(p95 {_percentile(self.latency_ms, 95):.0f}) · model {_percentile(self.model_ms, 50):.0f} ms · "
            f"{self.frames} frames, {self.dropped} dropped"
        )


@dataclass
class LiveFrame:
    """One rendered frame and the readout after it."""

    image: np.ndarray  # (H, W, 3) uint8 RGB
    readout: str
    model_s: float  # the forwards' time of this frame
    step_s: float  # this frame's time in :meth:`LiveSession.step`
    latency_s: float  # capture (or arrival) to rendered
    stages: dict[str, float] = field(default_factory=dict)  # seconds: decode, load, people, prepare, ...
