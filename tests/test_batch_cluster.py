"""``sapiens2 batch`` against a real Ray cluster (two raylets of one CPU each, started by ``ray
start`` with their own temp folder and ports, tests/ray_cluster.py; without token authentication,
which a driver must set before it imports Ray, as pytest has; bench/batch.py uses a token) and an S3 server (moto, on 127.0.0.1), as a
data engineer runs it: no cluster at the address fails in seconds and leaves OUT as it was; the
driver's settings reach the workers; a bucket round trip gives the local engine's rows; two runs
into one bucket keep each other's parts; a driver killed midway leaves committed rows."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

ray = pytest.importorskip("ray")

from ray_cluster import closed_port, start_cluster, wait_until  # noqa: E402
from test_batch import HW, job_for, photos  # noqa: E402

from sapiens2 import batch  # noqa: E402
from sapiens2.batch import store as store_module  # noqa: E402
from sapiens2.batch.cluster import connected, shipped_env  # noqa: E402
from sapiens2.batch.placement import RayOptions  # noqa: E402
from sapiens2.batch.store import JOB_FILE, Store  # noqa: E402
from sapiens2.cli import main  # noqa: E402
from sapiens2.errors import OptionError  # noqa: E402
from sapiens2.tasks import registry  # noqa: E402

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[1]
POSE = ["--no-detector", "--network-size", f"{HW[0]}x{HW[1]}"]


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on 127.0.0.1 with a bucket; its settings are this process's only (the
    cluster's nodes are started without them)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    settings = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "s3cr3t-never-printed", "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip
    before = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        import boto3

        boto3.client("s3", endpoint_url=settings["AWS_ENDPOINT_URL"]).create_bucket(Bucket="data")
        yield pafs.S3FileSystem(
            endpoint_override=settings["AWS_ENDPOINT_URL"], scheme="http", allow_delayed_open=True
        )
    finally:
        for k, v in before.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        server.stop()


@dataclass
class Joined:
    cluster: Any
    said: str  # what joining printed


@pytest.fixture(scope="module")
def joined(request):
    """The cluster, joined once by this process as ``sapiens2 batch --address`` joins it (one Ray
    job for the module: its worker processes serve every test). The S3 settings and a package
    setting are set here only, never on the nodes."""
    try:
        started = start_cluster(nodes=2, cpus=1, token=False)  # pytest imported Ray: no token here
    except Exception as err:  # no Ray here, no ports, a sandbox: say why
        pytest.skip(f"a two-node Ray cluster did not start: {err}")
    request.getfixturevalue("s3")  # its settings from here on: after the nodes started
    os.environ["SAPIENS2_FORWARD_ITEMS"] = "3"
    said = io.StringIO()
    try:
        with contextlib.ExitStack() as stack:
            with contextlib.redirect_stderr(said):
                stack.enter_context(connected(RayOptions(address=started.address)))
            yield Joined(started, said.getvalue())
    finally:
        os.environ.pop("SAPIENS2_FORWARD_ITEMS", None)
        print(f"\nthe cluster's processes used {started.cpu_seconds():.1f} CPU-s", file=sys.stderr)
        started.stop()


def upload(fs: pafs.FileSystem, made: list[Path], prefix: str) -> None:
    for p in made:
        with fs.open_output_stream(f"{prefix}/{p.name}") as f:
            f.write(p.read_bytes())


def rows_of(out: str, task: str):
    return batch.read_task(out, task).sort_by("source")


def test_no_cluster_at_the_address_fails_in_seconds_leaves_out_alone_and_ends_on_sigterm(tmp_path, capsys):
    photos(tmp_path / "in", 1, corrupt=False)
    out = tmp_path / "out"
    args = ["batch", "pose", str(tmp_path / "in"), "--out", str(out), "--engine", "ray",
            "--address", f"127.0.0.1:{closed_port()}", *POSE]  # fmt: skip
    started = time.monotonic()
    assert main([*args, "--connect-timeout", "3"]) == 1
    took = time.monotonic() - started
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: No Ray cluster at --address 127.0.0.1:"), err
    assert "for 3 s" in err[0] and took < 60  # Ray's own join retried for ever (9 min 54 s)
    assert not out.exists()  # no lock, no settings: OUT as it was
    # SIGTERM while waiting for the cluster ends the run at once (it used to need SIGKILL)
    before = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    started = time.monotonic()
    assert main([*args, "--connect-timeout", "120"]) == 130
    assert time.monotonic() - started < 60 and not out.exists()
    assert "interrupted (SIGTERM)" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before  # the command's handler only while it runs


def test_settings_reach_the_workers_and_a_bucket_round_trip_equals_the_local_engine(
    joined, s3, tiny_checkpoints, tmp_path, capfd
):
    """The S3 endpoint and a package setting are set only in this process, never on the nodes:
    every node's workers get them (Ray's runtime_env), the run reads and writes the bucket, its rows
    equal the local engine's, and no secret is printed. The GPU default comes from the cluster
    (0 GPUs: CPUs), and says so."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    assert "AWS_ENDPOINT_URL" not in joined.cluster.env
    assert "SAPIENS2_CPUS" not in shipped_env({"SAPIENS2_CPUS": "1"})  # a worker keeps to Ray's CPUs

    @ray.remote(num_cpus=0)
    def seen() -> tuple[str | None, str | None]:
        return os.environ.get("AWS_ENDPOINT_URL"), os.environ.get("SAPIENS2_FORWARD_ITEMS")

    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == 2
    on_each = [
        seen.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
        for n in nodes
    ]
    assert ray.get(on_each) == [(os.environ["AWS_ENDPOINT_URL"], "3")] * 2
    assert "AWS_ENDPOINT_URL" in joined.said and "AWS_SECRET_ACCESS_KEY" in joined.said  # names only
    assert "s3cr3t" not in joined.said and "2 node(s)" in joined.said

    made = photos(tmp_path / "in", 3)
    upload(s3, made, "data/in")
    common = ["batch", "pose", "s3://data/in/", *POSE, "--checkpoint", f"pose={tiny_checkpoints['pose']}",
              "--batch-size", "2"]  # fmt: skip
    capfd.readouterr()
    assert main([*common, "--out", "s3://data/local"]) == 0
    assert (
        main([*common, "--out", "s3://data/ray", "--engine", "ray", "--address", joined.cluster.address]) == 0
    )
    printed = capfd.readouterr()
    assert "s3cr3t" not in printed.out + printed.err
    assert f"forward on CPUs (the cluster at {joined.cluster.address} has 0 GPU(s))" in printed.err
    assert "2 node(s) can read INPUT, write OUT and find the weights" in printed.err
    assert "memory per step (GiB): read" in printed.err and "forward pose" in printed.err
    a, b = rows_of("s3://data/local", "pose"), rows_of("s3://data/ray", "pose")
    assert (
        a["source"].to_pylist() == b["source"].to_pylist() == sorted(f"s3://data/in/{p.name}" for p in made)
    )
    assert a["error"].to_pylist() == b["error"].to_pylist() and a["width"].equals(b["width"])
    assert b["error"].null_count == 3 and a["boxes"].equals(b["boxes"])
    left = s3.get_file_info(pafs.FileSelector("data/ray/pose"))
    assert left and not [i.path for i in left if i.base_name.startswith(".tmp-")]


def test_a_worker_that_cannot_find_the_weights_fails_in_seconds_naming_it_and_where(
    joined, tiny_checkpoints, tmp_path
):
    """A checkpoint the driver reads but a worker does not (here: moved away after the job was
    planned, as a path only the driver's machine has would be): the first small task says so per
    node, before any photo; nothing is recorded in OUT."""
    from sapiens2.batch.job import BatchJob, ModelPlan, TaskPlan

    photos(tmp_path / "in", 1, corrupt=False)
    job = job_for(("pose",), tiny_checkpoints, tmp_path / "out", pose_kwargs={"detector": None})
    plan = job.plans[0]
    gone = tmp_path / "elsewhere" / "pose.safetensors"
    moved = TaskPlan(ModelPlan(plan.task, plan.model.size, str(gone)), plan.options,
                     plan.pipeline_kwargs, plan.borrowed, plan.network_hw)  # fmt: skip
    job = BatchJob((moved,), job.out)
    started = time.monotonic()
    with pytest.raises(OptionError, match=r"node [\d.]+: pose weights: .*elsewhere.* does not exist"):
        batch.run(
            job, str(tmp_path / "in"), engine="ray", engine_options=RayOptions(address=joined.cluster.address)
        )
    assert time.monotonic() - started < 120
    assert not (tmp_path / "out").exists()  # made by the run, nothing committed: taken away again


def test_two_runs_into_one_bucket_keep_each_others_parts(s3, tiny_checkpoints, tmp_path, monkeypatch):
    """Run A has written a part it has not committed yet; run B into the same bucket OUT (no lock
    there) cleans only its own and stale temporary parts; A then commits its part."""
    made = photos(tmp_path / "in", 2, corrupt=False)
    upload(s3, made, "data/both-in")
    pose = registry.get("pose")
    job = job_for(("pose",), tiny_checkpoints, "s3://data/both", pose_kwargs={"detector": None})
    first = Store("s3://data/both", run_id="runa")
    from sapiens2.batch.records import rows_table

    row = {
        "source": "s3://data/elsewhere.png",
        "error": "ValueError: a row of run A",
        "width": 1,
        "height": 1,
    }
    pending = first.write(pose, rows_table(pose, [row]))
    batch.run(job, "s3://data/both-in/", progress=False)  # run B, beside A
    assert s3.get_file_info(pending.temp).type == pafs.FileType.File  # A's part survived B's start and end
    first.commit(pending)
    sources = rows_of("s3://data/both", "pose")["source"].to_pylist()
    assert sorted(sources) == sorted([row["source"], *(f"s3://data/both-in/{p.name}" for p in made)])
    # a dead run's part, once stale, is anyone's to clean; a live one's never
    dead = Store("s3://data/both", run_id="dead").write(pose, rows_table(pose, [row]))
    assert Store("s3://data/both").clean(pose) == 0 and s3.get_file_info(dead.temp).type == pafs.FileType.File
    monkeypatch.setattr(store_module, "STALE_SECONDS", -1.0)
    assert Store("s3://data/both").clean(pose) == 1


def test_a_driver_killed_midway_leaves_committed_rows(joined, tiny_checkpoints, tmp_path):
    """Rows are finished as they come out of the forward and committed in small parts as they
    come: SIGKILL the driver (a process of its own) once its first part is committed, and those
    rows are there to read, with the settings written with the first part, and progress lines
    printed (stdout is a pipe, not a terminal)."""
    made = photos(tmp_path / "in", 16, corrupt=False)
    out = tmp_path / "out"
    args = ["batch", "pose", str(tmp_path / "in"), "--out", str(out), "--engine", "ray", "--address",
            joined.cluster.address, "--checkpoint", f"pose={tiny_checkpoints['pose']}", *POSE, "--batch-size", "1",
            "--rows-per-part", "2"]  # fmt: skip
    env = {**joined.cluster.env, "SAPIENS2_PROGRESS_SECONDS": "0.5", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "sapiens2", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    parts = lambda: list((out / "pose").glob("part-*.parquet"))  # noqa: E731
    wait_until(lambda: bool(parts()) or proc.poll() is not None, 300)
    proc.send_signal(signal.SIGKILL)
    printed, errors = proc.communicate(timeout=60)
    committed = len(parts())
    assert 1 <= committed < len(made) // 2, f"not killed midway ({committed} parts): {errors[-2000:]}"
    rows = batch.read_task(str(out), "pose")
    assert rows.num_rows == 2 * committed and rows["error"].null_count == rows.num_rows
    assert (out / "pose" / JOB_FILE).is_file()
    assert "progress: " in printed and "/16 photos · " in printed and " rows/s · 0 errors" in printed


def test_the_connect_timeout_and_the_shipped_settings_are_checked():
    from sapiens2.batch.cluster import CONNECT_TIMEOUT_ENV, connect_timeout

    assert connect_timeout(None, {}) == 30.0 and connect_timeout(None, {CONNECT_TIMEOUT_ENV: "2.5"}) == 2.5
    assert connect_timeout(4, {CONNECT_TIMEOUT_ENV: "9"}) == 4.0  # the flag before the variable
    with pytest.raises(OptionError, match=r"\$SAPIENS2_RAY_CONNECT_TIMEOUT takes seconds"):
        connect_timeout(None, {CONNECT_TIMEOUT_ENV: "soon"})
    with pytest.raises(OptionError, match="--connect-timeout takes seconds between"):
        connect_timeout(-1)
    given = {"AWS_ENDPOINT_URL": "http://s3", "HF_HOME": "/hf", "SAPIENS2_CPUS": "1", "PATH": "/bin",
             "RAY_ADDRESS": "auto", "HF_TOKEN": "", "SAPIENS2_CHECKPOINTS": "/w"}  # fmt: skip
    assert shipped_env(given) == {
        "AWS_ENDPOINT_URL": "http://s3",
        "HF_HOME": "/hf",
        "SAPIENS2_CHECKPOINTS": "/w",
    }
