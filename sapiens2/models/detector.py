"""Person boxes for top-down pose: DETR-ResNet-50 in plain torch, NMS, and visible fallbacks.

``detect_people`` is what pipelines call. It never fails for want of a detector: caller boxes
are used as given; without weights, with detection turned off, or when nobody is found, the
whole image becomes one box (``[0, 0, w - 1, h - 1]``, as in the release), and
``Detections.notices`` says so in words.

Checkpoint: ``facebook/detr-resnet-50`` (Apache-2.0), ``model.safetensors`` of the **main**
revision, the file huggingface_hub fetches by default and the one most users already have in
their cache. Its backbone uses timm/torchvision ResNet names; the ``no_timm`` revision's names
load as well (see ``sapiens2.models.nn.detr``). Local copy: ``$SAPIENS2_CHECKPOINTS/detector/detr-resnet-50.safetensors``.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image

from ..errors import CheckpointError, InputImageError, OptionError, WeightsUnavailableError
from ..runtime.devices import canonical_device, default_device
from ..zerogpu.entry import cuda_emulation
from . import zoo
from .boxes import as_boxes, box_iou, nms, xyxy_from_centres  # noqa: F401 (re-exported)
from .nn.detr import DEFAULT_HEADS, Detr, build_detr
from .weights import ENV_VAR, find_weights, load_tensors

# The DETR image processor's defaults for facebook/detr-resnet-50 (preprocessor_config.json).
SHORTEST_EDGE = 800
LONGEST_EDGE = 1333
#: DETR's COCO label map puts "person" at id 1 (id 0 is an unused "N/A").
PERSON_LABEL = 1

Source = Literal["detector", "caller", "whole_image"]


@dataclass
class Detections:
    """Person boxes for one image.

    ``boxes`` are (N, 4) float32 ``x1, y1, x2, y2`` in original image pixels, sorted by score
    (highest first); caller and whole-image boxes score 1.0 since nothing scored them.
    """

    boxes: np.ndarray
    scores: np.ndarray
    source: Source
    num_found: int  # people found before the cap (0 for the whole-image fallback)
    notices: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.boxes)


# ----------------------------------------------------------------------------- pre/post


def resize_shape(
    height: int, width: int, shortest: int = SHORTEST_EDGE, longest: int = LONGEST_EDGE
) -> tuple[int, int]:
    """DETR's resize rule: shortest edge to ``shortest`` unless the longest edge would pass ``longest``.

    Follows transformers' DetrImageProcessor arithmetic (rounded target edge, truncated other
    edge) so the network sees exactly the size the checkpoint was evaluated at.
    """
    short, long = min(height, width), max(height, width)
    target: float = shortest
    exact: float | None = None
    if long / short * shortest > longest:
        exact = longest * short / long
        target = int(round(exact))
    if short == target:
        return height, width
    other = int((exact if exact is not None else target) * long / short)
    target = max(1, int(target))  # very elongated images (2 x 10000) would round to 0 px
    other = max(1, other)
    return (target, other) if height <= width else (other, target)


def resize_for_detr(
    image: np.ndarray, shortest: int = SHORTEST_EDGE, longest: int = LONGEST_EDGE
) -> np.ndarray:
    """(H, W, 3) uint8 RGB at DETR's input size (:func:`resize_shape`; bilinear, PIL), uint8 still:
    the detector's network input before normalisation, a quarter of its float bytes."""
    h, w = resize_shape(image.shape[0], image.shape[1], shortest, longest)
    if (h, w) != image.shape[:2]:
        image = np.array(Image.fromarray(image).resize((w, h), Image.BILINEAR))  # writable copy for torch
    return np.ascontiguousarray(image)


def normalise(
    pixels: np.ndarray, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Resized uint8 RGB -> (1, 3, h, w) network input: /255, ImageNet mean/std."""
    x = torch.from_numpy(pixels).to(device).permute(2, 0, 1)[None].float() / 255.0
    mean = torch.tensor(zoo.IMAGE_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(zoo.IMAGE_STD, device=device).view(1, 3, 1, 1)
    return ((x - mean) / std).to(dtype)


def preprocess(
    image: np.ndarray,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    shortest: int = SHORTEST_EDGE,
    longest: int = LONGEST_EDGE,
) -> torch.Tensor:
    """(H, W, 3) uint8 RGB -> (1, 3, h, w) network input: bilinear resize (PIL), /255, ImageNet mean/std."""
    return normalise(resize_for_detr(image, shortest, longest), device, dtype)


@dataclass
class DetectorInput:
    """One image's detector input made on a CPU (:func:`detector_input`), so a device step can
    find its people without the image: the uint8 pixels at DETR's size (or the image itself when
    DETR would enlarge it: the smaller of the two) and the size of the image the boxes are for."""

    pixels: np.ndarray  # (h, w, 3) uint8: DETR's input size, or the image when that is smaller
    image_hw: tuple[int, int]
    edges: tuple[int, int] = (SHORTEST_EDGE, LONGEST_EDGE)  # the resize rule it is for

    def network_pixels(self) -> np.ndarray:
        """The uint8 pixels at DETR's input size (resized here when the image came as it is)."""
        if tuple(self.pixels.shape[:2]) == tuple(self.image_hw):
            return resize_for_detr(self.pixels, *self.edges)
        return self.pixels


def detector_input(
    image: np.ndarray, shortest: int = SHORTEST_EDGE, longest: int = LONGEST_EDGE
) -> DetectorInput:
    """The detector's input for ``image`` (boxes found in it come back in ``image``'s pixels):
    resized here when that makes it smaller, else the image (enlarged on the device's side)."""
    image = _check_image(image)
    h, w = resize_shape(image.shape[0], image.shape[1], shortest, longest)
    pixels = resize_for_detr(image, shortest, longest) if h * w < image.shape[0] * image.shape[1] else image
    return DetectorInput(pixels, image.shape[:2], (shortest, longest))


def person_boxes(
    logits: torch.Tensor, boxes: torch.Tensor, height: int, width: int, person_label: int = PERSON_LABEL
) -> tuple[torch.Tensor, torch.Tensor]:
    """One image's raw DETR outputs -> (person boxes xyxy in pixels, scores), unfiltered by score.

    As DETR's own post-processing: softmax over all classes including "no object", each query
    takes its most likely real class; queries whose class is person are kept.
    """
    probs = logits.float().softmax(-1)[..., :-1]
    scores, labels = probs.max(-1)
    xyxy = xyxy_from_centres(boxes, width, height)
    is_person = labels == person_label
    return xyxy[is_person], scores[is_person]


# ----------------------------------------------------------------------------- checks


def check_options(score_threshold: float, iou_threshold: float = 0.3, max_people: int = 20) -> None:
    """The detection options checked (OptionError naming the allowed values)."""
    for name, value in (("score_threshold", score_threshold), ("iou_threshold", iou_threshold)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
            raise OptionError(f"{name} must be a number in [0, 1]; got {value!r}.")
    if isinstance(max_people, bool) or not isinstance(max_people, (int, np.integer)) or max_people < 1:
        raise OptionError(f"max_people must be a whole number >= 1; got {max_people!r}.")


def _check_image(image: Any) -> np.ndarray:
    if not isinstance(image, np.ndarray):
        raise InputImageError(
            f"The image must be a numpy array (H, W, 3) of uint8 RGB; got {type(image).__name__}. "
            "Load files with sapiens2.load_image first."
        )
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise InputImageError(
            f"The image must be (H, W, 3) uint8 RGB; got shape {image.shape} and dtype {image.dtype}. "
            "Convert it (e.g. drop alpha, expand grey to 3 channels, scale floats to 0..255)."
        )
    if image.shape[0] < 1 or image.shape[1] < 1:
        raise InputImageError(f"The image is empty (shape {image.shape}).")
    return image


def _whole_image(hw: tuple[int, int], notice: str, notices: list[str] | None = None) -> Detections:
    h, w = hw
    # the release's fallback (vis_pose.py): the last pixel's centre, not the far image edge
    box = np.array([[0.0, 0.0, w - 1, h - 1]], dtype=np.float32)
    return Detections(box, np.ones(1, np.float32), "whole_image", 0, [*(notices or []), notice])


def _finalize(
    hw: tuple[int, int],
    boxes: torch.Tensor,
    scores: torch.Tensor,
    score_threshold: float,
    iou_threshold: float,
    max_people: int,
    notices: list[str] | None = None,
) -> Detections:
    """Clip to the image (``hw``), drop low scores and empty boxes, NMS, sort, cap: detector Detections."""
    h, w = hw
    boxes = boxes.float().cpu().clone()
    scores = scores.float().cpu()
    boxes[:, 0::2] = boxes[:, 0::2].clamp(0, w)
    boxes[:, 1::2] = boxes[:, 1::2].clamp(0, h)
    ok = (scores > score_threshold) & (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    boxes, scores = boxes[ok], scores[ok]
    keep = nms(boxes, scores, iou_threshold)
    boxes, scores = boxes[keep], scores[keep]
    notices = list(notices or [])
    found = len(keep)
    if found > max_people:
        boxes, scores = boxes[:max_people], scores[:max_people]
        notices.append(
            f"Found {found} people, kept {max_people} (the highest scores); raise max_people to keep more."
        )
    return Detections(
        boxes.numpy().astype(np.float32), scores.numpy().astype(np.float32), "detector", found, notices
    )


# ----------------------------------------------------------------------------- detector


def _read_config(weights: Path) -> dict[str, Any]:
    """The transformers config.json beside the weights, when it describes a DETR (else {})."""
    path = weights.parent / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) and config.get("model_type") == "detr" else {}


def _config_person_label(config: dict[str, Any], path: Path) -> int:
    """Person's label id from config.json (1 without one); refuses variants the network lacks."""
    backbone = config.get("backbone_config") or {}
    unsupported = [
        what
        for what, present in (
            ("a dilated last stage (DC5)", bool(config.get("dilation"))),
            ("learned position embeddings", config.get("position_embedding_type", "sine") != "sine"),
            ("stride in the first 1x1 conv", bool(backbone.get("downsample_in_bottleneck"))),
        )
        if present
    ]
    if unsupported:
        raise CheckpointError(
            f"The detector config beside {path} asks for {', '.join(unsupported)}, which this DETR does "
            "not implement; use facebook/detr-resnet-50."
        )
    id2label = config.get("id2label")
    if not id2label:
        return PERSON_LABEL
    for key, name in id2label.items():
        if str(name).strip().lower() == "person":
            return int(key)
    raise CheckpointError(
        f"The detector config beside {path} has no 'person' class in id2label; use a COCO-trained DETR "
        "such as facebook/detr-resnet-50."
    )


class PersonDetector:
    """DETR person detector: ``PersonDetector.load()(image)`` -> :class:`Detections`.

    Returns only what the network found (possibly nothing); :func:`detect_people` adds the
    whole-image fallbacks.
    """

    def __init__(
        self,
        model: Detr,
        *,
        person_label: int = PERSON_LABEL,
        shortest_edge: int = SHORTEST_EDGE,
        longest_edge: int = LONGEST_EDGE,
        source_path: str | None = None,
        channels_last: bool = False,
    ) -> None:
        self.model = model.eval()
        self.channels_last = channels_last  # feed NHWC input to a model converted to channels_last
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.person_label = person_label
        self.shortest_edge, self.longest_edge = shortest_edge, longest_edge
        self.source_path = source_path

    @classmethod
    def load(
        cls,
        checkpoint: str | os.PathLike | None = None,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> PersonDetector:
        """Load DETR weights: ``checkpoint`` (file or folder) -> $SAPIENS2_CHECKPOINTS/detector/ -> Hub cache.

        Raises ``WeightsUnavailableError`` when no file can be found or downloaded and
        ``CheckpointError`` when the file is not a usable DETR checkpoint.
        """
        spec = zoo.DETECTOR
        path = find_weights(spec.repo_id, [spec.filename], spec.local_path, checkpoint, spec.revision)
        config = _read_config(path)
        model = build_detr(
            load_tensors(path),
            encoder_heads=int(config.get("encoder_attention_heads", DEFAULT_HEADS)),
            decoder_heads=int(config.get("decoder_attention_heads", DEFAULT_HEADS)),
        ).fuse_frozen_batchnorm()
        device = torch.device(device) if device else default_device()
        with cuda_emulation():  # ZeroGPU: from a request thread too, onto the emulated CUDA
            model = model.to(device=device, dtype=dtype or torch.float32)
        # NHWC convolutions are faster on CPU (bench/detector.py); the GPU layout is left as it is
        channels_last = device.type == "cpu"
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        person = _config_person_label(config, path)
        return cls(model, person_label=person, source_path=str(path), channels_last=channels_last)

    def input_for(self, image: np.ndarray) -> DetectorInput:
        """``image``'s input to this detector (its resize rule), made on the CPU."""
        return detector_input(image, self.shortest_edge, self.longest_edge)

    def raw(self, image: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """All person-class queries of ``image`` (boxes xyxy in pixels, scores), before any filtering."""
        return self.raw_input(self.input_for(image))

    @torch.inference_mode()
    def raw_input(self, inp: DetectorInput) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`raw` of an input made on a CPU (the same numbers as from the image itself)."""
        if tuple(inp.edges) != (self.shortest_edge, self.longest_edge):
            raise OptionError(
                f"The detector input was resized for edges {tuple(inp.edges)}; this detector takes "
                f"{(self.shortest_edge, self.longest_edge)}."
            )
        pixels = normalise(inp.network_pixels(), self.device, self.dtype)
        if self.channels_last:
            pixels = pixels.contiguous(memory_format=torch.channels_last)
        logits, boxes = self.model(pixels)
        return person_boxes(logits[0], boxes[0], inp.image_hw[0], inp.image_hw[1], self.person_label)

    def __call__(
        self,
        image: np.ndarray | DetectorInput,
        *,
        score_threshold: float = 0.3,
        iou_threshold: float = 0.3,
        max_people: int = 20,
    ) -> Detections:
        check_options(score_threshold, iou_threshold, max_people)
        inp = image if isinstance(image, DetectorInput) else self.input_for(image)
        boxes, scores = self.raw_input(inp)
        return _finalize(inp.image_hw, boxes, scores, score_threshold, iou_threshold, max_people)


# ----------------------------------------------------------------------------- public entry

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
    return _finalize(
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
        image = _check_image(image)
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
