"""Backbone features (the release's "pretrain" checkpoints): the CLS embedding of a photo and its
patch features, shown as the first three principal components in RGB, plus cosine similarity of two
embeddings. With ``per_person`` the person detector runs too, and each person found gets an
appearance vector from the same forward: the patch features pooled over their box
(:mod:`.features_people`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from ...errors import OptionError
from ...inputs.intake import Intake
from ...models.cost import Work
from ...models.zoo import get_task
from ...outputs.writers import NOW, Writer
from ..base import Pipeline, RunInfo, TaskResult
from ..dense import Timing, chunked_forward
from ..options import Option
from ..registry import Compare, Task, View
from ..result_record import Column, Record
from .features_people import pooled_embeddings


@dataclass(kw_only=True)
class FeaturesResult(TaskResult):
    """CLS embedding and the patch-feature grid (one vector per 16x16 patch of the network input)."""

    embedding: np.ndarray  # (D,) float32, CLS token after the final norm
    patch_features: np.ndarray  # (D, h, w) float32, h, w = network input / 16
    #: with ``per_person``: the people found, (P, 4) x1 y1 x2 y2 in photo pixels, and their unit
    #: appearance vectors (P, D) (patch features pooled over each box); P = 0 when the detector
    #: found nobody (the photo's CLS is then its only appearance). None: not asked for.
    person_boxes: np.ndarray | None = None
    person_embeddings: np.ndarray | None = None

    def render(self) -> np.ndarray:
        """The patch features' first three principal components as RGB, at the original size."""
        from .features_render import pca_rgb

        return pca_rgb(self.patch_features, self.image.shape[:2])

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out.update(dim=int(self.embedding.shape[0]), grid=list(self.patch_features.shape[1:]))
        if self.person_boxes is not None:
            out.update(people=len(self.person_boxes), person_boxes=np.round(self.person_boxes, 1).tolist())
        return out

    def save(
        self, out_dir: str | Path, *, rendered: np.ndarray | None = None, writer: Writer = NOW
    ) -> list[Path]:
        """Writes ``<name>_embedding.npy`` (D,) and ``<name>_features_pca.png`` (with ``per_person``
        also ``_person_boxes.npy`` (P, 4) and ``_person_embeddings.npy`` (P, D)); returns their
        paths. ``rendered``: an image already rendered (e.g. with the viewer's options) to write as
        the PNG instead of a fresh default ``render()``."""
        from ...outputs.export import safe_path, write_npy, write_png

        picture = self.render() if rendered is None else rendered
        paths = [
            write_npy(safe_path(out_dir, self.name, "_embedding.npy"), self.embedding, writer=writer),
            write_png(safe_path(out_dir, self.name, "_features_pca.png"), picture, writer=writer),
        ]
        if self.person_boxes is not None and self.person_embeddings is not None:
            for suffix, values in (
                ("_person_boxes.npy", self.person_boxes),
                ("_person_embeddings.npy", self.person_embeddings),
            ):
                paths.append(write_npy(safe_path(out_dir, self.name, suffix), values, writer=writer))
        return paths


@dataclass
class FeaturesPrep:
    """One photo resized to the network input on the CPU, still uint8 (small to send)."""

    pixels: np.ndarray  # (H, W, 3) uint8
    people: Any = None  # per_person: the detector's input (the working copy for a callable detector)


@dataclass
class FeaturesRaw:
    """One photo's device result at network resolution, in the model's dtype (bf16 is kept as
    bf16: half the bytes of float32 and exactly the values the network produced)."""

    embedding: torch.Tensor  # (D,)
    patch_features: torch.Tensor  # (D, h, w), h, w = network input / 16
    info: RunInfo
    boxes: np.ndarray | None = None  # per_person: the people found, in working-copy pixels
    notices: list[str] = field(default_factory=list)  # the detector's


class FeaturesPipeline(Pipeline):
    """Backbone features: ``FeaturesPipeline()(photo)`` (default size 0.1b) -> :class:`FeaturesResult`.

    Stages: :meth:`prepare` resizes to the network input on the CPU (``cv2.INTER_LINEAR`` on
    uint8, as the release's feature-extraction demo), :meth:`infer` normalises on the device and
    runs one forward for the batch's photos (several when the device's memory holds fewer), :meth:`finish` converts to float32 and checks
    the values.
    """

    task = "features"
    #: ``detector``: how people are found with ``per_person`` (as pose's: "auto", a DETR
    #: checkpoint, a PersonDetector, a callable, or None for the whole photo)
    parts = {"detector": "auto"}

    def attach(self, detector: Any = "auto") -> None:
        self.detector = detector

    def __call__(self, image: Any, *, per_person: bool = False) -> FeaturesResult:
        return self.run_stages(image, per_person=per_person)

    def prepare(self, intake: Intake, *, per_person: bool = False, **_: Any) -> FeaturesPrep:
        h, w = self.network_hw
        work = intake.work
        pixels = (
            work if work.shape[:2] == (h, w) else cv2.resize(work, (w, h), interpolation=cv2.INTER_LINEAR)
        )
        return FeaturesPrep(pixels, self._people_input(work) if per_person else None)

    def _people_input(self, work: np.ndarray) -> Any:
        """What the detector needs in :meth:`infer`: a DETR's small input made here on the CPU
        (not the photo), or the working copy for a callable detector or none."""
        from ...models.detector import people_input

        found = people_input(self.detector, work)
        return work if found is None else found

    def infer(self, batch: list[FeaturesPrep], *, per_person: bool = False, **_: Any) -> list[FeaturesRaw]:
        timings = [Timing() for _ in batch]
        raws: list[FeaturesRaw] = []
        for a, out in chunked_forward(self, [p.pixels for p in batch], timings):  # a bounded forward
            emb, patches = out.cls_embedding.cpu(), out.patch_features.cpu()
            for i in range(len(emb)):
                info = self.run_info()  # this photo's share of its chunk's forward
                info.model_s, info.forward_started = timings[a + i].model_s, timings[a + i].forward_started
                raws.append(FeaturesRaw(emb[i].clone(), patches[i].clone(), info))
        if per_person:
            from ...models.detector import detect_people

            for raw, prep in zip(raws, batch, strict=True):
                found = detect_people(prep.people, detector=self.detector, device=self.device)
                # the whole-photo fallback (nobody found, no detector): no person, the CLS stands
                none = found.source == "whole_image"
                raw.boxes = np.zeros((0, 4), np.float32) if none else np.asarray(found.boxes, np.float32)
                raw.notices = list(found.notices) + (
                    ["No person found: the photo's CLS embedding stands for it."] if none else []
                )
        return raws

    def finish(self, raw: FeaturesRaw, intake: Intake, **_: Any) -> FeaturesResult:
        emb, patches = raw.embedding.float(), raw.patch_features.float()
        notices = [*intake.notices, *self.small_photo_notices(intake), *raw.notices]
        if not (bool(torch.isfinite(emb).all()) and bool(torch.isfinite(patches).all())):
            notices.append("The backbone returned non-finite values; similarity may be meaningless.")
        patch_np = patches.contiguous().numpy()
        boxes = vectors = None
        if raw.boxes is not None:  # pooled in the working copy's pixels, which the grid covers
            vectors = pooled_embeddings(patch_np, raw.boxes, tuple(intake.work.shape[:2]))
            boxes = intake.boxes_to_original(raw.boxes).reshape(-1, 4)
        return FeaturesResult(
            image=intake.rgb,
            info=replace(raw.info),
            notices=notices,
            downscaled=intake.downscaled,
            name=intake.name,
            embedding=emb.numpy(),
            patch_features=patch_np,
            person_boxes=boxes,
            person_embeddings=vectors,
        )


def _vector(x: FeaturesResult | np.ndarray | torch.Tensor, which: str) -> np.ndarray:
    if isinstance(x, FeaturesResult):
        x = x.embedding
    if isinstance(x, torch.Tensor):
        x = x.detach().float().cpu().numpy()
    v = np.asarray(x, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise OptionError(f"{which} must be a FeaturesResult or a 1-D embedding; got shape {v.shape}.")
    if not np.isfinite(v).all():
        raise OptionError(f"{which} contains NaN or infinite values; cosine similarity is undefined.")
    return v


def cosine_similarity(
    a: FeaturesResult | np.ndarray | torch.Tensor, b: FeaturesResult | np.ndarray | torch.Tensor
) -> float:
    """Cosine similarity in [-1, 1] of two CLS embeddings (results or 1-D arrays of equal length)."""
    va, vb = _vector(a, "The first embedding"), _vector(b, "The second embedding")
    if va.shape != vb.shape:
        raise OptionError(
            f"Embeddings differ in length ({va.size} vs {vb.size}); compare results of the same model size."
        )
    na, nb = np.linalg.norm(va), np.linalg.norm(vb)
    if na == 0 or nb == 0:
        raise OptionError("An embedding is all zeros; cosine similarity is undefined.")
    return float(np.clip(va @ vb / (na * nb), -1.0, 1.0))


# ----------------------------------------------------------------------------- declaration


def _row(result: FeaturesResult) -> dict[str, Any]:
    vectors = result.person_embeddings
    return {
        "embedding": np.asarray(result.embedding, np.float32),
        "person_boxes": result.person_boxes,
        "person_embeddings": None if vectors is None else np.asarray(vectors, np.float32).reshape(-1),
    }


#: A batch row: the backbone's CLS embedding; with per_person, the people's boxes and vectors.
RECORD = Record(
    (
        Column("embedding", "tensor", "the CLS vector"),
        Column("person_boxes", "tensor", "per_person: people x (x1, y1, x2, y2), photo pixels", (4,)),
        # flat: the width is the CLS vector's, which differs between model sizes
        Column("person_embeddings", "tensor", "per_person: people x D unit vectors, flat (D: the CLS width)"),
    ),
    _row,
)


def _work(infer_opts: Mapping[str, Any]) -> Work:
    """One forward; with ``per_person`` the person detector first (pooling costs no forward)."""
    return Work(detector=bool(infer_opts.get("per_person")))


OPTIONS = (
    Option("per_person", "bool", False, "infer", "One vector per person (runs the person detector)",
           "also find the people and give each an appearance vector: the patch features pooled over "
           "their box, from the same forward"),
)  # fmt: skip


TASK = Task(
    spec=get_task("features"),
    pipeline=FeaturesPipeline,
    tab="Features",
    button="Run features",
    summary="Features: the backbone's image embedding and a PCA view of its patch features.",
    result_label="Features (PCA)",
    downloads="Downloads (embedding NPY, PCA PNG)",
    work=_work,
    options=OPTIONS,
    views=(View("json", "Summary", lambda result, files: result.summary()),),
    compare=Compare(
        "similarity",
        "Cosine similarity of the embeddings",
        "Similarity of two photos: cosine of their backbone embeddings (-1 to 1).",
        cosine_similarity,
        browser_output="cls",
    ),
    record=RECORD,
)
