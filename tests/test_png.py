"""The PNG encoder that deflates blocks of rows side by side (sapiens2.outputs.png): every file is a valid
PNG (chunk CRCs, one zlib stream with its Adler-32) that decodes to exactly the array given."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from sapiens2.outputs import png
from sapiens2.outputs.export import write_png, write_png_palette
from sapiens2.outputs.writers import Writer


def chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """(kind, body) of every chunk, each CRC checked."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    out, at = [], 8
    while at < len(data):
        (n,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + n]
        (crc,) = struct.unpack(">I", data[at + 8 + n : at + 12 + n])
        assert crc == zlib.crc32(body, zlib.crc32(kind)), kind
        out.append((kind, body))
        at += 12 + n
    assert out[0][0] == b"IHDR" and out[-1] == (b"IEND", b"")
    return out


def decoded(data: bytes) -> np.ndarray:
    """What OpenCV reads, in RGB(A) order."""
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if img.ndim == 3:
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB if img.shape[2] == 3 else cv2.COLOR_BGRA2RGBA)
    return img


CASES = [
    ((61, 47), np.uint8),
    ((61, 47, 3), np.uint8),
    ((61, 47, 4), np.uint8),
    ((61, 47), np.uint16),
    ((61, 47, 3), np.uint16),
    ((1, 1), np.uint8),
    ((1, 1, 3), np.uint8),
]


@pytest.mark.parametrize("block_bytes", [1, 300, 1 << 22])  # a block per row, several, one
@pytest.mark.parametrize(("shape", "dtype"), CASES)
def test_every_layout_decodes_to_the_same_array(monkeypatch, block_bytes, shape, dtype) -> None:
    monkeypatch.setattr(png, "BLOCK_BYTES", block_bytes)
    a = np.random.default_rng(sum(shape)).integers(0, np.iinfo(dtype).max + 1, shape, dtype=dtype)
    data = b"".join(png.png_chunks(a))
    parts = chunks(data)
    stream = b"".join(body for kind, body in parts if kind == b"IDAT")
    rows = zlib.decompress(stream)  # checks the combined Adler-32 too
    row_bytes = a[0].nbytes
    assert len(rows) == shape[0] * (1 + row_bytes)
    assert set(rows[:: 1 + row_bytes]) == {1}  # every row: the "sub" filter
    assert np.array_equal(decoded(data), a)
    with Image.open(io.BytesIO(data)) as im:  # a second decoder
        im.load()
        if dtype == np.uint8:
            assert np.array_equal(np.asarray(im), a)
    if block_bytes == 1 and shape[0] > 1:
        assert sum(kind == b"IDAT" for kind, _ in parts) == shape[0] + 2  # header, rows, checksum


def test_a_palette_picture_decodes_to_its_colours(monkeypatch) -> None:
    monkeypatch.setattr(png, "BLOCK_BYTES", 100)
    rng = np.random.default_rng(3)
    palette = rng.integers(0, 256, (29, 3), dtype=np.uint8)
    ids = rng.integers(0, 29, (40, 33), dtype=np.uint8)
    data = b"".join(png.png_chunks(ids, palette))
    assert dict(chunks(data))[b"PLTE"] == palette.tobytes()
    with Image.open(io.BytesIO(data)) as im:
        assert im.mode == "P"
        assert np.array_equal(np.asarray(im), ids)
        assert np.array_equal(np.asarray(im.convert("RGB")), palette[ids])


@pytest.mark.parametrize("cut", [0, 1, 5552, 5553, 70_000, 99_999, 100_000])
def test_adler32_combine_is_the_checksum_of_the_whole(cut: int) -> None:
    data = np.random.default_rng(cut).integers(0, 256, 100_000, dtype=np.uint8).tobytes()
    data = data[:50_000] + b"\xff" * 50_000  # long runs of the largest byte: the sums wrap often
    first, second = data[:cut], data[cut:]
    combined = png.adler32_combine(zlib.adler32(first), zlib.adler32(second), len(second))
    assert combined == zlib.adler32(data)


def test_the_writers_use_it_and_their_files_decode_exactly(tmp_path: Path, monkeypatch) -> None:
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(png, "BLOCK_BYTES", 4096)  # many blocks on the shared pool
    rng = np.random.default_rng(9)
    pictures = [rng.integers(0, 256, (300, 200, c), dtype=np.uint8) for c in (3, 4)]
    with ThreadPoolExecutor(3) as pool, Writer(pool) as writer:  # as the app writes them
        paths = [write_png(tmp_path / f"p{i}.png", p, writer=writer) for i, p in enumerate(pictures)]
        ids, palette = pictures[0][:, :, 0] % 7, np.eye(7, 3, dtype=np.uint8)
        paths.append(write_png_palette(tmp_path / "ids.png", ids, palette, writer=writer))
    for path, picture in zip(paths, pictures, strict=False):
        assert np.array_equal(decoded(path.read_bytes()), picture)
    with Image.open(paths[-1]) as im:
        assert np.array_equal(np.asarray(im), pictures[0][:, :, 0] % 7)
