"""Backbone features (pretrain checkpoints): the CLS embedding of a photo and its patch features,
shown as the first three principal components in RGB, plus cosine similarity of two embeddings.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import OptionError
from ..imaging import stretch_to
from ..zoo import get_task
from .base import Pipeline, TaskResult
from .registry import Compare, Task, View, forward_seconds


@dataclass(kw_only=True)
class FeaturesResult(TaskResult):
    """CLS embedding and the patch-feature grid (one vector per 16x16 patch of the network input)."""

    embedding: np.ndarray  # (D,) float32, CLS token after the final norm
    patch_features: np.ndarray  # (D, h, w) float32, h, w = network input / 16

    def render(self) -> np.ndarray:
        """The patch features' first three principal components as RGB, at the original size."""
        from ..render import pca_rgb

        return pca_rgb(self.patch_features, self.image.shape[:2])

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out.update(dim=int(self.embedding.shape[0]), grid=list(self.patch_features.shape[1:]))
        return out

    def save(self, out_dir: str | Path, *, rendered: np.ndarray | None = None) -> list[Path]:
        """Writes ``<name>_embedding.npy`` (D,) and ``<name>_features_pca.png``; returns their paths.
        ``rendered``: an image already rendered (e.g. with the viewer's options) to write as the PNG
        instead of a fresh default ``render()``."""
        from ..export import safe_path, write_npy, write_png

        paths = [
            write_npy(safe_path(out_dir, self.name, "_embedding.npy"), self.embedding),
            write_png(
                safe_path(out_dir, self.name, "_features_pca.png"),
                self.render() if rendered is None else rendered,
            ),
        ]
        return [Path(p) for p in paths]


class FeaturesPipeline(Pipeline):
    """Backbone features: ``FeaturesPipeline()(photo)`` (default size 0.1b) -> :class:`FeaturesResult`."""

    task = "pretrain"

    def __call__(self, image: Any) -> FeaturesResult:
        t0, intake, info, notices = self._begin(image)
        x = stretch_to(intake.work, self.network_hw, self.device, self.dtype)
        out = self.timed_forward(info, x)
        emb = out.cls_embedding[0].float()
        patches = out.patch_features[0].float()
        if not (bool(torch.isfinite(emb).all()) and bool(torch.isfinite(patches).all())):
            notices.append("The backbone returned non-finite values; similarity may be meaningless.")
        info.total_s = time.perf_counter() - t0
        return FeaturesResult(
            image=intake.rgb,
            info=info,
            notices=notices,
            downscaled=intake.downscaled,
            name=intake.name,
            embedding=emb.cpu().numpy(),
            patch_features=patches.contiguous().cpu().numpy(),
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


def _gpu_seconds(size: str, pixels: int, infer_opts: Mapping[str, Any]) -> float:
    return forward_seconds(size)


TASK = Task(
    spec=get_task("pretrain"),
    pipeline=FeaturesPipeline,
    api_name="features",
    tab="Features",
    button="Run features",
    summary="Features: the backbone's image embedding and a PCA view of its patch features.",
    result_label="Features (PCA)",
    downloads="Downloads (embedding NPY, PCA PNG)",
    gpu_seconds=_gpu_seconds,
    views=(View("json", "Summary", lambda result, files: result.summary()),),
    compare=Compare(
        "similarity",
        "Cosine similarity of the embeddings",
        "Similarity of two photos: cosine of their backbone embeddings (-1 to 1).",
        cosine_similarity,
    ),
)
