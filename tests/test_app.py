"""The real app (``app.build_demo``) served on 127.0.0.1 and called through ``gradio_client``.

Weights are the tiny random checkpoints, given through the documented injection point
(``ModelManager(checkpoints=...)``, the same as ``python app.py --checkpoint TASK=PATH``).
"""

from __future__ import annotations

import json
import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # app.py lives at the top level

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client, handle_file  # noqa: E402

import app  # noqa: E402
from sapiens2 import serving  # noqa: E402
from sapiens2.data.metadata import NUM_KEYPOINTS  # noqa: E402

PHOTO = ROOT / "assets" / "pexels-cc0-jockey-horse-racing.jpg"  # small: 640x426
PHOTO_WH = Image.open(PHOTO).size
ENDPOINTS = [
    "/pose", "/seg", "/normal", "/pointmap", "/pointmap_mesh", "/matting", "/features", "/similarity", "/all"
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(space_checkpoints, tmp_path_factory) -> Iterator[tuple[Any, str]]:
    """Two servers: the app with tiny weights, and the app with no weights at all (offline)."""
    mp = pytest.MonkeyPatch()
    tmp = tmp_path_factory.mktemp("app")
    mp.setenv("GRADIO_EXAMPLES_CACHE", str(tmp / "examples"))
    empty = tmp / "no_weights"
    empty.mkdir()
    mp.setenv("SAPIENS2_CHECKPOINTS", str(empty))
    mp.setenv("HF_HUB_OFFLINE", "1")
    demos = []
    urls = []
    for checkpoints in (space_checkpoints, {}):
        manager = serving.ModelManager(device="cpu", checkpoints=checkpoints)
        demo = app.build_demo(manager, folders=serving.RequestFolders(tmp / "requests"))
        _, url, _ = app.launch(demo, host="127.0.0.1", port=free_port(), prevent_thread_lock=True, quiet=True)
        demos.append(demo)
        urls.append(url)
    yield tmp, urls
    for demo in demos:
        demo.close()
    mp.undo()


@pytest.fixture(scope="module")
def client(served) -> Client:
    tmp, urls = served
    return Client(urls[0], download_files=str(tmp / "downloads"), verbose=False)


@pytest.fixture(scope="module")
def bare_client(served) -> Client:
    tmp, urls = served
    return Client(urls[1], download_files=str(tmp / "downloads_bare"), verbose=False)


def photo() -> Any:
    return handle_file(str(PHOTO))


def check_slider(pair: Any) -> None:
    before, after = pair
    assert Image.open(before).size == PHOTO_WH
    assert Image.open(after).size == PHOTO_WH


def check_files(paths: list[str], suffixes: set[str]) -> dict[str, Path]:
    """Every download exists and parses; returns them by suffix."""
    by_suffix: dict[str, Path] = {}
    for p in map(Path, paths):
        assert p.is_file() and p.stat().st_size > 0, p
        if p.suffix == ".png":
            with Image.open(p) as im:
                im.load()
                assert im.size == PHOTO_WH, p.name
        elif p.suffix == ".npy":
            np.load(p)
        elif p.suffix == ".json":
            json.loads(p.read_text())
        elif p.suffix == ".glb":
            assert p.read_bytes()[:4] == b"glTF"
        elif p.suffix == ".ply":
            assert p.read_bytes()[:3] == b"ply"
        by_suffix.setdefault(p.suffix, p)
    assert suffixes <= set(by_suffix), (suffixes, list(by_suffix))
    return by_suffix


def check_pose_json(data: dict) -> None:
    people = data["people"]
    assert len(people) >= 1
    for person in people:
        names = [k["name"] for k in person["keypoints"]]
        assert len(names) == NUM_KEYPOINTS == 308 and len(set(names)) == 308
        assert "left_wrist" in names


@pytest.mark.slow
def test_page_and_api_list_every_endpoint(client: Client, served) -> None:
    import urllib.request

    html = urllib.request.urlopen(served[1][0], timeout=30).read().decode()
    assert "Sapiens2" in html
    named = client.view_api(return_format="dict", print_info=False)["named_endpoints"]
    assert set(ENDPOINTS) <= set(named)


def test_pose(client: Client) -> None:
    pair, data, files, line = client.predict(  # four outputs, as before the keypoint formats
        photo(), "0.4b", 0.3, False, True, False, True, 20, api_name="/pose"
    )
    check_slider(pair)
    check_pose_json(data)
    check_files(files, {".json", ".png", ".csv"})  # every file in one list (the page groups them)
    by_name = {Path(p).name.split("_", 1)[-1]: Path(p) for p in files}
    assert set(by_name) == {
        "pose.json", "openpose.png", "pose.png", "coco17.json", "coco_wholebody.json",
        "openpose_body25.json", "openpose_coco18.json", "keypoints.csv",
    }  # fmt: skip
    assert len(files) == len(by_name)
    check_pose_json(json.loads(by_name["pose.json"].read_text()))
    coco18 = json.loads(by_name["openpose_coco18.json"].read_text())
    assert all(
        len(p["pose_keypoints_2d"]) == 54 and len(p["face_keypoints_2d"]) == 210 for p in coco18["people"]
    )
    assert all(len(p["face_kpts"]) == 204 for p in json.loads(by_name["coco_wholebody.json"].read_text()))
    assert Image.open(by_name["openpose.png"]).size == PHOTO_WH
    assert line.startswith("Pose (") and "cpu" in line and "model" in line


def test_seg(client: Client) -> None:
    pair, legend, files, line = client.predict(photo(), "0.4b", 0.5, ["Face_Neck", "Torso"], api_name="/seg")
    check_slider(pair)
    assert "<li" in legend and ("Face and neck" in legend or "Torso" in legend)  # the legend as text
    found = check_files(files, {".png", ".npy"})
    labels = np.load(found[".npy"])
    assert labels.shape == PHOTO_WH[::-1] and labels.max() < 29
    assert line.startswith("Body parts (")


def test_normal(client: Client) -> None:
    pair, files, line = client.predict(photo(), "0.4b", False, "photo", api_name="/normal")
    check_slider(pair)
    normals = np.load(check_files(files, {".png", ".npy"})[".npy"])
    assert normals.shape == (*PHOTO_WH[::-1], 3)
    assert line.startswith("Normals (")


def test_pointmap(client: Client, served) -> None:
    pair, glb, files, line = client.predict(photo(), "0.4b", False, api_name="/pointmap")
    check_slider(pair)
    assert Path(glb).read_bytes()[:4] == b"glTF" and Path(glb).name.endswith("_mesh_preview.glb")
    check_files(files, {".glb", ".npy", ".png"})
    names = {Path(p).name.split("_", 1)[-1] for p in files}
    assert {"mesh_preview.glb", "pointcloud.glb", "pointmap.npy", "depth.npy", "depth.png"} <= names
    assert not {"mesh.glb", "mesh.ply", "pointcloud.ply"} & names  # the full-resolution files: on request
    assert line.startswith("Pointmap / 3D (")


def test_the_full_resolution_mesh_is_made_on_request(client: Client, served) -> None:
    import trimesh

    by_url = Client(served[1][0], download_files=False, verbose=False)
    _, _, files, _ = by_url.predict(photo(), "0.4b", False, api_name="/pointmap")
    url = files[0]["url"]  # any file of the result names it
    folder = Path(files[0]["path"]).parent
    made, info = client.predict(url, api_name="/pointmap_mesh")
    assert [Path(p).name.split("_", 1)[-1] for p in made] == ["mesh.glb", "mesh.ply", "pointcloud.ply"]
    assert {p.name.split("_", 1)[-1] for p in folder.iterdir()} >= {"mesh.glb", "mesh.ply", "pointcloud.ply"}
    assert (
        info.startswith("pointmap: Full-resolution mesh and point cloud")
        and " MB" in info
        and "make " in info
    )
    # issue 44 item 10: in words, not stage names ("Seconds: find 0.00 · make 0.19")
    assert re.search(
        r"MB: made in [0-9.]+ s \([0-9.]+ s to find the earlier result, [0-9.]+ s to make the files\)\.$",
        info,
    ), info
    glb, mesh_ply, cloud_ply = made
    cloud = trimesh.load(cloud_ply, process=False)
    [mesh] = trimesh.load(glb, process=False).geometry.values()
    ply = trimesh.load(mesh_ply, process=False)
    # no segmentation: every finite point is foreground, in the cloud and in the mesh
    assert len(mesh.vertices) == len(ply.vertices) == len(cloud.vertices) > 0
    np.testing.assert_allclose(ply.vertices, cloud.vertices)
    again, _ = client.predict(folder.name, api_name="/pointmap_mesh")  # by its id: the same files
    assert [Path(p).read_bytes() for p in again] == [Path(p).read_bytes() for p in made]
    with pytest.raises(Exception, match="no longer holds that result"):
        client.predict("req-" + "0" * 32, api_name="/pointmap_mesh")
    with pytest.raises(Exception, match="does not name one result"):
        client.predict("/etc/passwd", api_name="/pointmap_mesh")


def test_matting(client: Client) -> None:
    pair, files, line = client.predict(photo(), "1b", "#ff0000", None, api_name="/matting")
    check_slider(pair)
    found = check_files(files, {".png"})
    modes = {Image.open(p).mode for p in files}
    assert "RGBA" in modes  # the cut-out
    assert found and line.startswith("Matting (")


def test_features_and_similarity(client: Client) -> None:
    pair, summary, files, line = client.predict(photo(), "0.1b", api_name="/features")
    check_slider(pair)
    emb = np.load(check_files(files, {".npy", ".png"})[".npy"])
    assert emb.ndim == 1 and summary["dim"] == emb.shape[0]
    score, sim_line = client.predict(photo(), photo(), "0.1b", api_name="/similarity")
    assert score == pytest.approx(1.0, abs=1e-4)  # a photo is identical to itself
    assert sim_line.count("features") == 1 and "both photos" in sim_line  # one line, not two alike


def _rest(url: str, api: str, data: list) -> tuple[str, Any]:
    """One call through Gradio's REST API, as curl users make it: (event, data)."""
    import json
    import re
    import urllib.request

    req = urllib.request.Request(
        f"{url}gradio_api/call/{api}",
        data=json.dumps({"data": data}).encode(),
        headers={"Content-Type": "application/json"},
    )
    event_id = json.loads(urllib.request.urlopen(req, timeout=30).read())["event_id"]
    text = urllib.request.urlopen(f"{url}gradio_api/call/{api}/{event_id}", timeout=120).read().decode()
    event, data = re.findall(r"^event: (\w+)\ndata: (.*)$", text, re.M)[-1]
    return event, json.loads(data)


def test_similarity_names_the_missing_photo(client: Client, served, tiny_checkpoints) -> None:
    """Issue 32: with the main photo loaded and no second one, the message names the second."""
    import base64

    from sapiens2.errors import InputImageError
    from sapiens2.tasks import registry

    with pytest.raises(Exception, match="No second photo to compare with") as err:
        client.predict(photo(), None, "0.1b", api_name="/similarity")
    assert "No photo given" not in str(err.value)
    with pytest.raises(Exception, match="No photo given"):  # the main photo missing: that one
        client.predict(None, photo(), "0.1b", api_name="/similarity")
    url = "data:image/jpeg;base64," + base64.b64encode(PHOTO.read_bytes()).decode()
    main = {"url": url, "meta": {"_type": "gradio.FileData"}}
    event, data = _rest(served[1][0], "similarity", [main, None, "0.1b"])
    assert event == "error" and "No second photo to compare with" in data["error"], data
    # the Python API the endpoint calls
    runner = serving.RequestRunner(serving.ModelManager(device="cpu", checkpoints=tiny_checkpoints))
    with pytest.raises(InputImageError, match="No second photo to compare with"):
        runner.compare(registry.get("features"), str(PHOTO), None, "0.1b")
    with pytest.raises(InputImageError, match="No photo given"):
        runner.compare(registry.get("features"), None, None, "0.1b")


@pytest.mark.slow
def test_all_tasks(client: Client) -> None:
    # pointmap and depth (v1) both take use_segmentation: /all prefixes a shared option's name with the task's
    values = client.predict(
        photo=photo(), pose_size="0.4b", classes=["Torso"], pointmap_use_segmentation=False, api_name="/all"
    )
    pose, seg, normal, pointmap, depth, matting, feats = (
        values[0:4], values[4:8], values[8:11], values[11:15], values[15:20], values[20:23], values[23:27]
    )  # fmt: skip
    assert len(values) == 28  # each tab's outputs as its own endpoint's, then the status
    assert values[-1].startswith("7 of 7 tasks:")
    check_pose_json(pose[1])
    for pair in (pose[0], seg[0], normal[0], pointmap[0], depth[0], matting[0], feats[0]):
        check_slider(pair)
    check_files(pointmap[2], {".glb", ".npy"})
    assert depth[2].endswith("_depth_mesh_preview.glb")  # v1 depth's 3D view: shape up to scale (issue 43)
    check_files(depth[3], {".glb", ".ply", ".npy"})


def test_unreadable_file_is_an_error_with_the_reason(client: Client, tmp_path) -> None:
    bad = tmp_path / "holiday.jpg"
    bad.write_text("this is a text file, not a photo")
    with pytest.raises(Exception, match=r"not an image \(it contains text\)"):
        client.predict(handle_file(str(bad)), "0.4b", 0.5, [], api_name="/seg")
    truncated = tmp_path / "cut.jpg"
    truncated.write_bytes(PHOTO.read_bytes()[:200])
    with pytest.raises(Exception, match=r"(?i)image"):
        client.predict(handle_file(str(truncated)), "0.4b", api_name="/features")


def test_too_large_image_is_an_error_naming_the_limit(client: Client, tmp_path) -> None:
    big = tmp_path / "huge.png"
    Image.new("1", (10000, 9000)).save(big)  # 90 megapixels in an 11 kB file
    with pytest.raises(Exception, match=r"10000x9000 px .* above the limit of 89\.5 megapixels"):
        client.predict(handle_file(str(big)), "0.1b", api_name="/features")


def test_no_gradio_stub_written_next_to_the_app() -> None:
    # Gradio writes a .pyi next to any component subclass; the app must not leave one behind
    assert not (ROOT / "app.pyi").exists()


def test_bad_options_are_errors_naming_the_allowed_values(client: Client) -> None:
    with pytest.raises(Exception, match=r"0\.4b.*0\.8b.*1b.*5b"):
        client.predict(photo(), "7b", 0.5, [], api_name="/seg")
    with pytest.raises(Exception, match=r"Unknown body-part class 'wings'"):
        client.predict(photo(), "0.4b", 0.5, ["wings"], api_name="/seg")


def test_without_weights_the_ui_serves_and_requests_name_the_repo(bare_client: Client, served) -> None:
    import urllib.request

    assert urllib.request.urlopen(served[1][1], timeout=30).status == 200
    # a visitor (an API caller too) gets one plain sentence; the repository and the settings are
    # the operator's details: the server log (and a local page's fold, tests/test_page_browser.py)
    with pytest.raises(Exception, match=r"weights are not (available )?on this server") as err:
        bare_client.predict(photo(), "0.4b", 0.5, [], api_name="/seg")
    assert "SAPIENS2_CHECKPOINTS" not in str(err.value)
    with pytest.raises(Exception, match=r"No task could run"):
        bare_client.predict(photo=photo(), api_name="/all")
