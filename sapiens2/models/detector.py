"""Person boxes for top-down pose: ``detect_people``, what pipelines call, and its fallbacks.

It never fails for want of a detector: caller boxes are used as given; without weights, with
detection turned off, or when nobody is found, the whole image becomes one box
(``[0, 0, w - 1, h - 1]``, as in the release), and ``Detections.notices`` says so in words. The
network is :mod:`.person_detector`, its input :mod:`.detr_input`, box arithmetic :mod:`.boxes`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from ..errors import OptionError, WeightsUnavailableError
from ..runtime.devices import canonical_device
from . import zoo
from .boxes import as_boxes, box_iou, nms  # noqa: F401 (re-exported)
from .detr_input import (  # noqa: F401 (re-exported)
    LONGEST_EDGE,
    SHORTEST_EDGE,
    DetectorInput,
    check_image,
    detector_input,
    normalise,
    preprocess,
    resize_for_detr,
    resize_shape,
)
from .person_detector import (  # noqa: F401 (re-exported)
    PERSON_LABEL,
    Detections,
    PersonDetector,
    Source,
    check_options,
    finalize_detections,
    person_boxes,
)
from .weights import ENV_VAR


def _whole_image(hw: tuple[int, int], notice: str, notices: list[str] | None = None) -> Detections:
    h, w = hw
    # the release's fallback (vis_pose.py): the last pixel's centre, not the far image edge
    box = np.array([[0.0, 0.0, w - 1, h - 1]], dtype=np.float32)
    return Detections(box, np.ones(1, np.float32), "whole_image", 0, [*(notices or []), notice])


_AUTO_LOCK = threading.Lock()
_AUTO: dict[str, PersonDetector] = {}  # one loaded detector per device, shared by all callers


def _reset_auto_lock() -> None:
    # A fork (ZeroGPU's GPU worker) taken while another thread held the lock during a load
    # would leave the child's copy locked forever: give the child a fresh one.
    global _AUTO_LOCK
    _AUTO_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_auto_lock)

DetectorArg = Literal["auto"] | str | os.PathLike | PersonDetector | Callable[[np.ndarray], Any] | None
_LOADED: dict[tuple[str, str], PersonDetector] = {}  # detectors from a given checkpoint, per device


def _auto_detector(device: torch.device | str | None = None) -> PersonDetector:
    """The shared default detector on ``device`` (None: CUDA if available, else CPU), one per
    device; a failed load raises and is retried on the next call."""
    dev = canonical_device(device)  # "cuda" (the manager) and "cuda:0" (a model's) share one
    key = str(dev)
    with _AUTO_LOCK:  # held while loading so that concurrent first calls load once
        if key not in _AUTO:
            _AUTO[key] = PersonDetector.load(device=dev)
        return _AUTO[key]


def detector_from(checkpoint: str | os.PathLike, device: torch.device | str | None = None) -> PersonDetector:
    """The DETR of ``checkpoint`` (a file or folder) on ``device``, loaded once per process;
    WeightsUnavailableError / CheckpointError when it is missing or not a DETR."""
    dev = canonical_device(device)
    key = (str(Path(checkpoint).expanduser().absolute()), str(dev))
    with _AUTO_LOCK:
        if key not in _LOADED:
            _LOADED[key] = PersonDetector.load(key[0], device=dev)
        return _LOADED[key]


def warm_detector(device: torch.device | str | None = None) -> bool:
    """Load the shared detector for ``device`` now (e.g. in a server, outside any GPU function).
    True when this call loaded it; False when it was already loaded or its weights are missing
    (pose then uses the whole image, with a notice, and retries on a later request)."""
    if str(canonical_device(device)) in _AUTO:
        return False
    try:
        _auto_detector(device)
    except WeightsUnavailableError:
        return False
    return True


def _from_callable(
    image: np.ndarray,
    detector: Callable[[np.ndarray], Any],
    score_threshold: float,
    iou_threshold: float,
    max_people: int,
) -> Detections:
    """Run an injected detector: it returns Detections, (boxes, scores), or boxes alone."""
    out = detector(image)
    notices: list[str] = []
    if isinstance(out, Detections):
        boxes, scores, notices = out.boxes, out.scores, list(out.notices)
    elif isinstance(out, tuple) and len(out) == 2:
        boxes, scores = out
    else:
        boxes, scores = out, None
    arr = as_boxes(boxes, "Boxes from the injected detector")
    sc = np.ones(len(arr), np.float32) if scores is None else np.asarray(scores, np.float32).reshape(-1)
    if sc.shape != (len(arr),):
        raise OptionError(f"The injected detector returned {len(arr)} boxes but {sc.size} scores.")
    return finalize_detections(
        image.shape[:2],
        torch.from_numpy(arr),
        torch.from_numpy(sc),
        score_threshold,
        iou_threshold,
        max_people,
        notices,
    )


def _caller_boxes(boxes: Any, w: int, h: int) -> Detections:
    """The caller's boxes, clipped to the image; OptionError when none or one is empty."""
    arr = as_boxes(boxes)
    if len(arr) == 0:
        raise OptionError("boxes is empty; pass None to detect people, or at least one x1, y1, x2, y2 box.")
    arr[:, 0::2] = arr[:, 0::2].clip(0, w)
    arr[:, 1::2] = arr[:, 1::2].clip(0, h)
    bad = np.flatnonzero((arr[:, 2] <= arr[:, 0]) | (arr[:, 3] <= arr[:, 1]))
    if bad.size:
        raise OptionError(
            f"Box {int(bad[0])} is empty inside the {w}x{h} image after clipping; boxes are x1, y1, x2, y2 "
            "pixels with x2 > x1 and y2 > y1."
        )
    return Detections(arr, np.ones(len(arr), np.float32), "caller", len(arr), [])


def _auto_detector_or_none(device: torch.device | str | None) -> PersonDetector | None:
    """The shared detector, or None when its weights are not available here."""
    try:
        return _auto_detector(device)
    except WeightsUnavailableError:
        return None


def _no_weights_notice() -> str:
    spec = zoo.DETECTOR
    return (
        f"No person detector here (the weights of {spec.repo_id} are not in the Hugging Face cache "
        f"and cannot be downloaded): the whole image is used as one person box. To detect people, "
        f"go online once, or put {spec.filename} at ${ENV_VAR}/{spec.local_path}."
    )


def _wrong_detector(detector: Any) -> OptionError:
    what = repr(detector) if isinstance(detector, str) else type(detector).__name__
    return OptionError(
        f"detector must be 'auto', None, a DETR checkpoint path, a PersonDetector or a callable; got {what}."
    )


def runs_apart(detector: Any) -> bool:
    """``detector`` is a DETR ("auto", a checkpoint path, a PersonDetector), which can run on its
    own small input in a device step; not no detector or a callable (they take the photo)."""
    return isinstance(detector, (str, os.PathLike, PersonDetector))


def people_input(detector: Any, image: np.ndarray) -> DetectorInput | None:
    """``image``'s input to ``detector`` made on the CPU (a PersonDetector's resize rule, or the
    DETR's default for "auto" or a checkpoint path); None when it does not run apart."""
    if isinstance(detector, PersonDetector):
        return detector.input_for(image)
    return detector_input(image) if runs_apart(detector) else None


def load_detector(detector: Any, device: torch.device | str | None = None) -> Any:
    """What :func:`detect_people` runs for ``detector``, loaded now: ``"auto"`` -> the shared DETR
    (None when its weights are missing here); a path -> that checkpoint's DETR (raises when it is
    missing or not a DETR); anything else as it is."""
    if isinstance(detector, str) and detector == "auto":
        return _auto_detector_or_none(device)
    if isinstance(detector, (str, os.PathLike)):
        if not str(detector).strip():
            raise _wrong_detector(detector)
        return detector_from(detector, device)
    return detector


def detect_people(
    image: np.ndarray | DetectorInput,
    *,
    boxes: Any = None,
    detector: DetectorArg = "auto",
    score_threshold: float = 0.3,
    iou_threshold: float = 0.3,
    max_people: int = 20,
    device: torch.device | str | None = None,
) -> Detections:
    """Person boxes for top-down pose, always at least one.

    - ``boxes`` given (N, 4 pixels xyxy): used as given, clipped to the image; no detector runs.
    - ``detector="auto"``: the shared DETR (loaded once per process and ``device``; None: CUDA
      if available, else CPU); if its weights are not available here, the whole image is one
      box and a notice says how to get them.
    - ``detector=None``: the whole image is one box.
    - a DETR checkpoint (a path: file or folder, loaded once per process and device), a
      :class:`PersonDetector` or any callable ``f(image) -> boxes | (boxes, scores) | Detections``.
    Boxes scoring ``<= score_threshold`` are dropped, overlaps above ``iou_threshold`` suppressed,
    and at most ``max_people`` kept (a notice says how many were found). Nobody found: whole image.

    ``image`` may be a :class:`DetectorInput` made on a CPU (:func:`detector_input`): the same
    boxes, in the pixels of the image it was made from, without that image (not with a callable).
    """
    prepared = image if isinstance(image, DetectorInput) else None
    if prepared is None:
        image = check_image(image)
    check_options(score_threshold, iou_threshold, max_people)
    hw = prepared.image_hw if prepared is not None else image.shape[:2]

    if boxes is not None:
        return _caller_boxes(boxes, hw[1], hw[0])
    if detector is None:
        return _whole_image(hw, "Person detection is off: the whole image is used as one person box.")
    if not (isinstance(detector, (str, os.PathLike, PersonDetector)) or callable(detector)):
        raise _wrong_detector(detector)
    detector = load_detector(detector, device)
    if detector is None:
        return _whole_image(hw, _no_weights_notice())
    if isinstance(detector, PersonDetector):
        found = detector(
            image, score_threshold=score_threshold, iou_threshold=iou_threshold, max_people=max_people
        )
    elif prepared is not None:
        raise OptionError("A callable detector needs the image itself, not a DetectorInput.")
    else:
        found = _from_callable(image, detector, score_threshold, iou_threshold, max_people)
    if len(found) == 0:
        return _whole_image(
            hw,
            f"No person found with score above {score_threshold}: the whole image is used as one person box.",
            found.notices,
        )
    return found
