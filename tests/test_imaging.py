"""Image intake (every conversion and every refusal) and the network-input geometry helpers."""

from __future__ import annotations

import io
import os
import struct
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from sapiens2.errors import InputImageError, OptionError
from sapiens2.inputs import image_decode
from sapiens2.inputs import intake as imaging
from sapiens2.inputs.intake import Intake, load_image
from sapiens2.inputs.network import (
    PadInfo,
    crop_padding,
    letterbox_release,
    network_batch,
    normalize,
    pad_info,
    resize_hwc,
    resize_to,
)
from sapiens2.models.zoo import IMAGE_MEAN, IMAGE_STD
from sapiens2.tasks.pose.pose_crops import (
    apply_affine,
    box_to_center_scale,
    crop_people,
    inverse_warp_matrix,
    warp_matrix,
)

MEAN = np.array(IMAGE_MEAN) * 255
STD = np.array(IMAGE_STD) * 255


def _png_bytes(im: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format="PNG", **kw)
    return buf.getvalue()


# ------------------------------------------------------------------ conversions


def test_exif_rotation_is_applied_and_marker_ends_up_upright() -> None:
    stored = np.zeros((20, 40, 3), np.uint8)  # 40 wide, 20 tall as stored
    stored[:4, :4] = (255, 0, 0)  # red marker at the stored top-left
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    intake = load_image(_png_bytes(Image.fromarray(stored), exif=exif))
    assert intake.rgb.shape == (40, 20, 3)  # upright: 20 wide, 40 tall
    assert tuple(intake.rgb[1, -2]) == (255, 0, 0)  # top-left went to the top-right
    assert tuple(intake.rgb[-2, 1]) == (0, 0, 0)


def test_rgba_is_composited_over_white() -> None:
    arr = np.zeros((2, 3, 4), np.uint8)
    arr[0, 0] = (10, 20, 30, 255)  # opaque
    arr[0, 1] = (0, 0, 0, 0)  # transparent -> white
    arr[0, 2] = (0, 0, 0, 128)  # half -> mid grey
    rgb = load_image(Image.fromarray(arr, "RGBA")).rgb
    assert tuple(rgb[0, 0]) == (10, 20, 30)
    assert tuple(rgb[0, 1]) == (255, 255, 255)
    assert abs(int(rgb[0, 2, 0]) - 127) <= 1


def test_fully_transparent_picture_becomes_white() -> None:
    rgb = load_image(_png_bytes(Image.new("RGBA", (8, 8), (200, 0, 0, 0)))).rgb
    assert (rgb == 255).all()


def test_la_over_white() -> None:
    arr = np.array([[[40, 255], [40, 0]]], np.uint8)
    rgb = load_image(Image.fromarray(arr, "LA")).rgb
    assert tuple(rgb[0, 0]) == (40, 40, 40) and tuple(rgb[0, 1]) == (255, 255, 255)


def test_palette_with_transparency_over_white() -> None:
    im = Image.new("P", (4, 1))
    im.putpalette([255, 0, 0, 0, 0, 255] + [0] * 762)
    im.putdata([0, 1, 0, 1])
    intake = load_image(_png_bytes(im, transparency=1))  # index 1 (blue) is transparent
    assert tuple(intake.rgb[0, 0]) == (255, 0, 0)
    assert tuple(intake.rgb[0, 1]) == (255, 255, 255)


def test_palette_without_transparency_keeps_colours() -> None:
    im = Image.new("P", (2, 1))
    im.putpalette([0, 255, 0] + [0] * 765)
    rgb = load_image(im).rgb
    assert tuple(rgb[0, 0]) == (0, 255, 0)


def test_grayscale_l() -> None:
    rgb = load_image(Image.fromarray(np.array([[0, 77, 255]], np.uint8), "L")).rgb
    assert rgb.shape == (1, 3, 3) and rgb.dtype == np.uint8
    assert rgb[0, :, 0].tolist() == [0, 77, 255] and (rgb[..., 0] == rgb[..., 2]).all()


def test_sixteen_bit_png_scaled_to_eight_bits() -> None:
    arr = np.array([[0, 257 * 100, 65535]], np.uint16)
    data = _png_bytes(Image.fromarray(arr))
    assert Image.open(io.BytesIO(data)).mode.startswith("I")
    assert load_image(data).rgb[0, :, 1].tolist() == [0, 100, 255]


def test_mode_i_with_wide_values_is_stretched_with_notice() -> None:
    intake = load_image(Image.fromarray(np.array([[-1000, 0, 1000]], np.int32), "I"))
    assert intake.rgb[0, :, 0].tolist() == [0, 128, 255]
    assert any("stretched" in n for n in intake.notices)


def test_mode_f_in_unit_range() -> None:
    im = Image.fromarray(np.array([[0.0, 0.5, 1.0]], np.float32), "F")
    assert load_image(im).rgb[0, :, 0].tolist() == [0, 128, 255]


def test_cmyk_jpeg_converted() -> None:
    buf = io.BytesIO()
    Image.new("CMYK", (8, 8), (255, 0, 0, 0)).save(buf, format="JPEG", quality=95)  # pure cyan
    rgb = load_image(buf.getvalue()).rgb
    r, g, b = (int(v) for v in rgb[4, 4])
    assert r < 30 and g > 225 and b > 225


def test_one_bit_image() -> None:
    im = Image.new("1", (2, 1), 0)
    im.putpixel((0, 0), 1)
    assert load_image(_png_bytes(im)).rgb[0, :, 0].tolist() == [255, 0]


def test_animated_gif_uses_first_frame_with_notice() -> None:
    frames = [Image.new("RGB", (6, 6), c) for c in ((255, 0, 0), (0, 0, 255), (0, 255, 0))]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], duration=50)
    intake = load_image(buf.getvalue())
    assert tuple(intake.rgb[3, 3]) == (255, 0, 0)
    assert any("first frame" in n and "3 frames" in n for n in intake.notices)


@pytest.mark.parametrize(
    ("arr", "expected"),
    [
        (np.array([[5, 250]], np.uint8), [5, 250]),
        (np.array([[[5], [250]]], np.uint8), [5, 250]),
        (np.array([[0, 65535]], np.uint16), [0, 255]),
        (np.array([[0.0, 1.0]], np.float32), [0, 255]),
        (np.array([[0.0, 200.0]], np.float64), [0, 200]),
        (np.array([[True, False]]), [255, 0]),
        (np.array([[3, 200]], np.int64), [3, 200]),
    ],
)
def test_numpy_gray_variants(arr: np.ndarray, expected: list[int]) -> None:
    rgb = load_image(arr).rgb
    assert rgb.dtype == np.uint8 and rgb.shape == (1, 2, 3)
    assert rgb[0, :, 0].tolist() == expected and (rgb[..., 0] == rgb[..., 1]).all()


def test_numpy_rgb_rgba_and_gray_alpha() -> None:
    rgb = np.array([[[1, 2, 3]]], np.uint8)
    assert load_image(rgb).rgb.tolist() == [[[1, 2, 3]]]
    assert load_image(np.array([[[1, 2, 3, 0]]], np.uint8)).rgb.tolist() == [[[255, 255, 255]]]
    assert load_image(np.array([[[9, 255]]], np.uint8)).rgb.tolist() == [[[9, 9, 9]]]


def test_numpy_float_wide_range_and_nan_give_notices() -> None:
    intake = load_image(np.array([[np.nan, -5.0, 5.0]], np.float32))
    assert intake.rgb[0, :, 0].tolist() == [128, 0, 255]  # NaN -> 0, then stretched
    assert any("NaN" in n for n in intake.notices) and any("stretched" in n for n in intake.notices)


def test_tiny_images_are_kept_as_they_are() -> None:
    tiny = load_image(np.full((1, 1, 3), 9, np.uint8))
    assert tiny.rgb.shape == (1, 1, 3) and not tiny.downscaled
    x, pad = letterbox_release(tiny.work)
    assert x.shape == (1024, 768, 3) and pad.inner_hw == (768, 768)
    crops, info = crop_people(tiny.work, np.array([[0, 0, 1, 1]]), backend="torch")
    assert torch.isfinite(crops).all() and crops.shape == (1, 3, 1024, 768)
    thin = load_image(np.full((2, 10000, 3), 9, np.uint8))
    assert thin.rgb.shape == (2, 10000, 3) and thin.work.shape == (1, 4096, 3)  # long side > 4096
    x, pad = letterbox_release(thin.work)
    assert pad.inner_hw[0] >= 1 and x.shape == (1024, 768, 3)


def test_safe_name_from_path(tmp_path: Path) -> None:
    path = tmp_path / "my photo (1).png"
    Image.new("RGB", (2, 2)).save(path)
    assert load_image(path).name == "my_photo_1"
    assert load_image(str(path)).name == "my_photo_1"
    assert load_image(path.read_bytes()).name == "image"
    with open(path, "rb") as f:
        assert load_image(f).name == "my_photo_1"
    # the same rule as the export names: dotted names stay distinct, paths never leak in
    for raw, stem in [("a.v1.jpg", "a_v1"), ("a.v2.jpg", "a_v2"), ("my.photo.v2.jpg", "my_photo_v2")]:
        (tmp_path / raw).write_bytes(path.read_bytes())
        assert load_image(tmp_path / raw).name == stem
    assert load_image(Image.open(path)).name == "my_photo_1"


# ------------------------------------------------------------------ downscaling


def test_large_image_downscaled_with_flag_and_mapping_back() -> None:
    h, w = 300, 1000
    yy, xx = np.mgrid[0:h, 0:w]
    cx, cy = 612.3, 141.7  # a smooth blob at a known sub-pixel spot
    blob = 255 * np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * 12.0**2))
    intake = load_image(np.repeat(blob[..., None], 3, 2).astype(np.uint8), max_side=250)
    assert intake.downscaled and intake.work.shape[:2] == (75, 250) and intake.rgb.shape[:2] == (h, w)
    assert intake.scale == pytest.approx(0.25)
    assert any("250x75" in n and "mapped back" in n for n in intake.notices)
    wimg = intake.work[..., 0].astype(np.float64)
    wy, wx = np.mgrid[0 : wimg.shape[0], 0 : wimg.shape[1]]
    centroid = np.array([(wx * wimg).sum(), (wy * wimg).sum()]) / wimg.sum()
    back = intake.points_to_original(centroid[None])
    assert np.abs(back[0] - [cx, cy]).max() < 0.3
    boxes = np.array([[100.0, 20.0, 500.0, 280.0]])
    assert np.allclose(intake.boxes_to_original(intake.boxes_to_work(boxes)), boxes, atol=1e-3)


def test_intake_passes_through_and_max_side_is_checked() -> None:
    intake = load_image(np.zeros((4, 4, 3), np.uint8))
    assert load_image(intake) is intake and isinstance(intake, Intake)
    with pytest.raises(OptionError, match="max_side must be an integer >= 16"):
        load_image(np.zeros((4, 4, 3), np.uint8), max_side=0)


# ------------------------------------------------------------------ refusals


def test_missing_file_and_folder(tmp_path: Path) -> None:
    with pytest.raises(InputImageError, match="not found: 'nope.jpg'"):
        load_image(tmp_path / "nope.jpg")
    with pytest.raises(InputImageError, match="is a folder, not an image file"):
        load_image(tmp_path)


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "empty.jpg").write_bytes(b"")
    with pytest.raises(InputImageError, match=r"empty \(0 bytes\)"):
        load_image(tmp_path / "empty.jpg")


def test_text_file_renamed_jpg(tmp_path: Path) -> None:
    (tmp_path / "notes.jpg").write_text("hello, this is not a picture\n")
    with pytest.raises(InputImageError, match="not an image \\(it contains text\\)"):
        load_image(tmp_path / "notes.jpg")


def test_random_bytes_are_refused() -> None:
    with pytest.raises(InputImageError, match="not an image Pillow can read"):
        load_image(bytes(range(256)) * 4)


def test_truncated_jpeg() -> None:
    buf = io.BytesIO()
    rng = np.random.default_rng(0)
    Image.fromarray((rng.random((64, 64, 3)) * 255).astype(np.uint8)).save(buf, format="JPEG")
    with pytest.raises(InputImageError, match="truncated"):
        load_image(buf.getvalue()[: len(buf.getvalue()) // 2])


def test_corrupt_png_data() -> None:
    data = bytearray(_png_bytes(Image.new("RGB", (32, 32), (1, 2, 3))))
    start = data.index(b"IDAT") + 4
    data[start : start + 20] = b"\xff" * 20  # scramble the compressed stream
    with pytest.raises(InputImageError, match="corrupt|truncated"):
        load_image(bytes(data))


def test_heic_without_decoder_is_named() -> None:
    fake = struct.pack(">I", 24) + b"ftypheic" + b"\x00" * 40
    with pytest.raises(InputImageError, match="HEIC/HEIF image, which this installation cannot decode"):
        load_image(fake)


def _png_with_size(w: int, h: int) -> bytes:
    """A valid 1x1 PNG whose header claims w x h (enough for Pillow's size checks)."""
    data = bytearray(_png_bytes(Image.new("RGB", (1, 1))))
    ihdr = data.index(b"IHDR")
    data[ihdr + 4 : ihdr + 12] = struct.pack(">II", w, h)
    crc = zlib.crc32(bytes(data[ihdr : ihdr + 17]))
    data[ihdr + 17 : ihdr + 21] = struct.pack(">I", crc)
    return bytes(data)


def test_decompression_bomb_far_over_the_limit() -> None:
    with pytest.raises(InputImageError, match=r"400\.0 megapixels, above the limit of 89\.5 megapixels"):
        load_image(_png_with_size(20000, 20000))


def test_decompression_bomb_just_over_the_limit() -> None:
    with pytest.warns(Image.DecompressionBombWarning):  # Pillow only warns here; we refuse
        with pytest.raises(InputImageError, match=r"10000x10000 px \(100\.0 megapixels\).*MAX_IMAGE_PIXELS"):
            load_image(_png_with_size(10000, 10000))


# ------------------------------------------------------------------ what a path may name, byte budget


def _finishes(fn, seconds: float = 30.0):
    """Run ``fn`` in a daemon thread: a regression that blocks fails the test instead of hanging it.
    A block lasts forever, so the bound is wide: a busy machine never reaches it."""
    import threading

    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # handed to the test below
            box["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds} s"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("value")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_a_fifo_is_refused_at_once_without_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "photo.jpg"
    os.mkfifo(fifo)
    with pytest.raises(InputImageError, match=r"'photo.jpg' is a FIFO \(named pipe\), not an image file"):
        _finishes(lambda: load_image(fifo))


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero here")
def test_devices_are_refused_and_an_endless_stream_is_read_only_to_the_budget() -> None:
    with pytest.raises(InputImageError, match="'zero' is a character device, not an image file"):
        _finishes(lambda: load_image("/dev/zero"))
    with open("/dev/zero", "rb") as endless:  # a file object is read to the budget + 1, never further
        with pytest.raises(InputImageError, match=r"larger than the limit of 1000 bytes"):
            _finishes(lambda: load_image(endless, max_bytes=1000))
        assert endless.tell() <= 1001


def test_the_byte_budget_holds_for_paths_bytes_and_file_objects(tmp_path: Path) -> None:
    assert imaging.MAX_FILE_BYTES == 40 * 2**20  # the app's upload limit is derived from it
    data = _png_bytes(Image.new("RGB", (64, 64), (5, 6, 7)))
    path = tmp_path / "p.png"
    path.write_bytes(data)
    budget = len(data)
    assert load_image(path, max_bytes=budget).rgb.shape == (64, 64, 3)  # exactly the budget is fine
    assert load_image(data, max_bytes=budget).rgb.shape == (64, 64, 3)
    over = rf"is {budget + 1} bytes, above the limit of {budget} bytes for one image .*MAX_FILE_BYTES"
    path.write_bytes(data + b"\0")
    with pytest.raises(InputImageError, match=over):
        load_image(path, max_bytes=budget)
    with pytest.raises(InputImageError, match=over):
        load_image(data + b"\0", max_bytes=budget)
    with (
        open(path, "rb") as f,
        pytest.raises(InputImageError, match=rf"larger than the limit of {budget} bytes"),
    ):
        load_image(f, max_bytes=budget)
    with pytest.raises(InputImageError, match=r"is 40\.0 MB, above the limit of 40\.0 MB"):
        load_image(b"\xff" * (imaging.MAX_FILE_BYTES + 2**20 // 20))  # 40.05 MiB rounds to 40.0
    with pytest.raises(OptionError, match="max_bytes must be a positive integer"):
        load_image(data, max_bytes=0)


# ------------------------------------------------------------------ large JPEGs decode reduced


def _jpeg(im: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=95, **kw)
    return buf.getvalue()


def _marked_photo(w: int, h: int) -> Image.Image:
    """Grey with a red square whose centre is at (w/4, h/4): where it lands shows the scale."""
    arr = np.full((h, w, 3), 128, np.uint8)
    arr[h // 4 - 40 : h // 4 + 40, w // 4 - 40 : w // 4 + 40] = (220, 20, 20)
    return Image.fromarray(arr)


def _red_centre(rgb: np.ndarray) -> np.ndarray:
    ys, xs = np.nonzero((rgb[..., 0] > 180) & (rgb[..., 1] < 80))
    return np.array([xs.mean(), ys.mean()])


@pytest.mark.parametrize(("limit", "reduction"), [(1_000_000, 2), (100_000, 8)])
def test_a_jpeg_over_the_pixel_limit_is_decoded_reduced(monkeypatch, limit: int, reduction: int) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", limit)  # 1600x1200 stands in for a 108 MP photo
    intake = load_image(_jpeg(_marked_photo(1600, 1200)))
    assert intake.reduction == reduction and intake.source_size == (1600, 1200)
    assert intake.rgb.shape == (1200 // reduction, 1600 // reduction, 3)
    assert intake.rgb.shape[0] * intake.rgb.shape[1] <= limit
    assert any("1600x1200 px" in n and f"1/{reduction} scale" in n for n in intake.notices)
    # a point of the reduced picture is (x + 0.5) * reduction - 0.5 in the file's pixels
    assert np.abs((_red_centre(intake.rgb) + 0.5) * reduction - 0.5 - [400 - 0.5, 300 - 0.5]).max() < 1.0


def test_the_source_size_is_upright_for_an_exif_rotated_jpeg(monkeypatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1_000_000)
    exif = Image.Exif()
    exif[0x0112] = 6  # stored sideways: the viewer turns it 90 degrees clockwise
    intake = load_image(_jpeg(_marked_photo(1600, 1200), exif=exif.tobytes()))
    assert intake.rgb.shape == (800, 600, 3) and intake.source_size == (1200, 1600)
    assert any("1200x1600 px" in n for n in intake.notices)


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # Pillow's open only warns
def test_what_cannot_decode_reduced_is_refused_with_the_reason(monkeypatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1_000_000)
    with pytest.raises(InputImageError, match=r"1600x1200 px .*above the limit .*only JPEG photos"):
        load_image(_png_bytes(_marked_photo(1600, 1200)))  # PNG has no reduced decode
    loaded = Image.open(io.BytesIO(_jpeg(_marked_photo(1600, 1200))))
    lazy = Image.open(io.BytesIO(_jpeg(_marked_photo(1600, 1200))))
    loaded.load()  # already decoded at full size: too late to reduce
    with pytest.raises(InputImageError, match=r"1600x1200 px .*above the limit"):
        load_image(loaded)
    assert load_image(lazy).reduction == 2  # a lazily opened PIL JPEG is reduced like bytes
    monkeypatch.setattr(image_decode, "MAX_REDUCED_PIXELS", 1_500_000)
    with pytest.raises(InputImageError, match=r"1600x1200 px \(1\.9 megapixels\), above the limit of 1\.5"):
        load_image(_jpeg(_marked_photo(1600, 1200)))


def test_a_108_megapixel_phone_jpeg_works_at_half_size() -> None:
    data = _jpeg(Image.new("L", (12000, 9000), 100))  # 12000x9000: over Pillow's 89.5 MP limit
    intake = load_image(data)
    assert intake.reduction == 2 and intake.source_size == (12000, 9000)
    assert intake.rgb.shape == (4500, 6000, 3) and intake.work.shape == (3072, 4096, 3)
    assert "12000x9000 px (108.0 megapixels)" in intake.notices[0]


def test_pixel_limit_applies_to_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(InputImageError, match=r"50x50 px .* above the limit"):
        load_image(np.zeros((50, 50, 3), np.uint8))


@pytest.mark.parametrize(
    ("arr", "message"),
    [
        (np.zeros((3, 20, 30), np.uint8), "looks channels-first"),
        (np.zeros((2, 2, 2, 2), np.uint8), "expected \\(H, W\\) or \\(H, W, C\\)"),
        (np.zeros((0, 5, 3), np.uint8), "has no pixels"),
        (np.zeros((2, 2), np.complex64), "dtype complex64 are not supported"),
    ],
)
def test_bad_arrays(arr: np.ndarray, message: str) -> None:
    with pytest.raises(InputImageError, match=message):
        load_image(arr)


def test_unsupported_input_type_and_text_mode_file(tmp_path: Path) -> None:
    with pytest.raises(InputImageError, match="Unsupported image input of type int"):
        load_image(42)  # type: ignore[arg-type]
    (tmp_path / "a.txt").write_text("x")
    with open(tmp_path / "a.txt") as f, pytest.raises(InputImageError, match="binary mode"):
        load_image(f)  # type: ignore[arg-type]


# ------------------------------------------------------------------ network input


def test_normalize_matches_formula_for_both_layouts() -> None:
    img = np.array([[[0, 128, 255]]], np.uint8)
    a = normalize(img)
    b = normalize(torch.from_numpy(img).permute(2, 0, 1)[None])
    want = (np.array([0, 128, 255]) - MEAN) / STD
    assert a.shape == (1, 3, 1, 1) and torch.equal(a, b)
    assert np.allclose(a.flatten().numpy(), want, atol=1e-5)
    assert normalize(img, torch.bfloat16).dtype == torch.bfloat16


def test_normalize_gives_the_model_the_same_values_and_layout_as_the_plain_formula() -> None:
    """The channel-first, in-place arithmetic is the formula's, to the bit, and the batch keeps the
    layout ``x.float()`` has (a permuted batch: channels last), since a convolution's last bits
    depend on its input's layout."""
    from sapiens2.inputs.network import _MEAN, _STD

    rng = np.random.default_rng(0)
    nhwc = torch.from_numpy(rng.integers(0, 256, (2, 6, 5, 3), dtype=np.uint8))
    for x in (nhwc.permute(0, 3, 1, 2), nhwc.permute(0, 3, 1, 2).contiguous()):
        plain = (x.float() - _MEAN) / _STD
        got = normalize(x)
        assert torch.equal(got, plain) and got.stride() == plain.stride()
    floats = nhwc.permute(0, 3, 1, 2).float()
    before = floats.clone()
    assert torch.equal(normalize(floats), (before - _MEAN) / _STD) and torch.equal(floats, before)


def _smooth_image(h: int, w: int) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    return np.stack([xx * 255 / w, yy * 255 / h, 128 + 100 * np.sin(xx / 9.0)], -1).astype(np.uint8)


def test_letterbox_geometry_padding_value_and_inverse() -> None:
    img = _smooth_image(100, 300)  # wide: fits 768 wide, 256 tall, centred vertically
    canvas, pad = letterbox_release(img, (1024, 768))
    assert pad == PadInfo(top=384, left=0, inner_hw=(256, 768), canvas_hw=(1024, 768), source_hw=(100, 300))
    assert pad.bottom == 384 and pad.right == 0
    ref = cv2.resize(img, (768, 256), interpolation=cv2.INTER_LINEAR)
    assert np.array_equal(canvas[384:640], ref) and not canvas[:384].any() and not canvas[640:].any()
    x = network_batch([canvas], "cpu")  # the zero padding reads -mean/std once normalised
    pad_value = torch.tensor(-MEAN / STD, dtype=torch.float32)
    assert torch.allclose(x[0, :, 0, 0], pad_value) and torch.allclose(x[0, :, -1, -1], pad_value)
    # undo: crop the padding and resize back; a smooth image survives within a few levels
    chw = torch.from_numpy(canvas).permute(2, 0, 1)[None].float()
    back = resize_to(crop_padding(chw, pad), pad.source_hw)
    assert back.shape == (1, 3, 100, 300)
    assert np.abs(back[0].permute(1, 2, 0).numpy() - img).mean() < 2.0
    # an output at 1/4 of the canvas (e.g. a heatmap-sized map) is cropped in proportion
    assert crop_padding(torch.zeros(1, 2, 256, 192), pad).shape == (1, 2, 64, 192)


def test_pad_info_odd_padding_puts_extra_pixel_bottom_right() -> None:
    pad = pad_info((1001, 999), (1024, 768))  # int(769.5) = 769 rows: 255 rows of padding
    assert pad.inner_hw == (769, 768) and (pad.top, pad.left, pad.bottom) == (127, 0, 128)
    pad = pad_info((1000, 999), (1024, 768))  # the release truncates: int(768.77) = 768, not 769
    assert pad.inner_hw == (768, 768) and (pad.top, pad.bottom) == (128, 128)
    pad = pad_info((10, 7), (16, 16))  # -> 16 tall, int(11.2)=11 wide, 5 columns of padding
    assert pad.inner_hw == (16, 11) and pad.left == 2 and pad.right == 3


def test_resize_to_modes() -> None:
    t = torch.arange(4.0).view(1, 1, 2, 2)
    assert resize_to(t, (2, 2)) is t
    near = resize_to(t, (4, 4), mode="nearest")
    assert near[0, 0].tolist()[0] == [0.0, 0.0, 1.0, 1.0]
    assert resize_to(t, (4, 4)).shape == (1, 1, 4, 4)


@pytest.mark.parametrize(
    ("src_hw", "out_hw"), [((57, 43), (300, 200)), ((120, 90), (47, 61)), ((9, 8), (9, 8))]
)
def test_resize_hwc_is_resize_to_channel_last(src_hw, out_hw) -> None:
    """The same bilinear rule (half-pixel centres) as ``resize_to``, on (H, W[, C]) arrays."""
    gen = torch.Generator().manual_seed(0)
    chw = F.interpolate(torch.randn(1, 4, 5, 4, generator=gen), size=src_hw, mode="bicubic")[0]
    ref = resize_to(chw[None], out_hw)[0].permute(1, 2, 0).numpy()
    hwc = chw.permute(1, 2, 0).numpy()  # not contiguous: taken as it is
    for channels in (slice(0, 3), slice(0, 4), slice(3, 4)):
        out = resize_hwc(hwc[..., channels], out_hw)
        assert out.shape == (*out_hw, channels.stop - channels.start) and out.dtype == np.float32
        np.testing.assert_allclose(out, ref[..., channels], atol=1e-5)
    flat = resize_hwc(hwc[..., 0], out_hw)
    assert flat.shape == out_hw
    np.testing.assert_allclose(flat, ref[..., 0], atol=1e-5)
    same = np.ascontiguousarray(hwc[..., :3])
    assert not np.shares_memory(resize_hwc(same, src_hw), same)  # always a new array
    with pytest.raises(InputImageError, match="C<=4"):
        resize_hwc(np.zeros((4, 4, 5), np.float32), (8, 8))


# ------------------------------------------------------------------ person crops


def test_box_to_center_scale_fixes_aspect_and_padding() -> None:
    c, s = box_to_center_scale(np.array([[10, 20, 110, 420], [0, 0, 400, 100]]))
    assert np.allclose(c, [[60, 220], [200, 50]])
    assert np.allclose(s[0], [375.0, 500.0])  # tall: height 400*1.25, width from 3:4
    assert np.allclose(s[1], [500.0, 500 / 0.75])  # wide: width 400*1.25, height from 3:4


def test_warp_and_inverse_round_trip_within_1e_3_px() -> None:
    rng = np.random.default_rng(1)
    boxes = np.array([[13.2, 40.7, 211.9, 530.1], [400.0, 5.0, 480.5, 90.25], [0, 0, 1, 1]])
    c, s = box_to_center_scale(boxes)
    pts = rng.uniform(-50, 600, size=(3, 50, 2))
    m, inv = warp_matrix(c, s), inverse_warp_matrix(c, s)
    crop_pts = np.einsum("nij,nkj->nki", m[:, :, :2], pts) + m[:, None, :, 2]
    back = apply_affine(crop_pts, inv)
    assert np.abs(back - pts).max() < 1e-3
    back_t = apply_affine(torch.from_numpy(crop_pts).float(), inv)
    assert isinstance(back_t, torch.Tensor) and np.abs(back_t.numpy() - pts).max() < 1e-3
    # UDP: the padded box's edges land on crop pixels 0 and W-1 / H-1
    edges = np.array(
        [[[c[0, 0] - s[0, 0] / 2, c[0, 1] - s[0, 1] / 2], [c[0, 0] + s[0, 0] / 2, c[0, 1] + s[0, 1] / 2]]]
    )
    on_crop = np.einsum("ij,kj->ki", m[0, :, :2], edges[0]) + m[0, :, 2]
    assert np.allclose(on_crop, [[0, 0], [767, 1023]], atol=1e-6)


def test_crop_places_an_image_point_where_the_matrix_says() -> None:
    h, w = 400, 300
    yy, xx = np.mgrid[0:h, 0:w]
    px, py = 140.3, 222.6
    img = np.repeat((255 * np.exp(-((xx - px) ** 2 + (yy - py) ** 2) / (2 * 4.0**2)))[..., None], 3, 2)
    img = img.astype(np.uint8)
    box = np.array([[100.0, 150.0, 200.0, 300.0]])
    for backend in ("cv2", "torch"):
        x, info = crop_people(img, box, backend=backend)
        v = (x[0, 0].numpy() * STD[0] + MEAN[0]).astype(np.float64)
        v = np.where(v > 20, v, 0)
        cy, cx = np.mgrid[0 : v.shape[0], 0 : v.shape[1]]
        got = np.array([(cx * v).sum(), (cy * v).sum()]) / v.sum()
        want = info.matrices[0, :, :2] @ [px, py] + info.matrices[0, :, 2]
        assert np.abs(got - want).max() < 0.1, backend


def test_crop_backends_agree_and_border_is_zero() -> None:
    rng = np.random.default_rng(0)
    img = cv2.GaussianBlur((rng.random((120, 90, 3)) * 255).astype(np.uint8), (5, 5), 1.5)
    boxes = np.array([[10.0, 10.0, 80.0, 110.0], [-30.0, -30.0, 20.0, 40.0], [30.0, 40.0, 33.0, 44.0]])
    a, info = crop_people(img, boxes, backend="cv2", out_hw=(256, 192))
    b, _ = crop_people(img, boxes, backend="torch", out_hw=(256, 192))
    assert a.shape == b.shape == (3, 3, 256, 192)
    # same sampling, both rounded to whole grey levels: at most 1 apart, nearly always equal
    grey = (a - b).abs() * torch.tensor(STD).view(1, 3, 1, 1)
    assert grey.max() < 1.01 and (grey > 0.5).float().mean() < 0.01
    # the second box sticks out of the image: its top-left corner is zero-padded
    assert torch.allclose(a[1, :, 0, 0], torch.tensor(-MEAN / STD, dtype=torch.float32))
    assert info.inverse.shape == (3, 2, 3)


def test_crop_backend_is_checked_and_no_boxes_give_empty_batch() -> None:
    img = np.zeros((10, 10, 3), np.uint8)
    with pytest.raises(OptionError, match="Unknown crop backend 'gpu'; choose one of: auto, cv2, torch"):
        crop_people(img, np.array([[0, 0, 5, 5]]), backend="gpu")  # type: ignore[arg-type]
    x, info = crop_people(img, np.zeros((0, 4)))
    assert x.shape == (0, 3, 1024, 768) and info.inverse.shape == (0, 2, 3)
