"""A task's photo-size arrays are described once (``Task.arrays``): the photo's files, the batch
record and a clip's raw NPZ are derived from that description and keep the same values in the
same dtype."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from sapiens2.batch.records import read_array, read_png, record_row
from sapiens2.errors import OptionError
from sapiens2.tasks import registry
from sapiens2.tasks.clip_frames import DenseFrames, raw_fields
from sapiens2.tasks.result_record import ResultArray, save_arrays

H, W = 6, 5
WITH_ARRAYS = [t for t in registry.declared().values() if t.arrays]


def fake_value(array: ResultArray, rng: np.random.Generator) -> np.ndarray:
    """A float64 (or int/bool) array with a NaN and a value beyond float16's range, so that the
    cast is visible."""
    if array.dtype == "bool":
        return rng.random((H, W)) > 0.5
    if array.dtype == "uint8":
        return rng.integers(0, 29, (H, W)).astype(np.int64)
    value = rng.normal(size=(H, W, 3))
    value[0, 0, 0], value[1, 1, 1] = np.nan, 1e6
    return value


def test_the_built_in_dense_tasks_declare_their_arrays() -> None:
    names = {t.name for t in WITH_ARRAYS}
    assert {"normal", "seg", "pointmap", "matting"} <= names


@pytest.mark.parametrize("task", WITH_ARRAYS, ids=lambda t: t.name)
def test_files_record_and_clip_keep_one_description(task: registry.Task, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    result = SimpleNamespace(**{a.attr: fake_value(a, rng) for a in task.arrays})
    for column in task.record.columns if task.record else ():  # the record's other columns
        setattr(result, column.name, getattr(result, column.name, 1.0))
    files = {p.name.removeprefix("x"): p for p in save_arrays(result, task.arrays, tmp_path, "x")}
    row = record_row(task, result) if task.record else {}
    clip = DenseFrames(task, {}, 1 << 30).raw_arrays(result) if task.video else {}
    assert set(clip) == {a.attr for a in task.arrays if a.in_clip} if task.video else True
    for array in task.arrays:
        expected = array.kept(result)
        assert expected.dtype == np.dtype(array.dtype)
        for suffix in array.files:
            kept = np.load(files[suffix]) if suffix.endswith(".npy") else read_png(files[suffix].read_bytes())
            if array.dtype == "bool" and suffix.endswith(".png"):
                kept = kept > 0
            np.testing.assert_array_equal(kept, expected)
            assert kept.dtype == expected.dtype or suffix.endswith(".png")
        if array.in_record and task.record:
            name = array.column.name
            cell = read_png(row[name]) if array.picture else read_array(row[name])
            np.testing.assert_array_equal(cell > 0 if array.dtype == "bool" else cell, expected)
        if array.in_clip and task.video:
            np.testing.assert_array_equal(clip[array.attr], expected)
            assert clip[array.attr].dtype == expected.dtype
    assert set(raw_fields(task)) == ({a.attr for a in task.arrays if a.in_clip} if task.video else set())


def test_one_cast_keeps_nan_and_clips_to_the_range() -> None:
    kept = ResultArray("a", "float16", "x").kept(SimpleNamespace(a=np.array([np.nan, 1e6, -1e6, 0.5])))
    assert np.isnan(kept[0]) and kept[1] == np.finfo(np.float16).max and kept[2] == -np.finfo(np.float16).max
    assert kept[3] == np.float16(0.5)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"dtype": "float64"}, "dtype"),
        ({"dtype": "float16", "files": ("_a.png",)}, "not a PNG"),
        ({"dtype": "uint8", "files": ("_a.tif",)}, ".npy or .png"),
    ],
)
def test_a_bad_array_declaration_is_refused(kwargs: dict, says: str) -> None:
    with pytest.raises(OptionError, match=says):
        ResultArray("a", what="x", **kwargs)


def test_a_png_column_refuses_pixels_it_cannot_write() -> None:
    from sapiens2.batch.records import png_bytes

    with pytest.raises(OptionError, match="uint8 or bool"):
        png_bytes(np.zeros((4, 4), np.int64))
