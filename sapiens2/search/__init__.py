"""Find people in a collection by appearance or by pose (``sapiens2 index``, ``sapiens2 search``).

:mod:`.vectors` (numpy: the pose vector, normalising, exact top-k, k-means), :mod:`.people_store`
(INDEX's LanceDB tables), :mod:`.indexing` (a collection through ``sapiens2 batch`` into them)
and :mod:`.query` (a photo's nearest people). LanceDB is the optional extra ``search``; the
Space's "Find similar" needs only :mod:`.vectors`. docs/SEARCH.md tells the whole story.
"""

from __future__ import annotations

from .indexing import IndexSummary, build_index, parse_kinds
from .query import Hit, find_similar
from .vectors import kmeans, mirrored, normalised, pose_vector, top_k

__all__ = [
    "Hit",
    "IndexSummary",
    "build_index",
    "find_similar",
    "kmeans",
    "mirrored",
    "normalised",
    "parse_kinds",
    "pose_vector",
    "top_k",
]
