"""A clip's raw per-frame arrays under a byte cap (counted uncompressed), written as one
uncompressed ``.npz`` with the frames stacked on axis 0. Past the cap nothing is kept and a notice
says how much it would have needed: a capped download never holds a silently partial clip."""

from __future__ import annotations

from pathlib import Path

import numpy as np

RAW_CAP_BYTES = 256 * 1024 * 1024


class RawArrays:
    """Per-frame arrays under a byte cap; ``write`` gives one NPZ (or None past the cap)."""

    def __init__(self, cap_bytes: int = RAW_CAP_BYTES) -> None:
        self.cap_bytes = int(cap_bytes)
        self.needed = 0  # bytes the whole clip needs, counted even past the cap
        self._frames: dict[str, list[np.ndarray]] = {}

    @property
    def over_cap(self) -> bool:
        return self.needed > self.cap_bytes

    def add(self, arrays: dict[str, np.ndarray]) -> None:
        self.needed += sum(int(a.nbytes) for a in arrays.values())
        if self.over_cap:
            self._frames.clear()  # past the cap: free what was kept, keep only counting
            return
        for key, arr in arrays.items():
            self._frames.setdefault(key, []).append(arr)

    def notice(self, what: str) -> str | None:
        return cap_notice(what, self.needed, self.cap_bytes) if self.over_cap else None

    def write(self, path: Path, extra: dict[str, np.ndarray] | None = None) -> Path | None:
        if self.over_cap or not self._frames:
            return None
        return save_npz(path, {**{k: np.stack(v) for k, v in self._frames.items()}, **(extra or {})})


def cap_notice(what: str, needed: int, cap: int) -> str:
    return (
        f"The raw {what} arrays of this clip would take {needed / 2**20:.0f} MB, above the "
        f"{cap / 2**20:.0f} MB download cap, so no NPZ was written. Use fewer frames "
        "(a larger stride) or a shorter clip."
    )


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    """Uncompressed NPZ (fast to write; ``np.load`` reads it without pickle)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return path
