"""Test helpers around the task registry (what only tests need stays out of the package)."""

from __future__ import annotations

from sapiens2.models.zoo import TASKS as ZOO
from sapiens2.tasks import registry


def unregister(task: registry.Task) -> None:
    """Remove a task a test registered, and its zoo row (the built-ins are never removed)."""
    with registry._lock:
        if registry._tasks.get(task.name) is task and task.pipeline.__module__.startswith("sapiens2."):
            raise AssertionError(f"{task.name} is a built-in task")
        if registry._tasks.get(task.name) is task:
            del registry._tasks[task.name]
    if ZOO.get(task.name) is task.spec:
        del ZOO[task.name]


def task(name: str) -> registry.Task:
    """A task by name, as the edge (the page, the API, the CLI) looks it up."""
    return registry.get(name)
