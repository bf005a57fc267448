"""Binary PLY and GLB (glTF 2.0) writers for coloured point clouds and triangle meshes, in numpy.

Both formats are a short header followed by the arrays as they lie in memory, so the arrays are
written straight to the file in bounded chunks: no intermediate copy of the whole file, no
hashing (``trimesh``'s exporters hash every array and assemble the file in memory: the figures
are in docs/PERFORMANCE.md). ``trimesh`` stays the reader the tests check these files with.
:func:`write_vertex_ply` and :func:`write_vertex_glb` take vertices with optional faces: a point
cloud, or a mesh.

PLY: ``binary_little_endian 1.0``; per vertex ``float x, y, z`` (+ ``uchar red, green, blue,
alpha``, alpha 255) and, for a mesh, ``list uchar int vertex_indices`` per face.
GLB: one mesh with one primitive, TRIANGLES (``indices`` uint32) or POINTS; POSITION float32
VEC3 with its min/max; COLOR_0 uint8 VEC4 normalised. Every bufferView starts and ends on a
4-byte boundary, as glTF requires of vertex attributes.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np

#: rows packed per write: bounds the extra memory (16 MB for faces) whatever the array size
CHUNK_ROWS = 1 << 20

_GLB_MAGIC, _GLB_VERSION = 0x46546C67, 2  # b"glTF", glTF 2.0
_JSON_CHUNK, _BIN_CHUNK = 0x4E4F534A, 0x004E4942  # b"JSON", b"BIN\0"
#: glTF's componentType of each array dtype
COMPONENT_TYPES = {
    np.dtype("float32"): 5126,
    np.dtype("uint8"): 5121,
    np.dtype("uint16"): 5123,
    np.dtype("uint32"): 5125,
}
_FLOAT, _UBYTE, _UINT = (COMPONENT_TYPES[np.dtype(t)] for t in ("float32", "uint8", "uint32"))
POINTS, TRIANGLES = 0, 4  # glTF primitive mode
_GENERATOR = "sapiens2"
#: the material of a POINTS primitive, as the point-cloud GLB has always carried it (white, not
#: metallic): viewers show the points in their vertex colours
POINTS_MATERIAL = {
    "pbrMetallicRoughness": {"baseColorFactor": [1, 1, 1, 1], "metallicFactor": 0, "roughnessFactor": 0}
}

_VERTEX = np.dtype([("xyz", "<f4", (3,))])
_VERTEX_RGBA = np.dtype([("xyz", "<f4", (3,)), ("rgba", "u1", (4,))])
_RGBA = np.dtype([("rgba", "u1", (4,))])
_FACE = np.dtype([("n", "u1"), ("v", "<i4", (3,))])  # packed: 13 bytes, as PLY lists are


def _checked(
    vertices: np.ndarray, colors: np.ndarray | None, faces: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    v = np.ascontiguousarray(vertices, dtype="<f4").reshape(-1, 3)
    c = None if colors is None else np.ascontiguousarray(colors, dtype=np.uint8).reshape(-1, 3)
    if c is not None and len(c) != len(v):
        raise ValueError(f"{len(v)} vertices but {len(c)} colours.")
    f = None if faces is None else np.ascontiguousarray(faces, dtype="<i4").reshape(-1, 3)
    if f is not None and len(f) and (int(f.min()) < 0 or int(f.max()) >= len(v)):
        raise ValueError(f"Face indices must lie in [0, {len(v)}).")
    return v, c, f


def _write_rows(out: IO[bytes], n: int, dtype: np.dtype, fill: Callable[[np.ndarray, slice], None]) -> None:
    """Writes ``n`` records of ``dtype``, packed ``CHUNK_ROWS`` at a time into one reused buffer
    by ``fill(buffer_rows, source_rows)``."""
    buf = np.empty(min(n, CHUNK_ROWS), dtype)
    for a in range(0, n, CHUNK_ROWS):
        rows = buf[: min(CHUNK_ROWS, n - a)]
        fill(rows, slice(a, a + len(rows)))
        out.write(memoryview(rows).cast("B"))


def write_vertex_ply(
    path: str | Path, vertices: Any, colors: Any = None, faces: Any = None, *, note: str | None = None
) -> Path:
    """Binary little-endian PLY of ``vertices`` (N, 3) float32, optional ``colors`` (N, 3) uint8
    (written RGBA, alpha 255) and optional ``faces`` (F, 3) vertex indices (a face element, even
    when F is 0; none when ``faces`` is None). ``note``: a header comment (one ASCII line) saying
    what the coordinates mean."""
    v, c, f = _checked(vertices, colors, faces)
    lines = ["ply", "format binary_little_endian 1.0"]
    if note is not None:
        if not note.isascii() or not note.isprintable():
            raise ValueError("A PLY comment must be one line of printable ASCII.")
        lines.append(f"comment {note}")
    lines.append(f"element vertex {len(v)}")
    lines += [f"property float {axis}" for axis in "xyz"]
    if c is not None:
        lines += [f"property uchar {name}" for name in ("red", "green", "blue", "alpha")]
    if f is not None:
        lines += [f"element face {len(f)}", "property list uchar int vertex_indices"]
    lines.append("end_header\n")

    def vertex(rows: np.ndarray, src: slice) -> None:
        rows["xyz"] = v[src]
        if c is not None:
            rows["rgba"][:, :3] = c[src]
            rows["rgba"][:, 3] = 255

    def face(rows: np.ndarray, src: slice) -> None:
        rows["n"] = 3
        rows["v"] = f[src]

    p = Path(path)
    with open(p, "wb") as out:
        out.write("\n".join(lines).encode("ascii"))
        _write_rows(out, len(v), _VERTEX if c is None else _VERTEX_RGBA, vertex)
        if f is not None:
            _write_rows(out, len(f), _FACE, face)
    return p


def _pad4(n: int) -> int:
    return -n % 4


#: A piece of a GLB's binary chunk (one bufferView): its byte length (a multiple of 4) and what
#: writes it, in file order.
Block = tuple[int, Callable[[IO[bytes]], None]]


def write_vertex_glb(
    path: str | Path,
    vertices: Any,
    colors: Any = None,
    faces: Any = None,
    *,
    flip: Any = None,
    note: str | None = None,
) -> Path:
    """GLB of one primitive: TRIANGLES when ``faces`` (F, 3) has a face, else POINTS.
    ``note``: what the coordinates mean, kept in the asset's ``extras``.

    ``flip``: per-axis factors (3,) applied to the positions as they are written (e.g.
    ``(1, -1, -1)``: camera frame -> glTF frame); faces are written as they are, so the caller
    keeps the winding right. A POINTS primitive gets :data:`POINTS_MATERIAL`, a TRIANGLES one
    glTF's default material. No vertex: a valid file whose one node has no mesh."""
    v, c, f = _checked(vertices, colors, faces)
    f = f if f is not None and len(f) else None
    scale = np.ones(3, np.float32) if flip is None else np.asarray(flip, np.float32).reshape(3)
    gltf: dict[str, Any] = {
        "asset": {"version": "2.0", "generator": _GENERATOR},
        "scene": 0,
        "scenes": [{"nodes": [0]}],
        "nodes": [{"name": "geometry_0"}],
    }
    if note is not None:
        gltf["asset"]["extras"] = {"note": str(note)}
    blocks: list[Block] = []
    if len(v):
        mesh, blocks = _glb_mesh(v, c, f, scale)
        gltf.update(mesh)
        gltf["nodes"][0]["mesh"] = 0
    return write_glb_document(path, gltf, blocks)


def _glb_mesh(
    v: np.ndarray, c: np.ndarray | None, f: np.ndarray | None, scale: np.ndarray
) -> tuple[dict[str, Any], list[Block]]:
    """The glTF entries of the one mesh (accessor i reads bufferView i) and the blocks they read."""
    parts: list[tuple[dict[str, Any], Block]] = []
    primitive: dict[str, Any] = {"attributes": {}, "mode": POINTS if f is None else TRIANGLES}
    if f is not None:
        primitive["indices"] = len(parts)
        parts.append(_index_part(f))
    primitive["attributes"]["POSITION"] = len(parts)
    parts.append(_position_part(v, scale))
    if c is not None:
        primitive["attributes"]["COLOR_0"] = len(parts)
        parts.append(_colour_part(c))
    accessors = [{"bufferView": i, **accessor} for i, (accessor, _) in enumerate(parts)]
    blocks = [block for _, block in parts]
    views, offset = [], 0
    for size, _ in blocks:  # every size is a multiple of 4: offsets stay aligned
        views.append({"buffer": 0, "byteOffset": offset, "byteLength": size})
        offset += size
    mesh: dict[str, Any] = {}
    if f is None:
        primitive["material"] = 0
        mesh["materials"] = [POINTS_MATERIAL]
    mesh.update(
        meshes=[{"name": "geometry_0", "primitives": [primitive]}],
        accessors=accessors,
        bufferViews=views,
        buffers=[{"byteLength": offset}],
    )
    return mesh, blocks


def _index_part(f: np.ndarray) -> tuple[dict[str, Any], Block]:
    accessor = {"componentType": _UINT, "type": "SCALAR", "count": f.size}
    return accessor, (f.nbytes, lambda out: out.write(memoryview(f).cast("B")))  # int32 >= 0 == uint32


def _position_part(v: np.ndarray, scale: np.ndarray) -> tuple[dict[str, Any], Block]:
    # per column: a min over axis 0 of an (N, 3) array runs ~20x slower than over one column
    lo = np.array([v[:, k].min() for k in range(3)]) * scale
    hi = np.array([v[:, k].max() for k in range(3)]) * scale  # a negated axis swaps its bounds
    accessor = {
        "componentType": _FLOAT,
        "type": "VEC3",
        "count": len(v),
        "min": np.minimum(lo, hi).tolist(),
        "max": np.maximum(lo, hi).tolist(),
    }

    def fill(rows: np.ndarray, src: slice) -> None:
        np.multiply(v[src], scale, out=rows["xyz"])

    return accessor, (v.nbytes, lambda out: _write_rows(out, len(v), _VERTEX, fill))


def _colour_part(c: np.ndarray) -> tuple[dict[str, Any], Block]:
    accessor = {"componentType": _UBYTE, "normalized": True, "type": "VEC4", "count": len(c)}

    def fill(rows: np.ndarray, src: slice) -> None:
        rows["rgba"][:, :3] = c[src]
        rows["rgba"][:, 3] = 255

    return accessor, (4 * len(c), lambda out: _write_rows(out, len(c), _RGBA, fill))


def write_glb_document(path: str | Path, gltf: dict[str, Any], blocks: list[Block]) -> Path:
    """A GLB file: the header, ``gltf`` as the JSON chunk (padded with spaces) and, when there
    are ``blocks``, the binary chunk they write one after another (each a multiple of 4 bytes,
    so the bufferViews the caller laid out on them stay aligned)."""
    path = Path(path)
    text = json.dumps(gltf, separators=(",", ":"), allow_nan=False).encode("utf-8")
    text += b" " * _pad4(len(text))
    bin_len = sum(size for size, _ in blocks)
    if bin_len % 4:
        raise ValueError(f"The binary chunk must be a multiple of 4 bytes, got {bin_len}.")
    total = 12 + 8 + len(text) + (8 + bin_len if blocks else 0)
    with open(path, "wb") as out:
        out.write(struct.pack("<III", _GLB_MAGIC, _GLB_VERSION, total))
        out.write(struct.pack("<II", len(text), _JSON_CHUNK) + text)
        if blocks:
            out.write(struct.pack("<II", bin_len, _BIN_CHUNK))
            for _, write in blocks:
                write(out)
    return path


__all__ = [
    "CHUNK_ROWS",
    "COMPONENT_TYPES",
    "POINTS",
    "POINTS_MATERIAL",
    "TRIANGLES",
    "Block",
    "write_glb_document",
    "write_vertex_glb",
    "write_vertex_ply",
]
