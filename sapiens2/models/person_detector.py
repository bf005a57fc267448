"""The DETR person detector: weights to :class:`Detections` (boxes found by the network, NMS'd).

Checkpoint: ``facebook/detr-resnet-50`` (Apache-2.0), ``model.safetensors`` of the **main**
revision, the file huggingface_hub fetches by default. Its backbone uses timm/torchvision ResNet
names; the ``no_timm`` revision's names load as well (see ``sapiens2.models.nn.detr``). Local
copy: ``$SAPIENS2_CHECKPOINTS/detector/detr-resnet-50.safetensors``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from ..errors import CheckpointError, OptionError
from ..runtime.devices import default_device
from ..zerogpu.entry import cuda_emulation
from . import zoo
from .boxes import nms, xyxy_from_centres
from .detr_input import LONGEST_EDGE, SHORTEST_EDGE, DetectorInput, detector_input, normalise
from .nn.detr import DEFAULT_HEADS, Detr, build_detr
from .weights import find_weights, load_tensors

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


def check_options(score_threshold: float, iou_threshold: float = 0.3, max_people: int = 20) -> None:
    """The detection options checked (OptionError naming the allowed values)."""
    for name, value in (("score_threshold", score_threshold), ("iou_threshold", iou_threshold)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
            raise OptionError(f"{name} must be a number in [0, 1]; got {value!r}.")
    if isinstance(max_people, bool) or not isinstance(max_people, (int, np.integer)) or max_people < 1:
        raise OptionError(f"max_people must be a whole number >= 1; got {max_people!r}.")


def finalize_detections(
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
        return finalize_detections(inp.image_hw, boxes, scores, score_threshold, iou_threshold, max_people)
