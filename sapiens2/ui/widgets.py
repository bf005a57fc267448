"""Widgets made from declarations: an option's input, a size menu, a result's output views."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gradio as gr

from ..errors import OptionError
from ..tasks.options import Option
from ..tasks.registry import Task, View
from .inputs import photo_input, say_on_arrival

#: Height of the before/after view, in CSS pixels.
VIEW_HEIGHT = 520
#: The class of every list of files the app gives (see PAGE_CSS).
OUTPUT_FILES = "sapiens2-output-files"
#: The page's own CSS (``launch(css=...)``): Gradio 6.31's file list shows a remove button on
#: every row of a list of two or more files, even in an output; the app's lists are outputs.
#: Pop-ups open at the bottom: at Gradio's top right they covered "Run all tasks" for seconds.
PAGE_CSS = f"""
.{OUTPUT_FILES} button[aria-label="Remove this file"] {{ display: none; }}
.toast-wrap {{ top: auto !important; bottom: var(--size-4); }}
"""


def checked_by_package(component: Any) -> Any:
    """Pass API values through unchanged so the package checks them: its message names the
    option and its allowed values, where Gradio's own range check names neither."""
    component.preprocess = lambda payload: payload  # type: ignore[method-assign]
    return component


def whole_number(value: Any, name: str, default: int) -> int:
    """An integer option from the API or a slider (which may send 3.0)."""
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionError(f"{name} must be a whole number, got {value!r}.")
    return value


def option_widget(opt: Option, gpu: bool) -> gr.components.Component:
    """The input widget of one option, showing this server's default (e.g. flip test on a GPU)."""
    value = opt.default_for(gpu)
    label = opt.label
    if opt.gpu_default is not None and opt.gpu_default != opt.default:
        state = "on" if value else "off"
        label = f"{opt.label} ({state} by default on this {'GPU' if gpu else 'CPU'})"
    if opt.kind == "bool":
        return gr.Checkbox(bool(value), label=label)
    if opt.kind in ("float", "int"):
        return checked_by_package(gr.Slider(opt.low, opt.high, value=value, step=opt.step, label=label))
    if opt.kind == "choice":
        return checked_by_package(gr.Radio(list(opt.choices), value=value, label=label))
    if opt.kind == "classes":
        return gr.Dropdown(
            list(opt.choices),
            value=[],
            multiselect=True,
            allow_custom_value=True,  # other spellings work too; unknown names get a clear error
            label=label,
        )
    if opt.kind == "color":
        return gr.ColorPicker(value, label=label)
    if opt.kind == "image":
        image = photo_input(label=label, sources=["upload", "clipboard"], height=160)
        say_on_arrival(image)
        return image
    raise AssertionError(opt.kind)  # pragma: no cover - a declaration typo


def size_dropdown(sizes: tuple[str, ...], default: str) -> gr.Dropdown:
    return gr.Dropdown(
        choices=list(sizes),
        value=default,
        label="Model size",
        info="Bigger is more accurate and slower.",
        allow_custom_value=True,  # so API callers get the package's message naming the sizes
    )


def view_widget(view: View) -> gr.components.Component:
    """An output view (made unrendered: the tab places it after the examples exist)."""
    if view.kind == "json":
        return gr.JSON(label=view.label, height=260, render=False)
    if view.kind == "image":
        return gr.Image(label=view.label, type="numpy", height=240, render=False)
    if view.kind == "html":
        return gr.HTML(label=view.label, render=False)
    if view.kind == "model3d":
        # "solid": meshes render as surfaces; a POINTS primitive still renders as points
        return gr.Model3D(label=view.label, display_mode="solid", height=360, render=False)
    raise AssertionError(view.kind)  # pragma: no cover - a declaration typo


def result_widgets(task: Task) -> list[gr.components.Component]:
    """A task's outputs, unrendered and in its endpoint's order: before/after slider, its views,
    downloads (every file), run info. The tab shows the downloads split (``download_groups``)."""
    slider = gr.ImageSlider(
        label=f"{task.result_label}: before / after",
        type="numpy",
        # a fixed box: a very wide or tall photo is letterboxed inside it, clear of the label and
        # the toolbar, instead of the box shrinking to the picture (a 25 px strip at 30:1)
        height=VIEW_HEIGHT,
        max_height=VIEW_HEIGHT,
        elem_id=f"{task.name}-result",
        render=False,
    )
    info = gr.Textbox(  # the first line: model, total; then each stage's seconds, then notes
        label="Run info", interactive=False, lines=2, max_lines=6, elem_id=f"{task.name}-info", render=False
    )
    return [slider, *(view_widget(v) for v in task.views), downloads_widget(task.downloads), info]


def downloads_widget(label: str) -> gr.File:
    # outputs: no remove buttons, no upload area (they are also event inputs, which would add them)
    return gr.File(
        label=label, file_count="multiple", interactive=False, elem_classes=[OUTPUT_FILES], render=False
    )


def download_groups(task: Task) -> list[gr.File]:
    """One more download list per ``Task.file_groups``, for the page only: the endpoint returns
    every file in one list (its outputs stay as they were), and the tab moves a group's files out
    of the main list when it changes (``ui.layout.split_downloads``)."""
    return [downloads_widget(g.label) for g in task.file_groups]


def render_results(
    components: list[gr.components.Component], under_info: Callable[[], Any] | None = None
) -> Any:
    """Show a tab's outputs: the before/after view, the run info under it, then what
    ``under_info()`` makes (its value is returned), then the rest."""
    slider, *rest, info = components
    slider.render()
    info.render()
    made = under_info() if under_info is not None else None
    for c in rest:
        c.render()
    return made
