"""Load test of the Space: concurrent gradio_client jobs against the real app on 127.0.0.1.

The app (``app.build_demo``) runs in a child process with tiny random checkpoints written to a
temporary folder, so it needs no weights and no network. The script then

1. warms up with 20 mixed requests and reads the server's resident memory (RSS);
2. sends ``--jobs`` concurrent jobs at once (mixed tasks): every job must answer, none be lost;
3. continues to ``--requests`` requests in all and reads the RSS again (no leak: within 10%);
4. counts the request folders and Gradio's cached files, waits for both cleaners, and checks
   what Gradio's cleaner promises (``delete_cache``): every file older than the age is gone, the
   younger ones and the app's kept copies (example photos) stay;
5. starts a second server with a small queue (``--overflow-queue``) and floods it: the jobs beyond
   the bound must get Gradio's "Queue is full! Please try again." at once instead of hanging, and
   the next request after the flood must succeed.

Every wait is bounded and both servers stop by themselves (``--deadline``). Exit status 0 when
every check passes. Not a test: latencies depend on the machine and what else runs on it.

    python bench/load.py                       # 50 concurrent jobs, 200 requests, quarter-size input
    python bench/load.py --jobs 20 --requests 60 --input native
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TASK_NAMES = ("pose", "seg", "normal", "pointmap", "matting", "features")
WARMUP = 20  # requests before the first memory reading: every model is loaded by then
RSS_TOLERANCE = 0.10
BUSY = "Queue is full"


# ----------------------------------------------------------------------------- server (child)


def serve(args: argparse.Namespace) -> None:
    """Child process: the app with tiny checkpoints, until the deadline or the parent goes."""
    sys.path.insert(0, str(ROOT))
    import torch

    torch.set_num_threads(args.threads)
    import app
    from sapiens2 import serving
    from sapiens2.tasks import pipeline

    # Shortened cache ages so that the bench can watch Gradio's cleaner work (the app: 15/30 min).
    app.DELETE_CACHE = (args.cache_every, args.cache_age)
    ckpt = Path(args.checkpoints)
    input_hw = None if args.input == "native" else tuple(int(v) for v in args.input.split("x"))

    def factory(task: str, size: str | None, **kwargs: Any) -> Any:
        pipe = pipeline(task, size, **kwargs)
        if input_hw and task != "pointmap":  # the pointmap's scale branch is sized for 1024x768
            pipe.input_hw = input_hw
        return pipe

    manager = serving.ModelManager(
        device="cpu", checkpoints={t: ckpt / t for t in TASK_NAMES}, factory=factory
    )
    folders = serving.RequestFolders(args.requests_dir, max_age_s=args.folder_age)
    demo = app.build_demo(manager, max_queue=args.max_queue, folders=folders)
    _, url, _ = app.launch(demo, host="127.0.0.1", port=args.port, prevent_thread_lock=True, quiet=True)
    print(f"URL {url}", flush=True)
    parent = os.getppid()
    stop = time.monotonic() + args.deadline
    while time.monotonic() < stop and os.getppid() == parent:  # bounded; ends with the parent
        time.sleep(0.5)
    demo.close()


# ----------------------------------------------------------------------------- client side


@dataclass
class Server:
    process: subprocess.Popen
    url: str
    requests_dir: Path
    cache_dir: Path
    #: Gradio's cache as the server started, before any request: the copies the app keeps
    #: (example photos, ``keep_in_cache``), which the cleaner must never delete
    kept: set[Path] = field(default_factory=set)

    def rss_mb(self) -> float:
        """Resident memory of the server process (Linux /proc), MiB."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("VmRSS not found")


@contextmanager
def server(tmp: Path, name: str, args: argparse.Namespace, max_queue: int) -> Iterator[Server]:
    """Start the app in a child process on a free 127.0.0.1 port; stop it on exit."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    work = tmp / name
    (work / "empty_root").mkdir(parents=True)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "SAPIENS2_CHECKPOINTS": str(work / "empty_root"),  # no detector weights: whole-image boxes
        "GRADIO_TEMP_DIR": str(work / "gradio"),
        "GRADIO_EXAMPLES_CACHE": str(work / "examples"),
        "GRADIO_ANALYTICS_ENABLED": "False",
    }
    cmd = [
        sys.executable, __file__, "--serve", "--port", str(port), "--max-queue", str(max_queue),
        "--checkpoints", str(tmp / "checkpoints"), "--requests-dir", str(work / "requests"),
        "--deadline", str(args.deadline), "--input", args.input, "--threads", str(args.threads),
        "--folder-age", str(args.folder_age), "--cache-every", str(args.cache_every),
        "--cache-age", str(args.cache_age),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = _wait_for_url(proc, timeout=180)
        cache = work / "gradio"
        yield Server(proc, url, work / "requests", cache, kept=set(list_files(cache)))
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _wait_for_url(proc: subprocess.Popen, timeout: float) -> str:
    found: list[str] = []
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith("URL ") and not found:
                found.append(line.split()[1])
        # keep draining so the child never blocks on a full pipe

    threading.Thread(target=read, daemon=True).start()
    stop = time.monotonic() + timeout
    while not found and time.monotonic() < stop and proc.poll() is None:
        time.sleep(0.2)
    if not found:
        raise SystemExit("the server did not start:\n" + "".join(lines[-30:]))
    return found[0]


def make_photos(folder: Path, n: int = 8) -> list[Path]:
    """``n`` tinted copies of an example photo, so that results (and cached files) differ."""
    import numpy as np
    from PIL import Image

    base = np.asarray(Image.open(ROOT / "assets" / "pexels-cc0-jockey-horse-racing.jpg").convert("RGB"))
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        tint = np.array([(i * 37) % 60, (i * 53) % 60, (i * 71) % 60], np.int16)
        img = np.clip(base.astype(np.int16) + tint - 30, 0, 255).astype(np.uint8)
        paths.append(folder / f"photo_{i}.jpg")
        Image.fromarray(img).save(paths[-1], quality=90)
    return paths


def request_for(i: int, photos: list[Path]) -> tuple[str, tuple]:
    """The i-th request of the mixed stream: (api_name, arguments)."""
    from gradio_client import handle_file

    p = handle_file(str(photos[i % len(photos)]))
    calls = [
        ("/pose", (p, "0.4b", 0.3, False, True, False, True, 20)),
        ("/seg", (p, "0.4b", 0.5, [])),
        ("/normal", (p, "0.4b", False, "black")),
        ("/pointmap", (p, "0.4b", False)),
        ("/matting", (p, "1b", "#00b140", None)),
        ("/features", (p, "0.1b")),
    ]
    return calls[i % len(calls)]


@dataclass
class Outcome:
    api: str
    seconds: float
    error: str | None = None  # None: answered
    lost: bool = False  # neither answered nor failed within the timeout


@dataclass
class Tally:
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def answered(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.error is None and not o.lost]

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.error is not None]

    @property
    def lost(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.lost]


def run_jobs(client: Any, indices: range, photos: list[Path], parallel: int, timeout: float) -> Tally:
    """Send the requests ``indices`` with at most ``parallel`` in flight; every job is accounted for."""
    tally = Tally()
    lock = threading.Lock()
    todo = iter(indices)

    def one(i: int) -> Outcome:
        api, call_args = request_for(i, photos)
        t0 = time.perf_counter()
        job = client.submit(*call_args, api_name=api)
        try:
            job.result(timeout=timeout)
            return Outcome(api, time.perf_counter() - t0)
        except TimeoutError:
            return Outcome(api, time.perf_counter() - t0, "timeout", lost=True)
        except Exception as err:  # an error the server sent (or the queue-full refusal)
            return Outcome(api, time.perf_counter() - t0, f"{type(err).__name__}: {err}")

    def worker() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            out = one(i)
            with lock:
                tally.outcomes.append(out)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(parallel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout * (len(indices) // parallel + 2))
    return tally


def count_files(folder: Path) -> tuple[int, float]:
    files = [p for p in folder.rglob("*") if p.is_file()] if folder.exists() else []
    return len(files), sum(p.stat().st_size for p in files) / 2**20


def list_files(folder: Path) -> dict[Path, float]:
    """Every file under ``folder`` -> its ctime (what Gradio's cleaner ages files by)."""
    out: dict[Path, float] = {}
    for path in folder.rglob("*") if folder.exists() else ():
        try:
            if path.is_file():
                out[path] = path.lstat().st_ctime
        except FileNotFoundError:  # deleted by the cleaner while we looked
            continue
    return out


@dataclass
class CacheVerdict:
    """Gradio's ``delete_cache=(every, age)`` promise, checked on two listings of its cache: every
    ``every`` seconds it deletes the app's files whose ctime is more than ``age`` seconds old,
    except the copies the app keeps. ``old``: files past the age at the first listing (not kept);
    ``young``: files still under the age at the second one."""

    old: list[Path]
    young: list[Path]
    old_left: list[Path]  # past the age, still there after the cleaner's runs: a cleaner that fails
    young_gone: list[Path]  # under the age, deleted anyway: a cleaner that deletes too much
    kept_gone: list[Path]  # the app's kept copies, deleted

    @property
    def ok(self) -> bool:
        """True when the cleaner kept its promise and the listings tested both sides of it."""
        tested = bool(self.old) and bool(self.young)
        return tested and not (self.old_left or self.young_gone or self.kept_gone)


def judge_cache(
    kept: set[Path],
    first: dict[Path, float],
    first_at: float,
    second: dict[Path, float],
    second_at: float,
    age: float,
    margin: float = 1.0,
) -> CacheVerdict:
    """Compare two listings (``list_files``) taken at ``first_at`` and ``second_at`` (time.time()),
    with at least one cleaner run between them. ``margin`` seconds around the age absorb the
    timestamps' resolution: a file that close to the age may go either way and is not judged."""
    old = sorted(p for p, c in first.items() if p not in kept and first_at - c > age + margin)
    # a file whose ctime moved on was handed out again (Gradio touches a reused copy): young again
    old_left = [p for p in old if p in second and second_at - second[p] > age + margin]
    young = sorted(p for p, c in first.items() if p not in kept and second_at - c < age - margin)
    young_gone = [p for p in young if p not in second]
    kept_gone = sorted(p for p in kept if p not in second)
    return CacheVerdict(old, young, old_left, young_gone, kept_gone)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def wait_until(check: Callable[[], bool], timeout: float) -> bool:
    stop = time.monotonic() + timeout
    while time.monotonic() < stop:
        if check():
            return True
        time.sleep(1)
    return check()


# ----------------------------------------------------------------------------- the run


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The three phases on freshly made tiny checkpoints; the report with its pass/fail checks."""
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_checkpoints import make_tiny_checkpoint

    report: dict[str, Any] = {"jobs": args.jobs, "requests": args.requests, "input": args.input}
    checks: dict[str, bool] = {}
    with tempfile.TemporaryDirectory(prefix="sapiens2-load-") as tmp_name:
        tmp = Path(tmp_name)
        for i, task in enumerate(TASK_NAMES):
            make_tiny_checkpoint(task, tmp / "checkpoints" / task, seed=i)
        photos = make_photos(tmp / "photos")
        queue = max(args.jobs + 8, 32)  # room for the whole burst: this phase tests answering
        with server(tmp, "main", args, max_queue=queue) as srv:
            client = _client(srv, args.jobs + 8)
            answering_phase(client, srv, args, photos, queue, report, checks)
            cleaning_phase(client, srv, args, photos, report, checks)
        with server(tmp, "small_queue", args, max_queue=args.overflow_queue) as srv:
            overflow_phase(_client(srv, args.overflow_jobs + 8), args, photos, report, checks)
    report["checks"] = checks
    return report


def _client(srv: Any, workers: int) -> Any:
    from gradio_client import Client

    return Client(srv.url, verbose=False, download_files=False, max_workers=workers)


def answering_phase(
    client: Any, srv: Any, args: argparse.Namespace, photos: list[Path], queue: int,
    report: dict[str, Any], checks: dict[str, bool],
) -> None:  # fmt: skip
    """Warm-up, the concurrent burst, then requests up to ``--requests`` with RSS read every 20."""
    warm = run_jobs(client, range(0, WARMUP), photos, parallel=4, timeout=args.job_timeout)
    rss_20 = srv.rss_mb()
    t0 = time.perf_counter()
    burst = run_jobs(client, range(WARMUP, WARMUP + args.jobs), photos, args.jobs, args.job_timeout)
    burst_s = time.perf_counter() - t0
    curve = {WARMUP: round(rss_20, 1), WARMUP + args.jobs: round(srv.rss_mb(), 1)}
    rest = Tally()
    for start in range(WARMUP + args.jobs, args.requests, WARMUP):  # RSS every 20 requests
        stop = min(start + WARMUP, args.requests)
        rest.outcomes += run_jobs(client, range(start, stop), photos, 4, args.job_timeout).outcomes
        curve[stop] = round(srv.rss_mb(), 1)
    rss_200 = srv.rss_mb()
    every = [*warm.outcomes, *burst.outcomes, *rest.outcomes]
    lat = [o.seconds for o in burst.answered]
    ok_s = [o.seconds for o in every if o.error is None]
    report["burst"] = {
        "sent": args.jobs,
        "answered": len(burst.answered),
        "errors": len(burst.failed),
        "lost": len(burst.lost),
        "error_kinds": dict(Counter((o.error or "")[:80] for o in burst.failed)),
        "p50_s": round(pct(lat, 0.50), 2),
        "p95_s": round(pct(lat, 0.95), 2),
        "wall_s": round(burst_s, 1),
        "max_queue": queue,
    }
    report["all_requests"] = {
        "sent": len(every),
        "answered": sum(o.error is None and not o.lost for o in every),
        "errors": sum(o.error is not None for o in every),
        "lost": sum(o.lost for o in every),
        "p50_s": round(pct(ok_s, 0.50), 2),
        "p95_s": round(pct(ok_s, 0.95), 2),
    }
    growth = rss_200 / rss_20 - 1
    report["rss_mb"] = {
        f"after_{WARMUP}": round(rss_20, 1),
        f"after_{args.requests}": round(rss_200, 1),
        "growth_pct": round(100 * growth, 1),
        "by_requests": curve,
    }
    checks["burst: every job answered, none lost"] = len(burst.answered) == args.jobs
    checks[f"all {len(every)} requests answered"] = report["all_requests"]["answered"] == len(every)
    checks[f"RSS after {args.requests} within 10% of after {WARMUP}"] = abs(growth) <= RSS_TOLERANCE


def cleaning_phase(
    client: Any, srv: Any, args: argparse.Namespace, photos: list[Path],
    report: dict[str, Any], checks: dict[str, bool],
) -> None:  # fmt: skip
    """Old request folders and Gradio's cached outputs are deleted once past their ages."""
    folders_now, _ = count_files(srv.requests_dir)
    cache_now, cache_mb = count_files(srv.cache_dir)
    before = list_files(srv.cache_dir)  # all past the age after the wait; the cleaner may start early
    req_dirs = lambda: len(list(srv.requests_dir.glob("req-*")))  # noqa: E731
    dirs_now = req_dirs()
    # wait past both ages, then one request makes RequestFolders prune (and gives the cache young
    # files); Gradio's cleaner runs on its own every --cache-every seconds
    time.sleep(max(args.folder_age, args.cache_age) + 1)
    after = run_jobs(client, range(args.requests, args.requests + 1), photos, 1, args.job_timeout)
    # one listing of both: a file handed out again since (same bytes, same path) counts as its new self
    first_at, first = time.time(), {**before, **list_files(srv.cache_dir)}
    pruned = wait_until(lambda: req_dirs() <= 2, args.cache_every * 3)
    # until the old files are gone (two periods after the first listing at most: at least one run)
    old = [p for p, c in first.items() if p not in srv.kept and first_at - c > args.cache_age + 1]
    wait_until(lambda: not any(p.exists() for p in old), args.cache_every * 2 + 1)
    second_at, second = time.time(), list_files(srv.cache_dir)
    verdict = judge_cache(srv.kept, first, first_at, second, second_at, args.cache_age)
    report["temp_files"] = {
        "request_folders_before": dirs_now,
        "request_files_before": folders_now,
        "request_folders_after": req_dirs(),
        "gradio_cache_files_before": cache_now,
        "gradio_cache_mb_before": round(cache_mb, 1),
        "gradio_cache_files_after": len(second),
        "gradio_cache": {
            "kept_copies": len(srv.kept),
            "older_than_age": len(verdict.old),
            "younger_than_age": len(verdict.young),
            "old_left": [str(p.relative_to(srv.cache_dir)) for p in verdict.old_left],
            "young_deleted": [str(p.relative_to(srv.cache_dir)) for p in verdict.young_gone],
            "kept_deleted": [str(p.relative_to(srv.cache_dir)) for p in verdict.kept_gone],
        },
        "folder_age_s": args.folder_age,
        "cache_age_s": args.cache_age,
    }
    checks["request folders pruned"] = pruned and len(after.answered) == 1
    checks["Gradio cache: every file past the age gone, younger and kept ones stay"] = verdict.ok


def overflow_phase(
    client: Any, args: argparse.Namespace, photos: list[Path], report: dict[str, Any], checks: dict[str, bool]
) -> None:
    """A flood past the queue bound gets quick "busy" errors, loses nothing, and the next request works."""
    run_jobs(client, range(0, 6), photos, parallel=2, timeout=args.job_timeout)  # load the models
    t0 = time.perf_counter()
    flood = run_jobs(client, range(0, args.overflow_jobs), photos, args.overflow_jobs, args.job_timeout)
    flood_s = time.perf_counter() - t0
    busy = [o for o in flood.failed if BUSY in (o.error or "")]
    other = [o for o in flood.failed if BUSY not in (o.error or "")]
    nxt = run_jobs(client, range(1, 2), photos, 1, args.job_timeout)
    report["overflow"] = {
        "max_queue": args.overflow_queue,
        "sent": args.overflow_jobs,
        "answered": len(flood.answered),
        "busy_errors": len(busy),
        "other_errors": len(other),
        "lost": len(flood.lost),
        "busy_message": busy[0].error if busy else None,
        "slowest_busy_error_s": round(max((o.seconds for o in busy), default=float("nan")), 2),
        "wall_s": round(flood_s, 1),
        "next_request_answered": len(nxt.answered) == 1,
    }
    checks["beyond the queue bound: 'busy, try again' errors"] = bool(busy) and not other
    checks["no job hangs or is lost in the flood"] = (
        not flood.lost and len(flood.outcomes) == args.overflow_jobs
    )
    checks["busy errors come at once (< 5 s)"] = bool(busy) and max(o.seconds for o in busy) < 5
    checks["the next request after the flood succeeds"] = len(nxt.answered) == 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=50, help="concurrent jobs in the burst")
    ap.add_argument(
        "--requests", type=int, default=200, help="requests in all (memory is read after 20 and this many)"
    )
    ap.add_argument("--overflow-queue", type=int, default=4, help="queue bound of the second server")
    ap.add_argument("--overflow-jobs", type=int, default=24, help="jobs sent at once to the second server")
    ap.add_argument(
        "--input", default="256x192", help="network input HxW of the tiny models, or 'native' (1024x768)"
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads in the server")
    ap.add_argument("--job-timeout", type=float, default=300.0, help="seconds before a job counts as lost")
    ap.add_argument("--deadline", type=float, default=1800.0, help="each server stops itself after this")
    ap.add_argument(
        "--folder-age", type=float, default=20.0, help="request folders older than this are pruned"
    )
    ap.add_argument("--cache-every", type=int, default=10, help="Gradio cache cleaner period (s)")
    ap.add_argument(
        "--cache-age", type=int, default=20, help="Gradio cache files older than this are deleted (s)"
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the report here")
    # child-process options
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--max-queue", type=int, default=32, help=argparse.SUPPRESS)
    ap.add_argument("--checkpoints", default="", help=argparse.SUPPRESS)
    ap.add_argument("--requests-dir", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.requests < WARMUP + args.jobs:
        ap.error(f"--requests must be at least {WARMUP} + --jobs")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        serve(args)
        return 0
    t0 = time.perf_counter()
    report = run(args)
    report["total_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    failed = [name for name, ok in report["checks"].items() if not ok]
    print("FAILED: " + "; ".join(failed) if failed else f"all {len(report['checks'])} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
