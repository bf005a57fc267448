"""sapiens2.models.hub_cache: pruning a fake Hugging Face cache keeps the defaults and the most recently
used sizes, never touches other repos, skips broken entries; the Space card's preload list."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tiny_checkpoints import place_hf_cache

from sapiens2.models import hub_cache, weights
from sapiens2.models.zoo import TASKS


def _repo_dir(cache: Path, repo_id: str) -> Path:
    return cache / f"models--{repo_id.replace('/', '--')}"


def _place(weights_file: Path, cache: Path, task: str, size: str, used_at: float) -> Path:
    snap = place_hf_cache(weights_file, cache, task, size)
    os.utime(snap, (used_at, used_at))  # the blob's access and modification times
    return snap


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    """Defaults at 1b (+ pretrain 0.1b), 5b used long ago, 0.8b a while ago, 0.4b last, plus a
    repo of another project; every file a few bytes."""
    root = tmp_path / "hub"
    blob = tmp_path / "w.safetensors"
    blob.write_bytes(b"x" * 1000)
    for task, spec in TASKS.items():
        if spec.on_hub:  # a task with local weights only (albedo) has no Hub repo to cache
            _place(blob, root, task, spec.default_size_gpu, used_at=1_000)
    for task, size, when in [
        ("pose", "5b", 2_000),
        ("seg", "5b", 2_100),
        ("pointmap", "0.8b", 3_000),
        ("pose", "0.4b", 4_000),
        ("normal", "0.4b", 3_500),
        ("features", "1b-4k", 2_500),
    ]:
        _place(tmp_path / "w.safetensors", root, task, size, used_at=when)
    other = _repo_dir(root, "someone/sapiens2-pose-5b-finetune") / "snapshots" / "abc"
    other.mkdir(parents=True)
    (other / "model.safetensors").write_bytes(b"y")
    return root


def _repos(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if p.name.startswith("models--")}


def test_prune_keeps_defaults_and_the_most_recent_size(cache: Path) -> None:
    before = _repos(cache)
    report = hub_cache.prune(1, cache_dir=cache)
    assert report.kept_sizes == ("0.4b",) and not report.dry_run
    assert report.deleted == (
        "facebook/sapiens2-pointmap-0.8b",
        "facebook/sapiens2-pose-5b",
        "facebook/sapiens2-pretrain-1b-4k",
        "facebook/sapiens2-seg-5b",
    )
    assert report.freed_bytes == 4 * 1000
    after = _repos(cache)
    assert before - after == {"models--" + r.replace("/", "--") for r in report.deleted}
    for spec in (s for s in TASKS.values() if s.on_hub):  # the defaults stay
        assert _repo_dir(cache, spec.repo_id(spec.default_size_gpu)).is_dir()
    assert _repo_dir(cache, "someone/sapiens2-pose-5b-finetune").is_dir()  # not ours: untouched


def test_prune_dry_run_and_more_sizes(cache: Path) -> None:
    report = hub_cache.prune(2, cache_dir=cache, dry_run=True)
    assert report.kept_sizes == ("0.4b", "0.8b") and report.dry_run
    assert report.deleted == (
        "facebook/sapiens2-pose-5b",
        "facebook/sapiens2-pretrain-1b-4k",
        "facebook/sapiens2-seg-5b",
    )
    assert _repo_dir(cache, "facebook/sapiens2-pose-5b").is_dir()  # nothing deleted
    assert hub_cache.prune(0, keep=[], cache_dir=cache, dry_run=True).kept_sizes == ()
    with pytest.raises(ValueError, match="keep_sizes must be >= 0"):
        hub_cache.prune(-1, cache_dir=cache)


def test_prune_skips_entries_zerogpu_emptied(cache: Path) -> None:
    """After packing, ZeroGPU deletes the blobs it had memory-mapped; the scan reports such repos
    as broken and pruning leaves them alone instead of failing."""
    repo = _repo_dir(cache, "facebook/sapiens2-seg-5b")
    for blob in (repo / "blobs").iterdir():
        blob.unlink()
    report = hub_cache.prune(1, cache_dir=cache)
    assert "facebook/sapiens2-seg-5b" not in report.deleted and repo.is_dir()
    assert "facebook/sapiens2-pose-5b" in report.deleted


def test_enable_pruning_runs_after_a_download(cache: Path, tiny_checkpoints, monkeypatch) -> None:
    import huggingface_hub
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(weights, "_DOWNLOAD_LISTENERS", [])
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("SAPIENS2_CHECKPOINTS", raising=False)
    hub_cache.enable_pruning(1)
    hub_cache.enable_pruning(1)  # once only
    assert len(weights._DOWNLOAD_LISTENERS) == 1

    def download(repo_id, filename, **kwargs):  # a fresh 5b seg download lands in the cache
        return str(place_hf_cache(tiny_checkpoints["seg"], cache, "seg", "5b", filename))

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: None)
    path = weights.find_weights("facebook/sapiens2-seg-5b", ["sapiens2_5b_seg.safetensors"], "seg/x")
    assert path.is_file()
    remaining = _repos(cache)
    assert "models--facebook--sapiens2-seg-5b" in remaining  # just used: its size is the newest
    assert "models--facebook--sapiens2-pose-5b" in remaining  # same size, kept with it
    assert "models--facebook--sapiens2-pose-0.4b" not in remaining
    assert "models--facebook--sapiens2-pointmap-0.8b" not in remaining


def test_preload_list_and_repo_sizes() -> None:
    lines = hub_cache.preload_from_hub()
    assert lines == [
        "facebook/sapiens2-pose-1b sapiens2_1b_pose.safetensors",
        "facebook/sapiens2-seg-1b sapiens2_1b_seg.safetensors",
        "facebook/sapiens2-normal-1b sapiens2_1b_normal.safetensors",
        "facebook/sapiens2-pointmap-1b sapiens2_1b_pointmap.safetensors",
        "facebook/sapiens2-matting-1b sapiens2_1b_matting.safetensors",
        "facebook/sapiens2-pretrain-0.1b sapiens2_0.1b_pretrain.safetensors",
        "facebook/detr-resnet-50 model.safetensors,config.json",
    ]
    assert {line.split()[0] for line in lines} == hub_cache.default_repos()
    assert hub_cache.size_of("facebook/sapiens2-pretrain-1b-4k") == "1b-4k"
    assert hub_cache.size_of("facebook/sapiens2-pose-0.1b") is None  # no such checkpoint
    assert hub_cache.size_of("facebook/detr-resnet-50") is None
    assert hub_cache.size_of("someone/sapiens2-pose-1b") is None
