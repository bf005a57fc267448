"""A visitor's set of photos for "Find similar": several files or one zip, read into memory with
every limit checked first. Nothing is extracted to disk, so no name in a zip can reach a path;
a name that tries (``../x``, ``/etc/x``) refuses the whole zip all the same, since it says the
file was not made for this. Each problem is one InputImageError a visitor can act on."""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import InputImageError
from ..inputs.intake import IMAGE_EXTENSIONS
from ..inputs.limits import MAX_FILE_BYTES

#: Photos a set may hold at most (fewer when a visitor's GPU quota holds fewer: see ``similar``).
MAX_SET_PHOTOS = 32
#: Bytes a whole set may hold once unzipped (a zip bomb stops here, before its bytes are made).
MAX_SET_BYTES = 256 * 2**20
KINDS = ", ".join(sorted(e.lstrip(".").upper() for e in IMAGE_EXTENSIONS))


def _is_image(name: str) -> bool:
    return PurePosixPath(name).suffix.lower() in IMAGE_EXTENSIONS


def _not_image(name: str) -> InputImageError:
    return InputImageError(f"{name} is not a photo. A set takes photos ({KINDS}) or one .zip of them.")


def _from_zip(path: Path, room: int, limit: int) -> list[tuple[str, bytes]]:
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError):
        raise InputImageError(f"{path.name} is not a readable zip file.") from None
    with archive:
        members = [m for m in archive.infolist() if not m.is_dir()]
        for m in members:
            parts = PurePosixPath(m.filename.replace("\\", "/")).parts
            if m.filename.startswith(("/", "\\")) or ".." in parts or ":" in m.filename:
                raise InputImageError(
                    f"{path.name} holds a path that leaves its folder ({m.filename!r}); zip the photos alone."
                )
        members = [
            m for m in members if not PurePosixPath(m.filename).name.startswith(".")
        ]  # __MACOSX, .DS_Store
        members = [m for m in members if not m.filename.startswith("__MACOSX/")]
        for m in members:
            if not _is_image(m.filename):
                raise _not_image(f"{m.filename} (in {path.name})")
        if len(members) > limit:
            raise _too_many(limit)
        if sum(m.file_size for m in members) > room:
            raise InputImageError(
                f"{path.name} unzips to more than {MAX_SET_BYTES >> 20} MiB; a set holds up to "
                f"{MAX_SET_PHOTOS} photos of at most {MAX_FILE_BYTES >> 20} MiB each."
            )
        out = []
        for m in members:
            with archive.open(m) as f:  # the header's size may lie: never read past the room left
                data = f.read(min(room, MAX_FILE_BYTES) + 1)
            if len(data) > min(room, MAX_FILE_BYTES):
                raise InputImageError(f"{m.filename} in {path.name} unzips to more than its header says.")
            room -= len(data)
            out.append((f"{path.name}/{m.filename}", data))
        return out


def _too_many(limit: int) -> InputImageError:
    return InputImageError(
        f"The set has more than {limit} photos; up to {limit} fit in one run (a visitor's GPU quota)."
    )


def read_set(files: Sequence[Any] | None, limit: int = MAX_SET_PHOTOS) -> list[tuple[str, bytes]]:
    """(name, bytes) of each photo of a set: ``files`` are paths (a visitor's uploads), photos or
    .zip files of photos. InputImageError for an empty set, a non-photo, a zip that is not one,
    leaves its folder or unzips too large, or more than ``limit`` photos."""
    photos: list[tuple[str, bytes]] = []
    room = MAX_SET_BYTES
    for item in files or []:
        path = Path(str(getattr(item, "name", None) or item))
        if not path.is_file():
            raise InputImageError(f"{path.name} could not be read; add it again.")
        if path.suffix.lower() == ".zip":
            found = _from_zip(path, room, limit)
        elif _is_image(path.name):
            if path.stat().st_size > MAX_FILE_BYTES:
                raise InputImageError(
                    f"{path.name} is over the {MAX_FILE_BYTES >> 20} MiB limit of one photo."
                )
            found = [(path.name, path.read_bytes())]
        else:
            raise _not_image(path.name)
        room -= sum(len(d) for _, d in found)
        photos += found
        if room < 0:
            raise InputImageError(f"The set is over {MAX_SET_BYTES >> 20} MiB; use fewer or smaller photos.")
        if len(photos) > limit:
            break
    if not photos:
        raise InputImageError(f"The set is empty: add up to {limit} photos, or one .zip of them.")
    if len(photos) > limit:
        raise _too_many(limit)
    return photos
