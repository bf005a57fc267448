"""Appearance per person: each person the detector finds gets the backbone's patch features
pooled over their box (one forward, no crops); a photo with nobody found keeps its CLS as the
whole photo. Controlled patch features show that the right person is found, with their box,
through the batch row, the index, ``find_similar`` and the Space's set."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from sapiens2.batch import read_task, records
from sapiens2.batch.store import Store
from sapiens2.cli import main
from sapiens2.errors import OptionError
from sapiens2.inputs.intake import load_image
from sapiens2.search import build_index, find_similar
from sapiens2.search.people_store import PeopleStore
from sapiens2.search.query import query_vectors
from sapiens2.search.vectors import WHOLE_PHOTO, appearance_people
from sapiens2.serving.similar import PeopleSet, Person, _people, most_similar
from sapiens2.tasks import registry
from sapiens2.tasks.base import RunInfo
from sapiens2.tasks.features import FeaturesPipeline, FeaturesRaw
from sapiens2.tasks.features.features_people import pooled_embeddings

D, GRID = 16, (8, 6)  # patch grid rows x columns of a 128 x 96 network input
W, H = 120, 160  # the photo (its working copy: no downscale at this size)


def unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(D).astype(np.float32)
    return v / np.linalg.norm(v)


def two_people(left: np.ndarray, right: np.ndarray, seed: int = 0) -> np.ndarray:
    """(D, 8, 6) patch features: ``left`` on the grid's left half, ``right`` on its right half,
    a little noise everywhere (as a background would add)."""
    noise = np.random.default_rng(seed).standard_normal((D, *GRID)).astype(np.float32) * 0.02
    f = noise
    f[:, :, :3] += left[:, None, None]
    f[:, :, 3:] += right[:, None, None]
    return f


BOXES = np.array([[0, 0, 60, 160], [60, 0, 120, 160]], np.float32)  # left person, right person


def test_pooling_follows_the_box():
    a, b = unit(1), unit(2)
    f = two_people(a, b)
    v = pooled_embeddings(f, BOXES, (H, W))
    assert v.shape == (2, D) and np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert v[0] @ a > 0.99 and v[1] @ b > 0.99 and v[0] @ b == pytest.approx(a @ b, abs=0.03)
    tiny = pooled_embeddings(f, np.array([[100, 10, 101, 11]]), (H, W))  # inside one right-hand patch
    assert tiny[0] @ b > 0.99
    outside = pooled_embeddings(f, np.array([[-50, -50, 500, 500]]), (H, W))  # clipped: all patches
    assert outside[0] @ normalised_mean(f) > 0.9999
    f[:, 0, 0] = np.nan  # non-finite patches under a box: nothing to search by (zeros)
    assert not pooled_embeddings(f, BOXES[:1], (H, W)).any()
    assert pooled_embeddings(f, np.zeros((0, 4)), (H, W)).shape == (0, D)
    with pytest.raises(OptionError, match="finite"):
        pooled_embeddings(f, np.array([[0, 0, np.inf, 1]]), (H, W))


def normalised_mean(f: np.ndarray) -> np.ndarray:
    m = f.reshape(D, -1).mean(1)
    return m / np.linalg.norm(m)


def features_result(left: np.ndarray, right: np.ndarray, seed: int, people: bool = True):
    """A features result made by the pipeline's own ``finish`` from a constructed device output:
    two people (the detector's boxes given) over controlled patch features."""
    pipe = FeaturesPipeline.without_weights("0.1b", input_hw=(128, 96))
    intake = load_image(np.zeros((H, W, 3), np.uint8))
    cls = unit(50 + seed)  # the same-ish CLS for every photo: only the people tell them apart
    raw = FeaturesRaw(torch.from_numpy(cls), torch.from_numpy(two_people(left, right, seed)),
                      RunInfo("features", "0.1b", "cpu", "float32"),
                      boxes=BOXES.copy() if people else np.zeros((0, 4), np.float32))  # fmt: skip
    return pipe.finish(raw, intake)


def batch_out(out: Path, results: dict[str, object]) -> None:
    """A batch OUT of features rows as ``sapiens2 batch features --per-person`` writes them."""
    task = registry.get("features")
    store = Store(str(out))
    made_by = {"task": "features", "options": {"per_person": True}}
    store.check_job(task, made_by)
    store.record_job(task, made_by)
    rows = [records.result_row(task, source, r) for source, r in results.items()]
    store.commit(store.write(task, records.rows_table(task, rows)))


@pytest.mark.slow  # LanceDB's first import is most of it
def test_the_right_person_is_found_with_their_box(tmp_path, monkeypatch):
    red, blue, green, grey = unit(11), unit(12), unit(13), unit(14)
    photos = {
        "a.jpg": features_result(red, blue, 1),  # red left, blue right
        "b.jpg": features_result(green, grey, 2),
        "c.jpg": features_result(grey, grey, 3, people=False),  # nobody found: the CLS stands
    }
    a = photos["a.jpg"]
    assert a.person_boxes.tolist() == BOXES.tolist() and a.person_embeddings.shape == (2, D)
    assert a.summary()["people"] == 2
    out = tmp_path / "batch_out"
    batch_out(out, photos)
    summary = build_index(str(out), str(tmp_path / "index"))
    assert summary.added == {"appearance": 3} and summary.people == {"appearance": 5}
    rows = PeopleStore(str(tmp_path / "index")).table("appearance").to_arrow().sort_by([("source", "ascending"),
                                                                                        ("person", "ascending")])  # fmt: skip
    assert list(zip(rows.column("source").to_pylist(), rows.column("person").to_pylist(), strict=True)) == [
        ("a.jpg", 0), ("a.jpg", 1), ("b.jpg", 0), ("b.jpg", 1), ("c.jpg", WHOLE_PHOTO)]  # fmt: skip
    assert rows.column("box").to_pylist()[4] == [0, 0, W, H]  # the whole photo says so

    # the query: blue on the LEFT of another photo, and someone else on its right
    query = features_result(blue, unit(15), 4)
    q_out = tmp_path / "query_out"
    batch_out(q_out, {"q.jpg": query})
    row = records_of(q_out)
    monkeypatch.setattr("sapiens2.search.query.query_rows", lambda photo, made_by: row)
    hits = find_similar("q.jpg", str(tmp_path / "index"), k=2, person=0)
    assert (hits[0].source, hits[0].person, hits[0].box) == ("a.jpg", 1, (60.0, 0.0, 120.0, 160.0))
    assert hits[0].score > 0.99 and hits[1].score < 0.9
    with pytest.raises(OptionError, match="person 5 is not one of them"):
        find_similar("q.jpg", str(tmp_path / "index"), person=5)
    for bad in (True, -1, "0"):
        with pytest.raises(OptionError, match="person must be a whole number"):
            find_similar("q.jpg", str(tmp_path / "index"), person=bad)
    v, p = query_vectors(row, "appearance", None)  # the largest person (a tie: the first)
    assert p == 0 and v.shape == (1, D)


def records_of(out: Path):
    return read_task(str(out), "features")


def test_whole_photo_rows_and_bad_widths():
    cls = unit(3) * 5
    [(p, box, v)] = appearance_people(cls, None, None, 40, 30)  # made without per_person
    assert p == WHOLE_PHOTO and box.tolist() == [0, 0, 40, 30] and np.allclose(v, unit(3), atol=1e-6)
    found = appearance_people(cls, BOXES, np.stack([np.zeros(D), unit(4)]).reshape(-1), 40, 30)
    assert [x[0] for x in found] == [1]  # a person with no vector is left out, the others kept
    with pytest.raises(OptionError, match="2 person boxes but 5 person values"):
        appearance_people(cls, BOXES, np.ones(5), 40, 30)


def test_the_space_set_shows_the_person_and_their_box(tmp_path):
    red, blue = unit(21), unit(22)
    results = [features_result(red, blue, 5), features_result(blue, red, 6)]
    people = [person for i, r in enumerate(results) for person in _people("appearance", r, i)]
    assert [(p.photo, p.person, p.box) for p in people] == [
        (0, 0, (0.0, 0.0, 60.0, 160.0)), (0, 1, (60.0, 0.0, 120.0, 160.0)),
        (1, 0, (0.0, 0.0, 60.0, 160.0)), (1, 1, (60.0, 0.0, 120.0, 160.0))]  # fmt: skip
    nobody = _people("appearance", features_result(red, red, 7, people=False), 2)
    assert [(p.person, p.box) for p in nobody] == [(WHOLE_PHOTO, (0.0, 0.0, float(W), float(H)))]
    pictures = [np.zeros((H, W, 3), np.uint8)] * 2
    query = [Person(-1, 0, (0, 0, 1, 1), people[1].vector).vector]  # blue
    shown = most_similar(PeopleSet(("k",), "appearance", ["x.png", "y.png"], pictures, people, query=query),
                         tmp_path, k=2)  # fmt: skip
    assert shown[0][1].startswith("1. 1.000 · x.png · person 2") and "y.png · person 1" in shown[1][1]


def test_the_pipeline_finds_people_in_one_forward(tiny_checkpoints, tmp_path):
    """The tiny backbone with a callable detector: boxes in photo pixels, a unit vector each, one
    forward; off by default; nobody found (no detector) keeps the CLS and says so."""
    rgb = (np.random.default_rng(0).random((80, 120, 3)) * 255).astype(np.uint8)
    boxes = np.array([[0, 0, 60, 80], [60, 10, 120, 80]], np.float32)
    pipe = FeaturesPipeline(checkpoint=tiny_checkpoints["features"], detector=lambda image: boxes)
    pipe.input_hw = (64, 48)
    calls = []
    real = pipe.timed_forward
    pipe.timed_forward = lambda *a: calls.append(1) or real(*a)
    r = pipe(rgb, per_person=True)
    assert len(calls) == 1 and r.person_boxes.tolist() == boxes.tolist()
    assert np.allclose(np.linalg.norm(r.person_embeddings, axis=1), 1.0, atol=1e-5)
    assert pipe(rgb).person_boxes is None
    names = sorted(path.name for path in r.save(tmp_path))
    assert names == ["image_embedding.npy", "image_features_pca.png", "image_person_boxes.npy",
                     "image_person_embeddings.npy"]  # fmt: skip
    assert np.array_equal(np.load(tmp_path / "image_person_embeddings.npy"), r.person_embeddings)
    none = FeaturesPipeline(checkpoint=tiny_checkpoints["features"], detector=None)(rgb, per_person=True)
    assert none.person_boxes.shape == (0, 4) and any("CLS embedding stands" in n for n in none.notices)
    task = registry.get("features")
    assert task.work({"per_person": True}).detector and not task.work({}).detector
    row = records.rows_table(task, [records.result_row(task, "x.jpg", r)])
    flat = records.column_arrays(row.column("person_embeddings"))[0]
    assert np.allclose(flat.reshape(2, -1), r.person_embeddings)


@pytest.mark.slow
def test_index_and_search_by_person_from_the_command_line(tmp_path, tiny_checkpoints, tiny_detr, capsys):
    """``sapiens2 index`` turns per_person on: a (tiny, random) DETR's people each get a row with
    their box; ``sapiens2 search --person 0`` finds that person first, with their box."""
    folder = tmp_path / "set"
    folder.mkdir()
    for i in range(2):
        rgb = (np.random.default_rng(i).random((90, 120, 3)) * 255).astype(np.uint8)
        Image.fromarray(rgb).save(folder / f"p{i}.png")
    index = tmp_path / "index"
    argv = ["index", str(folder), "--out", str(index), "--checkpoint", f"features={tiny_checkpoints['features']}",
            "--network-size", "128x96", "--detector-checkpoint", str(tiny_detr)]  # fmt: skip
    assert main(argv) == 0
    rows = PeopleStore(str(index)).table("appearance").to_arrow()
    persons, boxes = rows.column("person").to_pylist(), np.array(rows.column("box").to_pylist())
    assert min(persons) >= 0 and (boxes[:, 2] <= 120).all() and (boxes[:, 3] <= 90).all()
    capsys.readouterr()
    assert (
        main(["search", str(folder / "p1.png"), "--index", str(index), "-k", "1", "--json", "--person", "0"])
        == 0
    )
    [hit] = json.loads(capsys.readouterr().out)
    mine = [b for s, p, b in zip(rows.column("source").to_pylist(), persons, boxes.tolist(), strict=True)
            if s.endswith("p1.png") and p == 0]  # fmt: skip
    assert hit["source"].endswith("p1.png") and hit["person"] == 0 and hit["box"] == pytest.approx(mine[0])
    assert hit["score"] == pytest.approx(1.0, abs=1e-4)
