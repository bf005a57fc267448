"""Keep the Hugging Face cache from filling a Space's disk.

All Sapiens2 sizes together are about 84 GB in bf16, and every size a visitor picks is downloaded
into the cache. :func:`prune` keeps the default checkpoints (the ones the Space card preloads)
and the checkpoints of the most recently used other sizes, and deletes the other Sapiens2
checkpoints through ``huggingface_hub``'s cache API. Repos that are not Sapiens2 checkpoints are
never touched. :func:`enable_pruning` runs it after every download (for a Space; a local user's
cache is left alone unless they ask).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .zoo import DETECTOR, TASKS, is_v1

log = logging.getLogger(__name__)

_REPO = re.compile(r"^facebook/sapiens2-(?P<task>[a-z]+)-(?P<size>\d.*)$")


def default_repos() -> frozenset[str]:
    """Repo ids of the checkpoints the app loads by default on a GPU, plus the person detector."""
    repos = {
        spec.repo_id(spec.default_size_gpu)
        for spec in TASKS.values()
        if spec.on_hub and not is_v1(spec.default_size_gpu)  # the preload's (v1 repos are never pruned)
    }
    return frozenset(repos | {DETECTOR.repo_id})


def preload_from_hub() -> list[str]:
    """The Space card's ``preload_from_hub`` entries ("repo file") for the default checkpoints."""
    lines = [
        f"{spec.repo_id(spec.default_size_gpu)} {spec.filename(spec.default_size_gpu)}"
        for spec in TASKS.values()
        # a task with local weights only (albedo) or a Sapiens v1 default (depth: downloaded on
        # first use) adds nothing to the Space's preload
        if spec.on_hub and not is_v1(spec.default_size_gpu)
    ]
    return [*lines, f"{DETECTOR.repo_id} {DETECTOR.filename},config.json"]  # the detector reads its config


def size_of(repo_id: str) -> str | None:
    """The zoo size of a Sapiens2 checkpoint repo ("facebook/sapiens2-pose-1b" -> "1b"), else None."""
    match = _REPO.match(repo_id)
    spec = next((t for t in TASKS.values() if match is not None and t.release == match["task"]), None)
    return match["size"] if spec is not None and match["size"] in spec.sizes else None


@dataclass(frozen=True)
class PruneReport:
    """What :func:`prune` kept and deleted."""

    kept_sizes: tuple[str, ...]  # the most recently used sizes, newest first
    deleted: tuple[str, ...]  # repo ids
    freed_bytes: int
    dry_run: bool


def prune(
    keep_sizes: int = 1,
    *,
    keep: Iterable[str] | None = None,
    cache_dir: str | os.PathLike | None = None,
    dry_run: bool = False,
) -> PruneReport:
    """Delete cached Sapiens2 checkpoints except ``keep`` (default: :func:`default_repos`) and those
    of the ``keep_sizes`` most recently used sizes. Recency is the cache's "last accessed" time,
    which ``sapiens2.models.weights`` sets whenever it resolves a file. Broken cache entries (for example
    blobs ZeroGPU removed after packing them) are skipped by the scan and left alone."""
    from huggingface_hub import scan_cache_dir

    if keep_sizes < 0:
        raise ValueError(f"keep_sizes must be >= 0; got {keep_sizes}.")
    kept = default_repos() if keep is None else frozenset(keep)
    info = scan_cache_dir(cache_dir)
    candidates = [
        r for r in info.repos if r.repo_type == "model" and r.repo_id not in kept and size_of(r.repo_id)
    ]
    last_use: dict[str, float] = {}
    for repo in candidates:
        size = str(size_of(repo.repo_id))
        last_use[size] = max(last_use.get(size, 0.0), repo.last_accessed, repo.last_modified)
    recent = tuple(sorted(last_use, key=last_use.__getitem__, reverse=True)[:keep_sizes])
    doomed = [r for r in candidates if size_of(r.repo_id) not in recent]
    hashes = [rev.commit_hash for repo in doomed for rev in repo.revisions]
    freed = 0
    if hashes:
        strategy = info.delete_revisions(*hashes)
        freed = strategy.expected_freed_size
        if not dry_run:
            strategy.execute()
            log.info("hub cache: deleted %s (%.1f GB)", [r.repo_id for r in doomed], freed / 1e9)
    return PruneReport(recent, tuple(sorted(r.repo_id for r in doomed)), freed, dry_run)


def enable_pruning(keep_sizes: int = 1, *, keep: Iterable[str] | None = None) -> None:
    """Prune the default Hub cache after every weight download from now on (call once at start-up
    on a Space). Failures are logged by ``sapiens2.models.weights``, never raised to the request."""
    from . import weights

    kept = None if keep is None else frozenset(keep)
    listener = _Pruner(keep_sizes, kept)
    weights.on_download(listener)


@dataclass(frozen=True)
class _Pruner:
    """A download listener (equal pruners count once in ``weights.on_download``)."""

    keep_sizes: int
    keep: frozenset[str] | None

    def __call__(self, path: Path) -> None:
        report = prune(self.keep_sizes, keep=self.keep, cache_dir=_cache_dir_of(path))
        if report.deleted:
            log.info("after downloading %s: %s", path.name, report)


def _cache_dir_of(path: Path) -> Path | None:
    """The cache folder holding ``path`` (``.../models--org--name/snapshots/rev/file``), if any."""
    for parent in Path(path).parents:
        if parent.name.startswith("models--"):
            return parent.parent
    return None
