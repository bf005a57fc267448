"""The task registry drives everything above the pipelines: a toy task registered here gets a tab,
an API endpoint (its own and a place in /all), CLI flags and checked options, with no other code.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from registry_helpers import unregister

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sapiens2 import serving  # noqa: E402
from sapiens2.errors import OptionError  # noqa: E402
from sapiens2.inputs.intake import Intake  # noqa: E402
from sapiens2.models.zoo import TASKS as ZOO  # noqa: E402
from sapiens2.models.zoo import TaskSpec  # noqa: E402
from sapiens2.tasks import registry  # noqa: E402
from sapiens2.tasks.base import RunInfo, TaskResult  # noqa: E402
from sapiens2.tasks.options import Option  # noqa: E402
from sapiens2.tasks.result_record import Column, Record  # noqa: E402

# ----------------------------------------------------------------------------- a toy task (one file's worth)


@dataclass(kw_only=True)
class InvertResult(TaskResult):
    inverted: np.ndarray

    def render(self, *, strength: float = 1.0) -> np.ndarray:
        mix = self.image * (1 - strength) + self.inverted * strength
        return mix.round().astype(np.uint8)

    def save(self, out_dir: Path, *, rendered: np.ndarray | None = None) -> list[Path]:
        from sapiens2.outputs.export import safe_path, write_png

        return [
            write_png(
                safe_path(out_dir, self.name, "_invert.png"), self.render() if rendered is None else rendered
            )
        ]


class InvertPipeline:
    """No weights: the 'model' inverts the picture. Follows the pipeline contract."""

    task = "invert"

    def __init__(self, size: str | None = None, **kwargs: Any) -> None:
        self.size = size or "tiny"
        self.calls = 0

    @classmethod
    def without_weights(cls, size: str | None, **kwargs: Any) -> InvertPipeline:
        """The weight-free stages a batch's CPU side runs (there are no weights at all here)."""
        return cls(size)

    def prepare(self, intake: Intake, **opts: Any) -> np.ndarray:
        return intake.work

    def infer(self, batch: list[np.ndarray], **opts: Any) -> list[np.ndarray]:
        self.calls += 1
        return [255 - x for x in batch]

    def finish(self, raw: np.ndarray, intake: Intake, **opts: Any) -> InvertResult:
        info = RunInfo("invert", self.size, "cpu", "none")
        return InvertResult(image=intake.rgb, info=info, name=intake.name, inverted=raw)

    def __call__(self, image: Any, **opts: Any) -> InvertResult:
        from sapiens2.inputs.intake import load_image

        intake = load_image(image)
        return self.finish(self.infer([self.prepare(intake)])[0], intake)


TOY = registry.Task(
    spec=TaskSpec("invert", ("tiny",), None, "tiny", "tiny"),
    pipeline=InvertPipeline,
    tab="Invert",
    button="Run invert",
    summary="Invert: the photo's negative.",
    result_label="Invert",
    downloads="Downloads (PNG)",
    options=(
        Option(
            "strength", "float", 1.0, "render", "Strength", "how much to invert", low=0.0, high=1.0, step=0.1
        ),
    ),
    record=Record(
        (Column("inverted_png", "png", "the negative"), Column("darkness", "float", "mean of the negative")),
        lambda result: {"inverted_png": result.inverted, "darkness": float(result.inverted.mean())},
    ),
)


@pytest.fixture
def toy() -> Iterator[registry.Task]:
    registry.register(TOY)
    try:
        yield TOY
    finally:
        unregister(TOY)
    assert "invert" not in registry.all_tasks() and "invert" not in ZOO


def photo() -> np.ndarray:
    img = np.zeros((20, 30, 3), np.uint8)
    img[:, :15] = 200
    return img


# ----------------------------------------------------------------------------- tests


def test_builtin_tasks_are_declared_in_the_zoo_order_and_shown_when_their_weights_can_be_had(
    monkeypatch, tmp_path
) -> None:
    monkeypatch.setenv("SAPIENS2_CHECKPOINTS", str(tmp_path))  # an empty local root
    declared = registry.declared()
    assert list(declared) == [name for name in ZOO if name in declared]  # tab order = zoo rows
    assert set(declared) == set(ZOO)  # every zoo row has its module, every module its row
    shown = registry.all_tasks()
    assert list(shown) == [n for n, t in declared.items() if t.spec.on_hub]
    assert registry.get("features").spec.release == "pretrain"  # one name; the release's files keep theirs
    names = ", ".join(declared)  # the look-up takes every declared task, shown or not (as the CLI's help)
    with pytest.raises(OptionError, match=f"choose one of: {names}"):
        registry.get("height")


def test_each_task_module_is_found_and_the_model_layer_reads_the_zoo_rows() -> None:
    import sapiens2
    from sapiens2 import tasks as tasks_pkg
    from sapiens2.models.nn import outputs
    from sapiens2.models.nn.heads import predictors

    for task in registry.declared().values():
        assert task.pipeline.__module__.split(".")[2] in registry.builtin_modules()  # tasks/<name>/
        assert tasks_pkg.pipeline_class(task.name) is task.pipeline
        assert getattr(sapiens2, task.pipeline.__name__) is task.pipeline  # public name, derived
        assert issubclass(outputs.output_type(task.spec.output), outputs.TaskOutput)
        if task.spec.head is not None:
            assert predictors()[task.spec.predictor] == task.name


def test_option_names_are_unique_per_task_and_defaults_pass_their_own_checks() -> None:
    for task in registry.all_tasks().values():
        names = [o.name for o in task.options]
        assert len(names) == len(set(names)), task.name
        for gpu in (False, True):
            infer, render = task.split({}, gpu=gpu)
            assert set(infer) | set(render) == set(names)


@pytest.mark.slow
def test_a_registered_task_gets_a_tab_an_endpoint_and_a_place_in_all(toy, tmp_path) -> None:
    import app

    manager = serving.ModelManager(device="cpu")
    demo = app.build_demo(manager, folders=serving.RequestFolders(tmp_path / "req"))
    tabs = [b.label for b in demo.blocks.values() if type(b).__name__ == "Tab"]
    assert tabs == [t.tab for t in registry.all_tasks().values()] + ["Video", "Live"]  # tab order, then clips
    assert tabs[-3] == "Invert" and demo.title.endswith(", Invert")  # the page title names it too
    api = demo.get_api_info()["named_endpoints"]
    assert [p["parameter_name"] for p in api["/invert"]["parameters"]] == ["photo", "size", "strength"]
    all_params = [p["parameter_name"] for p in api["/all"]["parameters"]]
    assert all_params[-2:] == ["invert_size", "strength"]
    # the endpoint function works end to end through the app's runner (CPU, no GPU entry needed)
    fn = next(f.fn for f in demo.fns.values() if f.api_name == "invert")
    (before, after), files, line = fn(photo(), None, 0.5)
    assert Path(files[0]).name == "image_invert.png" and Path(after).name == "image_invert_preview.jpg"
    assert np.asarray(Image.open(files[0]))[0, 0].tolist() == [128, 128, 128]
    with pytest.raises(Exception, match=r"'strength' must be a number from 0 to 1; got 3"):
        fn(photo(), None, 3)


def test_a_registered_task_gets_cli_flags(toy, tmp_path, capsys) -> None:
    from PIL import Image

    from sapiens2.cli import build_parser, main

    args = build_parser().parse_args(["invert", "x.png", "--strength", "0.2"])
    assert args.task == "invert" and args.strength == 0.2
    Image.fromarray(photo()).save(tmp_path / "p.png")
    assert main(["invert", str(tmp_path / "p.png"), "--out", str(tmp_path / "o"), "--strength", "1"]) == 0
    out = np.asarray(Image.open(tmp_path / "o" / "p" / "p_invert.png"))
    assert out[0, 0].tolist() == [55, 55, 55]
    assert main(["invert", str(tmp_path / "p.png"), "--out", str(tmp_path / "o"), "--strength", "9"]) == 1
    assert "--strength must be a number from 0 to 1" in capsys.readouterr().err


def test_a_task_name_cannot_be_registered_twice(toy) -> None:
    with pytest.raises(OptionError, match="already registered"):
        registry.register(toy)


def test_a_registered_task_with_a_record_runs_in_a_local_batch(toy, tmp_path) -> None:
    """The toy's declared record is its batch row: one row per photo, a broken file an error row;
    a task without a record is refused before anything runs."""
    import dataclasses

    from sapiens2 import batch
    from sapiens2.batch import records
    from sapiens2.batch.job import BatchJob, task_plan

    folder = tmp_path / "in"
    folder.mkdir()
    Image.fromarray(photo()).save(folder / "a.png")
    (folder / "b.png").write_bytes(b"not a png at all")
    batch.run(BatchJob((task_plan(toy),), str(tmp_path / "out")), str(folder), progress=False)
    good, bad = batch.read_task(str(tmp_path / "out"), toy).sort_by("source").to_pylist()
    assert good["error"] is None and (good["width"], good["height"]) == (30, 20)
    assert np.array_equal(records.read_png(good["inverted_png"]), 255 - photo())
    assert good["darkness"] == pytest.approx(float((255 - photo()).mean()))
    assert bad["error"] and bad["inverted_png"] is None and bad["darkness"] is None
    assert records.schema(toy).names[5:] == ["inverted_png", "darkness"]
    assert "invert" in records.batch_tasks()
    with pytest.raises(OptionError, match=r"invert has no batch record; batch runs: pose, seg"):
        task_plan(dataclasses.replace(toy, record=None))


def test_a_record_is_checked_where_it_is_declared() -> None:
    with pytest.raises(OptionError, match="kind 'npz'"):
        Column("x", "npz")  # type: ignore[arg-type]
    with pytest.raises(OptionError, match="needs kind 'tensor'"):
        Column("x", "png", shape=(3,))
    with pytest.raises(OptionError, match="dtype 'int8'"):
        Column("x", "npy", dtype="int8")
    with pytest.raises(OptionError, match="distinct names"):
        Record((Column("x", "png"), Column("x", "float")), dict)
