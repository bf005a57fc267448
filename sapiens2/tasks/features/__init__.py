"""Backbone features: the CLS embedding, patch features in PCA colours, cosine similarity.

The task's declaration is ``TASK``; ``sapiens2.tasks.registry`` finds it by listing the task
folders of ``sapiens2.tasks``."""

from __future__ import annotations

from .features_pipeline import (
    TASK,
    FeaturesPipeline,
    FeaturesPrep,
    FeaturesRaw,
    FeaturesResult,
    cosine_similarity,
)

__all__ = ["FeaturesPipeline", "FeaturesPrep", "FeaturesRaw", "FeaturesResult", "TASK", "cosine_similarity"]
