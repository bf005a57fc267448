"""The inputs of ``sapiens2 batch``: what INPUT names, and each photo read through pyarrow's
filesystems, so a bucket is read where it lies (no download step).

INPUT is one of:

* a folder: its image files, recursively, sorted;
* a glob (``photos/*.jpg``, ``s3://bucket/set/**/*.png``): ``*``, ``?`` and ``[...]`` within one
  path component, ``**`` for any number of folders;
* a list: a text file (``.txt``, ``.lst``: one path or URI a line; ``#`` comments; relative
  paths are relative to the list's folder) or a Parquet file (``.parquet``: its ``source`` column,
  else its ``path`` column);
* one image file;

each as a local path or a URI any pyarrow filesystem reads (``file://``, ``s3://``, ``gs://``,
``hdfs://``, ``abfs://``, ``hf://``), or one fsspec knows (``memory://`` ...), wrapped for pyarrow.
A caller of the Python API may pass a ``pyarrow.fs.FileSystem`` instead, and INPUT and the
sources are then paths inside it.

A source is named in the rows as it was listed: an absolute path for a local path, the full URI
otherwise. Local files are read as :func:`sapiens2.inputs.intake.load_image` reads them (regular
files only, never a FIFO or a device); other sources are read through the filesystem with the
same byte limit. A source that cannot be read becomes an error row, never a failed run.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
from pathlib import Path, PurePosixPath

import pyarrow as pa
import pyarrow.fs as pafs

from ..errors import InputImageError, OptionError
from ..inputs.image_file import read_image_file
from ..inputs.intake import DEFAULT_MAX_SIDE, IMAGE_EXTENSIONS, Intake, load_image
from ..inputs.limits import MAX_FILE_BYTES
from ..outputs.export import file_stem

LIST_EXTENSIONS = frozenset({".txt", ".lst"})
PARQUET_EXTENSIONS = frozenset({".parquet", ".pq"})
#: Columns a Parquet list may name its sources in, in order of preference.
LIST_COLUMNS = ("source", "path")

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_GLOB = re.compile(r"[*?[]")


def is_uri(text: str) -> bool:
    return bool(_URI.match(text))


def _split(uri: str) -> tuple[str, str]:
    """``scheme://authority`` and the rest of a URI (``file://`` has no authority)."""
    scheme, rest = uri.split("://", 1)
    if scheme.lower() == "file":
        return "file://", rest
    authority, slash, tail = rest.partition("/")
    return f"{scheme}://{authority}", slash + tail


@functools.lru_cache(maxsize=32)
def _mount(prefix: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem of a ``scheme://authority`` and that prefix's path in it: one per bucket, so
    a client is made once, not per photo. pyarrow's own filesystems first, then fsspec's."""
    if prefix == "file://":
        return pafs.LocalFileSystem(), ""
    if prefix.startswith("s3://"):  # a small part in one request, not a multipart upload (three)
        prefix += "?allow_delayed_open=true"
    try:
        return pafs.FileSystem.from_uri(prefix)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
        pass
    try:
        import fsspec

        fs, path = fsspec.core.url_to_fs(prefix)
    except (ImportError, ValueError) as err:
        raise OptionError(f"No filesystem reads {prefix!r}: {err}") from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path.rstrip("/")


def resolve(location: str, filesystem: pafs.FileSystem | None = None) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) of a local path or a URI; with ``filesystem``, ``location``
    is a path in it."""
    if filesystem is not None:
        return filesystem, location
    if not is_uri(location):
        return pafs.LocalFileSystem(), str(Path(location).expanduser().absolute())
    prefix, rest = _split(location)
    fs, base = _mount(prefix)
    return fs, base + rest


def name_of(location: str, path: str, filesystem: pafs.FileSystem | None = None) -> str:
    """How ``path`` (in the filesystem of ``location``) is named in the rows: a path, or a URI
    with the scheme and bucket ``location`` was given with."""
    if filesystem is not None or not is_uri(location):
        return path
    prefix, _ = _split(location)
    base = _mount(prefix)[1]
    return prefix + (path[len(base) :] if path.startswith(base) else path)


def _glob_parts(pattern: str) -> tuple[str, list[str]]:
    """(the folder before the first wildcard, the remaining pattern components)."""
    parts = pattern.split("/")
    for i, part in enumerate(parts):
        if _GLOB.search(part):
            return "/".join(parts[:i]) or ("/" if pattern.startswith("/") else "."), parts[i:]
    return pattern, []


def _match(parts: list[str], names: list[str]) -> bool:
    """``names`` (path components) match the pattern ``parts`` (``**``: any number of components)."""
    if not parts:
        return not names
    if parts[0] == "**":
        return any(_match(parts[1:], names[i:]) for i in range(len(names) + 1))
    return bool(names) and fnmatch.fnmatchcase(names[0], parts[0]) and _match(parts[1:], names[1:])


def _files_under(fs: pafs.FileSystem, folder: str) -> list[str]:
    infos = fs.get_file_info(pafs.FileSelector(folder, recursive=True, allow_not_found=True))
    return sorted(i.path for i in infos if i.type == pafs.FileType.File)


def _is_image(path: str) -> bool:
    return PurePosixPath(path).suffix.lower() in IMAGE_EXTENSIONS


def _glob(location: str, filesystem: pafs.FileSystem | None) -> list[str]:
    prefix = location.split("://", 1)[0] + "://" if is_uri(location) and filesystem is None else ""
    body = location[len(prefix) :]
    base, parts = _glob_parts(body)
    fs, root = resolve(prefix + base, filesystem)
    found = []
    for path in _files_under(fs, root):
        rel = PurePosixPath(path).relative_to(PurePosixPath(root)).parts if path != root else ()
        if _match(parts, list(rel)) and _is_image(path):
            found.append(name_of(prefix + base, path, filesystem))
    return found


def _read_list(
    location: str, fs: pafs.FileSystem, path: str, filesystem: pafs.FileSystem | None
) -> list[str]:
    """The sources of a text or Parquet list; relative entries are relative to the list's folder."""
    suffix = PurePosixPath(path).suffix.lower()
    if suffix in PARQUET_EXTENSIONS:
        import pyarrow.parquet as pq

        table = pq.read_table(path, filesystem=fs)
        column = next((c for c in LIST_COLUMNS if c in table.column_names), None)
        if column is None:
            raise OptionError(
                f"The Parquet list {location!r} has no {' or '.join(map(repr, LIST_COLUMNS))} column; "
                f"its columns: {', '.join(table.column_names)}."
            )
        entries = [str(v) for v in table.column(column).to_pylist() if v]
    else:
        with fs.open_input_stream(path) as f:
            text = f.read(MAX_LIST_BYTES + 1)
        if len(text) > MAX_LIST_BYTES:
            raise OptionError(
                f"The list {location!r} is over {MAX_LIST_BYTES >> 20} MiB; use a Parquet list."
            )
        lines = (line.strip() for line in text.decode("utf-8", "replace").splitlines())
        entries = [line for line in lines if line and not line.startswith("#")]
    folder = str(PurePosixPath(path).parent)
    out = []
    for entry in entries:
        if is_uri(entry) or filesystem is None and os.path.isabs(entry) and not is_uri(location):
            out.append(entry)
        else:  # relative to the list (or absolute inside the list's own filesystem)
            out.append(name_of(location, entry if entry.startswith("/") else f"{folder}/{entry}", filesystem))
    return out


#: The most bytes of a text list read (a Parquet list has no limit).
MAX_LIST_BYTES = 256 << 20


def list_sources(location: str, filesystem: pafs.FileSystem | None = None) -> list[str]:
    """The sources INPUT names (see the module docstring), in order, each once. OptionError when
    INPUT names nothing that exists."""
    location = str(location)
    body = location.split("://", 1)[1] if is_uri(location) and filesystem is None else location
    if _GLOB.search(body):
        found = _glob(location, filesystem)
        if not found:
            raise OptionError(f"No image file matches {location!r}.")
        return list(dict.fromkeys(found))
    fs, path = resolve(location, filesystem)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        found = [name_of(location, p, filesystem) for p in _files_under(fs, path) if _is_image(p)]
        if not found:
            raise OptionError(f"The folder {location!r} holds no image file.")
        return found
    if info.type == pafs.FileType.NotFound:
        raise OptionError(f"No such file or folder: {location!r}.")
    suffix = PurePosixPath(path).suffix.lower()
    if suffix in LIST_EXTENSIONS | PARQUET_EXTENSIONS:
        return list(dict.fromkeys(_read_list(location, fs, path, filesystem)))
    return [name_of(location, path, filesystem)]


def read_source(source: str, filesystem: pafs.FileSystem | None = None) -> tuple[bytes, str]:
    """One source's file bytes and its export name (InputImageError, with a message a person can
    act on, when it cannot be read). Local files: regular files only, never blocking."""
    try:
        fs, path = resolve(source, filesystem)
    except OptionError as err:
        raise InputImageError(str(err)) from None
    name = file_stem(PurePosixPath(path).name)
    if isinstance(fs, pafs.LocalFileSystem):
        return read_image_file(Path(path)), name
    try:
        with fs.open_input_stream(path) as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise InputImageError(f"Image file not found: {source!r}.") from None
    except (OSError, pa.ArrowException) as err:
        raise InputImageError(f"Could not read {source!r}: {_first_line(err)}") from None
    if len(data) > MAX_FILE_BYTES:
        raise InputImageError(f"{source!r} is over the {MAX_FILE_BYTES >> 20} MiB limit of one image.")
    return data, name


def decode_source(data: bytes, name: str, *, max_side: int = DEFAULT_MAX_SIDE) -> Intake:
    """The decoded photo of a source's bytes (the same photo every time: a step after the device
    may decode the bytes again rather than carry the pixels)."""
    intake = load_image(data, max_side=max_side)
    intake.name = name
    return intake


def read_intake(
    source: str, filesystem: pafs.FileSystem | None = None, *, max_side: int = DEFAULT_MAX_SIDE
) -> Intake:
    """The decoded photo of one source (InputImageError when it cannot be read or decoded)."""
    return decode_source(*read_source(source, filesystem), max_side=max_side)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__
