"""``sapiens2 batch`` without Ray: records, inputs, OUT (committed parts, resume, a kill), the
local engine against the library, the CPU budget, and the command line. Tiny checkpoints at a
small network size; the Ray engine is in test_batch_ray.py."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from PIL import Image

from sapiens2 import batch
from sapiens2.batch import records, sources
from sapiens2.batch.job import BatchJob, task_plan
from sapiens2.batch.store import Store
from sapiens2.cli import main
from sapiens2.errors import InputImageError, OptionError
from sapiens2.runtime import cpus
from sapiens2.tasks import registry

ROOT = Path(__file__).resolve().parents[1]
HW = (128, 96)  # network input for the tiny models: every code path, a fraction of the time


def photo(path: Path, w: int = 48, h: int = 36, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)).save(path)
    return path


def photos(folder: Path, n: int, corrupt: bool = True) -> list[Path]:
    made = [photo(folder / f"p{i:02d}.png", 40 + 4 * i, 30 + 2 * i, seed=i) for i in range(n)]
    if corrupt:
        (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
        made.append(folder / "broken.jpg")
    return made


def job_for(tasks, ckpts, out, **kw) -> BatchJob:
    plans = tuple(
        task_plan(
            registry.get(t), checkpoints=ckpts, network_hw=HW, pipeline_kwargs=kw.pop(f"{t}_kwargs", None)
        )
        for t in tasks
    )
    return BatchJob(plans, str(out), **kw)


def table(out: Path, task: str) -> pa.Table:
    return pads.dataset(str(out / task)).to_table().sort_by("source")


# ----------------------------------------------------------------------------- records


def test_every_batch_task_has_a_record_and_tables_round_trip(tmp_path):
    assert records.batch_tasks() == list(registry.declared())  # every built-in task declares a record
    kp = np.random.default_rng(0).random((2, 308, 2), dtype=np.float32)
    rows = [
        {"source": "a", "width": 4, "height": 3, "notices": [], "keypoints": kp, "scores": kp[..., 0],
         "boxes": np.ones((2, 4)), "box_scores": np.ones(2), "detection": "caller"},
        records.error_row("b", "InputImageError: nope"),
        {"source": "c", "keypoints": np.zeros((0, 308, 2)), "scores": np.zeros((0, 308)),
         "boxes": np.zeros((0, 4)), "box_scores": np.zeros(0)},
    ]  # fmt: skip
    pq.write_table(records.rows_table(registry.get("pose"), rows), tmp_path / "p.parquet")
    back = pq.read_table(tmp_path / "p.parquet")
    fixed = pa.list_(pa.list_(pa.list_(pa.float32(), 2), 308))  # people x 308 x 2: fixed sizes kept
    assert back.schema.field("keypoints").type == fixed
    got = records.column_arrays(back["keypoints"])
    assert np.array_equal(got[0], kp) and got[1] is None and got[2].shape == (0, 308, 2)
    assert back["error"].to_pylist() == [None, "InputImageError: nope", None]
    for task in registry.declared().values():  # every schema starts with the common columns
        names = records.schema(task).names
        assert names[:5] == ["source", "error", "width", "height", "notices"] and len(names) > 5
    labels = np.arange(12, dtype=np.uint8).reshape(3, 4)
    assert np.array_equal(records.read_png(records.png_bytes(labels)), labels)
    big = np.array([1e6, -2.0, np.nan], np.float32)
    back16 = records.read_array(records.npy_bytes(big))
    assert back16.dtype == np.float16 and back16[0] == np.finfo(np.float16).max and np.isnan(back16[2])


# ----------------------------------------------------------------------------- inputs


def test_inputs_folder_glob_lists_uris_and_a_filesystem(tmp_path):
    root = tmp_path / "set"
    a, b, c = photo(root / "a.jpg"), photo(root / "sub" / "b.png"), photo(root / "sub" / "deep" / "c.PNG")
    (root / "notes.txt").write_text("not a photo")
    abs_ = lambda p: str(p.absolute())  # noqa: E731
    assert sources.list_sources(str(root)) == [abs_(a), abs_(b), abs_(c)]  # recursive, sorted, images only
    assert sources.list_sources(str(root / "*.jpg")) == [abs_(a)]  # * stays in its folder
    assert sources.list_sources(str(root / "**" / "*.png")) == [abs_(b)]  # case-sensitive, any depth
    assert sources.list_sources(f"file://{root}/sub/*") == [f"file://{b}"]  # a URI stays a URI
    listing = root / "list.txt"
    listing.write_text(f"# a comment\nsub/b.png\n\n{c}\nsub/b.png\nmissing.jpg\n")
    assert sources.list_sources(str(listing)) == [abs_(b), abs_(c), abs_(root / "missing.jpg")]
    pq.write_table(pa.table({"path": [str(a), "s3://bucket/x.jpg"]}), root / "list.parquet")
    assert sources.list_sources(str(root / "list.parquet")) == [str(a), "s3://bucket/x.jpg"]
    with pytest.raises(OptionError, match="No such file"):
        sources.list_sources(str(tmp_path / "nothing"))
    with pytest.raises(OptionError, match="No image file matches"):
        sources.list_sources(str(root / "*.gif"))
    # a pyarrow filesystem given by the caller: paths inside it, read through it (not load_image(Path))
    sub = pafs.SubTreeFileSystem(str(root), pafs.LocalFileSystem())
    assert sources.list_sources("sub", sub) == ["sub/b.png", "sub/deep/c.PNG"]
    got = sources.read_intake("sub/b.png", sub)
    assert got.rgb.shape == (36, 48, 3) and got.name == "b"
    assert np.array_equal(got.rgb, np.asarray(Image.open(b)))


def test_one_list_of_image_extensions():
    from sapiens2.cli import tasks as cli_tasks
    from sapiens2.inputs import intake

    assert sources.IMAGE_EXTENSIONS is intake.IMAGE_EXTENSIONS is cli_tasks.IMAGE_EXTENSIONS
    assert {".jpg", ".png", ".heic"} <= intake.IMAGE_EXTENSIONS and ".mp4" not in intake.IMAGE_EXTENSIONS


def test_inputs_through_fsspec_memory_uris():
    import fsspec

    mem = fsspec.filesystem("memory")
    for i in range(2):
        img = np.full((20, 30, 3), 40 * i, np.uint8)
        with mem.open(f"/batchtest/set/m{i}.png", "wb") as f:
            Image.fromarray(img).save(f, format="PNG")
    mem.pipe("/batchtest/set/bad.png", b"garbage")
    found = sources.list_sources("memory://batchtest/set")
    assert found == [
        "memory://batchtest/set/bad.png",
        "memory://batchtest/set/m0.png",
        "memory://batchtest/set/m1.png",
    ]
    assert sources.read_intake(found[2]).rgb[0, 0, 0] == 40
    with pytest.raises(InputImageError):
        sources.read_intake(found[0])
    with pytest.raises(InputImageError, match="not found"):
        sources.read_intake("memory://batchtest/set/none.png")


# ----------------------------------------------------------------------------- the local engine


def test_local_rows_match_the_library_one_decode_per_photo_and_a_bad_file_is_a_row(
    tiny_checkpoints, tmp_path, monkeypatch
):
    from sapiens2.inputs.intake import load_image

    made = photos(tmp_path / "in", 3)
    decoded: list[str] = []

    def counting(src, **kw):
        decoded.append(str(src))
        return load_image(src, **kw)

    monkeypatch.setattr(sources, "load_image", counting)
    job = job_for(
        ("pose", "seg"), tiny_checkpoints, tmp_path / "out", batch_size=2, pose_kwargs={"detector": None}
    )
    summary = batch.run(job, str(tmp_path / "in"), progress=False)
    assert summary.rows == {"pose": 4, "seg": 4} and summary.errors == {"pose": 1, "seg": 1}
    assert len(decoded) == 4  # one decode per photo for both tasks
    pose, seg = table(tmp_path / "out", "pose"), table(tmp_path / "out", "seg")
    assert pose["source"].to_pylist() == sorted(str(p) for p in made)
    bad = pose.filter(pc.field("source") == str(made[-1])).to_pylist()[0]
    assert bad["error"].startswith("InputImageError") and bad["keypoints"] is None

    pipes = {
        t: registry.get(t).pipeline(None, checkpoint=tiny_checkpoints[t], device="cpu")
        for t in ("pose", "seg")
    }
    pipes["pose"].detector = None
    for pipe in pipes.values():
        pipe.input_hw = HW
    at = {s: i for i, s in enumerate(pose["source"].to_pylist())}
    assert at == {s: i for i, s in enumerate(seg["source"].to_pylist())}
    kps, scores = records.column_arrays(pose["keypoints"]), records.column_arrays(pose["scores"])
    for path in made[:-1]:
        i, want = at[str(path)], pipes["pose"](path)
        assert np.allclose(kps[i], want.keypoints, atol=1e-4) and np.allclose(
            scores[i], want.scores, atol=1e-5
        )
        labels = records.read_png(seg["labels_png"][i])
        assert np.array_equal(labels, pipes["seg"](path).labels)
        assert (pose["width"][i].as_py(), pose["height"][i].as_py()) == (labels.shape[1], labels.shape[0])


def test_dense_and_feature_records_match_the_library(tiny_checkpoints, tmp_path):
    img = photo(tmp_path / "in" / "a.png", 40, 32)
    tasks = ("normal", "matting", "albedo", "features")
    values = {"normal": {"remove_background": True}}
    plans = tuple(
        task_plan(registry.get(t), checkpoints=tiny_checkpoints, values=values.get(t), network_hw=HW)
        for t in tasks
    )
    assert [b.task.name for b in plans[0].borrowed] == ["seg"]  # the mask's model, from --checkpoint seg=
    summary = batch.run(BatchJob(plans, str(tmp_path / "out")), str(img), progress=False)
    assert summary.errors == dict.fromkeys(("normal", "matting", "albedo", "features"), 0)
    out = tmp_path / "out"
    seg = registry.get("seg").pipeline(None, checkpoint=tiny_checkpoints["seg"], device="cpu")
    seg.input_hw = HW

    def lib(task: str, **kw):
        pipe = registry.get(task).pipeline(None, checkpoint=tiny_checkpoints[task], device="cpu", **kw)
        pipe.input_hw = HW
        return pipe

    normal = lib("normal", seg=seg)(img, remove_background=True)
    row = table(out, "normal").to_pylist()[0]
    assert np.array_equal(records.read_array(row["normals"]), normal.normals.astype(np.float16))
    assert np.array_equal(records.read_png(row["mask_png"]) > 0, normal.mask)
    matting = lib("matting")(img)
    row = table(out, "matting").to_pylist()[0]
    assert np.array_equal(records.read_array(row["alpha"]), matting.alpha.astype(np.float16))
    assert records.read_array(row["foreground"]).shape == (32, 40, 3)
    albedo = lib("albedo", seg=seg)(img)
    row = table(out, "albedo").to_pylist()[0]
    assert np.array_equal(records.read_array(row["albedo"]), albedo.albedo.astype(np.float16))
    feats = lib("features")(img)
    assert np.array_equal(
        np.asarray(table(out, "features")["embedding"][0].as_py(), np.float32), feats.embedding
    )
    assert batch.read_task(str(out), registry.get("features")).num_rows == 1  # OUT/features: its name


def test_the_cpu_stages_never_load_weights(tiny_checkpoints, tmp_path, monkeypatch):
    from sapiens2.batch.stages import Geometry, TaskStages
    from sapiens2.inputs.intake import load_image
    from sapiens2.models import loading

    loads: list[str] = []
    real = loading.load_model
    monkeypatch.setattr(
        loading, "load_model", lambda task, *a, **k: loads.append(task) or real(task, *a, **k)
    )
    photos(tmp_path / "in", 2, corrupt=False)
    job = job_for(("pose", "seg"), tiny_checkpoints, tmp_path / "out")
    assert batch.run(job, str(tmp_path / "in"), progress=False).errors == {"pose": 0, "seg": 0}
    assert sorted(loads) == ["pose", "seg"]  # the forward's models, once each; prepare/finish none
    # the CPU stages alone: no model object is built, and what they make is the forward's input
    plan = next(p for p in job.plans if p.task.name == "pose")
    cpu, device = TaskStages(plan), TaskStages(plan)
    device.load("cpu", "float32")
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("a CPU stage loaded weights"))
    intake = load_image(photo(tmp_path / "one.png", seed=3))
    prep = cpu.prepare(intake)
    assert cpu.cpu_pipeline().model is None and cpu._device is None
    [raw] = device.forward([prep])
    row = cpu.finish(raw, Geometry.of(intake), "one.png")
    assert row["error"] is None and np.asarray(row["keypoints"]).shape[1:] == (308, 2)
    with pytest.raises(RuntimeError, match="without weights"):
        cpu.cpu_pipeline().infer([prep], **plan.options)


def test_weight_free_stages_are_the_pipelines_and_options_resolve_once(tiny_checkpoints, tmp_path):
    import pickle

    from sapiens2.batch.stages import Geometry, TaskStages
    from sapiens2.inputs.intake import load_image
    from sapiens2.tasks.pose import PosePipeline

    rng = np.random.default_rng(5)
    intake = load_image((rng.random((480, 640, 3)) * 255).astype(np.uint8))
    job = job_for(("pose", "normal"), tiny_checkpoints, tmp_path / "out", pose_kwargs={"detector": None})
    for plan in job.plans:
        lib = plan.task.pipeline(checkpoint=tiny_checkpoints[plan.task.name], device="cpu",
                                 **plan.pipeline_kwargs)  # fmt: skip
        lib.input_hw = HW
        cpu = TaskStages(plan)
        prep, lib_prep = cpu.prepare(intake), lib.prepare(intake, **plan.options)
        assert pickle.dumps(prep) == pickle.dumps(lib_prep)  # the same network input
        [raw] = lib.infer([prep], **plan.options)
        row = cpu.finish(raw, Geometry.of(intake), "x.png")
        lib_row = records.result_row(plan.task, "x.png", lib.finish(raw, intake, **plan.options))
        assert row.keys() == lib_row.keys() and row["error"] is None
        for key, value in row.items():
            assert np.array_equal(np.asarray(value), np.asarray(lib_row[key])), key
        if plan.task.name == "pose":  # no detector: the crop travels, not the 640x480 working copy
            assert prep.image is None and prep.crops.shape == (1, *HW, 3)
            assert len(pickle.dumps(prep)) < HW[0] * HW[1] * 3 + 4096 < intake.work.nbytes
    # flip test's default: the declaration's for the device, in a plan and in a pipeline alike
    pose = registry.get("pose")
    for gpu, device in ((False, "cpu"), (True, "cuda")):
        planned = pose.resolve({"threshold": 0.5}, gpu=gpu)  # rendering options are not the plan's
        assert set(planned) == {o.name for o in pose.options if o.stage == "infer"}
        assert planned["flip_test"] is gpu
        assert PosePipeline.without_weights("0.4b", device=device)._flip_test(None) is gpu
    with pytest.raises(TypeError, match="unexpected keyword argument 'sed'"):
        PosePipeline.without_weights("0.4b", sed=None)


def smooth_jpeg(path: Path, w: int, h: int, seed: int = 0) -> Path:
    """A camera-sized photo that compresses as photos do (gradients and blocks, not noise)."""
    yy, xx = np.mgrid[0:h, 0:w]
    rgb = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy + seed * 40) % 256], -1).astype(np.uint8)
    rgb[h // 4 : h // 2, w // 3 : w // 2] = (200, 30 + seed * 20, 40)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rgb).save(path, quality=90)
    return path


def test_pose_with_its_detector_rows_equal_the_library_and_match_in_any_batch(
    tiny_checkpoints, tiny_detr, tmp_path
):
    """Pose with the person detector (the default) finds the people in a step of its own: rows
    equal the library's exactly (one photo a forward), a batch of two gives the same people."""
    made = photos(tmp_path / "in", 3)
    runs = {}
    for n in (1, 2):
        job = job_for(("pose",), tiny_checkpoints, tmp_path / f"out{n}", batch_size=n,
                      pose_kwargs={"detector": str(tiny_detr)})  # fmt: skip
        summary = batch.run(job, str(tmp_path / "in"), progress=False)
        assert summary.rows == {"pose": 4} and summary.errors == {"pose": 1}
        runs[n] = table(tmp_path / f"out{n}", "pose")
    lib = registry.get("pose").pipeline(None, checkpoint=tiny_checkpoints["pose"], device="cpu",
                                        detector=str(tiny_detr))  # fmt: skip
    lib.input_hw = HW
    one, two = runs[1], runs[2]
    assert one["source"].to_pylist() == two["source"].to_pylist() == sorted(str(p) for p in made)
    at = {src: i for i, src in enumerate(one["source"].to_pylist())}
    for path in made[:-1]:
        i, want = at[str(path)], lib(path)
        assert (
            one["detection"][i].as_py() == want.detection_source == "detector"
        )  # the tiny DETR finds people
        got = {k: records.column_arrays(one[k])[i] for k in ("keypoints", "scores", "boxes")}
        assert np.array_equal(got["keypoints"], want.keypoints) and np.array_equal(got["scores"], want.scores)
        assert np.array_equal(got["boxes"], want.boxes)
        assert np.array_equal(np.asarray(one["box_scores"][i].as_py(), np.float32), want.box_scores)
    assert one["boxes"].equals(two["boxes"]) and one["box_scores"].equals(two["box_scores"])
    assert one["notices"].equals(two["notices"])


def test_pose_with_its_detector_never_passes_the_photos_pixels_to_a_device_step(
    tiny_checkpoints, tiny_detr, tmp_path
):
    """The issue's measure, with the person detector: what each step hands on per photo is the
    network input (the detector's, then the crops) and the photo's file, never its pixels."""
    from sapiens2.batch import flow
    from sapiens2.batch.stages import stages_for

    big = smooth_jpeg(tmp_path / "big.jpg", 1600, 1200)
    job = job_for(
        ("pose", "seg"), tiny_checkpoints, tmp_path / "out", pose_kwargs={"detector": str(tiny_detr)}
    )
    stages = stages_for(job.plans)
    pose, seg = job.plans[0].task, job.plans[1].task
    [item] = flow.read_prepare([(str(big), job.tasks)], stages, max_side=job.max_side)
    work = item.intake.work.nbytes  # 1600 x 1200 x 3: the decoded photo stays in this process
    detr_input = 1067 * 800 * 3  # DETR's 800-px input, uint8
    sent = len(item.dumps())
    assert item.intake is not None and flow.Item.loads(item.dumps()).intake is None
    assert pose in item.people_inputs and pose not in item.preps and seg in item.preps
    seg_input = len(pickle.dumps(item.preps[seg]))  # seg's network input, for the tiny 128x96 model
    assert sent < detr_input + big.stat().st_size + seg_input + 8192 < work  # the file, not its pixels
    stages[pose].load_finder("cpu")
    flow.find_people([item], stages[pose])
    assert pose in item.people and not item.people_inputs
    far = flow.Item.loads(item.dumps())  # as another process gets it: the photo decoded again
    spoilt = flow.Item.loads(item.dumps())
    spoilt.photo = spoilt.photo[:5000]  # a file that no longer decodes: that task's error, nothing lost
    flow.prepare_found([spoilt], stages, max_side=job.max_side)
    assert (
        spoilt.errors[pose].startswith("InputImageError") and pose not in spoilt.preps and seg in spoilt.preps
    )
    assert spoilt.photo is None and not spoilt.people
    flow.prepare_found([far], stages, max_side=job.max_side)
    flow.prepare_found([item], stages, max_side=job.max_side)
    assert far.photo is None and item.photo is None and item.intake is None
    a, b = far.preps[pose], item.preps[pose]
    assert a.image is None and np.array_equal(a.crops, b.crops) and a.crops.shape[1:] == (*HW, 3)
    people = len(a.crops)
    assert len(far.dumps()) < len(pickle.dumps(far.preps[seg])) + people * HW[0] * HW[1] * 3 + 8192


def test_rerun_skips_done_sources_refuses_other_settings_and_ignores_temp_files(tiny_checkpoints, tmp_path):
    photos(tmp_path / "in", 2)
    job = job_for(("pose",), tiny_checkpoints, tmp_path / "out", rows_per_part=1)
    first = batch.run(job, str(tmp_path / "in"), progress=False)
    assert first.rows == {"pose": 3} and first.parts == 3
    stale = tmp_path / "out" / "pose" / ".tmp-deadbeef.parquet"  # a killed run's uncommitted part
    stale.write_bytes(b"half a file")
    assert pads.dataset(str(tmp_path / "out" / "pose")).count_rows() == 3  # invisible to readers
    photo(tmp_path / "in" / "new.png", seed=9)
    again = batch.run(job, str(tmp_path / "in"), progress=False)
    assert again.photos == 1 and again.skipped == 3 and again.rows == {"pose": 1}
    assert not stale.exists()  # cleaned at the start
    sources_out = table(tmp_path / "out", "pose")["source"].to_pylist()
    assert len(sources_out) == len(set(sources_out)) == 4
    other = BatchJob((task_plan(registry.get("pose"), values={"flip_test": True}, checkpoints=tiny_checkpoints,
                                network_hw=HW),), str(tmp_path / "out"))  # fmt: skip
    with pytest.raises(OptionError, match="flip_test"):
        batch.run(other, str(tmp_path / "in"), progress=False)
    with Store(str(tmp_path / "out")).locked():  # a second run into the same OUT waits for none
        with pytest.raises(OptionError, match="Another sapiens2 batch run"):
            batch.run(job, str(tmp_path / "in"), progress=False)


@pytest.mark.subprocess
def test_a_killed_run_then_a_rerun_gives_each_source_once_and_never_imports_ray(tiny_checkpoints, tmp_path):
    """SIGKILL the process running the batch once some parts are committed; rerun; count. The
    rerun's process also shows that the package and the local engine never import Ray."""
    made = photos(tmp_path / "in", 40, corrupt=False)
    out = tmp_path / "out"
    args = ["batch", "pose", str(tmp_path / "in"), "--out", str(out), "--checkpoint",
            f"pose={tiny_checkpoints['pose']}", "--network-size", "128x96", "--no-detector",
            "--batch-size", "1", "--rows-per-part", "1"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sapiens2", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    parts = lambda: list((out / "pose").glob("part-*.parquet"))  # noqa: E731
    deadline = time.monotonic() + 240
    while len(parts()) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    killed_at = len(parts())
    assert 3 <= killed_at < len(made), f"the run was not killed mid-way ({killed_at} parts)"
    rerun = (
        f"import sys\nfrom sapiens2.cli import main\ncode = main({args!r})\nprint('ray' in sys.modules, code)"
    )
    done = subprocess.run(
        [sys.executable, "-c", rerun], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    lines = done.stdout.strip().splitlines()
    assert lines and lines[-1] == "False 0", done.stdout + done.stderr
    assert f"{len(made) - killed_at} photos" in done.stdout and f"{killed_at} already done" in done.stdout
    rows = table(out, "pose")
    assert sorted(rows["source"].to_pylist()) == sorted(str(p) for p in made)  # each once
    assert rows["error"].null_count == len(made)
    assert not list((out / "pose").glob(".tmp-*"))


# ----------------------------------------------------------------------------- CPUs and the command


def test_cpu_budget_caps_pools_and_threads(monkeypatch):
    import cv2
    import torch

    from sapiens2.batch import workers

    machine = cpus.available_cpus()
    threads, cv_threads = torch.get_num_threads(), cv2.getNumThreads()
    try:
        assert cpus.set_cpu_budget(0.5) == 1 and cpus.available_cpus() == 1
        assert cpus.cpu_pool("budget-test")._max_workers == 1
        cpus.set_cpu_budget(None)
        assert cpus.available_cpus() == machine
        assert cpus.cpu_pool("budget-test")._max_workers == machine  # a new pool of the new size
        monkeypatch.setenv(cpus.CPU_BUDGET_ENV, "1")
        assert cpus.cpu_budget() == 1 and cpus.available_cpus() == 1
        monkeypatch.setenv(cpus.CPU_BUDGET_ENV, "lots")
        assert cpus.cpu_budget() is None  # unreadable: no budget, not a crash
        monkeypatch.delenv(cpus.CPU_BUDGET_ENV)
        assert workers.use_cpus(1) == 1 and torch.get_num_threads() == 1 and cv2.getNumThreads() == 1
    finally:
        cpus.set_cpu_budget(None)
        torch.set_num_threads(threads)
        cv2.setNumThreads(cv_threads)


def test_actor_resources_always_leave_a_cpu_for_the_cpu_steps():
    from sapiens2.batch.ray_engine import Actors, RayOptions, actor_resources

    def pools(opts, tasks, cluster, gpu=False, finding=0):
        got = actor_resources(opts, tasks, cluster, gpu, finding)
        return (got.gpus, got.cpus) if not finding else got

    assert pools(RayOptions(), 1, {"CPU": 2}) == (0.0, 1.0)
    assert pools(RayOptions(), 2, {"CPU": 2}) == (0.0, 0.5)  # two tasks share the spare CPU
    assert pools(RayOptions(actors=2), 1, {"CPU": 16, "GPU": 2}, gpu=True) == (1.0, 1.0)
    assert pools(RayOptions(gpus_per_actor=0.25, actors=4), 1, {"CPU": 8, "GPU": 1}, True) == (0.25, 1.0)
    # pose with its detector: on CPUs the read step detects (no finder actor) unless asked for one;
    # on GPUs a finder actor beside each forward actor, sharing its GPU
    assert pools(RayOptions(), 1, {"CPU": 2}, finding=1) == Actors(0.0, 1.0, 0.0, 0.0, 0)
    assert pools(RayOptions(detector_actors=1), 1, {"CPU": 2}, finding=1) == Actors(0.0, 0.5, 0.0, 0.5, 1)
    assert pools(RayOptions(actors=8), 1, {"CPU": 64, "GPU": 8}, True, 1) == Actors(0.9, 1.0, 0.1, 1.0, 8)
    assert pools(RayOptions(actors=8, gpus_per_actor=1, detector_actors=2, detector_gpus=0.5), 1,
                 {"CPU": 64, "GPU": 9}, True, 1) == Actors(1.0, 1.0, 0.5, 1.0, 2)  # fmt: skip
    with pytest.raises(OptionError, match="leave no CPU"):
        actor_resources(RayOptions(actors=2, cpus_per_actor=1), 1, {"CPU": 2})
    assert pools(RayOptions(actors=8, detector_actors=0), 1, {"CPU": 64, "GPU": 8}, True, 1) == Actors(
        1.0, 1.0, 0.0, 0.0, 0
    )  # the DETR on the read steps' CPUs: the forward actors keep whole GPUs
    with pytest.raises(OptionError, match="leave no CPU"):  # 1 forward + 2 finders at 0.5 on 2 CPUs
        actor_resources(RayOptions(detector_actors=2, cpus_per_actor=0.5), 1, {"CPU": 2}, finding=1)
    with pytest.raises(OptionError, match="has 0 GPU"):
        actor_resources(RayOptions(), 1, {"CPU": 2}, gpu=True)
    with pytest.raises(OptionError, match="resolved for a CPU forward"):  # flip test, dtype: CPU defaults
        actor_resources(RayOptions(gpus_per_actor=1), 1, {"CPU": 4, "GPU": 1}, gpu=False)
    with pytest.raises(OptionError, match="--detector-gpus 0.5 but"):
        actor_resources(RayOptions(detector_actors=1, detector_gpus=0.5), 1, {"CPU": 4}, finding=1)
    with pytest.raises(OptionError, match="--detector-gpus is for detector actors"):
        actor_resources(RayOptions(detector_gpus=0.5), 1, {"CPU": 4}, finding=1)
    with pytest.raises(OptionError, match="--detector-actors at least 0"):
        actor_resources(RayOptions(detector_actors=-1), 1, {"CPU": 4}, finding=1)
    # pose and seg at one GPU each on a local Ray of 1 GPU: refused, the second pool would never start
    with pytest.raises(
        OptionError, match=r"need 2.1 GPUs .* 2 task\(s\) x 1, 1 detector actor\(s\) x 0.1\) but"
    ):
        actor_resources(RayOptions(gpus_per_actor=1), 2, {"CPU": 8, "GPU": 1}, True, 1)
    joined = RayOptions(address="auto", gpus_per_actor=1)  # a cluster may scale up: its pools wait
    assert actor_resources(joined, 2, {"CPU": 8, "GPU": 1}, True, 1).gpus == 1.0


def test_the_network_size_follows_the_one_input_rule():
    from sapiens2.batch.job import parse_network_size

    assert parse_network_size("128x96") == (128, 96)
    for text in ("100x50", "32x32", "8192x64"):  # not a multiple of 16; below 64; above 4096
        with pytest.raises(OptionError, match="multiples of 16"):
            parse_network_size(text)


def test_command_line_errors_are_one_line(tiny_checkpoints, tmp_path, capsys):
    img = photo(tmp_path / "a.png")
    base = ["batch", "pose", str(img), "--out", str(tmp_path / "o")]
    assert main([*base, "--checkpoint", f"pose={tiny_checkpoints['seg']}"]) == 1
    assert "is a seg checkpoint, not a pose one" in capsys.readouterr().err
    assert main([*base, "--network-size", "100x50"]) == 1
    assert "multiples of 16" in capsys.readouterr().err
    assert main([*base, "--max-people", "0", "--checkpoint", f"pose={tiny_checkpoints['pose']}"]) == 1
    assert "--max-people must be a number from 1 to 50" in capsys.readouterr().err
    assert main(["batch", "pose", str(tmp_path / "none"), "--out", str(tmp_path / "o"),
                 "--checkpoint", f"pose={tiny_checkpoints['pose']}"]) == 1  # fmt: skip
    err = capsys.readouterr().err
    assert "No such file or folder" in err and "Traceback" not in err
    ckpt = ["--checkpoint", f"pose={tiny_checkpoints['pose']}"]
    assert main([*base, *ckpt, "--detector-checkpoint", str(tmp_path / "nope")]) == 1
    assert "--detector-checkpoint" in capsys.readouterr().err and not list((tmp_path / "o").rglob("part-*"))
    (tmp_path / "notdetr").mkdir()
    (tmp_path / "notdetr" / "model.safetensors").write_bytes(b"not a checkpoint")
    assert main([*base, *ckpt, "--detector-checkpoint", str(tmp_path / "notdetr")]) == 1
    err = capsys.readouterr().err  # refused when the finder loads, before any photo: no rows
    assert "error:" in err and "Traceback" not in err and not list((tmp_path / "o").rglob("part-*"))
    with pytest.raises(SystemExit):
        main(["batch", str(img), "--out", str(tmp_path / "o")])  # INPUT but no task


def test_command_runs_and_reports(tiny_checkpoints, tmp_path, capsys):
    photos(tmp_path / "in", 1)
    args = ["batch", "pose", "features", str(tmp_path / "in"), "--out", str(tmp_path / "o"), "--no-detector",
            "--checkpoint", f"pose={tiny_checkpoints['pose']}", "--checkpoint", f"features={tiny_checkpoints['features']}",
            "--network-size", "128x96"]  # fmt: skip
    assert main(args) == 0
    cap = capsys.readouterr()
    assert "pose: 2 rows (1 errors) · features: 2 rows (1 errors) · 2 photos in" in cap.out
    assert "error (pose)" in cap.err and "broken.jpg" in cap.err
    assert main(args) == 0 and "nothing to do" in capsys.readouterr().out


def test_a_workers_package_error_reaches_the_command_as_itself():
    """An actor that cannot load its model fails in Ray with the error as text only."""
    from sapiens2.batch.ray_engine import _package_cause
    from sapiens2.errors import WeightsUnavailableError

    died = RuntimeError(
        "The actor died because of an error raised in its creation task ...\n  File weights.py, line 133\n"
        "sapiens2.errors.WeightsUnavailableError: Weights for facebook/sapiens2-seg-0.4b are not available here.\n"
    )
    found = _package_cause(died)
    assert isinstance(found, WeightsUnavailableError) and str(found).startswith(
        "Weights for facebook/sapiens2-seg"
    )
    chained = RuntimeError("wrapper")
    chained.__cause__ = OptionError("the real one")
    assert str(_package_cause(chained)) == "the real one"
    assert _package_cause(RuntimeError("sapiens2.errors.NoSuchError: made up")) is None
