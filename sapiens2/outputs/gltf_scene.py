"""A small glTF 2.0 scene builder (meshes, nodes, skins, animations) over the GLB writer of
:mod:`sapiens2.outputs.plyglb`, plus the stick-figure geometry the 3D skeletons are made of.

Arrays become accessors on their own bufferViews, each starting on a 4-byte boundary (the
binary chunk is padded between them); matrices are stored column-major, as glTF reads them.
Vertex attributes and indices carry their bufferView ``target``; animation and skin data do not
(glTF forbids it there).
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

import numpy as np

from .plyglb import COMPONENT_TYPES, TRIANGLES, Block, write_glb_document

_TYPES = {1: "SCALAR", 2: "VEC2", 3: "VEC3", 4: "VEC4", 16: "MAT4"}
ARRAY_BUFFER, ELEMENT_ARRAY_BUFFER = 34962, 34963
#: KHR_materials_unlit: the vertex colours shown as they are, like the 2D drawing
UNLIT_MATERIAL = {
    "pbrMetallicRoughness": {"baseColorFactor": [1, 1, 1, 1], "metallicFactor": 0, "roughnessFactor": 1},
    "doubleSided": True,
    "extensions": {"KHR_materials_unlit": {}},
}


class GltfBuilder:
    """Collects a glTF document and its binary data; :meth:`write` makes the GLB."""

    def __init__(self, generator: str = "sapiens2") -> None:
        self.gltf: dict[str, Any] = {
            "asset": {"version": "2.0", "generator": generator},
            "scene": 0,
            "scenes": [{"nodes": []}],
            "nodes": [],
        }
        self._blocks: list[Block] = []
        self._offset = 0

    def _list(self, key: str) -> list[Any]:
        return self.gltf.setdefault(key, [])

    def accessor(
        self,
        array: np.ndarray,
        *,
        target: int | None = None,
        normalized: bool = False,
        bounds: bool = False,
    ) -> int:
        """An accessor over ``array`` (N,) / (N, k) / (N, 4, 4) (row-major matrices, stored
        column-major); ``bounds`` adds min/max (required for POSITION and animation input)."""
        a = np.asarray(array)
        if a.ndim == 3:
            a = np.ascontiguousarray(a.transpose(0, 2, 1)).reshape(len(a), 16)
        a = np.ascontiguousarray(a.reshape(len(a), -1) if a.ndim > 1 else a[:, None])
        if a.dtype not in COMPONENT_TYPES:
            raise ValueError(f"glTF has no component type for {a.dtype}.")
        data = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        padded = data + b"\0" * (-len(data) % 4)
        view: dict[str, Any] = {"buffer": 0, "byteOffset": self._offset, "byteLength": len(data)}
        if target is not None:
            view["target"] = target
        self._blocks.append((len(padded), lambda out, b=padded: _write(out, b)))
        self._offset += len(padded)
        views = self._list("bufferViews")
        views.append(view)
        acc: dict[str, Any] = {
            "bufferView": len(views) - 1,
            "componentType": COMPONENT_TYPES[a.dtype],
            "count": int(len(a)),
            "type": _TYPES[a.shape[1]],
        }
        if normalized:
            acc["normalized"] = True
        if bounds:
            finite = a.astype(np.float64)
            acc["min"] = finite.min(axis=0).tolist()
            acc["max"] = finite.max(axis=0).tolist()
        accessors = self._list("accessors")
        accessors.append(acc)
        return len(accessors) - 1

    def material(self, material: dict[str, Any]) -> int:
        mats = self._list("materials")
        mats.append(material)
        if "KHR_materials_unlit" in material.get("extensions", {}):
            used = self._list("extensionsUsed")
            if "KHR_materials_unlit" not in used:
                used.append("KHR_materials_unlit")
        return len(mats) - 1

    def mesh(self, name: str, primitives: list[dict[str, Any]]) -> int:
        meshes = self._list("meshes")
        meshes.append({"name": name, "primitives": primitives})
        return len(meshes) - 1

    def node(self, *, root: bool = False, **fields: Any) -> int:
        """A node (``name``, ``mesh``, ``skin``, ``translation``, ``children`` ...); ``root``: in the scene."""
        nodes = self.gltf["nodes"]
        nodes.append({k: v for k, v in fields.items() if v is not None})
        if root:
            self.gltf["scenes"][0]["nodes"].append(len(nodes) - 1)
        return len(nodes) - 1

    def add_child(self, parent: int, child: int) -> None:
        self.gltf["nodes"][parent].setdefault("children", []).append(child)

    def skin(self, name: str, joints: list[int], inverse_bind: np.ndarray, skeleton: int) -> int:
        skins = self._list("skins")
        ibm = self.accessor(np.asarray(inverse_bind, np.float32))
        skins.append({"name": name, "joints": joints, "inverseBindMatrices": ibm, "skeleton": skeleton})
        return len(skins) - 1

    def animation(self, name: str, channels: list[tuple[int, str, int, int, str]]) -> int:
        """One animation: ``channels`` = (node, path, input accessor, output accessor, interpolation)."""
        samplers, chans = [], []
        for node, path, inp, out, interp in channels:
            samplers.append({"input": inp, "output": out, "interpolation": interp})
            chans.append({"sampler": len(samplers) - 1, "target": {"node": node, "path": path}})
        anims = self._list("animations")
        anims.append({"name": name, "samplers": samplers, "channels": chans})
        return len(anims) - 1

    def write(self, path: str | Path) -> Path:
        if self._blocks:
            self.gltf["buffers"] = [{"byteLength": self._offset}]
        return write_glb_document(path, self.gltf, self._blocks)


def _write(out: IO[bytes], data: bytes) -> None:
    out.write(data)


# ----------------------------------------------------------------------------- stick figures

#: A square prism's 8 corners (4 at each end) and its 8 side triangles.
_PRISM_FACES = np.array(
    [[0, 1, 5], [0, 5, 4], [1, 2, 6], [1, 6, 5], [2, 3, 7], [2, 7, 6], [3, 0, 4], [3, 4, 7]], np.uint32
)
_OCTA = np.array([[1, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1]], np.float32)
_OCTA_FACES = np.array(
    [[0, 2, 4], [2, 1, 4], [1, 3, 4], [3, 0, 4], [2, 0, 5], [1, 2, 5], [3, 1, 5], [0, 3, 5]], np.uint32
)


def _across(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two unit vectors perpendicular to ``d`` (B, 3) and to each other."""
    n = d / np.maximum(np.linalg.norm(d, axis=1, keepdims=True), 1e-9)
    helper = np.where(np.abs(n[:, 1:2]) < 0.9, [[0, 1, 0]], [[1, 0, 0]]).astype(np.float64)
    a = np.cross(n, helper)
    a /= np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-9)
    return a, np.cross(n, a)


def sticks(a: np.ndarray, b: np.ndarray, radius: float) -> tuple[np.ndarray, np.ndarray]:
    """Square prisms from ``a`` to ``b`` (B, 3): vertices (8B, 3) float32 (corners 0-3 at ``a``,
    4-7 at ``b`` for each stick) and triangles (8B, 3) uint32."""
    a, b = np.asarray(a, np.float64).reshape(-1, 3), np.asarray(b, np.float64).reshape(-1, 3)
    u, v = _across(b - a)
    ring = np.stack([u, v, -u, -v], axis=1) * radius  # (B, 4, 3)
    verts = np.concatenate([a[:, None] + ring, b[:, None] + ring], axis=1).reshape(-1, 3)
    faces = (_PRISM_FACES[None] + 8 * np.arange(len(a), dtype=np.uint32)[:, None, None]).reshape(-1, 3)
    return verts.astype(np.float32), faces


def knobs(centres: np.ndarray, radius: float) -> tuple[np.ndarray, np.ndarray]:
    """Octahedra at ``centres`` (N, 3): vertices (6N, 3) float32 and triangles (8N, 3) uint32."""
    c = np.asarray(centres, np.float64).reshape(-1, 3)
    verts = (c[:, None] + _OCTA[None] * radius).reshape(-1, 3)
    faces = (_OCTA_FACES[None] + 6 * np.arange(len(c), dtype=np.uint32)[:, None, None]).reshape(-1, 3)
    return verts.astype(np.float32), faces


__all__ = [
    "ARRAY_BUFFER",
    "ELEMENT_ARRAY_BUFFER",
    "TRIANGLES",
    "UNLIT_MATERIAL",
    "GltfBuilder",
    "knobs",
    "sticks",
]
