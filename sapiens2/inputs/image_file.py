"""An image's bytes, read safely: a path must name a regular file (opened without blocking, so a
FIFO or a device is refused, never read), and at most ``max_bytes`` are read from a file, a file
object or bytes."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import IO

from ..errors import InputImageError
from .limits import MAX_FILE_BYTES


def safe_stem(filename: str | Path) -> str:
    """The export stem of a file name: one rule for the whole package (export.file_stem)."""
    from ..outputs.export import file_stem  # local: export pulls in render, which intake does not need

    return file_stem(filename)


def read_bytes(src: object, max_bytes: int) -> tuple[bytes, str]:
    if isinstance(src, (bytes, bytearray, memoryview)):
        if len(src) > max_bytes:
            raise InputImageError(_too_many_bytes(max_bytes, len(src)))
        return bytes(src), "image"
    if isinstance(src, (str, Path)):
        path = Path(src)
        return read_image_file(path, max_bytes), safe_stem(path.name)
    if hasattr(src, "read"):
        return _read_capped(src, max_bytes), safe_stem(getattr(src, "name", "") or "")
    raise InputImageError(
        f"Unsupported image input of type {type(src).__name__}; pass a file path, bytes, a PIL image "
        "or a numpy array."
    )


_NOT_REGULAR = {  # what a path names when it is not a regular file, for the message
    stat.S_IFDIR: "a folder",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def _check_regular(mode: int, name: str) -> None:
    if not stat.S_ISREG(mode):
        kind = _NOT_REGULAR.get(stat.S_IFMT(mode), "not a regular file")
        raise InputImageError(f"{name!r} is {kind}, not an image file.")


def read_image_file(path: Path, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file, at most ``max_bytes`` (never blocks, never reads a device).

    ``stat`` first, so a device is never even opened (opening some has side effects); then an
    ``O_NONBLOCK`` open, so a FIFO swapped in meanwhile cannot block, and ``fstat`` on what was
    actually opened, so nothing but a regular file is ever read.
    """
    name = path.name
    flags = (
        os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)
    )
    try:
        _check_regular(os.stat(path).st_mode, name)
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputImageError(f"Image file not found: {name!r}.") from None
    except OSError as e:
        raise InputImageError(f"Could not read the image file {name!r}: {e.strerror or e}.") from None
    with open(fd, "rb") as f:  # owns fd from here: closed on every path
        info = os.fstat(fd)
        _check_regular(info.st_mode, name)
        if info.st_size > max_bytes:
            raise InputImageError(_too_many_bytes(max_bytes, info.st_size))
        try:
            return _read_capped(f, max_bytes)
        except OSError as e:
            raise InputImageError(f"Could not read the image file {name!r}: {e.strerror or e}.") from None


def _read_capped(f: IO[bytes], max_bytes: int) -> bytes:
    """Read a binary file object to its end, refusing it once it gives more than ``max_bytes``."""
    chunks: list[bytes] = []
    total = 0
    while total <= max_bytes:
        chunk = f.read(max_bytes + 1 - total)
        if not isinstance(chunk, (bytes, bytearray)):
            raise InputImageError("The file object must be opened in binary mode ('rb') and blocking.")
        if not chunk:
            return b"".join(chunks)
        chunks.append(bytes(chunk))
        total += len(chunk)
    raise InputImageError(_too_many_bytes(max_bytes))


def _too_many_bytes(max_bytes: int, size: int | None = None) -> str:
    limit = f"the limit of {_amount(max_bytes)} for one image (sapiens2.inputs.limits.MAX_FILE_BYTES)"
    head = (
        f"The image file is {_amount(size)}, above {limit}"
        if size
        else f"The image data is larger than {limit}"
    )
    return f"{head}. Save it as a JPEG (quality 90 is plenty) or downscale it."


def _amount(n: int) -> str:
    return f"{n / 2**20:.1f} MB" if n >= 2**20 else f"{n} bytes"
