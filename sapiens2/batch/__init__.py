"""``sapiens2 batch``: the Space's results over whole datasets, in this process or on a Ray cluster.

The building blocks, lowest first: :mod:`.records` (a declared Arrow schema per task and the row
made from a result), :mod:`.sources` (what INPUT names, read through pyarrow's filesystems),
:mod:`.store` (OUT: one Parquet dataset per task, written in committed parts, resumable),
:mod:`.job` (the run's plan, resolved once), :mod:`.stages` (THE adapter to the task pipelines:
prepare / forward / finish), :mod:`.flow` (the steps both engines run, with per-photo errors),
:mod:`.parts` (rows gathered and committed per task, the summary), :mod:`.runner` (a run from
listing to summary), and the engines :mod:`.local` and :mod:`.ray_engine`, with the Ray engine's
driver side: :mod:`.cluster` (joining within a time limit, the settings shipped to the workers),
:mod:`.worker_check` (a first task per node), :mod:`.placement` (actor pools and each step's
resources) and :mod:`.footprint` (each step's memory). Nothing here imports Ray until the Ray
engine runs.

``run(job, INPUT, engine="local")`` is the Python entry; ``sapiens2 batch`` (``sapiens2.cli.batch``)
builds the job from the command line. docs/USAGE.md shows both; docs/SCALE.md a cluster.
"""

from __future__ import annotations

from .batch_run import run
from .job import BatchJob, ModelPlan, TaskPlan, task_plan
from .parts import Summary
from .records import column_arrays, read_array, read_png
from .store import read_task

__all__ = [
    "BatchJob",
    "ModelPlan",
    "Summary",
    "TaskPlan",
    "column_arrays",
    "read_array",
    "read_png",
    "read_task",
    "run",
    "task_plan",
]
