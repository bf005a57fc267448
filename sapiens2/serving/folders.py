"""One fresh output folder per request; old ones are deleted as new ones are made."""

from __future__ import annotations

import secrets
import shutil
import tempfile
import threading
import time
from pathlib import Path


class RequestFolders:
    """One fresh output folder per request under ``root``; folders older than ``max_age_s``
    are deleted when new ones are made. The app serves downloads straight from these folders
    (no copy into Gradio's cache), so a folder's name is 128 random bits: nobody can guess
    another visitor's, as nobody can guess a Gradio cache folder (a hash of the file)."""

    def __init__(self, root: str | Path | None = None, max_age_s: float = 1800.0) -> None:
        self.root = Path(root) if root else Path(tempfile.gettempdir()) / "sapiens2-requests"
        self.max_age_s = float(max_age_s)
        self._last_prune = 0.0
        self._lock = threading.Lock()

    def new(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        self.prune()
        folder = self.root / f"req-{secrets.token_hex(16)}"
        folder.mkdir(mode=0o700)
        return folder

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
