"""The serving layer: what a server (the Space, a batch job) needs around the task pipelines.

Nothing here imports Gradio, and nothing names a task: every task-specific fact comes from the
task registry (``sapiens2.tasks.registry``). Per request::

    runner = RequestRunner(manager, folders, device_call)   # device_call: the server's GPU entry
    shown = runner.run("pose", photo, "1b", threshold=0.4)  # read, check, load, prepare,
                                                            # infer (device_call), finish, present

Modules: ``cache`` (the model cache and residency), ``runner`` (one request, any task),
``present`` (result -> rendering, files, views), ``gpu_time`` (seconds to reserve), ``memory``
(heap/accelerator memory, out-of-memory errors), ``folders`` (per-request output folders),
``checkpoints`` (explicit per-task checkpoints).
"""

from __future__ import annotations

from ..errors import OutOfMemoryError
from ..outputs.render import parse_color
from .cache import CUSTOM, DEFAULT_MAX_MODELS, ModelManager, default_device, pipeline_bytes
from .checkpoints import CHECKPOINTS_ENV, checkpoints_from_env, parse_checkpoint_specs, task_name
from .folders import RequestFolders
from .memory import free_accelerator_memory, is_out_of_memory, release_cpu_threads, release_memory
from .present import Presented, present
from .runner import DeviceCall, Job, RequestRunner, read_photo, run_on_device

__all__ = [
    "CHECKPOINTS_ENV",
    "CUSTOM",
    "DEFAULT_MAX_MODELS",
    "DeviceCall",
    "Job",
    "ModelManager",
    "OutOfMemoryError",
    "Presented",
    "RequestFolders",
    "RequestRunner",
    "checkpoints_from_env",
    "default_device",
    "free_accelerator_memory",
    "is_out_of_memory",
    "pipeline_bytes",
    "parse_checkpoint_specs",
    "parse_color",
    "present",
    "read_photo",
    "release_cpu_threads",
    "release_memory",
    "run_on_device",
    "task_name",
]
