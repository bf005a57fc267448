"""The page, made from the task declarations: one tab per task, "Run all tasks", the about text.

A tab: the size menu, the option widgets, the run button and the examples on the left; the
before/after view, run info, the task's views and its downloads on the right. Every model run
(buttons and the examples' lazy cache alike) shares one concurrency group, ``MODELS``. A run that
fails leaves its error in the tab's run info until the next run (the event's ``.failure`` step;
on a local launch also the operator's details, in a fold under it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
from gradio.context import get_blocks_context

from ..models.zoo import ARCHS, DETECTOR, V1_LICENSE, V1_LICENSE_URL, WEIGHTS_LICENSE, is_v1
from ..serving import ModelManager
from ..serving.folders import result_id
from ..tasks.registry import OnDemand, Task
from .browser_compare import browser_block
from .endpoints import all_endpoint, compare_endpoint, on_demand_endpoint, task_endpoint
from .error_board import shown_error
from .inputs import photo_input, say_on_arrival
from .page_runner import Runner
from .similar_block import similar_block
from .widgets import (
    OUTPUT_FILES,
    download_groups,
    option_widget,
    render_results,
    result_widgets,
    size_dropdown,
)

#: The concurrency group of everything that runs a model.
MODELS = "models"


@dataclass
class TabParts:
    """What "Run all tasks" needs from a task's tab: its input widgets and its output widgets."""

    task: Task
    controls: list[Any]  # size menu, then one widget per option
    outputs: list[Any]


def share_model_slots(event: Any) -> None:
    """Put an event made by Gradio itself (the examples' lazy-cache run) in the models'
    concurrency group. ``gr.Examples`` takes no ``concurrency_id``, and the ``Dependency`` it
    returns holds only the Python function: the setting lives on the Blocks' ``BlockFunction``."""
    blocks = get_blocks_context()
    if blocks is None or event is None:
        raise RuntimeError("share_model_slots needs an event made inside the Blocks being built")
    blocks.fns[event["id"]].concurrency_id = MODELS


def add_examples(
    photo: gr.Image, task: Task, handler: Callable[..., Any], parts: TabParts, examples: list[str]
) -> Any:
    """The example photos for one tab, run with the tab's default options and cached on first use.
    Returns the event that runs one (None without examples): a failed run's reason goes to the
    tab's run info like a button's (the handler records it for the page session's request)."""
    if not examples:
        return None
    defaults = [c.value for c in parts.controls]

    def run_example(photo: Any, request: gr.Request) -> Any:
        return handler(photo, *defaults, None, request)

    ex = gr.Examples(
        examples=[[p] for p in examples],
        inputs=[photo],
        outputs=parts.outputs,
        fn=run_example,
        cache_examples=True,
        cache_mode="lazy",
        examples_per_page=8,
        label=f"Examples: click a photo to run {task.tab} on it",
        api_visibility="private",  # Gradio 6: api_name=False became public endpoints named "/false"
        elem_id=f"{task.name}-examples",
    )
    share_model_slots(ex.cache_event)
    return ex.cache_event


def compare_block(run: Runner, task: Task, photo: gr.Image, size: gr.Dropdown) -> None:
    """A second photo and a button that scores the two with the task's ``compare``."""
    assert task.compare is not None
    other = photo_input(
        label="Second photo (to compare)", sources=["upload", "webcam", "clipboard"], height=180
    )
    say_on_arrival(other)
    button = gr.Button("Compare the two photos")
    # hidden until a comparison ran: Gradio's number box shows an empty value as 0, read as a score
    score = gr.Number(None, label=task.compare.label, precision=4, interactive=False, visible=False)
    info = gr.Textbox(  # room for the whole run info: what ran, its seconds, the model's details
        label="Comparison run info",
        interactive=False,
        lines=3,
        max_lines=8,
        elem_id=f"{task.name}-compare-info",
    )
    event = button.click(
        compare_endpoint(run, task),
        inputs=[photo, other, size],
        outputs=[score, info],
        api_name=task.compare.api_name,
        concurrency_id=MODELS,
    )
    event.success(lambda: gr.Number(visible=True), None, score, api_visibility="private", queue=False)
    event.failure(
        shown_error(task.compare.api_name, False), None, [info], api_visibility="private", queue=False
    )
    manager = run.manager
    browser_block(task, manager.checkpoints, manager.checkpoint_size(task))  # "Compute in my browser"


def on_demand_block(run: Runner, task: Task, entry: OnDemand, downloads: gr.File) -> None:
    """A button that makes an on-demand download of the tab's last result (``/<api_name>``).

    The result is named by a hidden text box that follows the tab's downloads (whatever filled
    them: the button, an example, "Run all tasks"); API callers pass the id themselves."""
    result = gr.Textbox(visible=False, label="result")
    button = gr.Button(
        entry.button, variant="secondary", interactive=False, elem_id=f"{entry.api_name}-button"
    )
    files = gr.File(
        label=entry.label,
        file_count="multiple",
        interactive=False,
        elem_id=f"{entry.api_name}-files",
        elem_classes=[OUTPUT_FILES],
    )
    info = gr.Textbox(
        label=f"{entry.label}: run info",
        interactive=False,
        lines=2,
        max_lines=6,
        elem_id=f"{entry.api_name}-info",
    )

    def follow(paths: Any) -> tuple[str, Any, None, str]:
        """The id of the result now in the downloads; a cached example's files are copies
        outside any request folder, so its result cannot be made more of: say so."""
        found = result_id(" ".join(str(p) for p in paths or []))
        if found is None and paths:
            hint = f"Press “{task.button}” to make this from a run of your own (an example shows stored results)."
            return "", gr.update(interactive=False), None, hint
        return found or "", gr.update(interactive=bool(found)), None, ""

    downloads.change(
        follow, inputs=downloads, outputs=[result, button, files, info], api_visibility="private"
    )
    button.click(
        on_demand_endpoint(run, task, entry),
        inputs=[result],
        outputs=[files, info],
        api_name=entry.api_name,
        concurrency_id="files",  # CPU file work: never waits behind a model run
        concurrency_limit=1,
    ).failure(shown_error(entry.api_name, False), None, [info], api_visibility="private", queue=False)


def operator_fold(operator: bool, key: str) -> list[Any]:
    """Under the run info on a local launch: a fold for the operator's details of an error
    (hidden until one happens); nothing on a public server."""
    if not operator:
        return []
    with gr.Accordion("Details for this server's operator", open=False, visible=False) as fold:
        details = gr.Textbox(
            show_label=False, interactive=False, lines=3, max_lines=12, elem_id=f"{key}-operator"
        )
    return [fold, details]


def task_tab(
    run: Runner, task: Task, photo: gr.Image, examples: list[str], operator: bool = False
) -> TabParts:
    """One task's tab and its endpoint (``/<api_name>``). ``operator``: errors show the
    operator's details in a fold (a local launch)."""
    manager: ModelManager = run.manager
    outputs = result_widgets(task)
    with gr.Tab(task.tab, id=task.api_name):
        with gr.Row():
            with gr.Column(scale=1):
                size = size_dropdown(manager.sizes(task), manager.default_size(task))
                widgets = {o.name: option_widget(o, manager.cuda) for o in task.options}
                parts = TabParts(task, [size, *widgets.values()], outputs)
                link_enabled_options(task, widgets)
                button = gr.Button(task.button, variant="primary")
                handler = task_endpoint(run, task, manager.cuda)
                if task.compare is not None:  # an embedding to compare is one to search by
                    compare_block(run, task, photo, size)
                    similar_block(run, task, photo, size, MODELS)
                example = add_examples(photo, task, handler, parts, examples)
            with gr.Column(scale=2):
                fold = render_results(outputs, lambda: operator_fold(operator, task.name))
                downloads = outputs[1 + len(task.views)]
                split_downloads(task, downloads, download_groups(task))
                for entry in task.on_demand:
                    on_demand_block(run, task, entry, downloads)
    event = button.click(
        handler,
        inputs=[photo, *parts.controls],
        outputs=outputs,
        api_name=task.api_name,
        concurrency_id=MODELS,
    )
    for run_event in (event, example) if example is not None else (event,):
        run_event.failure(
            shown_error(task.api_name, operator),
            None,
            [outputs[-1], *fold],
            api_visibility="private",
            queue=False,
        )
        if fold:
            run_event.success(
                lambda: gr.Accordion(visible=False), None, fold[:1], api_visibility="private", queue=False
            )
    return parts


def split_downloads(task: Task, files: gr.File, groups: list[gr.File]) -> None:
    """Render a tab's further download lists (pose: the keypoint formats) and fill them from the
    main one whenever a result lands in it (a run, a cached example, Run all): the endpoint's
    outputs keep every file in one list, the page shows them grouped."""
    for group in groups:
        group.render()
    if not groups:
        return

    def split(paths: list[str] | None) -> list[Any]:
        lists = task.group_files([Path(p) for p in paths or []])
        if not any(lists[1:]):  # already split (this listener's own update), or nothing to move
            return [gr.skip()] * len(lists)
        return [[str(p) for p in group] for group in lists]

    files.change(split, files, [files, *groups], api_visibility="private", queue=False)


def link_enabled_options(task: Task, widgets: Mapping[str, Any]) -> None:
    """An option declared ``enabled_by`` another (a switch) can be changed only while that switch
    is on: e.g. normals' background choice matters only when the background is removed."""
    for opt in task.options:
        if opt.enabled_by is None:
            continue
        switch, widget = widgets[opt.enabled_by], widgets[opt.name]
        widget.interactive = bool(switch.value)
        switch.change(
            lambda on: gr.update(interactive=bool(on)), switch, widget, api_visibility="private", queue=False
        )


def all_tasks_event(
    run: Runner,
    tasks: Mapping[str, Task],
    tabs: list[TabParts],
    photo: gr.Image,
    button: gr.Button,
    status: Any,
) -> None:
    """``/all``: every tab's inputs in, every tab's outputs (and a status line) out."""
    inputs = [photo, *(c for parts in tabs for c in parts.controls)]
    outputs = [*(c for parts in tabs for c in parts.outputs), status]
    button.click(
        all_endpoint(run, tasks, run.manager.cuda),
        inputs=inputs,
        outputs=outputs,
        api_name="all",
        concurrency_id=MODELS,
    ).failure(shown_error("all", False), None, [status], api_visibility="private", queue=False)


def about_markdown(tasks: Mapping[str, Task]) -> str:
    rows = "\n".join(
        f"| {a.size} | {a.params_b:.3f} B | {a.hidden} | {a.layers} | "
        f"{'-' if a.tflops_1024x768 is None else f'{a.tflops_1024x768:.2f} T'} |"
        for key, a in ARCHS.items()
        if not is_v1(key)
    )
    listed = "\n".join(f"- **{t.tab}**: sizes {', '.join(t.spec.sizes)}" for t in tasks.values())
    return f"""
**Sapiens2** (Meta, ICLR 2026) is a family of vision transformers pretrained on 1 billion human
images, with task heads for 308-keypoint pose, 29-class body-part segmentation, surface normals,
pointmaps and matting. Input 1024x768 (HxW), patch 16; the 1b-4k backbone takes 4096x3072.

| backbone | params | width | layers | FLOPs @1024x768 |
|---|---|---|---|---|
{rows}

{listed}

**Sapiens v1** (Meta, ECCV 2024, [arXiv 2408.12569](https://arxiv.org/abs/2408.12569)) models are
the `v1-*` sizes (`-bf16`: its bfloat16 files) of the tasks they serve, and the only models of
the Depth (v1) tab, whose depth is relative, not metric. Each v1 result is marked "Sapiens v1 ·
size · {V1_LICENSE}". They run with v1's own pre- and post-processing as this package implements
it ([notes](https://github.com/facebookresearch/sapiens); docs/SAPIENS_V1.md), a modified pipeline.

**Weights licences:** Sapiens2: {WEIGHTS_LICENSE}. Sapiens v1: [{V1_LICENSE}]({V1_LICENSE_URL}),
non-commercial use only, attribution to Meta and the Sapiens authors. This Space does not re-host
weights: they are downloaded from the `facebook/sapiens2-*` and `facebook/sapiens-*` repositories
on the Hugging Face Hub on first use. Person boxes for pose come from `{DETECTOR.repo_id}`
({DETECTOR.license}).

Links: [paper (arXiv 2604.21681)](https://arxiv.org/abs/2604.21681) ·
[code](https://github.com/facebookresearch/sapiens2) ·
[licence](https://github.com/facebookresearch/sapiens2/blob/main/LICENSE.md) ·
[models](https://huggingface.co/facebook/sapiens2-pose-1b)
"""
