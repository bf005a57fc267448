"""``sapiens2 batch --engine ray`` on a local Ray this module starts itself (2 CPUs, bound to
127.0.0.1, no dashboard, a small object store): its rows equal the local engine's, a corrupt file
is an error row, a half-done OUT is completed with each source once, and every Ray worker keeps
to the CPUs Ray gave it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow.dataset as pads
import pytest

ray = pytest.importorskip("ray")

from test_batch import photos, smooth_jpeg  # noqa: E402

from sapiens2.batch import records  # noqa: E402
from sapiens2.batch.store import JOB_FILE  # noqa: E402
from sapiens2.cli import main  # noqa: E402

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def local_ray():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        object_store_memory=96 << 20,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}},
    )
    yield
    ray.shutdown()


def sorted_table(out: Path, task: str):
    return pads.dataset(str(out / task)).to_table().sort_by("source")


def test_ray_rows_equal_local_rows_with_an_error_row_and_a_half_done_out(
    local_ray, tiny_checkpoints, tmp_path, capsys
):
    made = photos(tmp_path / "in", 5)  # + broken.jpg
    args = ["pose", "seg", str(tmp_path / "in"), "--no-detector", "--network-size", "128x96", "--batch-size", "2",
            "--checkpoint", f"pose={tiny_checkpoints['pose']}", "--checkpoint", f"seg={tiny_checkpoints['seg']}"]  # fmt: skip
    local, far = tmp_path / "local", tmp_path / "ray"
    assert main(["batch", *args, "--out", str(local)]) == 0
    # OUT half done: pose holds one committed part of the local run, plus a killed run's temp file
    (far / "pose").mkdir(parents=True)
    first = sorted((local / "pose").glob("part-*.parquet"))[0]
    shutil.copy(first, far / "pose" / first.name)
    shutil.copy(local / "pose" / JOB_FILE, far / "pose" / JOB_FILE)
    (far / "pose" / ".tmp-0123.parquet").write_bytes(b"never committed")
    capsys.readouterr()
    assert main(["batch", *args, "--out", str(far), "--engine", "ray", "--rows-per-part", "3"]) == 0
    cap = capsys.readouterr()
    assert "6 photos in" in cap.out and "ray)" in cap.out and "passed between steps per photo" in cap.out
    assert "error (seg)" in cap.err and "broken.jpg" in cap.err  # pose's error row came with the copied part

    for task in ("pose", "seg"):
        a, b = sorted_table(local, task), sorted_table(far, task)
        assert a["source"].to_pylist() == b["source"].to_pylist() == sorted(str(p) for p in made)  # each once
        assert a["error"].to_pylist() == b["error"].to_pylist()
        assert b.filter(b["error"].is_valid())["source"].to_pylist() == [str(made[-1])]
        for name in ("width", "height", "notices"):
            assert a[name].equals(b[name])
    a, b = sorted_table(local, "pose"), sorted_table(far, "pose")
    for name, tol in (("keypoints", 0.05), ("scores", 1e-5), ("boxes", 1e-4)):
        for x, y in zip(records.column_arrays(a[name]), records.column_arrays(b[name]), strict=True):
            assert (x is None and y is None) or np.abs(x - y).max() <= tol, name
    a, b = sorted_table(local, "seg"), sorted_table(far, "seg")
    for x, y in zip(a["labels_png"], b["labels_png"], strict=True):
        assert (x.as_py() is None and y.as_py() is None) or np.array_equal(
            records.read_png(x), records.read_png(y)
        )
    assert not list((far / "pose").glob(".tmp-*"))


def hops_of(printed: str) -> dict[str, float]:
    """The command's "passed between steps per photo" line: MB by "step -> step", in order."""
    line = next(t for t in printed.splitlines() if t.startswith("passed between steps per photo: "))
    return {hop: float(mb) for hop, mb, _ in (h.rsplit(" ", 2) for h in line.split(": ", 1)[1].split(", "))}


def test_pose_with_its_detector_on_ray_equals_local_and_passes_no_photo_pixels(
    local_ray, tiny_checkpoints, tiny_detr, tmp_path, capsys
):
    """Pose with its person detector on Ray: the rows equal the local engine's, both where the
    read step detects (a CPU job's default) and with detector actors (a GPU job's default, asked
    for here on CPUs), and per photo no step hands on the decoded photo (1600 x 1200 x 3 = 5.76
    MB): the crops, or before them the detector's input and the photo's file."""
    made = [smooth_jpeg(tmp_path / "in" / f"cam{i}.jpg", 1600, 1200, seed=i) for i in range(2)]
    (tmp_path / "in" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    args = ["pose", str(tmp_path / "in"), "--detector-checkpoint", str(tiny_detr), "--network-size", "128x96",
            "--batch-size", "2", "--checkpoint", f"pose={tiny_checkpoints['pose']}"]  # fmt: skip
    local = tmp_path / "local"
    assert main(["batch", *args, "--out", str(local)]) == 0
    a = sorted_table(local, "pose")
    assert a["detection"].to_pylist() == [None, "detector", "detector"] and a["error"].null_count == 2
    crops = 128 * 96 * 3 * 2 / 1e6  # at most two people a photo here
    files = sum(p.stat().st_size for p in made) / 3 / 1e6  # the broken file's row carries nothing
    for extra, steps in (
        ([], ["prepare + detect pose -> forward pose", "forward pose -> write"]),
        (["--detector-actors", "1"], ["prepare -> detect pose", "detect pose -> crops", "crops -> forward pose",
                                      "forward pose -> write"]),
    ):  # fmt: skip
        far = tmp_path / f"ray{len(extra)}"
        capsys.readouterr()
        assert main(["batch", *args, "--out", str(far), "--engine", "ray", *extra]) == 0
        hops = hops_of(capsys.readouterr().out)
        assert list(hops) == steps
        b = sorted_table(far, "pose")
        assert a["source"].to_pylist() == b["source"].to_pylist() and a["error"].equals(b["error"])
        assert a["detection"].equals(b["detection"]) and a["boxes"].equals(b["boxes"])
        assert a["notices"].equals(b["notices"])
        for x, y in zip(
            records.column_arrays(a["keypoints"]), records.column_arrays(b["keypoints"]), strict=True
        ):
            assert (x is None and y is None) or np.abs(x - y).max() <= 0.05
        assert hops[steps[-2]] < crops and hops["forward pose -> write"] < 0.1
        if extra:  # the detector's input (DETR's 1067 x 800) and the file, never the 5.76 MB photo
            assert hops["prepare -> detect pose"] < 1067 * 800 * 3 / 1e6 * 2 / 3 + files + 0.02 < 5.76


def test_every_ray_worker_keeps_to_its_cpu_allotment(local_ray):
    from sapiens2.batch.workers import use_ray_allotment

    @ray.remote(num_cpus=1)
    def one() -> tuple[int, ...]:
        import cv2
        import torch

        from sapiens2.runtime.cpus import available_cpus, cpu_pool

        budget = use_ray_allotment()
        return (
            budget,
            available_cpus(),
            torch.get_num_threads(),
            cv2.getNumThreads(),
            cpu_pool("png")._max_workers,
        )

    assert ray.get(one.remote()) == (1, 1, 1, 1, 1)  # not 2, the machine's CPUs
    assert ray.get(one.options(num_cpus=0.5).remote()) == (1, 1, 1, 1, 1)  # a share runs one thread
    assert ray.get(one.options(num_cpus=2).remote()) == (2, 2, 2, 2, 2)
