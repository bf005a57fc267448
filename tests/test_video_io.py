"""Reading and writing clips: formats, frame rate and count, stride, limits, hostile files."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest
from video_clips import H, W, boxes_at, count_frames, find_boxes, write_clip

from sapiens2.errors import InputImageError, InputVideoError, OptionError
from sapiens2.outputs.webm_writer import VideoWriter, even_frame
from sapiens2.video.reader import VideoLimits, iter_frames, probe_video


@pytest.mark.parametrize(("suffix", "fps"), [(".mp4", 10.0), (".webm", 12.5), (".mov", 24.0), (".gif", 10.0)])
def test_each_container_reads_with_its_frame_rate_count_and_rgb_order(
    tmp_path: Path, suffix: str, fps: float
) -> None:
    clip = write_clip(tmp_path / f"clip{suffix}", n=6, fps=fps)
    info = probe_video(clip)
    assert (info.width, info.height) == (W, H)
    assert info.fps == pytest.approx(fps, rel=1e-3)
    frames = list(iter_frames(info))
    assert [i for i, _ in frames] == list(range(6))
    for i, rgb in frames:
        assert rgb.dtype == np.uint8 and rgb.shape == (H, W, 3)
        found = find_boxes(rgb)  # red found as red: the frames are RGB, not OpenCV's BGR
        np.testing.assert_allclose(found["red"], boxes_at(i)[0], atol=2)
        np.testing.assert_allclose(found["green"], boxes_at(i)[1], atol=2)


def test_stride_keeps_every_kth_frame(tmp_path: Path) -> None:
    info = probe_video(write_clip(tmp_path / "c.webm", n=7))
    assert [i for i, _ in iter_frames(info, stride=3)] == [0, 3, 6]
    with pytest.raises(OptionError, match="stride"):
        list(iter_frames(info, stride=0))


def test_large_frames_are_downscaled_to_max_side(tmp_path: Path) -> None:
    info = probe_video(write_clip(tmp_path / "c.mp4", n=2, size=(192, 128)))
    frames = list(iter_frames(info, limits=VideoLimits(max_side=96)))
    assert frames[0][1].shape == (64, 96, 3)


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (VideoLimits(max_bytes=100), "MB, above the limit"),
        (VideoLimits(max_seconds=0.5), "lasts 0.8 s, above the limit of 0.5 s"),
        (VideoLimits(max_pixels=W * H - 1), "megapixels"),
    ],
)
def test_header_limits_give_clear_errors(tmp_path: Path, limits: VideoLimits, message: str) -> None:
    clip = write_clip(tmp_path / "c.mp4", n=8, fps=10.0)
    with pytest.raises(InputVideoError, match=message):
        probe_video(clip, limits)


def test_limits_are_checked_again_while_decoding(tmp_path: Path) -> None:
    """A header can lie: decoding counts the real frames and seconds."""
    info = probe_video(write_clip(tmp_path / "c.webm", n=8, fps=10.0))
    with pytest.raises(InputVideoError, match="more than 3 frames to process at stride 2"):
        list(iter_frames(info, stride=2, limits=VideoLimits(max_frames=3)))
    assert len(list(iter_frames(info, stride=2, limits=VideoLimits(max_frames=4)))) == 4
    with pytest.raises(InputVideoError, match="above the limit of 0.3 s"):
        list(iter_frames(info, limits=VideoLimits(max_seconds=0.3)))


def test_bad_limits_are_option_errors() -> None:
    for bad in ({"max_frames": 0}, {"max_seconds": float("nan")}, {"max_side": True}, {"max_bytes": -1}):
        with pytest.raises(OptionError):
            VideoLimits(**bad)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty"),
        (
            b"#EXTM3U\n#EXT-X-STREAM-INF\nhttp://example.invalid/a.m3u8\n",
            "not a video",
        ),  # never given to FFmpeg
        (b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 20, "could not be decoded"),
        (b"GIF89a" + b"\x00" * 40, "decoded"),
    ],
)
def test_corrupt_or_non_video_files_give_clear_errors(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "upload.mp4"
    path.write_bytes(content)
    with pytest.raises(InputVideoError, match=message):
        info = probe_video(path)
        list(iter_frames(info))


def test_a_truncated_clip_processes_what_decodes_and_says_so(tmp_path: Path) -> None:
    clip = write_clip(tmp_path / "c.webm", n=30, size=(192, 128))
    data = clip.read_bytes()
    cut = tmp_path / "cut.webm"
    cut.write_bytes(data[: len(data) // 2])
    info = probe_video(cut)
    frames = list(iter_frames(info))
    assert 0 < len(frames) < 30
    assert any("cut off" in n for n in info.notices)


def test_missing_folders_fifos_and_devices_are_refused_without_blocking(tmp_path: Path) -> None:
    with pytest.raises(InputVideoError, match="not found"):
        probe_video(tmp_path / "nope.mp4")
    with pytest.raises(InputVideoError, match="not a regular file"):
        probe_video(tmp_path)
    fifo = tmp_path / "pipe.mp4"
    os.mkfifo(fifo)
    errors: list[BaseException] = []

    def probe() -> None:
        try:
            probe_video(fifo)
        except BaseException as e:  # noqa: BLE001 - the thread hands any outcome back
            errors.append(e)

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(30)  # a blocked open never returns: a wide bound a busy machine never reaches
    assert not t.is_alive(), "probe_video blocked on a FIFO"
    assert isinstance(errors[0], InputVideoError) and "not a regular file" in str(errors[0])
    link = tmp_path / "zero.mp4"
    link.symlink_to("/dev/zero")
    with pytest.raises(InputVideoError, match="not a regular file"):
        probe_video(link)
    with pytest.raises(InputVideoError, match="file path"):
        probe_video(b"\x1a\x45\xdf\xa3")  # type: ignore[arg-type]
    assert issubclass(InputVideoError, InputImageError)  # upload handlers catch both


@pytest.mark.parametrize("fps", [12.5, 29.97, 7.0])
def test_writer_keeps_frame_rate_and_count(tmp_path: Path, fps: float) -> None:
    rng = np.random.default_rng(0)
    with VideoWriter(tmp_path / "out.webm", fps) as out:
        for _ in range(9):
            out.write(rng.integers(0, 255, (H, W, 3), dtype=np.uint8))
        path = out.close()
    assert out.codec == "VP80"
    n, got_fps, size = count_frames(path)
    assert (n, size) == (9, (W, H))
    assert got_fps == pytest.approx(fps, rel=1e-3)


def test_writer_pads_odd_sizes_and_checks_its_input(tmp_path: Path) -> None:
    odd = np.zeros((65, 97, 3), np.uint8)
    assert even_frame(odd).shape == (66, 98, 3)
    with VideoWriter(tmp_path / "odd.webm", 10) as out:
        out.write(odd)
        with pytest.raises(InputImageError, match="the video"):
            out.write(np.zeros((64, 96, 3), np.uint8))
        with pytest.raises(InputImageError, match="uint8 RGB"):
            out.write(np.zeros((66, 98), np.float32))
        path = out.close()
    assert count_frames(path)[2] == (98, 66)
    with pytest.raises(OptionError, match=".webm"):
        VideoWriter(tmp_path / "x.mp4", 10)
    with pytest.raises(OptionError, match="frame rate"):
        VideoWriter(tmp_path / "x.webm", float("inf"))


def test_a_real_h264_mp4_with_audio_reads(tmp_path: Path) -> None:
    """H.264 MP4 (what phones and most tools write): Gradio ships one, with an audio track."""
    gradio = pytest.importorskip("gradio")
    sample = Path(gradio.__file__).parent / "media_assets" / "videos" / "b.mp4"
    if not sample.exists():
        pytest.skip(f"Gradio's sample video is not at {sample}")
    info = probe_video(sample)
    assert (info.container, info.width, info.height, info.fps) == ("mp4/mov", 480, 270, 30.0)
    frames = list(iter_frames(info, stride=30))
    assert [i for i, _ in frames] == [0, 30, 60, 90, 120] and frames[0][1].shape == (270, 480, 3)


def test_an_unbelievable_frame_rate_falls_back_with_a_notice(tmp_path: Path) -> None:
    info = probe_video(write_clip(tmp_path / "fast.webm", n=3, fps=500.0))
    assert info.fps == 25.0 and "25 fps is assumed" in info.notices[0]
