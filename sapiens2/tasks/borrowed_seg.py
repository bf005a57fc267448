"""The body-part segmentation other tasks borrow for their foreground (normal, pointmap, albedo).

:class:`SegMaskedPipeline` is the base of those tasks: the letterboxed input of the release
(shared by all three) plus, when a request asks for the person mask, the seg model's own input;
its compact logits come back from ``infer`` and are resized to the photo in ``finish``.
:class:`LazySeg` holds the borrowed pipeline without keeping a server's model alive.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch

from ..errors import CheckpointError, OptionError, Sapiens2Error, WeightsUnavailableError
from ..inputs.intake import Intake
from ..inputs.network import dense_input
from ..models.cost import Work
from ..models.zoo import get_task
from .base import Pipeline
from .dense import DensePrep
from .registry import Task
from .seg.seg_pipeline import TASK as SEG
from .seg.seg_pipeline import SegPipeline

log = logging.getLogger(__name__)

SegSource = SegPipeline | Callable[[], SegPipeline] | None

#: Seconds a failed load of the borrowed model is answered from memory before it is tried again.
RETRY_AFTER_S = 60.0


class LazySeg:
    """The SegPipeline an owner borrows: given, from a factory, or loaded next to the owner.

    A factory is called on every use and its result never kept: the factory's owner (e.g. the
    server's model manager) must stay free to evict or trim that model, and a private copy here
    would keep it alive. Only a pipeline given directly or built here is kept. A failed load
    here (weights missing, bad file) is remembered for :data:`RETRY_AFTER_S`: a clip's frames or a
    folder's photos get the same answer without a Hub request and a log paragraph each, and a
    later call can still succeed.
    """

    def __init__(self, source: SegSource, owner: Pipeline) -> None:
        if source is not None and not (isinstance(source, SegPipeline) or callable(source)):
            raise OptionError(
                f"seg must be a SegPipeline, a function returning one, or None; got {type(source).__name__}."
            )
        self._factory = None if isinstance(source, SegPipeline) else source
        self._owner = owner
        self._pipe: SegPipeline | None = source if isinstance(source, SegPipeline) else None
        self._lock = threading.Lock()  # concurrent first requests load the model once
        self._failed: tuple[float, Sapiens2Error] | None = None  # (when, why) of the last failed load

    def get(self) -> SegPipeline:
        if self._factory is not None:
            try:
                pipe = self._factory()
            except (WeightsUnavailableError, CheckpointError) as err:
                log.warning("the borrowed segmentation model is unavailable: %s", err)  # details
                raise
            if not isinstance(pipe, SegPipeline):
                raise OptionError(f"The seg factory must return a SegPipeline; got {type(pipe).__name__}.")
            return pipe
        with self._lock:
            if self._pipe is None:
                if self._failed is not None and time.monotonic() - self._failed[0] < RETRY_AFTER_S:
                    raise self._failed[1]
                own = self._owner
                size = own.size if own.size in get_task(SegPipeline.task).sizes else None
                try:
                    self._pipe = SegPipeline(size, device=own.device, dtype=own.dtype)
                except (WeightsUnavailableError, CheckpointError) as err:
                    self._failed = (time.monotonic(), err)
                    log.warning("the borrowed segmentation model is unavailable: %s", err)  # once
                    raise
            return self._pipe


class SegMaskedPipeline(Pipeline):
    """Base of the tasks that borrow the body-part segmentation for their foreground (normal,
    pointmap). ``seg``: a SegPipeline, a zero-argument function returning one (called on every
    use, result not kept), or None to load the seg model of the same size when first needed.

    The borrowed model fits the stages: ``prepare`` adds the seg model's own input (the
    release's stretch, uint8) to the prep, ``infer`` runs it after the task's forward and returns
    its compact logits, ``finish`` resizes them to the photo (:meth:`foreground`).
    """

    #: what the notice says is done instead when the seg model is unavailable
    seg_fallback: ClassVar[str] = ""
    parts = {"seg": None}

    def attach(self, seg: SegSource = None) -> None:
        self.seg = LazySeg(seg, self)

    def _seg_pipe(self, notices: list[str]) -> SegPipeline | None:
        """The borrowed pipeline, or None with a notice naming the cause and the fallback."""
        try:
            return self.seg.get()
        except (WeightsUnavailableError, CheckpointError) as err:
            why = (
                "its checkpoint cannot be used"
                if isinstance(err, CheckpointError)
                else "its weights are not available here"
            )
            notices.append(
                f"No person mask: the segmentation model is unavailable ({why}). {self.seg_fallback}"
            )
            return None

    def prepare_dense(self, intake: Intake, with_seg: bool, input_hw: Any = None) -> DensePrep:
        """Letterboxed uint8 input (the release's rule) and, when asked, the seg model's input;
        ``input_hw``: another network input for both (:meth:`Pipeline.input_size`)."""
        hw = self.input_size(input_hw)
        pixels, pad = dense_input(intake.work, hw, self.rules.dense_resize, letterbox=True)
        prep = DensePrep(pixels, pad)
        if with_seg and (pipe := self._seg_pipe(prep.notices)) is not None:
            prep.seg = dense_input(intake.work, pipe.input_size(input_hw), pipe.rules.dense_resize)[0]
        return prep

    def infer_seg(self, batch: list[DensePrep], raws: list[Any], nearest: bool = False) -> None:
        """Borrowed segmentation of the preps that carry a seg input: ``raw.seg`` (compact logits;
        with ``nearest``, Live's, the network-resolution labels to enlarge nearest-neighbour)."""
        for raw, prep in zip(raws, batch, strict=True):
            raw.notices += prep.notices
        todo = [i for i, p in enumerate(batch) if p.seg is not None]
        if not todo:
            return
        notices: list[str] = []
        pipe = self._seg_pipe(notices)
        for i in todo:
            raws[i].notices += notices
        if pipe is not None:
            found = pipe.seg_logits([batch[i].seg for i in todo], [raws[i] for i in todo], nearest)
            for i, logits in zip(todo, found, strict=True):
                raws[i].seg = logits

    @staticmethod
    def foreground(raw: Any, out_hw: tuple[int, int]) -> torch.Tensor | None:
        """(H, W) bool on the CPU, True off the background class; None without segmentation."""
        return None if raw.seg is None else raw.seg.foreground(out_hw)


def seg_borrowing(
    option: str, default: bool
) -> tuple[Callable[[Mapping[str, Any]], tuple[Task, ...]], Callable[[Mapping[str, Any]], Work]]:
    """A borrowing task's ``needs`` and ``work`` declaration fields: it borrows seg when its bool
    ``option`` (default ``default``) is on, and then runs the seg model's forward too."""

    def needs(infer_opts: Mapping[str, Any]) -> tuple[Task, ...]:
        return (SEG,) if infer_opts.get(option, default) else ()

    def work(infer_opts: Mapping[str, Any]) -> Work:
        return Work(borrowed=len(needs(infer_opts)))

    return needs, work
