"""``sapiens2 index`` / ``sapiens2 search``: pose vectors, the LanceDB tables, indexing through the
batch machinery (resume, a corrupt file, an earlier batch OUT), the command line and Python.

Appearance with the tiny random backbone: every CLS embedding is nearly the same (cosines above
0.999), so "a flipped / cropped / recoloured copy finds its original" is not something random
weights can show (measured: 17 of 24 copies of assets/ did with one tiny seed). That test runs on
controlled vectors instead (each copy its original's vector plus a small perturbation) and checks
the store's ranking; the real pipeline is checked for what it can show: each photo finds itself
first, with score 1."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sapiens2.batch import records
from sapiens2.batch.job import BatchJob, task_plan
from sapiens2.batch.store import Store
from sapiens2.cli import main
from sapiens2.data.metadata import FLIP_INDEX
from sapiens2.errors import InputImageError, OptionError
from sapiens2.search import build_index, find_similar, kmeans, mirrored, normalised, pose_vector, top_k
from sapiens2.search.indexing import batch_folder, parse_kinds
from sapiens2.search.people_store import People, PeopleStore
from sapiens2.tasks import registry

HW = (128, 96)


def photo(path: Path, seed: int, w: int = 48, h: int = 40) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)).save(path)
    return path


# ----------------------------------------------------------------------------- vectors


def a_pose(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0, 100, (308, 2)).astype(np.float32)


@pytest.mark.slow
def test_same_pose_moved_scaled_and_mirrored_ranks_first_a_different_pose_last(tmp_path):
    pose = a_pose(0)
    scores = np.full(308, 0.9, np.float32)
    moved = pose * 2.5 + np.array([300.0, 40.0], np.float32)  # another place, another scale
    flipped = pose[FLIP_INDEX].copy()
    flipped[:, 0] = 640 - flipped[:, 0]  # the same pose in a mirrored photo
    upside_down = -pose + 500  # every limb turned round: the most different pose there is
    masked = pose.copy()
    masked_scores = scores.copy()
    masked[:40], masked_scores[:40] = 1e4, 0.05  # low-score points are left out, whatever they say
    people = [moved, flipped, upside_down, masked] + [a_pose(s) for s in range(10, 16)]
    scored = [scores, scores, scores, masked_scores] + [scores] * 6
    vectors = np.stack([pose_vector(p, s) for p, s in zip(people, scored, strict=True)])
    names = ["moved", "mirrored", "upside-down", "masked"] + [f"other{i}" for i in range(6)]
    store = PeopleStore(str(tmp_path / "index"))
    store.add(
        "pose", People(names, list(range(10)), np.zeros((10, 4)), vectors), [(n, None, 1) for n in names]
    )
    query = pose_vector(pose, scores)
    found = store.nearest("pose", query, 10)
    order = found.column("source").to_pylist()
    assert order[0] == "moved" and found.column("score")[0].as_py() == pytest.approx(1.0, abs=1e-5)
    assert order[-1] == "upside-down" and found.column("score")[9].as_py() < -0.99
    assert order.index("masked") == 1  # its 268 confident points still match
    back = store.nearest("pose", mirrored(query)[0], 1)  # the mirrored query finds the mirrored photo
    assert back.column("source").to_pylist() == ["mirrored"] and back.column("score")[0].as_py() > 0.9999
    assert pose_vector(pose, np.zeros(308)) is None  # no confident point: no vector
    ids, s = top_k(query, vectors, 3)  # numpy's exact search agrees with the store's
    assert [names[i] for i in ids[:2]] == order[:2] and s[0] == pytest.approx(1.0, abs=1e-5)


def test_kmeans_groups_points_around_their_centres():
    rng = np.random.default_rng(0)
    centres = normalised(rng.standard_normal((3, 16)))
    x = normalised(np.repeat(centres, 5, 0) + 0.05 * rng.standard_normal((15, 16)))
    labels = kmeans(x, 3)
    groups = {tuple(np.flatnonzero(labels == g)) for g in set(labels)}
    assert groups == {tuple(range(0, 5)), tuple(range(5, 10)), tuple(range(10, 15))}
    assert kmeans(x[:2], 5).shape == (2,) and kmeans(x[:0], 2).shape == (0,)


def test_copies_find_their_originals_in_the_top_3_controlled_vectors(tmp_path):
    """The store's ranking with controlled vectors (see the module docstring): 8 originals, and a
    flipped, a cropped and a recoloured copy of each, 10% of the originals' norm away."""
    rng = np.random.default_rng(3)
    originals = normalised(rng.standard_normal((8, 768)))
    names, vectors = [f"o{i}" for i in range(8)], [originals]
    for edit in ("flip", "crop", "recolour"):
        noise = rng.standard_normal((8, 768)) * 0.1 / np.sqrt(768)
        vectors.append(normalised(originals + noise))
        names += [f"o{i}_{edit}" for i in range(8)]
    v = np.concatenate(vectors)
    store = PeopleStore(str(tmp_path / "index"))
    store.add("appearance", People(names, [0] * len(names), np.zeros((len(names), 4)), v),
              [(n, None, 1) for n in names])  # fmt: skip
    for i, name in enumerate(names[8:], 8):
        top = store.nearest("appearance", v[i], 3).column("source").to_pylist()
        assert name.split("_")[0] in top, (name, top)


# ----------------------------------------------------------------------------- indexing


@pytest.fixture(scope="module")
def features_job(tiny_checkpoints):
    def make(index: Path) -> BatchJob:
        plan = task_plan(registry.get("features"), checkpoints=tiny_checkpoints, network_hw=HW)
        return BatchJob((plan,), batch_folder(str(index)))

    return make


def test_index_resumes_keeps_errors_and_finds_each_photo_itself(tmp_path, features_job):
    folder = tmp_path / "set"
    for i in range(3):
        photo(folder / f"p{i}.png", seed=i)
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    index = tmp_path / "index"
    first = build_index(str(folder), str(index), job=features_job(index), progress=False)
    assert first.added == {"appearance": 4} and first.people == {"appearance": 3}
    [(bad, why)] = first.errors["appearance"]
    assert bad.endswith("broken.jpg") and "InputImageError" in why
    photo(folder / "p3.png", seed=3)  # the collection grows
    second = build_index(str(folder), str(index), job=features_job(index), progress=False)
    assert second.added == {"appearance": 1} and second.total == {"appearance": 4}
    assert second.batch.skipped == 4  # the batch step skipped what it had
    store = PeopleStore(str(index))
    assert store.count("appearance") == 4 and len(store.errors("appearance")) == 1
    hits = find_similar(str(folder / "p2.png"), str(index), k=3)
    assert hits[0].source == str((folder / "p2.png").absolute()) and hits[0].score == pytest.approx(
        1.0, abs=1e-4
    )
    assert [h.rank for h in hits] == [1, 2, 3] and hits[0].box == (0.0, 0.0, 48.0, 40.0)
    pixels = np.asarray(Image.open(folder / "p1.png"))  # any image load_image reads, from Python
    assert find_similar(pixels, str(index), k=1)[0].source.endswith("p1.png")


def test_a_vector_run_killed_before_its_sources_row_is_redone_once(tmp_path):
    store = PeopleStore(str(tmp_path / "index"))
    v = normalised(np.eye(4, 8))
    store.add("appearance", People(["a", "b"], [0, 0], np.zeros((2, 4)), v[:2]), [("a", None, 1)])
    assert store.count("appearance") == 2 and store.done("appearance") == {"a"}  # "b": killed midway
    assert store.drop_orphans("appearance") == 1 and store.count("appearance") == 1


def pose_rows(out: Path) -> None:
    """A batch OUT of pose rows written as ``sapiens2 batch pose`` writes them (no model)."""
    task = registry.get("pose")
    store = Store(str(out))
    made_by = {"task": "pose", "options": {}}
    store.check_job(task, made_by)  # the run's check (reads only)
    store.record_job(task, made_by)  # the settings, written with the first part
    kp = np.stack([a_pose(1), a_pose(2)])
    rows = [
        {"source": "s3://bucket/a.jpg", "width": 200, "height": 100, "notices": [], "keypoints": kp,
         "scores": np.full((2, 308), 0.9), "boxes": np.array([[0, 0, 10, 10], [5, 5, 50, 60]]),
         "box_scores": np.ones(2), "detection": "detector"},
        records.error_row("s3://bucket/broken.jpg", "InputImageError: not an image"),
    ]  # fmt: skip
    store.commit(store.write(task, records.rows_table(task, rows)))


def test_an_earlier_batch_output_is_indexed_as_it_is(tmp_path, monkeypatch):
    out = tmp_path / "batch_out"
    pose_rows(out)

    def no_run(*a, **k):
        raise AssertionError("nothing is computed again")

    monkeypatch.setattr("sapiens2.search.indexing.run_batch", no_run)
    assert main(["index", str(out), "--out", str(tmp_path / "index"), "--by", "pose"]) == 0
    store = PeopleStore(str(tmp_path / "index"))
    rows = store.table("pose").to_arrow().sort_by("person")
    assert rows.column("source").to_pylist() == ["s3://bucket/a.jpg"] * 2
    assert rows.column("box").to_pylist()[1] == [5, 5, 50, 60] and len(rows.column("keypoints")[0]) == 616
    assert store.errors("pose") == [("s3://bucket/broken.jpg", "InputImageError: not an image")]
    summary = build_index(str(out), str(tmp_path / "index"), by="pose")
    assert summary.added == {"pose": 0} and not summary.computed  # a rerun adds nothing


def test_search_command_line_and_hostile_options(tmp_path, tiny_checkpoints, capsys):
    folder = tmp_path / "set"
    for i in range(2):
        photo(folder / f"p{i}.png", seed=i)
    index = tmp_path / "index"
    argv = ["index", str(folder), "--out", str(index), "--checkpoint", f"features={tiny_checkpoints['features']}",
            "--network-size", "128x96"]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    assert main(["search", str(folder / "p1.png"), "--index", str(index), "-k", "2", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert [h["rank"] for h in hits] == [1, 2] and hits[0]["source"].endswith("p1.png")
    assert set(hits[0]) == {"rank", "source", "person", "score", "box"}
    assert main(["search", str(folder / "p1.png"), "--index", str(index), "--by", "pose"]) == 1
    assert "no pose vectors" in capsys.readouterr().err
    assert main(["search", str(tmp_path / "nope.png"), "--index", str(index)]) == 1
    assert "No such file" in capsys.readouterr().err
    with pytest.raises(OptionError, match="--by takes"):
        parse_kinds("colour")
    with pytest.raises(OptionError, match="k must be"):
        find_similar(str(folder / "p1.png"), str(index), k=0)
    with pytest.raises(InputImageError, match="No query photo"):
        find_similar(None, str(index))
    assert main(["index", str(folder), "--out", str(index), "--by", "appearance,hair"]) == 1
