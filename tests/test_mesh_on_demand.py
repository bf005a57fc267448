"""The full-resolution files made on request (issue 21): a run in the app leaves the mesh (GLB, PLY)
and the point cloud PLY out and keeps what makes them (``serving.on_demand.keep``);
``serving.on_demand.make`` then writes the same files, byte for byte, as ``save()``."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from test_mesh import F, colours, plane_pointmap

from sapiens2.errors import ResultNotFoundError
from sapiens2.outputs.writers import Writer
from sapiens2.serving import RequestFolders, on_demand
from sapiens2.tasks import registry
from sapiens2.tasks.base import RunInfo
from sapiens2.tasks.pointmap import TASK as POINTMAP
from sapiens2.tasks.pointmap import PointmapResult
from sapiens2.tasks.pointmap.pointmap_files import make_full_resolution

[ENTRY] = POINTMAP.on_demand


def result(h: int = 37, w: int = 53, name: str = "me") -> PointmapResult:
    """A step in depth, an odd-sized mask (its bits do not fill the last byte) and a hole."""
    z = np.full((h, w), 2.0, np.float32)
    z[:, w // 2 :] = 2.6
    pm = plane_pointmap(h, w, z)
    mask = np.zeros((h, w), bool)
    mask[3:-2, 4:-3] = True
    mask[10:14, 10:15] = False
    return PointmapResult(
        image=colours(h, w), info=RunInfo("pointmap", "0.4b", "cpu", "float32"), name=name,
        pointmap=pm, depth=pm[:, :, 2].copy(), mask=mask, scale=1.0, focal_px=F, focal_px_input=F,
    )  # fmt: skip


def by_name(paths: list[Path]) -> dict[str, Path]:
    return {Path(p).name: Path(p) for p in paths}


def save_later(res: PointmapResult, folder: Path) -> list[Path]:
    """As the app saves a run (``serving.present``): the big files left out and their source kept,
    written side by side."""
    with ThreadPoolExecutor(3) as pool, Writer(pool) as writer:
        files = res.save(folder, later=True, writer=writer)
        on_demand.keep(ENTRY, res, folder, writer)
    return files


BIG = {"me_mesh.glb", "me_mesh.ply", "me_pointcloud.ply"}


def test_later_leaves_the_big_files_out_and_making_them_gives_the_same_bytes(tmp_path: Path) -> None:
    res = result()
    now = by_name(res.save(tmp_path / "now"))
    later_dir = tmp_path / "later"
    later = by_name(save_later(res, later_dir))
    assert BIG <= set(now)
    assert not BIG & set(later)
    assert set(later) == set(now) - BIG
    for name, path in later.items():  # everything else is as before
        assert path.read_bytes() == now[name].read_bytes(), name
    source = on_demand.source_path
    assert source(later_dir, ENTRY).is_file() and not source(tmp_path / "now", ENTRY).exists()

    made = on_demand.make(ENTRY, later_dir)
    assert [p.name for p in made] == ["me_mesh.glb", "me_mesh.ply", "me_pointcloud.ply"]
    for path in made:
        assert path.parent == later_dir
        assert path.read_bytes() == now[path.name].read_bytes(), path.name
    again = on_demand.make(ENTRY, later_dir)  # made once: the second call returns the same files
    assert again == made and [p.stat().st_mtime_ns for p in again] == [p.stat().st_mtime_ns for p in made]
    assert not list(later_dir.glob(".making-*"))


def test_two_requests_at_once_both_get_whole_files(tmp_path: Path) -> None:
    res = result(120, 160)
    reference = by_name(res.save(tmp_path / "ref"))
    save_later(res, tmp_path / "r")
    barrier, out = threading.Barrier(2), []

    def make() -> None:
        barrier.wait()
        out.append(on_demand.make(ENTRY, tmp_path / "r"))

    threads = [threading.Thread(target=make) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == 2 and out[0] == out[1]
    for path in out[0]:
        assert path.read_bytes() == reference[path.name].read_bytes()
    assert not list((tmp_path / "r").glob(".making-*"))


def test_a_folder_without_a_pointmap_result_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ResultNotFoundError, match="Run pointmap on the photo first"):
        on_demand.make(ENTRY, tmp_path)
    kept = on_demand.source_path(tmp_path, ENTRY)
    kept.parent.mkdir()
    kept.write_bytes(b"not an npz")
    with pytest.raises(ResultNotFoundError):
        on_demand.make(ENTRY, tmp_path)


def test_the_pointmap_task_declares_its_full_resolution_files_on_demand() -> None:
    assert ENTRY.api_name == "pointmap_mesh" and ENTRY.make is make_full_resolution
    others = [t.name for t in registry.declared().values() if t.on_demand and t is not POINTMAP]
    assert others == []  # the endpoint is made per entry: no name to look up


@pytest.mark.parametrize(
    "ref",
    [
        None, 7, "", "   ", "req-", "req-" + "0" * 31, "req-" + "0" * 33, "req-" + "A" * 32,
        "../../etc/passwd", "/etc/passwd", "req-" + "g" * 32, "x" * 5000,
    ],
)  # fmt: skip
def test_a_reference_that_names_no_result_of_ours_is_refused(tmp_path: Path, ref: object) -> None:
    folders = RequestFolders(tmp_path / "requests")
    folders.new()
    with pytest.raises(ResultNotFoundError):
        folders.find(ref)


def test_a_result_is_found_by_its_id_a_path_or_a_url_and_only_under_the_root(tmp_path: Path) -> None:
    folders = RequestFolders(tmp_path / "requests")
    folder = folders.new()
    url = f"http://127.0.0.1:7860/gradio_api/file={folder}/me_depth.png"
    for ref in (
        folder.name,
        str(folder / "me_pointmap.npy"),
        url,
        f"{{'path': '{folder}/a.ply', 'url': '{url}'}}",
    ):
        assert folders.find(ref) == folder
    other = folders.new()
    with pytest.raises(ResultNotFoundError, match="does not name one result"):
        folders.find(f"{folder}/a {other}/b")  # two results: which one?
    gone = "req-" + "0" * 32
    with pytest.raises(ResultNotFoundError, match="no longer holds"):
        folders.find(gone)
    outside = tmp_path / "elsewhere" / ("req-" + "1" * 32)  # a folder of that name elsewhere
    outside.mkdir(parents=True)
    with pytest.raises(ResultNotFoundError):
        folders.find(str(outside))
    link = folders.root / ("req-" + "2" * 32)  # a link planted in the root is not a result
    link.symlink_to(outside)
    with pytest.raises(ResultNotFoundError):
        folders.find(link.name)


@pytest.mark.parametrize("max_points", [1, 17, 500, 10_000])
def test_the_viewer_cloud_is_the_subset_write_glb_picks_from_the_whole_cloud(max_points: int) -> None:
    from sapiens2.outputs.export import subsample

    res = result()
    res.pointmap[5, 7] = np.nan  # in the mask but not finite: no point
    pts, cols = res.points()
    keep = subsample(len(pts), max_points)
    sampled_pts, sampled_cols = res.sampled_points(max_points)
    assert len(sampled_pts) == min(max_points, len(pts))
    np.testing.assert_array_equal(sampled_pts, pts[keep])
    np.testing.assert_array_equal(sampled_cols, cols[keep])
