"""THE adapter between the batch engines and the task pipelines: per task, ``prepare(intake)
-> prep`` (CPU), ``forward(preps) -> raws`` (the device, weights loaded once), ``finish(raw,
geometry, source) -> row`` (CPU). The engines know nothing else of the tasks.

A task whose people come from a detector (pose with its DETR) has one more pair, so the photo
never goes to a device step: ``people_input(intake)`` (CPU: the detector's input, a small uint8
copy), ``find_people(inputs)`` (the device: the detector alone, no task weights), then
``prepare(intake, people)`` (CPU: the person crops, the task's network input).

The CPU stages are the tasks' own weight-free stages: ``Pipeline.without_weights`` (the task's
``prepare`` and ``finish`` with its size, network size and parts, and no model built or loaded),
so a CPU worker never holds a model. Options come resolved in the plan (``job.task_plan``: the
declaration's defaults for the device the forward runs on), the same mapping on both sides.
``finish`` gets the photo's geometry, not the photo: :meth:`Geometry.intake` is an ``Intake``
whose pixels are a broadcast zero (no memory), since finish reads only sizes, scales and notices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..inputs.intake import Intake
from ..tasks.registry import Task
from .job import ModelPlan, TaskPlan
from .records import result_row


@dataclass(frozen=True)
class Geometry:
    """What ``finish`` needs of a decoded photo: sizes, scale, notices, name (a few hundred bytes)."""

    size_hw: tuple[int, int]
    work_hw: tuple[int, int]
    scale: float
    notices: tuple[str, ...] = ()
    name: str = "image"
    reduction: int = 1
    source_size: tuple[int, int] | None = None

    @classmethod
    def of(cls, intake: Intake) -> Geometry:
        return cls(
            intake.size_hw,
            (int(intake.work.shape[0]), int(intake.work.shape[1])),
            intake.scale,
            tuple(intake.notices),
            intake.name,
            intake.reduction,
            intake.source_size,
        )

    def intake(self) -> Intake:
        """An Intake of this geometry whose pixels take no memory (read-only zeros)."""
        zero = np.zeros((1, 1, 3), np.uint8)
        rgb = np.broadcast_to(zero, (*self.size_hw, 3))
        work = rgb if self.work_hw == self.size_hw else np.broadcast_to(zero, (*self.work_hw, 3))
        return Intake(rgb, work, self.scale, list(self.notices), self.name, self.reduction, self.source_size)


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


@dataclass
class TaskStages:
    """One task's three stages for the engines (see the module docstring)."""

    plan: TaskPlan
    _cpu: Any = field(default=None, repr=False)
    _device: Any = field(default=None, repr=False)
    _finder: Any = field(default=None, repr=False)

    @property
    def task(self) -> Task:
        return self.plan.task

    # -- CPU side: no weights

    def _sized(self, pipe: Any) -> Any:
        if self.plan.network_hw is not None:
            pipe.input_hw = self.plan.network_hw
        return pipe

    def _shell(self, model: ModelPlan, **kwargs: Any) -> Any:
        return model.task.pipeline.without_weights(model.size, input_hw=self.plan.network_hw, **kwargs)

    def cpu_pipeline(self) -> Any:
        """The task's pipeline without weights (built once)."""
        if self._cpu is None:
            borrowed = {b.task.name: self._shell(b) for b in self.plan.borrowed}  # keyword: its name
            self._cpu = self._shell(self.plan.model, **self.plan.pipeline_kwargs, **borrowed)
        return self._cpu

    def prepare(self, intake: Intake, people: Any = None) -> Any:
        """The task's network input (``people``: what :meth:`find_people` found in this photo)."""
        extra = {} if people is None else {"people": people}
        return self.cpu_pipeline().prepare(intake, **self.plan.options, **extra)

    @property
    def finds_people(self) -> bool:
        """The task's people come from a device step of their own (:meth:`find_people`)."""
        apart = getattr(self.cpu_pipeline(), "people_apart", None)
        return bool(apart and apart())

    def people_input(self, intake: Intake) -> Any | None:
        """The detector's input for this photo (None: :meth:`prepare` needs no people step)."""
        if not self.finds_people:
            return None
        return self.cpu_pipeline().people_input(intake, **self.plan.options)

    def finish(self, raw: Any, geometry: Geometry, source: str) -> dict[str, Any]:
        result = self.cpu_pipeline().finish(raw, geometry.intake(), **self.plan.options)
        return result_row(self.task, source, result)

    # -- device side: the weights, loaded once per process

    def load(self, device: str, dtype: str) -> Any:
        """The task's pipeline with its weights on ``device`` (built once), and what it borrows."""
        if self._device is None:
            kw = {"device": device, "dtype": _dtype(dtype)}
            borrowed = {}
            for b in self.plan.borrowed:  # no checkpoint: the pipeline loads it by size when needed
                if b.checkpoint is not None:
                    pipe = b.task.pipeline(b.size, checkpoint=b.checkpoint, **kw)
                    borrowed[b.task.name] = self._sized(pipe)
            m = self.plan.model
            pipe = m.task.pipeline(
                m.size, checkpoint=m.checkpoint, **kw, **self.plan.pipeline_kwargs, **borrowed
            )
            self._device = self._sized(pipe)
        return self._device

    def load_finder(self, device: str) -> Any:
        """The task's people finder on ``device``: its pipeline without weights, whose detector
        loads on first use (the detector alone, never the task's model)."""
        if self._finder is None:
            finder = self._shell(self.plan.model, device=device, **self.plan.pipeline_kwargs)
            finder.warm_people()  # a detector checkpoint that cannot load stops the run here
            self._finder = finder
        return self._finder

    def find_people(self, inputs: list[Any]) -> list[Any]:
        if self._finder is None:
            raise RuntimeError("TaskStages.load_finder() comes before find_people().")
        return list(self._finder.find_people(inputs, **self.plan.options))

    def forward(self, preps: list[Any]) -> list[Any]:
        if self._device is None:
            raise RuntimeError("TaskStages.load() comes before forward().")
        return list(self._device.infer(preps, **self.plan.options))


def stages_for(plans: tuple[TaskPlan, ...]) -> dict[Task, TaskStages]:
    return {p.task: TaskStages(p) for p in plans}
