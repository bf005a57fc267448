"""Weights from the Hub when it cannot be reached (a refused port, a server that never answers):
a clear error within seconds instead of huggingface_hub's ~24 s of silent retries, cached files
still served at once; and, with a Hub that answers, a download that shows its progress.

Each case runs in a fresh interpreter: huggingface_hub reads ``HF_ENDPOINT`` once, at import."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from tiny_checkpoints import place_hf_cache

ROOT = Path(__file__).resolve().parent.parent
#: The fast paths wait at most the probe's 3 s; huggingface_hub alone waits 10 s per request
#: (HF_HUB_ETAG_TIMEOUT) and, in some versions, retries for ~24 s before it gives up or uses the
#: cache. Bounds with room for a busy machine: the whole call (imports included) ...
FAST_S = 12.0
#: ... and one request as the silent server times it, from the connection to the client's hang-up
#: (a timer's wait, which a busy machine barely stretches): the probe's 3 s, not huggingface_hub's 10 s.
PROBE_HELD_S = 6.5

RESOLVE = """
import json, logging, sys, time
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
from sapiens2.models.loading import resolve_checkpoint
t0 = time.monotonic()
try:
    out = {"path": str(resolve_checkpoint(sys.argv[1], sys.argv[2]))}
except Exception as err:
    out = {"error": type(err).__name__, "message": str(err)}
out["seconds"] = time.monotonic() - t0
print(json.dumps(out))
"""


def _resolve(endpoint: str, cache: Path, task: str = "pose", size: str = "0.4b", **env: str) -> dict:
    """``resolve_checkpoint`` in a fresh interpreter whose Hub is ``endpoint``; its own timing."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "SAPIENS2_"))}
    clean.update(HF_ENDPOINT=endpoint, HF_HUB_CACHE=str(cache), HF_HUB_DISABLE_TELEMETRY="1", **env)
    done = subprocess.run(
        [sys.executable, "-c", RESOLVE, task, size], cwd=ROOT, env=clean, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "stderr": done.stderr}


@pytest.fixture
def refused_port() -> int:
    """A local port nobody listens on (connections are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SilentHub:
    """A port that accepts connections and never answers (a black hole, like a dead proxy), and
    counts them: how many the client opened and how long it kept each before giving up."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port: int = self.sock.getsockname()[1]
        self.held: list[float] = []  # seconds per connection, from accept to the client's close
        self._holders: list[threading.Thread] = []
        self._stop = threading.Event()
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            holder = threading.Thread(target=self._hold, args=(conn, time.monotonic()), daemon=True)
            self._holders.append(holder)
            holder.start()

    def _hold(self, conn: socket.socket, t0: float) -> None:
        with conn:
            while conn.recv(1 << 16):  # read the request, never answer, until the client hangs up
                pass
        self.held.append(time.monotonic() - t0)

    def connections(self) -> list[float]:
        """The hold time of every connection so far (call after the client process has ended)."""
        for holder in list(self._holders):
            holder.join(timeout=10)
        return list(self.held)

    def close(self) -> None:
        self._stop.set()
        self._acceptor.join(timeout=5)
        self.sock.close()


@pytest.fixture
def silent_hub() -> Iterator[SilentHub]:
    hub = SilentHub()
    try:
        yield hub
    finally:
        hub.close()


def _says_what_to_do(message: str, endpoint: str) -> None:
    assert message.startswith("Weights for facebook/sapiens2-pose-0.4b are not in the Hugging Face cache")
    assert f"the Hub cannot be reached: {endpoint}" in message
    for fix in (
        "connect to the internet",
        "SAPIENS2_HUB_TIMEOUT=30",
        "SAPIENS2_CHECKPOINTS=",
        "HF_HUB_OFFLINE=1",
    ):
        assert fix in message, fix


@pytest.mark.subprocess
def test_refused_connection_fails_fast(tmp_path: Path, refused_port: int) -> None:
    endpoint = f"http://127.0.0.1:{refused_port}"
    got = _resolve(endpoint, tmp_path / "cache")
    assert got.get("error") == "WeightsUnavailableError", got
    assert got["seconds"] < FAST_S, f"took {got['seconds']:.1f} s"
    _says_what_to_do(got["message"], endpoint)
    assert "refused or failed the connection (ConnectError" in got["message"]
    assert "Retrying" not in got["stderr"]  # huggingface_hub's backoff never started


@pytest.mark.subprocess
def test_silent_server_fails_within_the_probe_timeout(tmp_path: Path, silent_hub: SilentHub) -> None:
    endpoint = f"http://127.0.0.1:{silent_hub.port}"
    got = _resolve(endpoint, tmp_path / "cache")
    assert got.get("error") == "WeightsUnavailableError", got
    assert 2.5 < got["seconds"] < FAST_S, f"took {got['seconds']:.1f} s"  # waited the 3 s, no retries
    _says_what_to_do(got["message"], endpoint)
    assert "did not answer within 3.0 s" in got["message"]
    # one request, held for the probe's 3 s (huggingface_hub's own would wait 10 s, then retry)
    (held,) = silent_hub.connections()
    assert 2.5 < held < PROBE_HELD_S, held
    quicker = _resolve(endpoint, tmp_path / "cache", SAPIENS2_HUB_TIMEOUT="1")
    assert "did not answer within 1.0 s" in quicker["message"]
    # timed by the server, from the connection to the hang-up: the probe's own wait, not the
    # interpreter's imports, so a busy machine adds little to it
    first, second = silent_hub.connections()
    assert second < 2.5 < first, (first, second)


@pytest.mark.subprocess
def test_cached_weights_are_used_at_once_when_the_hub_is_unreachable(
    tmp_path: Path, silent_hub: SilentHub, tiny_checkpoints: dict[str, Path]
) -> None:
    cached = place_hf_cache(tiny_checkpoints["pose"], tmp_path / "cache", "pose", "0.4b")
    got = _resolve(f"http://127.0.0.1:{silent_hub.port}", tmp_path / "cache")
    assert got.get("path") == str(cached), got
    # the probe's one request, given up after its 3 s, and no other: huggingface_hub's own request
    # (10 s) and retries never started
    (held,) = silent_hub.connections()
    assert held < PROBE_HELD_S and "Retrying" not in got["stderr"], held
    assert got["seconds"] < FAST_S, f"took {got['seconds']:.1f} s"


class _FakeHub(BaseHTTPRequestHandler):
    """Just enough of the Hub's resolve endpoint for ``hf_hub_download`` (HEAD + GET of one file)."""

    payload = b""
    commit = "0" * 40

    def _headers(self) -> None:
        etag = hashlib.sha256(self.payload).hexdigest()
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.payload)))
        self.send_header("ETag", f'"{etag}"')
        self.send_header("X-Repo-Commit", self.commit)
        self.end_headers()

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's naming)
        self._headers()

    def do_GET(self) -> None:  # noqa: N802
        self._headers()
        for i in range(0, len(self.payload), 1 << 16):
            self.wfile.write(self.payload[i : i + (1 << 16)])

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.subprocess
def test_a_real_download_shows_progress(tmp_path: Path, tiny_checkpoints: dict[str, Path]) -> None:
    handler = type(
        "Hub", (_FakeHub,), {"payload": (tiny_checkpoints["pose"] / "model.safetensors").read_bytes()}
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        # TQDM_POSITION=-1: huggingface_hub's switch for bars on a non-terminal stderr (a pipe here)
        got = _resolve(endpoint, tmp_path / "cache", HF_HUB_DISABLE_XET="1", TQDM_POSITION="-1")
    finally:
        server.shutdown()
        server.server_close()
    assert "path" in got, got
    path = Path(got["path"])
    assert path.name == "sapiens2_0.4b_pose.safetensors" and path.read_bytes() == handler.payload
    assert str(tmp_path / "cache") in got["path"]
    said = (
        "sapiens2.models.weights: downloading sapiens2_0.4b_pose.safetensors from facebook/sapiens2-pose-0.4b"
    )
    assert said in got["stderr"]  # before the first byte, whatever the terminal
    bar = [
        line
        for line in got["stderr"].split("\r")
        if "sapiens2_0.4b_pose.safetensors" in line and "100%" in line
    ]
    assert bar, got["stderr"]  # huggingface_hub's progress bar ran to the end
