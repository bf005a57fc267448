"""What every browser test needs first: Debian's chromium (Playwright cannot download its own
browser here) and Playwright, or a skip of the whole module that says which is missing."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

CHROMIUM = Path("/usr/bin/chromium")


def playwright_or_skip() -> ModuleType:
    """``playwright.sync_api``; call it at module level, before the module imports the app."""
    if not CHROMIUM.exists():
        pytest.skip(
            "Debian's chromium is not installed at /usr/bin/chromium (apt-get install chromium; "
            "Playwright cannot download its own browser here).",
            allow_module_level=True,
        )
    return pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
    )
