"""The parts of ``spaces`` this package relies on without a public API, all in this module.

``spaces`` offers ``spaces.GPU`` and nothing to refresh a worker, read a node's duration factor,
or give a request thread its CUDA emulation. Each function below says what it touches; docs/DESIGN.md
("Patched internals") says why, and ``tests/test_spaces_internals.py`` fails with a clear message
when one of them changes shape in an installed ``spaces``. Checked against :data:`CHECKED_SPACES`.
Nothing here imports ``spaces`` or ``torch`` when the module is imported.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: The spaces release every internal below was read in (requirements.txt bounds spaces to it).
CHECKED_SPACES = "0.51.3"
#: spaces' refusal of a schedule for quota (``spaces/zero/client.py``, ``schedule``): the seconds
#: asked and left, and when the quota refills.
REFUSAL_ASKED_LEFT = re.compile(r"\((\d+)s requested vs\. (\d+)s left\)")
REFUSAL_WAIT = re.compile(r"Try again in ([0-9:]+)")


@functools.cache
def node_configs() -> tuple[dict[str, Any], ...]:
    """ZeroGPU's node table shipped in spaces (``spaces/zero/configs.json``: one entry per GPU model,
    with the ``duration_factor`` spaces multiplies a request by), read without importing spaces;
    empty when spaces is not installed or the file is unreadable."""
    spec = importlib.util.find_spec("spaces")
    if spec is None or not spec.submodule_search_locations:
        return ()
    path = Path(next(iter(spec.submodule_search_locations))) / "zero" / "configs.json"
    try:
        return tuple(json.loads(path.read_text()))
    except (OSError, ValueError):
        return ()


def forget_decorated(*functions: Callable[..., Any]) -> None:
    """Drop ``functions`` from ``spaces.zero.decorator.decorated_cache`` (spaces keeps every function
    it decorated, and the decorated one, with its worker handles, for the life of the process)."""
    try:
        from spaces.zero.decorator import decorated_cache
    except ImportError:
        return
    for fn in functions:
        decorated_cache.pop(fn, None)


def torch_modes() -> tuple[Any, Any] | None:
    """spaces' two torch modes (``spaces.zero.torch.patching.function_mode`` and ``dispatch_mode``)
    that emulate CUDA in the server process, or None where spaces did not patch torch (it imports
    that module only on ZeroGPU)."""
    patching = sys.modules.get("spaces.zero.torch.patching")
    if patching is None:
        return None
    return patching.function_mode, patching.dispatch_mode


def active_function_modes() -> list[Any]:
    """The torch function modes active in this thread (torch has no public accessor for the stack)."""
    from torch.overrides import _get_current_function_mode_stack

    return _get_current_function_mode_stack()


def is_refusal(err: BaseException) -> bool:
    """Whether ``err`` is spaces' own error around a GPU call (a refused schedule, an aborted
    worker): a ``gr.Error`` (or spaces' ``HTMLError``) with a title, made by ``spaces.zero.gradio.error``."""
    return type(err).__name__ in ("Error", "HTMLError") and hasattr(err, "title")


def _parent_pid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # after "pid (name)": state, ppid, ...
    return int(fields[1]) if len(fields) > 1 else None


def end_workers(pids: Iterable[int]) -> None:
    """SIGTERM each pid that is still a child of this process: a spaces worker (a fork of the
    server) closes its argument queue on SIGTERM and its loop, and the process, end."""
    for pid in pids:
        if _parent_pid(pid) != os.getpid():
            continue  # already gone (or not ours): nothing to end
        try:
            os.kill(pid, signal.SIGTERM)
            log.info("ended stale GPU worker %d", pid)
        except ProcessLookupError:
            pass


__all__ = [
    "CHECKED_SPACES",
    "REFUSAL_ASKED_LEFT",
    "REFUSAL_WAIT",
    "active_function_modes",
    "end_workers",
    "forget_decorated",
    "is_refusal",
    "node_configs",
    "torch_modes",
]
