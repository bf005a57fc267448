"""Finding and reading weight files: explicit path -> $SAPIENS2_CHECKPOINTS -> Hugging Face Hub cache.

Only safetensors are ever read (nothing is unpickled). Nothing here knows about model classes.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import struct
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file

from ..errors import CheckpointError, DiskFullError, WeightsUnavailableError
from ..zerogpu.entry import cuda_emulation
from ..zerogpu.loadguard import check_loading_allowed

log = logging.getLogger(__name__)

ENV_VAR = "SAPIENS2_CHECKPOINTS"
#: Seconds the Hub gets to answer one request before a download is attempted (env override for a
#: slow connection). huggingface_hub itself retries a dead connection for about 24 s in silence.
HUB_TIMEOUT_ENV = "SAPIENS2_HUB_TIMEOUT"
DEFAULT_HUB_TIMEOUT_S = 3.0
#: How long a probe's verdict is reused (a batch of files or requests asks once).
_PROBE_TTL_S = 60.0
_probes: dict[str, tuple[float, str | None]] = {}  # endpoint -> (monotonic time, reason or None)
#: Called with the file's path after each file that had to be downloaded (see ``on_download``).
_DOWNLOAD_LISTENERS: list[Callable[[Path], None]] = []


def on_download(listener: Callable[[Path], None]) -> None:
    """Call ``listener(path)`` after every weight file that had to be downloaded (not after a cache
    hit); used to prune the Hub cache (``sapiens2.models.hub_cache.enable_pruning``). A listener that
    fails is logged, never fatal. Registering the same listener twice has no effect."""
    if listener not in _DOWNLOAD_LISTENERS:
        _DOWNLOAD_LISTENERS.append(listener)


def local_root() -> Path | None:
    """The local checkpoint root named by ``$SAPIENS2_CHECKPOINTS``, if set."""
    root = os.environ.get(ENV_VAR, "").strip()
    return Path(root).expanduser() if root else None


def _pick_in_folder(folder: Path, filenames: Sequence[str]) -> Path:
    for name in (*filenames, "model.safetensors"):
        if (folder / name).is_file():
            return folder / name
    found = sorted(folder.glob("*.safetensors"))
    if len(found) == 1:
        return found[0]
    if not found:
        raise WeightsUnavailableError(f"No .safetensors file in the folder {folder}.")
    names = ", ".join(p.name for p in found[:5])
    raise WeightsUnavailableError(
        f"The folder {folder} holds several .safetensors files ({names}); pass the file itself."
    )


def find_weights(
    repo_id: str,
    filenames: Sequence[str],
    local_path: str,
    checkpoint: str | os.PathLike | None = None,
    revision: str | None = None,
) -> Path:
    """Return the path of a weight file, looking in this order:

    1. ``checkpoint``: a .safetensors file, or a folder holding one;
    2. ``$SAPIENS2_CHECKPOINTS/<local_path>`` (the release's layout, e.g. ``pose/sapiens2_0.4b_pose.safetensors``);
    3. the Hub via ``huggingface_hub`` (its cache; each of ``filenames`` in turn, then ``model.safetensors``).

    Raises ``DiskFullError`` when a download fails for lack of disk space and ``ResidencyError``
    inside a ZeroGPU worker (weights are loaded by the server process, never during a GPU call).
    """
    check_loading_allowed(f"the weights of {repo_id}")
    if checkpoint is not None:
        path = Path(checkpoint).expanduser()
        if path.is_dir():
            return _pick_in_folder(path, filenames)
        if path.is_file():
            return path
        raise WeightsUnavailableError(f"Checkpoint {path} does not exist.")

    root = local_root()
    if root is not None:
        candidate = root / local_path
        if candidate.is_file():
            return candidate
        root_note = f" (${ENV_VAR}={root} is set but {candidate} does not exist)"
    else:
        root_note = ""

    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    tried = list(dict.fromkeys([*filenames, "model.safetensors"]))
    reasons: list[str] = []
    # The Hub gets one quick request first: unreachable, the cache still answers at once and a
    # missing file is an error within seconds instead of after huggingface_hub's retries.
    unreachable = hub_unreachable(repo_id, tried[0], revision)
    local_only = unreachable is not None
    for name in tried:
        try:
            return _from_hub(repo_id, name, revision, local_only)
        except EntryNotFoundError as err:  # not in the repo, or not in the cache: try the next name
            reasons.append(_hub_reason(err))
            # Local* = the Hub could not be asked (offline, timeout, no connection): the next names
            # are looked up in the cache only, so a timeout is not waited out once per name.
            local_only = local_only or isinstance(err, LocalEntryNotFoundError)
        except Exception as err:  # gated repo, no such repo, disk full ...
            full = disk_full_error(err, _hub_cache_dir(), f"Downloading {name} from {repo_id}")
            if full is not None:
                raise full from err
            reasons.append(_hub_reason(err))
            break
    if unreachable is not None:
        raise WeightsUnavailableError(
            f"Weights for {repo_id} are not in the Hugging Face cache{root_note}, and the Hub cannot be "
            f"reached: {unreachable}. Fix it one of these ways: connect to the internet (on a slow "
            f"connection set {HUB_TIMEOUT_ENV}=30), download {tried[0]} from https://huggingface.co/{repo_id} "
            f"yourself and set {ENV_VAR}=/your/root so that /your/root/{local_path} exists, or pass the "
            "file as the checkpoint. Set HF_HUB_OFFLINE=1 to use only files already downloaded.",
            plain=missing_plain(repo_id),
        )
    reason = reasons[0] if reasons else "unknown error"  # the first name's, as the message names it
    raise WeightsUnavailableError(
        f"Weights for {repo_id} are not available here{root_note}: could not get {tried[0]} from the "
        f"Hugging Face Hub ({reason}). Fix it either way: go online so huggingface_hub can download it "
        f"(https://huggingface.co/{repo_id}; accept the licence there if asked), or download the file "
        f"yourself and set {ENV_VAR}=/your/root so that /your/root/{local_path} exists.",
        plain=missing_plain(repo_id),
    )


def missing_plain(repo_id: str) -> str:
    """A visitor's sentence for weights that are neither here nor downloadable: the Hub repository
    and both fixes, in words without the server's paths or settings (the operator's message has them)."""
    return (
        f"This model's weights are not on this server and could not be downloaded from the Hugging Face "
        f"Hub repository {repo_id}, so it cannot run. Either fix is the server operator's: let the server "
        "reach the Hub to download them, or download them there and point the server to the file. "
        "Other tabs may still work."
    )


def hub_timeout() -> float:
    """Seconds for the reachability probe: ``$SAPIENS2_HUB_TIMEOUT`` or 3."""
    try:
        value = float(os.environ.get(HUB_TIMEOUT_ENV, "") or DEFAULT_HUB_TIMEOUT_S)
    except ValueError:
        return DEFAULT_HUB_TIMEOUT_S
    return value if value > 0 else DEFAULT_HUB_TIMEOUT_S


def hub_unreachable(repo_id: str, filename: str, revision: str | None = None) -> str | None:
    """Why the Hub cannot be reached now, or None when it answers (any HTTP status counts, a gated
    or missing file included: huggingface_hub then says what is wrong) or when offline mode is on.

    One HEAD request, no retries, within :func:`hub_timeout` seconds; the verdict is reused for a
    minute per endpoint."""
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub.utils import get_session

    if constants.HF_HUB_OFFLINE:
        return None  # hf_hub_download reads only the cache then: nothing to wait for
    url = hf_hub_url(repo_id, filename, revision=revision)
    endpoint = url.split("/", 3)[2] if "://" in url else url
    seen = _probes.get(endpoint)
    if seen is not None and time.monotonic() - seen[0] < _PROBE_TTL_S:
        return seen[1]
    timeout = hub_timeout()
    t0 = time.monotonic()
    try:
        get_session().head(url, timeout=timeout, follow_redirects=False)
        reason = None
    except Exception as err:  # DNS failure, refused, timeout, proxy or TLS error: all "unreachable"
        where = f"{url.split('/', 3)[0]}//{endpoint}"
        if "timeout" in type(err).__name__.lower():
            reason = f"{where} did not answer within {timeout:.1f} s"
        else:
            reason = f"{where} refused or failed the connection ({type(err).__name__}: {_first_line(err)})"
        log.debug("Hub probe failed after %.1f s: %s", time.monotonic() - t0, reason)
    _probes[endpoint] = (time.monotonic(), reason)
    return reason


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _from_hub(repo_id: str, name: str, revision: str | None, local_only: bool) -> Path:
    """``hf_hub_download`` (tqdm progress included), then mark the file used and tell the
    download listeners when it was not in the cache before."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    cached = isinstance(try_to_load_from_cache(repo_id, name, revision=revision), str)
    if not cached and not local_only:  # huggingface_hub's tqdm bar follows (and the app's progress)
        log.info("downloading %s from %s (first use; cached afterwards)", name, repo_id)
    path = Path(hf_hub_download(repo_id, name, revision=revision, local_files_only=local_only))
    _mark_used(path)
    if not cached:
        for listener in list(_DOWNLOAD_LISTENERS):
            try:
                listener(path)
            except Exception:  # a housekeeping failure must not fail the load
                log.exception("download listener %r failed for %s", listener, path)
    return path


def _mark_used(path: Path) -> None:
    """Set the file's access time to now: the Hub cache's "last accessed" then means last used by
    this package even on filesystems mounted noatime/relatime (hub_cache prunes by it)."""
    try:
        os.utime(path, (time.time(), path.stat().st_mtime))
    except OSError:
        pass  # read-only cache: nothing to record


def _hub_cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def disk_full_error(err: BaseException, folder: str | os.PathLike, what: str) -> DiskFullError | None:
    """A ``DiskFullError`` naming ``folder`` and its free space when ``err`` (or its cause) is
    "no space left on device", else None. ``what`` says what failed ("Downloading X", "Writing Y")."""
    if not _is_disk_full(err):
        return None
    folder = Path(folder)
    try:
        free = f"{shutil.disk_usage(_existing_parent(folder)).free / 1e9:.1f} GB are free there"
    except OSError:
        free = "its free space could not be read"
    return DiskFullError(
        f"The disk is full: {what} into {folder} failed ({err}); {free}. Free some space (for the "
        "Hugging Face cache: `hf cache delete`, or sapiens2.models.hub_cache.prune), or point HF_HUB_CACHE "
        "(or HF_HOME) to a disk with more room, then try again."
    )


def _is_disk_full(err: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno == errno.ENOSPC:
            return True
        if "no space left on device" in str(current).lower():  # e.g. the Xet downloader's errors
            return True
        current = current.__cause__ or current.__context__
    return False


def _existing_parent(folder: Path) -> Path:
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent
    return folder


def _hub_reason(err: BaseException) -> str:
    """A one-line reason for a failed Hub download, naming the network cause when there is one:
    huggingface_hub wraps a timeout or a refused connection in a generic "cannot find" error."""
    first = lambda e: f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"  # noqa: E731
    reason = first(err)
    cause = err.__cause__ or err.__context__
    if cause is not None and cause is not err:
        reason += f"; cause: {first(cause)}"
    if any("timeout" in type(e).__name__.lower() for e in (err, cause) if e is not None):
        reason += "; the Hub did not answer in time, so trying again later may work"
    return reason


def read_header(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """Tensor names -> shapes, read from the safetensors header only (cheap, no tensor data).

    Raises ``CheckpointError`` for a file that is not a valid safetensors file.
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) != 8:
                raise ValueError("file shorter than a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n <= 0 or n > min(100_000_000, path.stat().st_size - 8):
                raise ValueError("bad header length")
            header = json.loads(fh.read(n))
        return {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(
            f"{path} is not a valid safetensors file ({err}). Delete it and download it again "
            "(for the Hub cache: `hf cache delete`, or remove the file)."
        ) from err


def load_tensors(path: str | os.PathLike, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file, read on the CPU and then moved to ``device`` (never
    unpickles; safetensors' direct CUDA reads need a real CUDA context, which ZeroGPU's server
    process does not have)."""
    check_loading_allowed(f"the weights in {path}")
    read_header(path)
    try:
        tensors = load_file(str(path), device="cpu")
    except Exception as err:
        raise CheckpointError(
            f"Could not read {path} ({err}): the file is damaged or incomplete. Delete it and download it again."
        ) from err
    if torch.device(device).type == "cpu":
        return tensors
    with cuda_emulation():
        return {name: t.to(device) for name, t in tensors.items()}
