"""One fresh output folder per request; old ones are deleted as new ones are made."""

from __future__ import annotations

import re
import secrets
import shutil
import tempfile
import threading
import time
from pathlib import Path

from ..errors import ResultNotFoundError

#: a request folder's name: this prefix, then 128 random bits in hex
PREFIX, TOKEN_BYTES = "req-", 16
#: that name, alone or inside a path or URL of one of the folder's files
_FOLDER = re.compile(rf"(?<![0-9A-Za-z]){PREFIX}([0-9a-f]{{{2 * TOKEN_BYTES}}})(?![0-9A-Za-z])")
#: the longest reference :meth:`RequestFolders.find` reads (a URL of a file of the result)
MAX_REF_CHARS = 4096


def result_id(text: str) -> str | None:
    """The one request folder name (``req-<32 hex digits>``) that ``text`` holds, else None."""
    ids = set(_FOLDER.findall(text))
    return f"{PREFIX}{ids.pop()}" if len(ids) == 1 else None


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
        folder = self.root / f"{PREFIX}{secrets.token_hex(TOKEN_BYTES)}"
        folder.mkdir(mode=0o700)
        return folder

    def find(self, ref: object) -> Path:
        """The folder of an earlier request: ``ref`` is its id (``req-<32 hex digits>``) or holds
        it, as a path or URL of any of its files does. Only that name is taken from ``ref``, and
        only a folder of this server's root is returned: anything else raises
        :class:`ResultNotFoundError` with what to do."""
        if not isinstance(ref, str) or not ref.strip():
            raise ResultNotFoundError(
                "Name the result: its id (req-...), or the path or URL of any of its files."
            )
        if len(ref) > MAX_REF_CHARS:
            raise ResultNotFoundError(f"A result reference is at most {MAX_REF_CHARS} characters.")
        name = result_id(ref)
        if name is None:
            raise ResultNotFoundError(
                "That does not name one result: expected its id (req- and 32 hex digits), or the "
                "path or URL of one of its files."
            )
        folder = self.root / name
        if not folder.is_dir() or folder.is_symlink():
            raise ResultNotFoundError(
                f"This server no longer holds that result (results are kept about "
                f"{self.max_age_s / 60:.0f} minutes). Run the task again."
            )
        return folder

    def prune(self, force: bool = False) -> int:
        """Delete request folders older than ``max_age_s``; returns how many were removed."""
        now = time.time()
        with self._lock:
            if not force and now - self._last_prune < min(60.0, self.max_age_s / 2):
                return 0
            self._last_prune = now
        removed = 0
        for folder in self.root.glob(f"{PREFIX}*"):
            try:
                if now - folder.stat().st_mtime > self.max_age_s:
                    shutil.rmtree(folder, ignore_errors=True)
                    removed += 1
            except OSError:
                continue
        return removed
