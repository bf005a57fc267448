"""Albedo: the surface colour without shading.

The task's declaration is ``TASK``; ``sapiens2.tasks.registry`` finds it by listing the task
folders of ``sapiens2.tasks``."""

from __future__ import annotations

from .albedo_pipeline import TASK, AlbedoPipeline, AlbedoRaw, AlbedoResult

__all__ = ["AlbedoPipeline", "AlbedoRaw", "AlbedoResult", "TASK"]
