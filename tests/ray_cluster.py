"""A real Ray cluster of two raylets on this machine, as a data engineer's would be: ``ray start
--head`` and a second ``ray start --address``, each with 1 CPU, its own temp folder, free ports and
its own token (Ray 2.60's token authentication), stopped by process id (never ``ray stop``,
which ends every Ray on the machine). Used by tests/test_batch_cluster.py and bench/batch.py.

Ray binds ``ray start`` to the machine's address (it turns 127.0.0.1 into it), so the cluster is
reachable from this machine's network; the token keeps others out.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    """A started cluster: its address, the environment a driver needs, and its folder."""

    address: str
    env: dict[str, str]
    folder: Path
    pids: list[int] = field(default_factory=list)

    def cpu_seconds(self) -> float:
        """CPU seconds (user + system, with reaped children) the cluster's processes used so far."""
        total = 0.0
        for pid in _processes_of(str(self.folder)):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")
            except (OSError, IndexError, ValueError):
                continue
        return total

    def stop(self) -> None:
        """SIGTERM every process of this cluster (found by its folder, and their children), then
        SIGKILL what is left."""
        procs = _processes_of(str(self.folder))
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in procs:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            if not wait_until(lambda: not any(_alive(p) for p in procs), 5.0):
                continue
            break
        shutil.rmtree(self.folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _processes_of(marker: str) -> list[int]:
    """Processes whose command line holds ``marker``, and all their descendants (from /proc)."""
    parent, found = {}, set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if marker in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                found.add(int(d.name))
        except (OSError, IndexError, ValueError):
            continue
    grew = True
    while grew:
        kids = {pid for pid, ppid in parent.items() if ppid in found} - found
        grew = bool(kids)
        found |= kids
    return sorted(found)


def start_cluster(nodes: int = 2, cpus: int = 1, object_store_mb: int = 150, token: bool = True) -> Cluster:
    """Start the cluster (RuntimeError with Ray's output when a node does not start). ``token``:
    Ray's token authentication, with a token of its own; a driver then needs :func:`auth_env` set
    before it imports Ray (Ray reads ``RAY_AUTH_MODE`` once, at import), so a process that has
    imported Ray already joins a cluster without it."""
    folder = Path(tempfile.mkdtemp(prefix="s2ray-", dir="/tmp"))  # short: Ray's socket paths
    auth = {"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN_PATH": ""}
    if token:
        (folder / "token").write_text(secrets.token_hex(32))
        auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(folder / "token")}
    env = {
        **os.environ,
        **auth,
        "RAY_USAGE_STATS_ENABLED": "0",
        # the nodes import the package from this checkout (settings set before `ray start`)
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("RAY_ADDRESS", None)
    port = free_port()
    ray = str(Path(sys.executable).with_name("ray"))

    def common() -> list[str]:  # each node its own ports: they share this machine
        return ["--num-cpus", str(cpus), "--num-gpus", "0", "--temp-dir", str(folder / "t"),
                "--object-store-memory", str(object_store_mb << 20), "--disable-usage-stats",
                "--dashboard-agent-listen-port", "0", "--metrics-export-port", str(free_port()),
                "--runtime-env-agent-port", str(free_port())]  # fmt: skip

    head = [ray, "start", "--head", "--port", str(port), "--include-dashboard", "false",
            "--dashboard-port", str(free_port())]  # fmt: skip
    cluster = Cluster("", env, folder)
    try:
        _run([*head, *common()], env)
        address = (folder / "t" / "ray_current_cluster").read_text().strip()
        cluster.address = address
        for _ in range(nodes - 1):
            _run([ray, "start", "--address", address, *common()], env)
        _wait_for_nodes(cluster, nodes)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _run(cmd: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} failed: {(done.stdout + done.stderr)[-2000:]}")


def _wait_for_nodes(cluster: Cluster, nodes: int, timeout: float = 120) -> None:
    """Until the GCS lists ``nodes`` live raylets (a driver then sees every node's CPUs); this
    process joins and leaves again."""
    with auth_env(cluster):
        import ray  # after the token settings, for a process that has not imported Ray yet

        ray.init(address=cluster.address, log_to_driver=False)
        try:
            if not wait_until(lambda: len([n for n in ray.nodes() if n["Alive"]]) >= nodes, timeout, 0.2):
                raise RuntimeError(f"the cluster at {cluster.address} has not {nodes} live nodes")
        finally:
            ray.shutdown()


@contextlib.contextmanager
def auth_env(cluster: Cluster):
    """This process's environment holds the cluster's token settings meanwhile (a driver needs them
    before it imports Ray)."""
    keys = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_USAGE_STATS_ENABLED")
    before = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: cluster.env[k] for k in keys if cluster.env[k]})
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    return free_port()


def wait_until(check, timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(step)
    return False
