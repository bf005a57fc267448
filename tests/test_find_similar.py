"""The Features tab's "Find similar" below the page: a visitor's set read with its limits (one
clear message per hostile input), the set and the query in one GPU call, the gallery's ranking
and groups, what fits a visitor's quota, and the set's folder going with the session."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sapiens2.errors import InputImageError
from sapiens2.models import cost
from sapiens2.serving import ModelManager, RequestFolders, photo_set
from sapiens2.serving.photo_set import MAX_SET_PHOTOS, read_set
from sapiens2.serving.request_runner import RequestRunner, model_sizes
from sapiens2.serving.similar import grouped, most_similar, photos_that_fit, run_set
from sapiens2.tasks import registry


def png(seed: int, w: int = 40, h: int = 32) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def zipped(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def test_a_set_gets_one_clear_message_per_hostile_input(tmp_path, monkeypatch):
    a, b = tmp_path / "a.png", tmp_path / "b.jpg"
    a.write_bytes(png(0))
    b.write_bytes(png(1))
    good = zipped(tmp_path / "set.zip", {"x/c.png": png(2), "__MACOSX/._c.png": b"junk", ".DS_Store": b"j"})
    got = read_set([str(a), str(b), str(good)])
    assert [n for n, _ in got] == ["a.png", "b.jpg", "set.zip/x/c.png"] and got[2][1] == png(2)
    with pytest.raises(InputImageError, match="The set is empty"):
        read_set([])
    with pytest.raises(InputImageError, match="The set is empty"):
        read_set([str(zipped(tmp_path / "none.zip", {}))])
    notes = tmp_path / "notes.txt"
    notes.write_text("minutes")
    with pytest.raises(InputImageError, match=r"notes.txt is not a photo\. A set takes photos \(.*JPG.*\)"):
        read_set([str(a), str(notes)])
    with pytest.raises(InputImageError, match=r"run.sh \(in mixed.zip\) is not a photo"):
        read_set([str(zipped(tmp_path / "mixed.zip", {"a.png": png(0), "run.sh": b"rm -rf /"}))])
    for name in ("../up.png", "/etc/abs.png", "a/../../b.png", "C:/win.png"):
        bad = zipped(tmp_path / "paths.zip", {name: png(3)})
        with pytest.raises(InputImageError, match="holds a path that leaves its folder"):
            read_set([str(bad)])
    monkeypatch.setattr(photo_set, "MAX_SET_BYTES", 1 << 20)  # a bomb: 4 MiB of zeros in a 4 kB zip
    bomb = zipped(tmp_path / "bomb.zip", {"big.png": bytes(4 << 20)})
    assert bomb.stat().st_size < 10_000
    with pytest.raises(InputImageError, match="bomb.zip unzips to more than 1 MiB"):
        read_set([str(bomb)])
    with pytest.raises(InputImageError, match="more than 2 photos; up to 2 fit"):
        read_set([str(a), str(b), str(good)], limit=2)
    (tmp_path / "fake.zip").write_bytes(b"PK not really")
    with pytest.raises(InputImageError, match="fake.zip is not a readable zip"):
        read_set([str(tmp_path / "fake.zip")])


@pytest.fixture(scope="module")
def runner(tiny_checkpoints, tmp_path_factory):
    manager = ModelManager(device="cpu", checkpoints={t: tiny_checkpoints[t] for t in ("features", "pose")})
    return RequestRunner(manager, RequestFolders(tmp_path_factory.mktemp("requests")))


def test_photos_that_fit_follow_the_price_of_a_call(runner):
    features, pose = registry.get("features"), registry.get("pose")
    n = photos_that_fit(runner, features, "0.1b", {})
    assert n == MAX_SET_PHOTOS  # 0.1b: about half a second a photo, 32 fit easily
    pose_n = photos_that_fit(runner, pose, "1b", {})
    # The price of the size that runs, as the call's (runner.call_seconds via Job.size): with a
    # checkpoint that is the file's size, here CUSTOM (a tiny file), priced as the largest backbone.
    size = runner.manager.resolve_size(pose, "1b")
    infer = pose.split({}, gpu=runner.manager.cuda)[0]
    per_photo = cost.photo_seconds(size, pose.work(infer))
    own = cost.weight_bytes(model_sizes(pose, size, infer))
    start = cost.start_seconds(max(runner.manager.resident_bytes(), own))
    assert pose_n == int((cost.MAX_CALL_S - start) // per_photo) - 1 < MAX_SET_PHOTOS  # fewer by pose
    # the set and the query fit the longest call; one photo more would not
    assert start + per_photo * (pose_n + 1) <= cost.MAX_CALL_S < start + per_photo * (pose_n + 2)


@pytest.mark.slow
def test_the_set_and_query_run_once_rank_and_group(runner, tmp_path):
    photos = [(f"p{i}.png", png(i, 48 + 4 * i, 40)) for i in range(5)]
    query = tmp_path / "query.png"
    query.write_bytes(photos[3][1])
    calls = []
    real = runner.device
    runner.device = lambda unit: calls.append(unit) or real(unit)
    try:
        people = run_set(runner, registry.get("features"), "appearance", str(query), photos, None, ("k",))
    finally:
        runner.device = real
    assert len(calls) == 1 and len(calls[0].batch.preps) == 6  # the query and the set, one call
    people.folder = runner.folders.new()
    shown = most_similar(people, people.folder)
    assert len(shown) == 5 and shown[0][1].startswith("1. 1.000 · p3.png · whole photo")
    assert all(Path(p).is_file() and Path(p).parent == people.folder for p, _ in shown)
    with Image.open(shown[0][0]) as im:  # the box (the whole photo) is drawn in the picture's colour
        assert max(im.size) == 256 and np.asarray(im)[1, 128, 0] > 200
    rows = grouped(people, people.folder, 2)
    assert len(rows) == 2 and sum(int(c.split("(")[1].split(")")[0]) for _, c in rows) == 5
    people.close()
    assert not people.folder.exists()  # the session's end deletes the set's pictures
