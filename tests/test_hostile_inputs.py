"""Hostile input, end to end: every odd file gets a correct result or a clear message.

The corpus is generated here (small files, made in memory or in tmp_path). Three levels:

* intake (``load_image``): each file -> an upright RGB picture, or InputImageError naming the cause;
* pipelines and the serving layer (tiny checkpoints, quarter-size network input): odd shapes,
  EXIF rotation, nobody / a crowd, NaN and inf in every task's model output, wrong options;
* the real app served on 127.0.0.1 and called with ``gradio_client``: each bad request gets its
  message, the server stays up and the next good request succeeds.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import socket
import struct
import sys
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from registry_helpers import task as T

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # app.py lives at the top level

import one_request  # noqa: E402

from sapiens2 import serving  # noqa: E402
from sapiens2.errors import InputImageError, OptionError  # noqa: E402
from sapiens2.inputs.intake import load_image  # noqa: E402
from sapiens2.serving.request_runner import read_photo  # noqa: E402
from sapiens2.tasks import pipeline, registry  # noqa: E402

SMALL = (256, 192)  # quarter of the native input: tiny models stay fast (pointmap keeps its own)
TASKS = tuple(registry.declared())  # every task, shown on the Space or not (albedo)


# ----------------------------------------------------------------------------- the corpus


def encode(im: Image.Image, fmt: str, **kw: Any) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt, **kw)
    return buf.getvalue()


def person_like(h: int = 48, w: int = 36, seed: int = 0) -> np.ndarray:
    """A non-symmetric test picture: gradient, a block and a red top-left marker."""
    rng = np.random.default_rng(seed)
    img = np.zeros((h, w, 3), np.uint8)
    img[:] = np.linspace(40, 220, w, dtype=np.uint8)[None, :, None]
    img[h // 4 : 3 * h // 4, w // 3 : 2 * w // 3] = rng.integers(0, 255, 3, dtype=np.uint8)
    img[: max(1, h // 8), : max(1, w // 8)] = (255, 0, 0)
    return img


def jpeg_with_size(width: int, height: int) -> bytes:
    """A small JPEG whose frame header claims ``width`` x ``height`` (a decompression bomb's header)."""
    data = bytearray(encode(Image.new("L", (16, 16), 128), "JPEG"))
    sof = data.index(b"\xff\xc0")  # baseline frame: marker, length(2), precision(1), height(2), width(2)
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def png_with_size(width: int, height: int) -> bytes:
    """A tiny PNG whose IHDR claims ``width`` x ``height`` (no pixel data worth decoding)."""
    data = bytearray(encode(Image.new("L", (8, 8), 0), "PNG"))
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))  # keep the chunk's CRC valid
    return bytes(data)


def corrupt_png() -> bytes:
    data = bytearray(encode(Image.fromarray(person_like(64, 64)), "PNG"))
    idat = data.index(b"IDAT")
    data[idat + 8 : idat + 40] = b"\x00" * 32  # zero the zlib stream's start (CRC no longer matches)
    return bytes(data)


def animated_gif() -> bytes:
    frames = [Image.new("RGB", (20, 30), c) for c in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    return encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)


def palette_with_transparency() -> bytes:
    im = Image.new("P", (10, 6), 1)
    im.putpalette([0, 0, 0, 200, 30, 30] + [0] * 762)
    im.paste(0, (0, 0, 5, 6))  # left half uses index 0, which is transparent
    return encode(im, "PNG", transparency=0)


def sixteen_bit_png() -> bytes:
    ramp = np.tile(np.linspace(0, 65535, 32).astype(np.uint16), (8, 1))
    return encode(Image.fromarray(ramp), "PNG")


def cmyk_jpeg() -> bytes:
    return encode(Image.new("CMYK", (16, 12), (0, 255, 255, 0)), "JPEG", quality=95)  # pure red


def heic_bytes() -> bytes:
    # An ISO-BMFF 'ftyp' box with the HEIC brand, as phones write: Pillow has no HEIC decoder.
    return struct.pack(">I", 24) + b"ftypheic" + b"\x00\x00\x00\x00mif1heic" + b"\x00" * 64


def avif_bytes() -> bytes:
    try:
        return encode(Image.fromarray(person_like(32, 24)), "AVIF")
    except (KeyError, OSError):  # a Pillow built without AVIF: the brand alone identifies the format
        return struct.pack(">I", 24) + b"ftypavif" + b"\x00\x00\x00\x00avifmif1" + b"\x00" * 64


# (name, file bytes, expected: a regex for the InputImageError message, or a check of the picture)
def _white_left_red_right(rgb: np.ndarray) -> bool:
    return (rgb[:, :5] == 255).all() and (rgb[:, 5:] == (200, 30, 30)).all()


CORPUS: list[tuple[str, Callable[[], bytes], str | Callable[[np.ndarray], bool]]] = [
    ("empty.jpg", lambda: b"", r"empty \(0 bytes\)"),
    ("notes.jpg", lambda: b"Shopping list:\n- eggs\n- milk\n" * 4, r"not an image \(it contains text\)"),
    (
        "random.png",
        lambda: bytes(np.random.default_rng(3).integers(0, 256, 512, dtype=np.uint8)),
        r"not an image Pillow can read",
    ),  # fmt: skip
    ("truncated.jpg", lambda: encode(Image.fromarray(person_like(64, 64)), "JPEG")[:300], r"truncated"),
    ("truncated.png", lambda: encode(Image.fromarray(person_like(64, 64)), "PNG")[:120], r"truncated"),
    ("corrupt.png", corrupt_png, r"corrupt"),
    ("bomb.png", lambda: png_with_size(20000, 20000), r"400\.0 megapixels, above the limit of 89\.5"),
    # JPEGs up to 200 MP decode reduced (issue 11); past that the header alone is refused
    ("bomb.jpg", lambda: jpeg_with_size(20000, 20000), r"400\.0 megapixels\), above the limit of 200\.0"),
    ("just_over.png", lambda: png_with_size(10000, 9000), r"10000x9000 px .*above the limit"),
    ("photo.heic", heic_bytes, r"HEIC/HEIF image, which this installation cannot decode.*JPEG or PNG"),
    (
        "one.png",
        lambda: encode(Image.new("RGB", (1, 1), (9, 8, 7)), "PNG"),
        lambda a: a.tolist() == [[[9, 8, 7]]],
    ),
    (
        "strip.png",
        lambda: encode(Image.new("RGB", (2, 10000), (0, 90, 0)), "PNG"),
        lambda a: a.shape == (10000, 2, 3),
    ),  # fmt: skip
    (
        "sixteen.png",
        sixteen_bit_png,
        lambda a: a[0, 0, 0] == 0 and a[0, -1, 0] == 255 and (a[..., 0] == a[..., 2]).all(),
    ),  # fmt: skip
    (
        "cmyk.jpg",
        cmyk_jpeg,
        lambda a: a.shape == (12, 16, 3) and a[..., 0].min() > 200 and a[..., 1:].max() < 60,
    ),  # fmt: skip
    ("palette.png", palette_with_transparency, _white_left_red_right),
    (
        "gray.jpg",
        lambda: encode(Image.new("L", (9, 7), 77), "JPEG"),
        lambda a: a.shape == (7, 9, 3) and (abs(a.astype(int) - 77) <= 1).all(),
    ),  # fmt: skip
    (
        "clear.png",
        lambda: encode(Image.new("RGBA", (6, 4), (10, 200, 30, 0)), "PNG"),
        lambda a: (a == 255).all(),
    ),  # fmt: skip
    ("anim.gif", animated_gif, lambda a: a.shape == (30, 20, 3) and tuple(a[0, 0]) == (255, 0, 0)),
]


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(width, height) of every image whose pixels Pillow decodes while the test runs: counted,
    not timed, so a busy machine cannot fail the checks that use it."""
    from PIL import ImageFile

    seen: list[tuple[int, int]] = []
    real = ImageFile.ImageFile.load

    def load(self: Any) -> Any:
        seen.append(self.size)
        return real(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    return seen


@pytest.mark.parametrize(("name", "make", "expected"), CORPUS, ids=[c[0] for c in CORPUS])
def test_corpus_decodes_or_names_the_problem(
    name: str, make, expected, tmp_path: Path, decodes: list[tuple[int, int]]
) -> None:
    path = tmp_path / name
    path.write_bytes(make())
    if isinstance(expected, str):
        with pytest.raises(InputImageError, match=expected):
            read_photo(str(path))
        # refusals are cheap: nothing above the pixel limit is decoded before the header is checked
        assert all(w * h <= Image.MAX_IMAGE_PIXELS for w, h in decodes), decodes
    else:
        intake = read_photo(str(path))
        assert intake.rgb.dtype == np.uint8 and intake.rgb.ndim == 3 and intake.rgb.shape[2] == 3
        assert expected(intake.rgb), intake.rgb[:2, :2]
        assert intake.name == Path(name).stem


def test_animated_gif_says_the_first_frame_was_used() -> None:
    assert any("first frame" in n for n in load_image(animated_gif()).notices)


def test_avif_and_heic_when_pillow_cannot_read_them(monkeypatch: pytest.MonkeyPatch) -> None:
    # Simulate a Pillow without the AVIF plugin (this one may have it): take AVIF off its format list.
    monkeypatch.setattr(Image, "ID", [f for f in Image.ID if f != "AVIF"])
    monkeypatch.setattr(Image, "OPEN", {k: v for k, v in Image.OPEN.items() if k != "AVIF"})
    for data, kind in ((avif_bytes(), "AVIF"), (heic_bytes(), "HEIC/HEIF")):
        with pytest.raises(InputImageError, match=rf"{kind} image, which this installation cannot decode"):
            load_image(data)


def test_a_damaged_avif_is_called_damaged_where_pillow_reads_avif() -> None:
    data = avif_bytes()[:60] + b"\x00" * 200
    with pytest.raises(InputImageError) as err:
        load_image(data)
    if "AVIF" in Image.OPEN:  # this Pillow reads AVIF: the file is at fault, not the installation
        assert "installation cannot decode" not in str(err.value)
        assert re.search(r"AVIF file is damaged", str(err.value))
    else:
        assert "AVIF image, which this installation cannot decode" in str(err.value)


def test_large_refusals_are_cheap(decodes: list[tuple[int, int]]) -> None:
    # The 90 MP header is refused from the header: no pixel is ever decoded.
    data = png_with_size(10000, 9000)
    for _ in range(20):
        with pytest.raises(InputImageError, match="above the limit"):
            load_image(data)
    assert decodes == []


# ----------------------------------------------------------------------------- EXIF orientation

# Stored pixels for each EXIF orientation, from the TIFF/EXIF definition of what the viewer does.
STORED_FOR: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    2: lambda u: u[:, ::-1],  # viewer mirrors horizontally
    3: lambda u: u[::-1, ::-1],  # viewer rotates 180
    4: lambda u: u[::-1],  # viewer mirrors vertically
    5: lambda u: u.transpose(1, 0, 2),  # viewer transposes
    6: lambda u: np.rot90(u, 1),  # viewer rotates 90 clockwise
    7: lambda u: u[::-1, ::-1].transpose(1, 0, 2),  # viewer transverses
    8: lambda u: np.rot90(u, -1),  # viewer rotates 90 counter-clockwise
}


def exif_copy(upright: np.ndarray, orientation: int, fmt: str = "PNG") -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    stored = np.ascontiguousarray(STORED_FOR[orientation](upright))
    return encode(Image.fromarray(stored), fmt, exif=exif, **({"quality": 95} if fmt == "JPEG" else {}))


@pytest.mark.parametrize("orientation", sorted(STORED_FOR))
def test_exif_orientations_come_out_upright(orientation: int) -> None:
    upright = person_like(30, 20)
    assert np.array_equal(load_image(exif_copy(upright, orientation)).rgb, upright)


def test_exif_rotated_jpeg_comes_out_upright() -> None:
    upright = person_like(64, 48)
    rgb = load_image(exif_copy(upright, 6, "JPEG")).rgb
    assert rgb.shape == upright.shape
    assert np.abs(rgb.astype(int) - upright).mean() < 4  # JPEG noise only
    assert tuple(rgb[1, 1]) > (200, 0, 0) and rgb[1, 1, 1] < 60  # the red marker is top-left again


# ----------------------------------------------------------------------------- pipelines


class Poison(torch.nn.Module):
    """Wraps a model: NaN over the top third and +/-inf at two pixels of every map; vectors all NaN."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> Any:
        out = self.inner(x)
        for f in dataclasses.fields(out):
            t = getattr(out, f.name).clone()
            if t.ndim == 4:
                t[:, :, : t.shape[2] // 3] = float("nan")
                t[:, :, -1, -1] = float("inf")
                t[:, :, -1, 0] = float("-inf")
            else:
                t[:] = float("nan")
            setattr(out, f.name, t)
        return out


def small_factory(tiny_checkpoints: dict[str, Path], *, poison: bool = False, detector: Any = None):
    """A ModelManager factory over the tiny checkpoints, quarter-size input, optional NaN wrapper."""

    def factory(task: str, size: str | None, **kwargs: Any) -> Any:
        kwargs["checkpoint"] = tiny_checkpoints[task]  # a tiny model answers for every size
        if task == "pose":
            kwargs["detector"] = detector
        pipe = pipeline(task, None, **kwargs)
        if task != "pointmap":  # its scale branch is sized for the native grid
            pipe.input_hw = SMALL
        if poison:
            pipe.model = Poison(pipe.model)
        return pipe

    return factory


@pytest.fixture(scope="module")
def manager(tiny_checkpoints) -> serving.ModelManager:
    return serving.ModelManager(device="cpu", factory=small_factory(tiny_checkpoints))


def run(manager: serving.ModelManager, task: str, image: Any, out: Path, **options: Any) -> serving.Presented:
    """What the app does per request, minus Gradio."""
    infer_opts, render_opts = one_request.split_options(task, options)
    intake = read_photo(image)
    result = one_request.infer(manager, task, intake, None, **infer_opts)
    return serving.present(T(task), result, out, **render_opts)


def check_exports(shown: serving.Presented, hw: tuple[int, int], out: Path) -> None:
    """Every file sits in ``out``, parses, and holds no inf (NaN only where it means 'no value')."""
    assert shown.after.shape == (*hw, 3) and shown.after.dtype == np.uint8
    assert shown.files and all(p.parent == out and p.stat().st_size > 0 for p in shown.files)
    for p in shown.files:
        if p.suffix == ".png":
            with Image.open(p) as im:
                assert im.size == (hw[1], hw[0]), p.name
        elif p.suffix == ".json":  # strict JSON: NaN/Infinity tokens are refused
            tokens: list[str] = []
            json.loads(p.read_text(), parse_constant=tokens.append)
            assert not tokens, f"{p.name} holds {tokens}"
        elif p.suffix == ".npy":
            arr = np.load(p)
            if arr.dtype.kind == "f":
                assert not np.isinf(arr).any(), p.name
                # NaN is the documented "no point" of pointmaps and the undefined embedding
                if not p.stem.endswith(("_pointmap", "_depth", "_embedding")):
                    assert np.isfinite(arr).all(), p.name
        elif p.suffix == ".ply":
            head, _, body = p.read_bytes().partition(b"end_header\n")
            n = int(head.split(b"element vertex ")[1].split(b"\n")[0])
            has_color = b"red" in head
            rgba = [("rgba", "u1", 4)] if has_color else []
            size = n * np.dtype([("xyz", "<f4", 3), *rgba]).itemsize  # vertices first, then any faces
            rec = np.frombuffer(body[:size], dtype=[("xyz", "<f4", 3), *rgba])
            assert len(rec) == n and np.isfinite(rec["xyz"]).all()
        elif p.suffix == ".glb":
            assert p.read_bytes()[:4] == b"glTF"


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(1, 1), (10000, 2), (2, 10000)], ids=["1x1", "2x10000", "10000x2"])
def test_extreme_shapes_run_every_task(manager, shape: tuple[int, int], tmp_path: Path) -> None:
    img = np.full((*shape, 3), 120, np.uint8)
    img[: shape[0] // 2] = (200, 60, 20)
    for task in TASKS:
        out = tmp_path / task
        shown = run(manager, task, img, out, **({"use_segmentation": False} if task == "pointmap" else {}))
        check_exports(shown, shape, out)
        assert np.array_equal(shown.before, img)


@pytest.mark.parametrize("name", ["sixteen.png", "cmyk.jpg", "palette.png", "clear.png", "anim.gif"])
def test_odd_modes_run_through_a_task(manager, name: str, tmp_path: Path) -> None:
    make = {c[0]: c[1] for c in CORPUS}[name]
    path = tmp_path / name
    path.write_bytes(make())
    shown = run(manager, "seg", str(path), tmp_path / "out")
    check_exports(shown, load_image(str(path)).size_hw, tmp_path / "out")


@pytest.mark.slow
def test_exif_rotated_photo_gives_results_aligned_with_the_upright_one(manager, tmp_path: Path) -> None:
    upright = person_like(64, 40, seed=4)
    seg_up = one_request.infer(manager, "seg", upright)
    pose_up = one_request.infer(manager, "pose", upright)
    for orientation in (3, 6, 8):
        rotated = exif_copy(upright, orientation)
        seg = one_request.infer(manager, "seg", rotated)
        pose = one_request.infer(manager, "pose", rotated)
        assert seg.image.shape == upright.shape and np.array_equal(seg.labels, seg_up.labels)
        assert np.allclose(pose.keypoints, pose_up.keypoints, atol=1e-3)
        assert np.allclose(pose.boxes, [[0, 0, 39, 63]])  # the whole upright picture, [0, 0, w-1, h-1]
    # ...and the orientation really matters: the stored pixels as they are give another answer
    raw = one_request.infer(manager, "pose", STORED_FOR[6](upright).copy())
    assert raw.image.shape != upright.shape


def test_no_person_falls_back_to_the_whole_image_with_a_notice(tiny_checkpoints, tmp_path: Path) -> None:
    nobody = serving.ModelManager(
        device="cpu", factory=small_factory(tiny_checkpoints, detector=lambda im: [])
    )
    shown = run(nobody, "pose", person_like(50, 70), tmp_path)
    data = shown.views[0]  # pose's first view: the 308-point JSON
    assert len(data["people"]) == 1 and data["detection"]["source"] == "whole_image"
    assert any("No person found" in n and "whole image" in n for n in shown.notices)


def test_a_photo_decoded_reduced_says_so_in_the_results_and_the_json(
    manager, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1_000_000)  # 1600x1200 stands in for 108 MP
    photo = tmp_path / "big.jpg"
    Image.fromarray(person_like(1200, 1600)).save(photo, quality=95)
    shown = run(manager, "pose", photo, tmp_path / "out")
    assert shown.before.shape == (600, 800, 3)  # results are in the pixels of the reduced picture
    check_exports(shown, (600, 800), tmp_path / "out")
    exported = json.loads(next(p for p in shown.files if p.name.endswith("_pose.json")).read_text())
    assert exported["image_size"] == {"width": 800, "height": 600}
    said = "The photo is 1600x1200 px (1.9 megapixels), above the 1.0 megapixel limit for a full decode"
    assert any(n.startswith(said) and "1/2 scale (800x600 px)" in n for n in exported["notices"])
    assert any("1/2 scale" in n for n in shown.notices)


def test_a_crowd_of_30_is_capped_and_the_cap_is_said(tiny_checkpoints, tmp_path: Path) -> None:
    h, w = 60, 300

    def crowd(im: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        boxes = np.array([[10 * i, 5, 10 * i + 9, 55] for i in range(30)], np.float32)
        return boxes, np.linspace(0.99, 0.5, 30)

    many = serving.ModelManager(device="cpu", factory=small_factory(tiny_checkpoints, detector=crowd))
    shown = run(many, "pose", person_like(h, w), tmp_path)  # the app's default max_people is 20
    people = shown.views[0]["people"]  # pose's first view: the 308-point JSON
    assert len(people) == 20 and shown.views[0]["detection"] == {"source": "detector", "num_found": 30}
    assert any("Found 30 people, kept 20" in n for n in shown.notices)
    assert [p["box"][0] for p in people] == pytest.approx([10.0 * i for i in range(20)])  # best scores
    assert len(json.loads((tmp_path / "image_pose.json").read_text())["people"]) == 20


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
def test_nan_and_inf_in_model_output_never_reach_pictures_or_files(tiny_checkpoints, task, tmp_path) -> None:
    sick = serving.ModelManager(device="cpu", factory=small_factory(tiny_checkpoints, poison=True))
    img = person_like(40, 30)
    opts = {"remove_background": True} if task == "normal" else {}
    shown = run(sick, task, img, tmp_path, **opts)
    check_exports(shown, (40, 30), tmp_path)
    assert any("NaN" in n or "non-finite" in n for n in shown.notices), shown.notices
    if task == "pose":  # every other rendering option draws too
        result = one_request.infer(sick, "pose", img)
        for kw in ({"threshold": 0.0}, {"body_only": True, "show_boxes": True}):
            assert result.render(**kw).shape == (40, 30, 3)
    if task == "features":
        from sapiens2.tasks.features import cosine_similarity

        res = one_request.infer(sick, "features", img)
        with pytest.raises(OptionError, match="NaN"):
            cosine_similarity(res, res)


@pytest.mark.parametrize(
    "background",
    [
        Image.new("LA", (7, 300), (90, 128)),
        Image.new("CMYK", (500, 20), (255, 0, 0, 0)),
        Image.fromarray(np.full((9, 13), 40000, np.uint16)),
        "palette",
    ],
    ids=["LA-7x300", "CMYK-500x20", "I16-13x9", "P-transparent"],
)
def test_matting_background_of_another_size_and_mode(manager, background, tmp_path: Path) -> None:
    bg = tmp_path / "bg.png"
    if background == "palette":
        bg.write_bytes(palette_with_transparency())
    else:
        (background.convert("RGB") if background.mode == "CMYK" else background).save(bg)
    out = tmp_path / "out"
    shown = run(manager, "matting", person_like(40, 30), out, background_image=str(bg))
    check_exports(shown, (40, 30), out)
    assert {p.name for p in shown.files} == {"image_cutout.png", "image_alpha.png", "image_composite.png"}


# ----------------------------------------------------------------------------- wrong options


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: pipeline("seg", "7b"),
            r"Size '7b' does not exist for seg; choose one of: 0\.4b, 0\.8b, 1b, 5b",
        ),
        (lambda: pipeline("matting", "0.4b"), r"choose one of: 1b\."),
        (lambda: pipeline("pose", "0.1b"), r"choose one of: 0\.4b, 0\.8b, 1b, 5b"),
        (lambda: pipeline("height"), r"Unknown task 'height'; choose one of: pose, seg"),
        (
            lambda: one_request.split_options("pose", {"threshold": 1.5}),
            r"'threshold' must be a number from 0 to 1; got 1\.5",
        ),  # fmt: skip
        (lambda: one_request.split_options("pose", {"max_people": 0}), r"from 1 to 50; got 0"),
        (lambda: one_request.split_options("seg", {"opacity": -0.1}), r"from 0 to 1"),
        (
            lambda: one_request.split_options("seg", {"classes": ["Torso", "wings"]}),
            r"Unknown body-part class 'wings'.*Torso",
        ),  # fmt: skip
        (
            lambda: one_request.split_options("normal", {"background": "purple"}),
            r"one of: black, photo; got 'purple'",
        ),
        (lambda: one_request.split_options("matting", {"background_color": "sky"}), r"'#rrggbb'"),
        (
            lambda: one_request.split_options("seg", {"colour": 1}),
            r"Unknown seg option 'colour'; allowed: opacity, classes",
        ),
    ],
)
def test_wrong_options_name_the_allowed_values(call, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        call()


def test_pipelines_refuse_wrong_option_values_too(manager) -> None:
    pose = manager.get(T("pose"))
    img = person_like(20, 20)
    with pytest.raises(OptionError, match=r"score_threshold must be a number in \[0, 1\]; got 1\.5"):
        pose(img, score_threshold=1.5)
    with pytest.raises(OptionError, match=r"max_people must be a whole number >= 1"):
        pose(img, max_people=0)
    seg = manager.get(T("seg"))(img)
    with pytest.raises(OptionError, match=r"opacity must be between 0 and 1"):
        seg.render(opacity=3)
    with pytest.raises(OptionError, match=r"Unknown body-part class 'wings'"):
        seg.render(classes=["wings"])


# ----------------------------------------------------------------------------- through the app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def client(tiny_checkpoints, tmp_path_factory) -> Iterator[Any]:
    gradio_client = pytest.importorskip("gradio_client")
    import app

    mp = pytest.MonkeyPatch()
    tmp = tmp_path_factory.mktemp("hostile_app")
    mp.setenv("GRADIO_EXAMPLES_CACHE", str(tmp / "examples"))
    manager = serving.ModelManager(device="cpu", factory=small_factory(tiny_checkpoints))
    demo = app.build_demo(manager, folders=serving.RequestFolders(tmp / "requests"))
    _, url, _ = app.launch(demo, host="127.0.0.1", port=free_port(), prevent_thread_lock=True, quiet=True)
    c = gradio_client.Client(url, download_files=str(tmp / "downloads"), verbose=False)
    c.requests_root = tmp / "requests"  # where the server writes each request's files
    yield c
    demo.close()
    mp.undo()


def count_forwards(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The task of every model forward from now on (in this process: the test's app server too)."""
    from sapiens2.tasks.base import Pipeline

    seen: list[str] = []
    real = Pipeline.timed_forward

    def timed_forward(self: Any, info: Any, pixel_values: Any) -> Any:
        seen.append(self.task)
        return real(self, info, pixel_values)

    monkeypatch.setattr(Pipeline, "timed_forward", timed_forward)
    return seen


@pytest.fixture
def gradio_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per data URL Gradio's image helpers decode (the app's server runs in this process)."""
    from gradio import image_utils

    seen: list[int] = []
    for name in ("decode_base64_to_image", "decode_base64_to_image_array"):
        real = getattr(image_utils, name)

        def decode(encoding: str, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            seen.append(len(encoding))
            return _real(encoding, *args, **kwargs)

        monkeypatch.setattr(image_utils, name, decode)
    return seen


def good_seg(client: Any, photo: Path) -> None:
    from gradio_client import handle_file

    pair, legend, files, line = client.predict(handle_file(str(photo)), "0.4b", 0.5, [], api_name="/seg")
    assert line.startswith("Body parts (") and len(files) == 4


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["empty.jpg", "notes.jpg", "truncated.jpg", "corrupt.png", "bomb.png", "bomb.jpg", "photo.heic"]
)
def test_app_names_the_problem_with_each_bad_file_and_stays_up(
    client, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gradio_client import handle_file

    make, expected = next((c[1], c[2]) for c in CORPUS if c[0] == name)
    bad = tmp_path / name
    bad.write_bytes(make())
    good = tmp_path / "good.png"
    Image.fromarray(person_like()).save(good)
    forwards = count_forwards(monkeypatch)  # the server runs in this process
    with pytest.raises(Exception, match=expected):
        client.predict(handle_file(str(bad)), "0.4b", 0.5, [], api_name="/seg")
    assert forwards == []  # refused before any model run
    good_seg(client, good)
    assert len(forwards) == 1  # the count sees the model runs it must not see above


@pytest.mark.slow
def test_app_runs_odd_but_valid_files(client, tmp_path: Path) -> None:
    from gradio_client import handle_file

    for name in ("strip.png", "palette.png", "anim.gif", "sixteen.png"):
        path = tmp_path / name
        path.write_bytes({c[0]: c[1] for c in CORPUS}[name]())
        pair, _, files, line = client.predict(handle_file(str(path)), "0.4b", 0.5, [], api_name="/seg")
        size = Image.open(path).size
        blended = next(f for f in files if f.endswith("_seg.png"))  # downloads keep the photo's size
        assert Image.open(blended).size == size and line.startswith("Body parts (")
        shown = Image.open(pair[1]).size  # the page's preview: at most 2048 px long (strip: 10000x2)
        assert shown == size if max(size) <= 2048 else max(shown) == 2048


def test_app_matting_background_of_another_size_and_mode(client, tmp_path: Path) -> None:
    from gradio_client import handle_file

    photo, bg = tmp_path / "p.png", tmp_path / "bg.png"
    Image.fromarray(person_like()).save(photo)
    Image.new("LA", (5, 200), (30, 255)).save(bg)
    pair, files, line = client.predict(
        handle_file(str(photo)), "1b", "#00b140", handle_file(str(bg)), api_name="/matting"
    )
    assert Image.open(pair[1]).size == (36, 48) and len(files) == 3
    bad = tmp_path / "bg.jpg"
    bad.write_bytes(b"")
    with pytest.raises(Exception, match=r"Background image: .*empty"):
        client.predict(handle_file(str(photo)), "1b", "#00b140", handle_file(str(bad)), api_name="/matting")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("api", "args", "message"),
    [
        ("/seg", ("7b", 0.5, []), r"Size '7b' does not exist for seg; choose one of: 0\.4b, 0\.8b, 1b, 5b"),
        ("/matting", ("0.4b", "#00b140", None), r"choose one of: 1b"),
        ("/features", ("2b",), r"choose one of: 0\.1b, 0\.4b, 0\.8b, 1b, 1b-4k, 5b"),
        (
            "/pose",
            ("0.4b", 1.5, False, True, False, True, 20),
            r"'threshold' must be a number from 0 to 1; got 1\.5",
        ),  # fmt: skip
        ("/pose", ("0.4b", 0.3, False, True, False, True, 0), r"'max_people' must be a number from 1 to 50"),
        ("/seg", ("0.4b", 7, []), r"'opacity' must be a number from 0 to 1"),
        ("/seg", ("0.4b", 0.5, ["Torso", "wings"]), r"Unknown body-part class 'wings'.*Torso"),
        ("/normal", ("0.4b", False, "purple"), r"one of: black, photo; got 'purple'"),
        ("/matting", ("1b", "sky blue", None), r"'#rrggbb'"),
        ("/similarity", ("PHOTO", "0.3b"), r"Size '0\.3b' does not exist for features"),
    ],
)
def test_app_wrong_option_values_are_errors_naming_the_allowed_values(
    client, api: str, args: tuple, message: str, tmp_path: Path
) -> None:
    from gradio_client import handle_file

    photo = tmp_path / "p.png"
    Image.fromarray(person_like()).save(photo)
    args = tuple(handle_file(str(photo)) if a == "PHOTO" else a for a in args)
    with pytest.raises(Exception, match=message):
        client.predict(handle_file(str(photo)), *args, api_name=api)
    good_seg(client, photo)  # the server is still up and serves the next request


def test_app_upload_names_never_become_paths(client, tmp_path: Path) -> None:
    from gradio_client import handle_file

    odd = tmp_path / "..\\..\\etc\\x.png"  # backslashes are legal in a Linux file name
    Image.fromarray(person_like()).save(odd, format="PNG")
    before = set(client.requests_root.rglob("*"))
    client.predict(handle_file(str(odd)), "0.4b", 0.5, [], api_name="/seg")
    written = sorted(set(client.requests_root.rglob("*")) - before)
    previews = [p for p in written if p.is_file() and p.parent.name == "preview"]  # the photo's safe stem
    assert sorted(p.name for p in previews) == ["etcx_preview.jpg", "etcx_seg_preview.jpg"]
    files = [p for p in written if p.is_file() and p not in previews]
    assert len(files) == 4 and len({p.parent for p in files}) == 1  # one fresh folder per request
    assert previews[0].parent.parent == files[0].parent
    folder = files[0].parent
    assert folder.parent == client.requests_root and folder.name.startswith("req-")
    for p in files:
        assert re.fullmatch(r"[A-Za-z0-9_-]+_seg(_color|_labels)?\.(png|npy)", p.name), p.name


def call_rest(base_url: str, api: str, data: list) -> tuple[str, Any]:
    """One call through Gradio's REST API (what curl users do): returns (event, data)."""
    import urllib.request

    req = urllib.request.Request(
        f"{base_url}gradio_api/call/{api}",
        data=json.dumps({"data": data}).encode(),
        headers={"Content-Type": "application/json"},
    )
    event_id = json.loads(urllib.request.urlopen(req, timeout=30).read())["event_id"]
    text = urllib.request.urlopen(f"{base_url}gradio_api/call/{api}/{event_id}", timeout=120).read().decode()
    event = re.search(r"^event: (\w+)", text, re.M).group(1)
    return event, json.loads(re.search(r"^data: (.*)$", text, re.M).group(1))


def data_url(data: bytes) -> dict:
    import base64

    return {
        "url": "data:image/png;base64," + base64.b64encode(data).decode(),
        "meta": {"_type": "gradio.FileData"},
    }


def test_app_data_urls_are_read_by_the_package_not_decoded_by_gradio(
    client, gradio_decodes: list[int], decodes: list[tuple[int, int]]
) -> None:
    # Gradio would decode a data URL and re-encode it as WebP (4 s for this 90 MP PNG) before any check.
    bomb = encode(Image.new("1", (10000, 9000)), "PNG")  # 90 megapixels in 11 kB
    event, data = call_rest(client.src, "seg", [data_url(bomb), "0.4b", 0.5, []])
    assert event == "error" and re.search(r"10000x9000 px .* above the limit", data["error"])
    assert gradio_decodes == [] and decodes == []  # counted, not timed: Gradio never decoded it
    event, data = call_rest(
        client.src, "seg", [{**data_url(b""), "url": "data:image/png;base64,@@"}, "0.4b", 0.5, []]
    )
    assert event == "error" and "not a valid data URL" in data["error"]
    event, data = call_rest(
        client.src, "seg", [data_url(encode(Image.fromarray(person_like()), "PNG")), "0.4b", 0.5, []]
    )
    assert event == "complete" and data[-1].startswith("Body parts (")
