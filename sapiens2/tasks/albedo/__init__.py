"""Albedo: the surface colour without shading.

The task's declaration is ``TASK``; ``sapiens2.tasks.registry`` finds it by listing this package's
folders."""

from __future__ import annotations

from .albedo_pipeline import TASK, AlbedoPipeline, AlbedoRaw, AlbedoResult

__all__ = ["AlbedoPipeline", "AlbedoRaw", "AlbedoResult", "TASK"]
