"""What every task pipeline shares: the result base type and the pipeline base class.

A pipeline = one loaded model + the task's pre/post-processing, in three stages:
``prepare(intake)`` makes the network input on the CPU (uint8, small), ``infer([preps])`` is the
only part that touches the model (the Space's GPU function runs just this, one forward per batch)
and returns network-resolution outputs, ``finish(raw, intake)`` maps them back to the photo on the
CPU. ``pipeline(image, **options)`` runs the three in one go. ``result.render(...)`` and
``result.save(dir)`` run on the CPU afterwards and never touch the model.

Shared steps: ``_prepare(image)`` reads any accepted input (path, bytes, PIL, numpy or an
already-made :class:`~sapiens2.inputs.intake.Intake`, so one upload can feed several pipelines) into an
upright original plus the working copy inference uses (long side <= ``max_side``);
``timed_forward`` runs the model once and adds its synchronised time to ``RunInfo.model_s``;
pipelines set ``RunInfo.total_s`` from their own start to the CPU arrays being ready.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from ..errors import OptionError
from ..inputs.intake import DEFAULT_MAX_SIDE, ImageSource, Intake, load_image
from ..models.zoo import Rules, TaskSpec, get_task

#: A photo enlarged more than this many times to fill the network input gets a notice: at 1024x768
#: an 8x8 photo is enlarged 96 times, 16x16 48 times; 32x24 (32 times) and larger get none.
FAR_BELOW = 32.0


@dataclass
class RunInfo:
    """How a result was made; shown under each result in the app."""

    task: str
    size: str | None
    device: str
    dtype: str
    model_s: float = 0.0  # time spent in model forwards (synchronised)
    total_s: float = 0.0  # intake + preprocessing + model + postprocessing
    #: perf_counter() when the first forward started: splits total_s into before / after the
    #: model for stage timing (bench/request.py) without timers inside the pipelines
    forward_started: float | None = None
    #: the model's generation, size and licence where the page marks it ("Sapiens v1 · 1b ·
    #: CC-BY-NC-4.0"); empty for Sapiens2 (``sapiens2.models.zoo.Rules.mark``)
    mark: str = ""

    def head(self) -> str:
        """How the result was made (model, device, dtype, model seconds), without the total."""
        size = self.size or "custom"
        mark = f" · {self.mark}" if self.mark else ""
        return f"{self.task} {size}{mark} · {self.device} · {self.dtype} · model {self.model_s:.2f} s"

    def line(self) -> str:
        return f"{self.head()} · total {self.total_s:.2f} s"


@dataclass
class TaskResult:
    """Base of every task's result: the upright input image plus how it was processed."""

    image: np.ndarray  # (H, W, 3) uint8 RGB, original size, EXIF-upright
    info: RunInfo
    notices: list[str] = field(default_factory=list)  # things the user should know (fallbacks, caps)
    downscaled: bool = False  # inference ran on a downscaled copy; arrays were mapped back
    name: str = "image"  # stem for export file names (never a user-controlled path)

    def render(self, **options: Any) -> np.ndarray:  # pragma: no cover - overridden
        raise NotImplementedError

    def save(self, out_dir: str | Path, *, rendered: np.ndarray | None = None) -> list[Path]:
        """Write the exports; ``rendered`` replaces the default rendering PNG."""
        raise NotImplementedError  # pragma: no cover - overridden

    def summary(self) -> dict[str, Any]:
        """A small JSON-friendly description (sizes, counts, notices) for UIs and logs."""
        return {
            "task": self.info.task,
            "size": self.info.size,
            "image_size": [int(self.image.shape[1]), int(self.image.shape[0])],
            "downscaled": self.downscaled,
            "notices": list(self.notices),
            "run": self.info.line(),
        }


def model_device_dtype(model: torch.nn.Module) -> tuple[torch.device, torch.dtype]:
    p = next(model.parameters())
    return p.device, p.dtype


class Pipeline:
    """Base class: holds a loaded model and can be reused across images."""

    task: ClassVar[str]
    #: Network input (H, W); None = the checkpoint's own (1024x768; 4x that for the 4K backbone).
    #: Other multiples of 16 run (faster when smaller) but are outside what the model was trained
    #: on: change it only for models trained at another size, or for quick tests.
    input_hw: tuple[int, int] | None = None
    #: The checkpoint fixes the network input (pointmap's scale branch): a call's ``input_hw``
    #: other than :attr:`network_hw` is refused.
    fixed_input: ClassVar[bool] = False
    #: long-side limit of the working copy (see sapiens2.inputs.intake.load_image); settable per instance
    max_side: int = DEFAULT_MAX_SIDE
    #: inputs per forward inside ``infer``; None = from the model's size and the device's free
    #: memory (:func:`sapiens2.models.forward_memory.items_per_forward`); settable per instance
    forward_items: int | None = None
    #: the constructor's keywords besides the model's, with their defaults (pose: ``detector``;
    #: the tasks that borrow the segmentation: ``seg``), handed to :meth:`attach`
    parts: ClassVar[Mapping[str, Any]] = {}

    def __init__(
        self,
        size: str | None = None,
        *,
        model: torch.nn.Module | None = None,
        checkpoint: str | Path | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        runtime: str | None = None,
        **parts: Any,
    ) -> None:
        from ..models.loading import load_model

        self._check_parts(parts)
        self.spec: TaskSpec = get_task(self.task)
        if model is None and runtime not in (None, "torch"):  # exported once, run by ONNX Runtime
            from ..models.onnx_cache import cached_onnx

            fp16 = dtype == torch.float16
            checkpoint = cached_onnx(self.task, size, checkpoint, runtime=runtime, fp16=fp16)
        if model is None:
            model = load_model(self.task, size, checkpoint=checkpoint, device=device, dtype=dtype)
        self.model = model
        self.size: str | None = getattr(model, "size", size)
        if self.input_hw is None and getattr(model, "input_hw", None):  # an ONNX file fixes its input
            self.input_hw = tuple(model.input_hw)
        self.device, self.dtype = model_device_dtype(model)
        if self.device.type == "cpu":
            from ..runtime.threads import configure_cpu_threads

            configure_cpu_threads()  # once per process; only ever lowers an oversubscribed count
        self.attach(**{**self.parts, **parts})

    @classmethod
    def without_weights(
        cls,
        size: str | None,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        input_hw: tuple[int, int] | None = None,
        **parts: Any,
    ) -> Any:
        """This pipeline's weight-free stages: ``prepare`` and ``finish`` as the pipeline with a
        ``size`` model on ``device`` in ``dtype`` runs them, with no model built or loaded (a
        worker that only prepares and finishes, ``sapiens2.batch``). ``infer`` raises. ``parts``:
        as the constructor's (a borrowed model is another pipeline ``without_weights``)."""
        pipe = cls.__new__(cls)
        pipe._check_parts(parts)
        pipe.spec, pipe.model, pipe.size = get_task(cls.task), None, size
        pipe.device, pipe.dtype = torch.device(device), dtype
        if input_hw is not None:
            pipe.input_hw = tuple(input_hw)
        pipe.attach(**{**cls.parts, **parts})
        return pipe

    def _check_parts(self, parts: Mapping[str, Any]) -> None:
        unknown = sorted(set(parts) - set(self.parts))
        if unknown:
            raise TypeError(f"{type(self).__name__}() got an unexpected keyword argument {unknown[0]!r}")

    def attach(self, **parts: Any) -> None:
        """Keep the constructor's extra :attr:`parts` (by default as attributes of the same names)."""
        for name, value in parts.items():
            setattr(self, name, value)

    @property
    def network_hw(self) -> tuple[int, int]:
        """The (H, W) the model is fed: ``input_hw`` or the checkpoint's own input size."""
        own = getattr(self.model, "input_hw", None)  # a v1 graph's (its size may be custom)
        return tuple(self.input_hw or own or self.spec.input_size(self.size or ""))

    @property
    def rules(self) -> Rules:
        """The model generation's pre- and post-processing rules (``sapiens2.models.zoo.Rules``):
        the loaded model's own, else its zoo size's."""
        return getattr(self.model, "rules", None) or self.spec.rules(self.size)

    def small_photo_notices(self, intake: Intake) -> list[str]:
        """A notice when the photo is far below the network input (enlarged more than
        :data:`FAR_BELOW` times to fill it): the model then sees a few blurred pixels."""
        h, w = intake.rgb.shape[:2]
        nh, nw = self.network_hw
        factor = min(nh / h, nw / w)
        if factor <= FAR_BELOW:
            return []
        return [
            f"The image is {w}x{h} px, far below the network's {nw}x{nh} input: it is enlarged about "
            f"{factor:.0f}x, so the model sees a few blurred pixels and its result says little."
        ]

    def input_size(self, input_hw: Any = None) -> tuple[int, int]:
        """The network input (H, W) of one call: ``input_hw`` when given (checked by
        :func:`sapiens2.inputs.network.check_input_hw`), else :attr:`network_hw`. The stages take
        it as their ``input_hw`` option (the live view's faster input); None keeps the release's
        path exactly."""
        if input_hw is None or getattr(self.model, "input_hw", None):  # an ONNX file runs at its own
            return self.network_hw
        from ..inputs.network import check_input_hw

        hw = check_input_hw(input_hw)
        if self.fixed_input and hw != tuple(self.network_hw):
            trained = "x".join(str(v) for v in self.network_hw)
            raise OptionError(
                f"The {self.task} model runs only at its trained input {trained}; got input_hw {hw}."
            )
        return hw

    def forward_chunk(self, input_hw: tuple[int, int] | None = None) -> int:
        """How many inputs one forward of this pipeline's model takes now, at the call's network
        input (a bounded forward: docs/DESIGN.md); ``infer`` runs a longer batch as several
        forwards of at most this many."""
        from ..models.forward_memory import items_per_forward

        hw = self.network_hw if input_hw is None else tuple(input_hw)
        return items_per_forward(self.model, hw, self.device, self.dtype, self.forward_items)

    def _prepare(self, image: ImageSource | Intake) -> Intake:
        """Image intake shared by every task (raises InputImageError on unusable input)."""
        return load_image(image, max_side=self.max_side)

    def run_info(self) -> RunInfo:
        dtype = str(self.dtype).replace("torch.", "")
        return RunInfo(self.task, self.size, str(self.device), dtype, mark=self.rules.mark(self.size))

    def timed_forward(self, info: RunInfo, pixel_values: torch.Tensor) -> Any:
        """One model forward, its time added to ``info.model_s`` (synchronised on CUDA)."""
        if self.model is None:
            raise RuntimeError(
                f"This {type(self).__name__} was made without weights: it prepares and finishes only."
            )
        cuda = self.device.type == "cuda"
        if cuda:  # queued preprocessing kernels must not be billed to the model
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        if info.forward_started is None:
            info.forward_started = t0
        with torch.inference_mode():
            out = self.model(pixel_values.to(self.device, self.dtype))
        if cuda:
            torch.cuda.synchronize(self.device)
        info.model_s += time.perf_counter() - t0
        return out

    def run_stages(self, image: ImageSource | Intake, **options: Any) -> Any:
        """The whole request in one process: prepare, infer (a batch of one), finish."""
        t0 = time.perf_counter()
        [result] = run_batch(self, [self._prepare(image)], options)
        result.info.total_s = time.perf_counter() - t0
        return result

    # -- stages: every built-in task overrides all three (docs/DESIGN.md). These defaults let a
    # one-call pipeline (a toy or third-party task) run too: its whole request runs in ``infer``,
    # on the device, so nothing is batched and the full result crosses the GPU boundary.

    def prepare(self, intake: Intake, **options: Any) -> Intake:
        return intake

    def infer(self, batch: list[Intake], **options: Any) -> list[Any]:
        return [self(item, **options) for item in batch]

    def finish(self, raw: Any, intake: Intake, **options: Any) -> Any:
        return raw


#: ``(preps, **options) -> raws``: a batch's device work (``pipe.infer``, or a server's GPU call)
Infer = Callable[..., Sequence[Any]]


def run_batch(
    pipe: Any,
    intakes: Sequence[Intake],
    options: Mapping[str, Any],
    infer: Infer | None = None,
    per_item: Sequence[Mapping[str, Any]] | None = None,
) -> list[Any]:
    """THE batch step of every request (a photo, a compared pair, the CLI, a clip's batch): each
    intake prepared, ONE ``infer`` over all the preps, each raw finished; one result per intake.

    ``infer`` runs the device work instead of ``pipe.infer`` (a server's GPU call, with the
    reservation of ``sapiens2.models.cost``). ``per_item``: options that differ per intake
    (a clip's per-frame person boxes), given to ``prepare`` and ``finish`` but not to ``infer``,
    which must take them from each prep."""
    preps = prepare_batch(pipe, intakes, options, per_item)
    raws = list((infer or pipe.infer)(preps, **options)) if preps else []
    return finish_batch(pipe, raws, intakes, options, per_item)


def prepare_batch(
    pipe: Any,
    intakes: Sequence[Intake],
    options: Mapping[str, Any],
    per_item: Sequence[Mapping[str, Any]] | None = None,
) -> list[Any]:
    """The first half of :func:`run_batch` (for a device call that spans several tasks)."""
    extra = per_item if per_item is not None else [{}] * len(intakes)
    return [pipe.prepare(i, **options, **e) for i, e in zip(intakes, extra, strict=True)]


def finish_batch(
    pipe: Any,
    raws: Sequence[Any],
    intakes: Sequence[Intake],
    options: Mapping[str, Any],
    per_item: Sequence[Mapping[str, Any]] | None = None,
) -> list[Any]:
    """The second half of :func:`run_batch`: one result per intake (OptionError when the device
    step gave another count)."""
    if len(raws) != len(intakes):
        raise OptionError(f"The pipeline's infer returned {len(raws)} results for {len(intakes)} inputs.")
    extra = per_item if per_item is not None else [{}] * len(intakes)
    return [pipe.finish(r, i, **options, **e) for r, i, e in zip(raws, intakes, extra, strict=True)]
