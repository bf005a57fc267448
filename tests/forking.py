"""Helper for tests that fork a child (as ZeroGPU does) and must not deadlock on a lock."""

from __future__ import annotations

import os
import time

import pytest


def expect_child_success(pid: int, what: str, timeout_s: float = 60.0) -> None:
    """Wait for a forked child: it must exit 0 in time, else it deadlocked on ``what`` (a deadlock
    lasts forever, so the bound is wide enough for a busy machine)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child deadlocked on {what}")
