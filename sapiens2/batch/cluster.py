"""The Ray engine's driver side before any photo: joining a cluster (or starting a local Ray) within
a time limit, the settings shipped to its workers, and a first small task per node that checks a
worker there can read INPUT, write OUT and find the weights (:func:`check_workers`).

Joining: Ray's own ``ray.init(address=...)`` retries for ever where nothing listens, so the
address is first resolved (``auto``: the cluster ``ray start`` recorded on this machine, or
``$RAY_ADDRESS``) and its port tried until :func:`connect_timeout`; only a port that answers is
handed to Ray. The wait sleeps in short steps, so SIGTERM and Ctrl-C end it at once.

Settings: a worker on another node sees only the environment its ``ray start`` had. The variables
the package, pyarrow's filesystems and ``huggingface_hub`` read (:data:`SHIPPED_PREFIXES`) go to
every worker of the run as Ray ``runtime_env`` ``env_vars``. Their names are printed, never their
values.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ..errors import OptionError

#: Env var: seconds to wait for a cluster at ``--address`` (default :data:`DEFAULT_CONNECT_TIMEOUT`).
CONNECT_TIMEOUT_ENV = "SAPIENS2_RAY_CONNECT_TIMEOUT"
DEFAULT_CONNECT_TIMEOUT = 30.0
#: Variables shipped to the workers: the package's, the object stores' and the Hub's settings.
SHIPPED_PREFIXES = ("SAPIENS2_", "AWS_", "HF_", "HUGGINGFACE_", "GOOGLE_", "GCS_", "AZURE_", "FSSPEC_")
#: Driver-only settings, never shipped: a worker keeps to the CPUs Ray gave it (workers.py).
NOT_SHIPPED = frozenset({"SAPIENS2_CPUS", CONNECT_TIMEOUT_ENV})
#: Seconds the first tasks may take to start and check (worker processes start at their pace).
CHECK_TIMEOUT = 180.0


def connect_timeout(given: float | None = None, environ: Mapping[str, str] | None = None) -> float:
    """Seconds to wait for a cluster: ``given`` (``--connect-timeout``), else
    ``$SAPIENS2_RAY_CONNECT_TIMEOUT``, else 30."""
    env = os.environ if environ is None else environ
    raw, where = (given, "--connect-timeout") if given is not None else (env.get(CONNECT_TIMEOUT_ENV), None)
    if raw is None or raw == "":
        return DEFAULT_CONNECT_TIMEOUT
    where = where or f"${CONNECT_TIMEOUT_ENV}"
    try:
        value = float(raw)
    except ValueError:
        raise OptionError(f"{where} takes seconds (a number); got {raw!r}.") from None
    if not 0 < value <= 86400:
        raise OptionError(f"{where} takes seconds between 0 and 86400; got {raw!r}.")
    return value


def shipped_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The driver's variables every worker gets (names by :data:`SHIPPED_PREFIXES`)."""
    env = os.environ if environ is None else environ
    return {
        k: v for k, v in env.items() if k.startswith(SHIPPED_PREFIXES) and k not in NOT_SHIPPED and v != ""
    }


def gcs_host_port(address: str) -> tuple[str, int]:
    """(host, port) Ray would join for ``address``: ``auto``, ``host:port`` or ``ray://host:port``."""
    if address.startswith("ray://"):
        target = address[len("ray://") :].rstrip("/")
    else:
        from ray._private import services

        try:
            target = services.canonicalize_bootstrap_address_or_die(address)
        except (ConnectionError, ValueError) as err:
            raise OptionError(f"--address {address}: {' '.join(str(err).split())}") from None
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise OptionError(f"--address takes auto, HOST:PORT or ray://HOST:PORT; got {address!r}.")
    return host.strip("[]"), int(port)


def wait_for_port(host: str, port: int, timeout: float, what: str) -> None:
    """Return once ``host:port`` accepts a connection; OptionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(2.0, timeout)):
                return
        except OSError as err:
            last = err.strerror or type(err).__name__
        if time.monotonic() >= deadline:
            raise OptionError(
                f"No Ray cluster at {what} ({host}:{port}: {last.lower()} for {timeout:g} s). Start one "
                f"(ray start --head), check --address, or wait longer (--connect-timeout, ${CONNECT_TIMEOUT_ENV})."
            )
        time.sleep(0.25)


def _package_path() -> str:
    """The folder holding the ``sapiens2`` package, for local workers to import it from."""
    from pathlib import Path

    return str(Path(__file__).resolve().parents[2])


@contextmanager
def connected(opts: Any) -> Iterator[dict[str, float]]:
    """Ray for the run (``opts``: :class:`~.ray_engine.RayOptions`): the cluster at its address,
    joined within the connect timeout, or a local Ray (bound to 127.0.0.1, no dashboard); yields
    the cluster's resources and, when this call started Ray, stops it at the end. A Ray already
    initialised in this process is used as it is."""
    import ray

    if ray.is_initialized():
        yield ray.cluster_resources()
        return
    env = shipped_env()
    if opts.address:
        host, port = gcs_host_port(opts.address)
        wait_for_port(host, port, connect_timeout(opts.connect_timeout), f"--address {opts.address}")
        try:
            ray.init(address=opts.address, log_to_driver=True, runtime_env={"env_vars": env})
        except ConnectionError as err:  # it answers but will not let us in (a token, another version)
            raise OptionError(
                f"Could not join the Ray cluster at {host}:{port}: {' '.join(str(err).split())}. A cluster "
                "with token authentication needs RAY_AUTH_MODE=token and its token here (docs/SCALE.md)."
            ) from None
    else:
        path = os.pathsep.join(p for p in (_package_path(), os.environ.get("PYTHONPATH", "")) if p)
        from ..runtime.cpus import available_cpus

        ray.init(
            num_cpus=opts.cpus or available_cpus(),
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            object_store_memory=opts.object_store_bytes,
            runtime_env={"env_vars": {**env, "PYTHONPATH": path}},
        )
    try:
        resources = ray.cluster_resources()
        if opts.address:
            shipped = ", ".join(sorted(env)) or "none"
            print(
                f"ray: joined {opts.address} ({len(alive_nodes())} node(s), {resources.get('CPU', 0):g} CPUs, "
                f"{resources.get('GPU', 0):g} GPUs); settings shipped to the workers: {shipped}",
                file=sys.stderr,
            )
        yield resources
    finally:
        ray.shutdown()


def alive_nodes() -> list[dict[str, Any]]:
    """The cluster's live nodes that run work (some CPU or GPU)."""
    import ray

    return [
        n
        for n in ray.nodes()
        if n.get("Alive") and (n["Resources"].get("CPU", 0) > 0 or n["Resources"].get("GPU", 0) > 0)
    ]


__all__ = [
    "CONNECT_TIMEOUT_ENV",
    "connect_timeout",
    "connected",
    "gcs_host_port",
    "shipped_env",
    "wait_for_port",
]
