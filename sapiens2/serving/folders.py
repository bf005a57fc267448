"""One fresh output folder per request; old ones are deleted as new ones are made."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path


class RequestFolders:
    """One fresh output folder per request under ``root``; folders older than ``max_age_s``
    are deleted when new ones are made (the server copies outputs to its own cache at once)."""

    def __init__(self, root: str | Path | None = None, max_age_s: float = 900.0) -> None:
        self.root = Path(root) if root else Path(tempfile.gettempdir()) / "sapiens2-requests"
        self.max_age_s = float(max_age_s)
        self._last_prune = 0.0
        self._lock = threading.Lock()

    def new(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        self.prune()
        return Path(tempfile.mkdtemp(prefix="req-", dir=self.root))

    def prune(self, force: bool = False) -> int:
        """Delete request folders older than ``max_age_s``; returns how many were removed."""
        now = time.time()
        with self._lock:
            if not force and now - self._last_prune < min(60.0, self.max_age_s / 2):
                return 0
            self._last_prune = now
        removed = 0
        for folder in self.root.glob("req-*"):
            try:
                if now - folder.stat().st_mtime > self.max_age_s:
                    shutil.rmtree(folder, ignore_errors=True)
                    removed += 1
            except OSError:
                continue
        return removed
