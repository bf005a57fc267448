"""The serving layer: what a server (the Space, a batch job) needs around the task pipelines.

Nothing here imports Gradio, and nothing names a task: a request arrives with its
:class:`~sapiens2.tasks.registry.Task`, looked up where it came in. Per request::

    runner = RequestRunner(manager, folders, device)     # device: runs a unit of GPU work
    shown = runner.run(task, photo, "1b", threshold=0.4)  # read, check, load, prepare,
                                                          # infer (one device call), finish, present

Modules: ``cache`` (the model cache and residency), ``request_runner`` (one request, any task),
``device`` (the typed units of device work: a task's batch, "All tasks", a clip), ``video``
(a clip in one device call, its plan and estimates), ``live`` (a camera's frames), ``present``
(result -> rendering, files, views, stage totals), ``on_demand`` (files made only when asked),
``memory_errors`` (out-of-memory errors and the one trim after them), ``folders`` (per-request
output folders). What a call costs is ``sapiens2.models.cost``'s.
"""

from __future__ import annotations

from ..runtime.heap import release_memory
from ..runtime.threads import release_cpu_threads
from .cache import DEFAULT_MAX_MODELS, ModelManager
from .folders import RequestFolders
from .memory_errors import is_out_of_memory, trim_after_out_of_memory
from .present import Presented, present
from .request_runner import RequestRunner

__all__ = [
    "DEFAULT_MAX_MODELS",
    "ModelManager",
    "Presented",
    "RequestFolders",
    "RequestRunner",
    "is_out_of_memory",
    "present",
    "release_cpu_threads",
    "release_memory",
    "trim_after_out_of_memory",
]
