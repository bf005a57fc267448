""" "Find similar" in the Features tab: a visitor's set of photos (several files or one zip) and
the tab's photo as the query; a gallery of the set's people most like the query, by appearance
or by pose, with scores and each person's box; "Group" puts the set's people in k-means groups,
one gallery row each. Endpoints ``/find_similar`` and ``/group_set`` (API and MCP tools).

The set's vectors live in the session's ``gr.State`` (one GPU call per set, whatever is asked
of it after) and its pictures in a request folder; both go when the session ends (the state's
delete callback) or the folders' age limit passes, whichever comes first.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import gradio as gr

from ..errors import InputImageError, OptionError
from ..search.indexing import TASK_OF
from ..serving.photo_set import MAX_SET_PHOTOS, read_set
from ..serving.similar import (
    SET_OPTIONS,
    PeopleSet,
    group_count,
    grouped,
    most_similar,
    photos_that_fit,
    run_set,
)
from ..tasks import registry
from ..tasks.registry import Task
from .endpoints import api_docstring, as_endpoint, split_call
from .error_board import BOARD, reported, shown_error
from .inputs import photo_set_input, refuse
from .mcp_files import photo_doc
from .page_runner import Runner

KINDS = tuple(TASK_OF)
#: How long an idle session's set is kept (seconds) before Gradio drops it (and its pictures).
SET_TTL_S = 3600


def fit_text(run: Runner, size: str | None) -> str:
    """What a visitor may add, said before anything runs."""
    fits = {}
    for kind in KINDS:
        task = registry.get(TASK_OF[kind])
        fits[kind] = photos_that_fit(
            run.requests, task, size if kind == "appearance" else None, SET_OPTIONS[kind]
        )
    return (
        f"Add up to {fits['appearance']} photos to find similar by appearance, up to {fits['pose']} by pose "
        f"(what one GPU call of a visitor's quota holds; at most {MAX_SET_PHOTOS}), as files or one .zip. "
        "The photo above is the query. Your set is kept for this session only."
    )


def _listed(files: Any) -> list[Any]:
    """The set's values as a list (a refused set arrives as its one Refused value)."""
    return [] if files is None else list(files) if isinstance(files, (list, tuple)) else [files]


def _key(files: list[Any] | None, kind: str, size: str | None) -> tuple[Any, ...]:
    names = []
    for item in files or []:
        path = Path(str(getattr(item, "name", None) or item))
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
        names.append((path.name, digest))
    return (tuple(names), kind, size)


def _people_set(run: Runner, held: PeopleSet | None, photo: Any, files: Any, by: Any, size: Any) -> PeopleSet:
    """The session's set for (files, kind, size): the one held when it matches, else run anew."""
    kind = by or "appearance"
    if kind not in KINDS:
        raise OptionError(f"by must be one of: {', '.join(KINDS)}; got {by!r}.")
    task = registry.get(TASK_OF[kind])
    size = size if kind == "appearance" else None  # the tab's sizes are the backbone's
    key = _key(files, kind, size)
    if held is not None and held.key == key and (photo is None or held.query_photo == _photo_key(photo)):
        return held
    limit = photos_that_fit(run.requests, task, size, SET_OPTIONS[kind])
    photos = read_set(files, limit)
    if photo is None:
        raise InputImageError("No query photo: add one above (upload, webcam or paste).")
    made = run_set(run.requests, task, kind, photo, photos, size, key)
    made.query_photo = _photo_key(photo)
    made.folder = run.requests.folders.new()
    if held is not None and held is not made:
        held.close()
    return made


def _photo_key(photo: Any) -> str:
    path = Path(str(photo)) if isinstance(photo, (str, Path)) else None
    if path is not None and path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    return repr(type(photo))


def _set_endpoint(
    run: Runner,
    name: str,
    label: str,
    extra: list[str],
    act: Any,
    summary: str,
    params: list[tuple[str, str]],
) -> Any:
    """An endpoint over the session's set: ``f(photo, photos, by, size, *extra)`` -> (gallery, run
    info), the set as state; ``act(people, *extra values)`` makes the gallery and the line."""

    def endpoint(*args: Any) -> tuple[Any, str, PeopleSet | None]:
        [photo, files, by, size, *more, held], _, request = split_call(args, 5 + len(extra))
        with BOARD.catching(request, name, label), reported(run.manager):
            refuse(photo, *_listed(files))
            people = _people_set(run, held, photo, files, by, size)
            gallery, info = act(people, *more)
            return gallery, info, people

    names = ["photo", "photos", "by", "size", *extra, "state"]
    return as_endpoint(endpoint, name, names, api_docstring(summary, params), required=2)


def _set_params(task: Task, query: str, by: str, size: str) -> list[tuple[str, str]]:
    return [
        ("photo", photo_doc(query)),
        ("photos", f"the set: up to {MAX_SET_PHOTOS} photo files, or .zip files of photos."),
        ("by", by),
        ("size", f"backbone size for appearance: {', '.join(task.spec.sizes)}{size}."),
    ]


def similar_endpoint(run: Runner, task: Task) -> Any:
    """``f(photo, photos, by, size)`` -> (gallery, run info); the session's set as state."""

    def act(people: PeopleSet) -> tuple[Any, str]:
        shown = most_similar(people, people.folder)
        info = f"{len(shown)} most similar of {len(people.people)} people in {len(people.names)} photos, by {people.kind}."
        return gr.Gallery(value=shown, columns=4, label="Most similar"), info

    by = "appearance (each person's part of the backbone's features) or pose (the 308 keypoints)."
    return _set_endpoint(
        run, "find_similar", "Find similar", [], act,
        "Find the people of a set of photos most like the person in a query photo, by appearance or pose.",
        _set_params(task, "the query photo", by, " (pose uses its default)"),
    )  # fmt: skip


def group_endpoint(run: Runner, task: Task) -> Any:
    """``f(photo, photos, by, size, groups)`` -> (gallery: one row per group, run info)."""

    def act(people: PeopleSet, groups: Any) -> tuple[Any, str]:
        if groups is not None and (not isinstance(groups, (int, float)) or not 1 <= int(groups) <= 8):
            raise OptionError(f"groups must be 1 to 8; got {groups!r}.")
        count = group_count(len(people.people)) if groups is None else int(groups)
        shown = grouped(people, people.folder, count)
        info = f"{len(people.people)} people by {people.kind} in {len(shown)} groups."
        return gr.Gallery(value=shown, columns=1, label="Groups: one row each"), info

    params = _set_params(task, "the query photo (the set's run includes it)", "appearance or pose.", "")
    params.append(("groups", "how many groups, 1 to 8 (None: about the square root of half the people)."))
    return _set_endpoint(
        run, "group_set", "Group", ["groups"], act,
        "Group the people of a set of photos by appearance or pose (k-means): one gallery row per group.", params,
    )  # fmt: skip


def similar_block(run: Runner, task: Task, photo: gr.Image, size: gr.Dropdown, concurrency: str) -> None:
    """The "Find similar" fold of the tab of ``task`` (the one whose ``compare`` scores embeddings)."""
    with gr.Accordion("Find similar", open=False, elem_id="find-similar"):
        gr.Markdown(fit_text(run, size.value), elem_id="find-similar-fit")
        files = photo_set_input(label="Your set: photos or a .zip", elem_id="find-similar-set")
        by = gr.Radio(list(KINDS), value="appearance", label="Similar by", elem_id="find-similar-by")
        groups = gr.Number(
            3, precision=0, minimum=1, maximum=8, label="Groups (for Group)", elem_id="find-similar-groups"
        )
        with gr.Row():
            find = gr.Button("Find similar", variant="secondary", elem_id="find-similar-button")
            group = gr.Button("Group", variant="secondary", elem_id="group-set-button")
        gallery = gr.Gallery(label="Most similar", columns=4, height="auto", elem_id="find-similar-gallery")
        info = gr.Textbox(
            label="Find similar: run info", interactive=False, max_lines=3, elem_id="find-similar-info"
        )
        held = gr.State(None, time_to_live=SET_TTL_S, delete_callback=lambda s: s.close() if s else None)
    for button, endpoint, name, extra in (
        (find, similar_endpoint(run, task), "find_similar", []),
        (group, group_endpoint(run, task), "group_set", [groups]),
    ):
        button.click(endpoint, inputs=[photo, files, by, size, *extra, held], outputs=[gallery, info, held],
                     api_name=name, concurrency_id=concurrency).failure(
            shown_error(name, False), None, [info], api_visibility="private", queue=False)  # fmt: skip
