"""Bounded forwards: every task's ``infer`` runs in chunks of ``forward_chunk()`` inputs, sized
from the model's widths and the device's free memory, with the unchunked forward's results."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_checkpoints import zoo_shapes

from sapiens2.inputs.intake import load_image
from sapiens2.models import forward_memory as fm
from sapiens2.models.nn.model import arch_from_shapes
from sapiens2.models.nn.outputs import PoseOutput
from sapiens2.tasks.base import run_batch
from sapiens2.tasks.features import FeaturesPipeline
from sapiens2.tasks.normal import NormalPipeline
from sapiens2.tasks.pose import PosePipeline
from sapiens2.tasks.seg import SegPipeline

SMALL = (256, 192)
PEOPLE = np.array([[5.0, 10.0, 95.0, 230.0], [110.0, 20.0, 200.0, 235.0], [220.0, 40.0, 315.0, 225.0]])


def photos(n: int, h: int = 240, w: int = 320) -> list:
    rng = np.random.default_rng(7)
    return [load_image((rng.random((h, w, 3)) * 255).astype(np.uint8)) for _ in range(n)]


def forward_sizes(pipe) -> list[int]:
    sizes: list[int] = []
    pipe.model.register_forward_hook(lambda _m, args, _out: sizes.append(int(args[0].shape[0])))
    return sizes


def run_with(pipe, items: int | None, intakes: list, **options):
    pipe.forward_items = items
    return run_batch(pipe, intakes, options)


class OneByOne(torch.nn.Module):
    """The pose model run one input at a time: its outputs do not depend on the batch, so the
    chunked pipeline must give exactly the unchunked one's keypoints."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.arch = inner, inner.arch

    def forward(self, x: torch.Tensor) -> PoseOutput:
        return PoseOutput(torch.cat([self.inner(x[i : i + 1]).heatmaps for i in range(len(x))]))


@pytest.mark.slow
@pytest.mark.parametrize("flip_test", [False, True])
def test_crowded_pose_batch_in_chunks_equals_one_forward(
    tiny_checkpoints: dict[str, Path], flip_test
) -> None:
    # the last photo's people are the caller's, cropped in prepare: both crop paths are sliced
    pipe = PosePipeline(checkpoint=tiny_checkpoints["pose"], device="cpu", detector=lambda im: PEOPLE)
    pipe.input_hw = SMALL
    heatmaps: list = []
    pipe.model.register_forward_hook(lambda _m, _args, out: heatmaps.append(out.heatmaps) and None)
    pipe.model = OneByOne(pipe.model)
    sizes = forward_sizes(pipe)
    intakes = photos(3)
    per_item = [{}, {}, {"boxes": PEOPLE[:2]}]

    def run(items: int | None) -> list:
        pipe.forward_items = items
        return run_batch(pipe, intakes, {"flip_test": flip_test}, per_item=per_item)

    whole = run(64)
    assert sizes == [8 * (2 if flip_test else 1)]  # 3 + 3 + 2 people in one forward
    sizes.clear()
    parts = run(6 if flip_test else 3)  # 3 people a forward: the chunks straddle the photos
    assert sizes == ([6, 6, 4] if flip_test else [3, 3, 2])
    assert len(heatmaps) == 2 * 8 * (2 if flip_test else 1)  # every crop (and mirror) once a run
    for a, b in zip(whole, parts, strict=True):
        assert len(a.keypoints) == (2 if a is whole[-1] else 3)
        np.testing.assert_array_equal(b.keypoints, a.keypoints)
        np.testing.assert_array_equal(b.scores, a.scores)
        np.testing.assert_array_equal(b.boxes, a.boxes)
        assert b.flip_test is flip_test and b.info.model_s > 0


def test_pose_chunks_heatmaps_equal_one_forward_s(tiny_checkpoints: dict[str, Path]) -> None:
    # the real model batched: a forward's sums depend on its batch size only in the last bits
    pipe = PosePipeline(checkpoint=tiny_checkpoints["pose"], device="cpu", detector=lambda im: PEOPLE)
    pipe.input_hw = SMALL
    maps: list = []
    pipe.model.register_forward_hook(lambda _m, _args, out: maps.append(out.heatmaps) and None)
    for items in (64, 4):
        run_with(pipe, items, photos(2), flip_test=True)
    one, chunks = maps[0], maps[1:]
    assert [len(m) for m in chunks] == [4, 4, 4]  # 6 people, 2 a forward with their mirrors
    plain = torch.cat([m[: len(m) // 2] for m in chunks])
    mirrored = torch.cat([m[len(m) // 2 :] for m in chunks])
    torch.testing.assert_close(torch.cat([plain, mirrored]), one, atol=1e-5, rtol=1e-5)


def test_pose_with_nobody_runs_no_forward(tiny_checkpoints: dict[str, Path], monkeypatch) -> None:
    from sapiens2.models.detector import Detections

    pipe = PosePipeline(checkpoint=tiny_checkpoints["pose"], device="cpu")
    pipe.input_hw = SMALL
    nobody = Detections(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), "detector", 0)
    monkeypatch.setattr(pipe, "_people", lambda prep, threshold, most: nobody)
    sizes = forward_sizes(pipe)
    results = run_with(pipe, 2, photos(2))
    assert sizes == [] and [r.keypoints.shape for r in results] == [(0, 308, 2)] * 2
    assert [r.scores.shape for r in results] == [(0, 308)] * 2


@pytest.mark.slow
@pytest.mark.parametrize("cls", [SegPipeline, NormalPipeline, FeaturesPipeline])
def test_dense_and_features_chunks_equal_one_forward(tiny_checkpoints: dict[str, Path], cls) -> None:
    pipe = cls(checkpoint=tiny_checkpoints[cls.task], device="cpu")
    pipe.input_hw = SMALL
    sizes = forward_sizes(pipe)
    intakes = photos(5, 90, 70)
    whole = run_with(pipe, 64, intakes)
    parts = run_with(pipe, 2, intakes)
    assert sizes == [5, 2, 2, 1]
    for a, b in zip(whole, parts, strict=True):
        if cls is SegPipeline:
            np.testing.assert_array_equal(b.labels, a.labels)
        elif cls is NormalPipeline:
            np.testing.assert_allclose(b.normals, a.normals, atol=1e-4)  # float rounding
        else:
            np.testing.assert_allclose(b.embedding, a.embedding, atol=1e-4)
            np.testing.assert_allclose(b.patch_features, a.patch_features, atol=1e-4)
        assert b.info.model_s > 0


def test_env_var_sets_the_count_and_a_bad_value_is_ignored(monkeypatch, tiny_checkpoints) -> None:
    pipe = SegPipeline(checkpoint=tiny_checkpoints["seg"], device="cpu")
    monkeypatch.setattr(fm, "device_budget", lambda device: 10**15)
    assert pipe.forward_chunk() == fm.MAX_ITEMS  # a tiny model: the cap
    monkeypatch.setenv(fm.FORWARD_ITEMS_ENV, "3")
    assert pipe.forward_chunk() == 3
    pipe.forward_items = 5  # the pipeline's own setting first
    assert pipe.forward_chunk() == 5
    pipe.forward_items = None
    for bad in ("0", "-2", "two", ""):
        monkeypatch.setenv(fm.FORWARD_ITEMS_ENV, bad)
        assert pipe.forward_chunk() == fm.MAX_ITEMS


class Widths(torch.nn.Module):
    """A model known only by its widths (what the estimate reads)."""

    def __init__(self, task: str, size: str) -> None:
        super().__init__()
        self.arch = arch_from_shapes(zoo_shapes(task, size))


def test_the_issue_s_crowded_batch_never_needs_more_than_one_chunk(monkeypatch) -> None:
    # 8 frames x 20 people, flip test: 320 crops of the 1b pose model at 1024x768 in bf16
    model = Widths("pose", "1b")
    per = fm.item_bytes(model, (1024, 768), torch.bfloat16)
    heatmaps = 308 * 256 * 192 * 4  # one crop's float32 heatmaps (320 of them: ~19 GB)
    assert fm.OUTPUT_COPIES * heatmaps < per < 4 * 1024**3
    free = 24 * 1024**3
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 * 1024**3))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 2 * 1024**3)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 1024**3)
    cuda = torch.device("cuda", 0)
    assert fm.device_budget(cuda) == int(fm.DEVICE_SHARE * (free + 1024**3))
    n = fm.items_per_forward(model, (1024, 768), cuda, torch.bfloat16)
    assert 1 <= n < 320 and n * per <= fm.device_budget(cuda)
    # a larger model or a float32 one gets fewer inputs a forward; a nearly full device one
    assert fm.items_per_forward(model, (1024, 768), cuda, torch.float32) <= n
    assert fm.items_per_forward(Widths("pointmap", "5b"), (1024, 768), cuda, torch.bfloat16) < n
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (0, 80 * 1024**3))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
    assert fm.items_per_forward(model, (1024, 768), cuda, torch.bfloat16) == 1


def test_estimates_grow_with_the_model_and_the_input() -> None:
    small, big = Widths("seg", "0.4b"), Widths("seg", "5b")
    e = fm.item_bytes
    assert e(small, (1024, 768), torch.bfloat16) < e(big, (1024, 768), torch.bfloat16)
    assert e(small, (512, 384), torch.float32) < e(small, (1024, 768), torch.float32)
    seg_out = 29 * 1024 * 768 * 4  # seg's float32 logits at the input size
    assert e(small, (1024, 768), torch.bfloat16) > fm.OUTPUT_COPIES * seg_out
    backbone = Widths("features", "0.4b")
    assert e(backbone, (1024, 768), torch.bfloat16) < e(small, (1024, 768), torch.bfloat16)

    class Sized(torch.nn.Module):  # a custom module: the zoo's row for its size, else a default
        def __init__(self, size: str | None) -> None:
            super().__init__()
            self.size = size

    assert e(Sized("1b"), (1024, 768), torch.float32) > e(Sized("0.4b"), (1024, 768), torch.float32)
    assert e(Sized(None), (1024, 768), torch.float32) == fm.UNKNOWN_ITEM_BYTES


def test_host_budget_is_a_capped_share_of_available_memory(tmp_path: Path, monkeypatch) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       25165824 kB\nMemAvailable:    8388608 kB\n")
    assert fm._meminfo_available(meminfo) == 8 * 1024**3
    assert fm._meminfo_available(tmp_path / "missing") is None
    (tmp_path / "memory.max").write_text("max\n")
    assert fm._cgroup_headroom(tmp_path) is None
    (tmp_path / "memory.max").write_text(str(6 * 1024**3))
    (tmp_path / "memory.current").write_text(str(4 * 1024**3))
    assert fm._cgroup_headroom(tmp_path) == 2 * 1024**3
    monkeypatch.setattr(fm, "_meminfo_available", lambda: 8 * 1024**3)
    monkeypatch.setattr(fm, "_cgroup_headroom", lambda: None)
    assert fm.host_budget() == 2 * 1024**3  # a quarter
    monkeypatch.setattr(fm, "_cgroup_headroom", lambda: 1024**3)
    assert fm.host_budget() == 1024**3 // 4  # the container's limit is the lower
    monkeypatch.setattr(fm, "_meminfo_available", lambda: 1024**4)
    monkeypatch.setattr(fm, "_cgroup_headroom", lambda: None)
    assert fm.host_budget() == fm.HOST_CAP_BYTES
    assert fm.device_budget(torch.device("cpu")) == fm.HOST_CAP_BYTES


def test_cuda_without_a_driver_plans_with_the_host_budget(monkeypatch) -> None:
    """ZeroGPU's CUDA emulated by `spaces` on a CPU build: "cuda" tensors, no driver to ask. The
    forward runs on the host, so it plans with the host's budget instead of failing the call."""
    if torch.cuda.is_available():
        pytest.skip("a real CUDA device answers mem_get_info")
    monkeypatch.setattr(fm, "host_budget", lambda: 3 * 1024**3)
    with pytest.raises((AssertionError, RuntimeError)):
        torch.cuda.mem_get_info(torch.device("cuda"))  # what the emulation's forward would meet
    assert fm.device_budget(torch.device("cuda")) == 3 * 1024**3
