"""Sapiens2 Space: one Gradio app for pose, body parts, normals, pointmaps, matting and features.

UI only: components, events and error messages. Models, inference, rendering and exports live
in the ``sapiens2`` package (``sapiens2.serving`` is the layer this file calls).

    python app.py [--host 0.0.0.0] [--port 7860] [--share] [--device cuda] [--size 0.4b]
                  [--checkpoint pose=/path/to/ckpt.safetensors ...]
"""

# ZeroGPU must patch torch before anything touches CUDA, so `spaces` comes first.
import spaces  # noqa: I001  (import order matters)
import spaces.config

import argparse
import importlib.util
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gradio as gr

from sapiens2 import serving
from sapiens2.errors import (
    CheckpointError,
    InputImageError,
    OptionError,
    Sapiens2Error,
    WeightsUnavailableError,
)
from sapiens2.limits import MAX_FILE_BYTES
from sapiens2.metadata import SEG_CLASS_NAMES
from sapiens2.ui.inputs import photo_input
from sapiens2.zoo import ARCHS, DETECTOR, TASKS, WEIGHTS_LICENSE

log = logging.getLogger("sapiens2.app")

HERE = Path(__file__).resolve().parent
ASSETS = HERE / "assets"
EXAMPLES = [str(p) for p in sorted(ASSETS.glob("*")) if p.suffix.lower() in (".jpg", ".jpeg", ".png")]
ZERO_GPU = bool(spaces.config.Config.zero_gpu)
MAX_FILE_SIZE = f"{MAX_FILE_BYTES // 2**20}mb"  # refused by the server before any decoding
MAX_QUEUE = 32  # waiting requests; more get a "queue is full" error instead of hanging
DELETE_CACHE = (900, 1800)  # every 15 min, delete Gradio's copies of outputs older than 30 min

# GPU functions run in a ZeroGPU worker process: they get the manager by id (it is not picklable).
_MANAGERS: dict[int, serving.ModelManager] = {}

ERROR_TITLES: list[tuple[type[Exception], str]] = [
    (WeightsUnavailableError, "Weights unavailable"),
    (CheckpointError, "Unusable checkpoint"),
    (InputImageError, "Image problem"),
    (OptionError, "Invalid option"),
    (serving.OutOfMemoryError, "Out of GPU memory"),
]


def checked_by_package(component: Any) -> Any:
    """Pass API values through unchanged so ``serving.split_options`` checks them: its message
    names the option and its allowed values, where Gradio's own range check names neither."""
    component.preprocess = lambda payload: payload  # type: ignore[method-assign]
    return component


def _user_error(err: BaseException) -> gr.Error:
    title = next((t for cls, t in ERROR_TITLES if isinstance(err, cls)), "Error")
    return gr.Error(str(err), title=title, print_exception=False)


# ----------------------------------------------------------------------------- GPU functions
# One small function per task: model call only, CPU arrays out. On ZeroGPU each call gets a GPU
# for the estimated duration; elsewhere @spaces.GPU does nothing.


def _pixels(intake: Any) -> int:
    return int(intake.rgb.shape[0] * intake.rgb.shape[1])


def _infer(manager_id: int, task: str, size: str, intake: Any, opts: dict[str, Any]) -> Any:
    try:
        return serving.infer(_MANAGERS[manager_id], task, intake, size, **opts)
    except Sapiens2Error as err:  # a gr.Error keeps its message across the ZeroGPU process boundary
        raise _user_error(err) from None


def _duration(task: str) -> Callable[..., int]:
    return lambda manager_id, size, intake, opts: serving.gpu_seconds(task, size, _pixels(intake), **opts)


@spaces.GPU(duration=_duration("pose"))
def gpu_pose(manager_id: int, size: str, intake: Any, opts: dict[str, Any]) -> Any:
    return _infer(manager_id, "pose", size, intake, opts)


@spaces.GPU(duration=_duration("seg"))
def gpu_seg(manager_id: int, size: str, intake: Any, opts: dict[str, Any]) -> Any:
    return _infer(manager_id, "seg", size, intake, opts)


@spaces.GPU(duration=_duration("normal"))
def gpu_normal(manager_id: int, size: str, intake: Any, opts: dict[str, Any]) -> Any:
    return _infer(manager_id, "normal", size, intake, opts)


@spaces.GPU(duration=_duration("pointmap"))
def gpu_pointmap(manager_id: int, size: str, intake: Any, opts: dict[str, Any]) -> Any:
    return _infer(manager_id, "pointmap", size, intake, opts)


@spaces.GPU(duration=_duration("matting"))
def gpu_matting(manager_id: int, size: str, intake: Any, opts: dict[str, Any]) -> Any:
    return _infer(manager_id, "matting", size, intake, opts)


@spaces.GPU(duration=_duration("pretrain"))
def gpu_features(manager_id: int, size: str, intake: Any, opts: dict[str, Any]) -> Any:
    return _infer(manager_id, "pretrain", size, intake, opts)


@spaces.GPU(duration=lambda manager_id, size, a, b: 2 * serving.gpu_seconds("pretrain", size, _pixels(a)))
def gpu_similarity(manager_id: int, size: str, a: Any, b: Any) -> tuple[Any, Any]:
    return _infer(manager_id, "pretrain", size, a, {}), _infer(manager_id, "pretrain", size, b, {})


def _all_duration(manager_id: int, jobs: list[tuple[str, str, dict[str, Any]]], intake: Any) -> int:
    return min(120, sum(serving.gpu_seconds(t, s, _pixels(intake), **o) for t, s, o in jobs))


@spaces.GPU(duration=_all_duration)
def gpu_all(manager_id: int, jobs: list[tuple[str, str, dict[str, Any]]], intake: Any) -> dict[str, Any]:
    """Every task in one GPU allocation; a task that fails gives its message instead of a result."""
    out: dict[str, Any] = {}
    for task, size, opts in jobs:
        try:
            out[task] = serving.infer(_MANAGERS[manager_id], task, intake, size, **opts)
        except Sapiens2Error as err:
            out[task] = f"{type(err).__name__}: {err}"
    return out


GPU_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "pose": gpu_pose,
    "seg": gpu_seg,
    "normal": gpu_normal,
    "pointmap": gpu_pointmap,
    "matting": gpu_matting,
    "pretrain": gpu_features,
}


# ----------------------------------------------------------------------------- request handling


@contextmanager
def _reported(manager: serving.ModelManager) -> Iterator[None]:
    """Package errors -> gr.Error with their message; anything else -> a short gr.Error (logged).
    Every request ends here, so this is also where its freed memory goes back to the system."""
    try:
        yield
    except gr.Error as err:
        if getattr(err, "title", "") == "Out of GPU memory":
            manager.trim()  # the worker's copy was trimmed; free this process's copy too
        raise
    except Sapiens2Error as err:
        raise _user_error(err) from None
    except Exception as err:
        if serving.is_out_of_memory(err):
            manager.trim()
            raise gr.Error(
                "Out of memory. Try a smaller model size or a smaller photo.", title="Out of GPU memory"
            ) from None
        log.exception("unexpected error")
        raise gr.Error(
            f"Unexpected error ({type(err).__name__}). The server is still running: try again or "
            "another photo.",
            print_exception=False,
        ) from None
    finally:
        serving.release_memory()


def _warn(notices: list[str], prefix: str = "") -> None:
    for notice in notices:
        gr.Warning(f"{prefix}{notice}")


class Runner:
    """Runs one task for the app: read the photo, check options, load, infer, render, export."""

    def __init__(self, manager: serving.ModelManager, folders: serving.RequestFolders) -> None:
        self.manager = manager
        self.folders = folders
        _MANAGERS[id(manager)] = manager

    def __call__(self, task: str, photo: Any, size: str | None, **options: Any) -> serving.Shown:
        m = self.manager
        with _reported(m):
            intake = serving.read_photo(photo)
            size = m.resolve_size(task, size)
            infer_opts, render_opts = serving.split_options(task, options)
            m.prepare(task, size, **infer_opts)  # load in this process, outside the GPU function
            result = GPU_FUNCTIONS[serving.task_name(task)](id(m), size, intake, infer_opts)
            shown = serving.present(result, self.folders.new(), **render_opts)
        _warn(shown.notices)
        return shown

    def similarity(self, photo_a: Any, photo_b: Any, size: str | None) -> tuple[float, str]:
        from sapiens2.tasks.features import cosine_similarity

        m = self.manager
        with _reported(m):
            a = serving.read_photo(photo_a)
            b = serving.read_photo(photo_b)
            size = m.resolve_size("pretrain", size)
            m.prepare("pretrain", size)
            ra, rb = gpu_similarity(id(m), size, a, b)
            score = float(cosine_similarity(ra, rb))
        _warn([*ra.notices, *rb.notices])
        return score, f"{ra.info.line()} | {rb.info.line()}"

    def run_all(
        self, photo: Any, jobs: list[tuple[str, str | None, dict[str, Any]]]
    ) -> tuple[dict[str, Any], str]:
        """Every task on one photo; returns task -> Shown (or an error message) and a status line."""
        m = self.manager
        shown: dict[str, Any] = {}
        ready: list[tuple[str, str, dict[str, Any]]] = []
        renders: dict[str, dict[str, Any]] = {}
        t0 = time.perf_counter()
        with _reported(m):
            intake = serving.read_photo(photo)
            for task, size, options in jobs:
                try:
                    size = m.resolve_size(task, size)
                    infer_opts, renders[task] = serving.split_options(task, options)
                    m.prepare(task, size, **infer_opts)
                    ready.append((task, size, infer_opts))
                except Sapiens2Error as err:
                    shown[task] = str(err)
            results = gpu_all(id(m), ready, intake) if ready else {}
            for task, result in results.items():
                shown[task] = (
                    result
                    if isinstance(result, str)
                    else serving.present(result, self.folders.new(), **renders[task])
                )
        failed = {t: v for t, v in shown.items() if isinstance(v, str)}
        if any(v.startswith(serving.OutOfMemoryError.__name__) for v in failed.values()):
            m.trim()  # the GPU worker trimmed its copy; free this process's copy too
        if failed and len(failed) == len(jobs):
            raise gr.Error(
                "No task could run: " + " | ".join(f"{TASKS[t].title}: {v}" for t, v in failed.items())
            )
        for task, value in shown.items():
            if isinstance(value, str):
                gr.Warning(f"{TASKS[task].title}: {value}", title="Task skipped")
            else:
                _warn(value.notices, f"{TASKS[task].title}: ")
        done = len(jobs) - len(failed)
        status = f"{done} of {len(jobs)} tasks done in {time.perf_counter() - t0:.1f} s."
        if failed:
            status += " Skipped: " + ", ".join(TASKS[t].title for t in failed) + "."
        return shown, status


# ----------------------------------------------------------------------------- UI


def _files(shown: serving.Shown) -> list[str]:
    return [str(p) for p in shown.files]


def _about_markdown() -> str:
    rows = "\n".join(
        f"| {a.size} | {a.params_b:.3f} B | {a.hidden} | {a.layers} | "
        f"{'-' if a.tflops_1024x768 is None else f'{a.tflops_1024x768:.2f} T'} |"
        for a in ARCHS.values()
    )
    tasks = "\n".join(f"- **{t.title}**: sizes {', '.join(t.sizes)}" for t in TASKS.values())
    return f"""
**Sapiens2** (Meta, ICLR 2026) is a family of vision transformers pretrained on 1 billion human
images, with task heads for 308-keypoint pose, 29-class body-part segmentation, surface normals,
pointmaps and matting. Input 1024x768 (HxW), patch 16; the 1b-4k backbone takes 4096x3072.

| backbone | params | width | layers | FLOPs @1024x768 |
|---|---|---|---|---|
{rows}

{tasks}

**Weights licence:** {WEIGHTS_LICENSE}. This Space does not re-host weights: they are downloaded
from the `facebook/sapiens2-*` repositories on the Hugging Face Hub on first use. Person boxes
for pose come from `{DETECTOR.repo_id}` ({DETECTOR.license}).

Links: [paper (arXiv 2604.21681)](https://arxiv.org/abs/2604.21681) ·
[code](https://github.com/facebookresearch/sapiens2) ·
[licence](https://github.com/facebookresearch/sapiens2/blob/main/LICENSE.md) ·
[models](https://huggingface.co/facebook/sapiens2-pose-1b)
"""


def _size_dropdown(manager: serving.ModelManager, task: str) -> gr.Dropdown:
    return gr.Dropdown(
        choices=list(manager.sizes(task)),
        value=manager.default_size(task),
        label="Model size",
        info="Bigger is more accurate and slower.",
        allow_custom_value=True,  # so API callers get the package's message naming the sizes
    )


def _result_widgets(task: str, task_label: str) -> tuple[gr.ImageSlider, gr.Textbox]:
    """The before/after view and the run-info line (made unrendered; see ``_render``)."""
    slider = gr.ImageSlider(
        label=f"{task_label}: before / after",
        type="numpy",
        max_height=520,
        elem_id=f"{task}-result",
        render=False,
    )
    info = gr.Textbox(label="Run info", interactive=False, max_lines=2, elem_id=f"{task}-info", render=False)
    return slider, info


def _downloads(label: str) -> gr.File:
    return gr.File(label=label, file_count="multiple", render=False)


def _render(components: list[gr.components.Component]) -> None:
    """Show a tab's outputs: the before/after view, the run info under it, then the rest."""
    slider, *rest, info = components
    for c in (slider, info, *rest):
        c.render()


def build_demo(
    manager: serving.ModelManager | None = None,
    *,
    concurrency: int | None = None,
    max_queue: int = MAX_QUEUE,
    folders: serving.RequestFolders | None = None,
) -> gr.Blocks:
    """The whole app as a ``gr.Blocks`` (tests drive exactly this object and its handlers)."""
    manager = manager or serving.ModelManager(checkpoints=serving.checkpoints_from_env())
    run = Runner(manager, folders or serving.RequestFolders())
    if concurrency is None:  # ZeroGPU gives each call its own GPU; one CPU/GPU does one at a time
        concurrency = 4 if ZERO_GPU else 1
    seg_classes = list(SEG_CLASS_NAMES)

    def pose(photo, size, threshold, flip_test, show_face, body_only, show_boxes, max_people):
        """Pose: 308 keypoints per person (body, hands, feet, face).

        Args:
            photo: the photo (file).
            size: model size: 0.4b, 0.8b, 1b or 5b.
            threshold: keypoints scoring below this are not drawn (0-1).
            flip_test: also run the mirrored photo and average (slower, a bit more accurate).
            show_face: draw the face points.
            body_only: draw only the body (no hands, feet or face).
            show_boxes: draw the person boxes.
            max_people: at most this many people (1-50).
        """
        s = run("pose", photo, size, threshold=threshold, flip_test=flip_test, show_face=show_face,
                body_only=body_only, show_boxes=show_boxes, max_people=max_people)  # fmt: skip
        return (s.before, s.after), s.data, _files(s), s.line

    def seg(photo, size, opacity, classes):
        """Body parts: one of 29 classes per pixel.

        Args:
            photo: the photo (file).
            size: model size: 0.4b, 0.8b, 1b or 5b.
            opacity: colour opacity over the photo (0-1).
            classes: class names to show (empty: all).
        """
        s = run("seg", photo, size, opacity=opacity, classes=classes or None)
        return (s.before, s.after), s.extra, _files(s), s.line

    def normal(photo, size, remove_background, background):
        """Surface normals: one unit normal per pixel, shown as RGB.

        Args:
            photo: the photo (file).
            size: model size: 0.4b, 0.8b, 1b or 5b.
            remove_background: mask the person with the body-part model.
            background: what shows outside the person: black or photo.
        """
        s = run("normal", photo, size, remove_background=remove_background, background=background)
        return (s.before, s.after), _files(s), s.line

    def pointmap(photo, size, use_segmentation):
        """Pointmap / 3D: metric XYZ per pixel, depth view and a coloured point cloud.

        Args:
            photo: the photo (file).
            size: model size: 0.4b, 0.8b, 1b or 5b.
            use_segmentation: keep only the person (body-part model) in the point cloud.
        """
        s = run("pointmap", photo, size, use_segmentation=use_segmentation)
        return (s.before, s.after), str(s.model3d) if s.model3d else None, _files(s), s.line

    def matting(photo, size, background_color, background_image=None):
        """Matting: alpha matte and cut-out of the person, composited over a background.

        Args:
            photo: the photo (file).
            size: model size: 1b.
            background_color: background colour as '#rrggbb'.
            background_image: optional background photo (file), used instead of the colour.
        """
        s = run("matting", photo, size, background_color=background_color, background_image=background_image)
        return (s.before, s.after), _files(s), s.line

    def features(photo, size):
        """Features: the backbone's image embedding and a PCA view of its patch features.

        Args:
            photo: the photo (file).
            size: backbone size: 0.1b, 0.4b, 0.8b, 1b, 1b-4k or 5b.
        """
        s = run("pretrain", photo, size)
        return (s.before, s.after), s.data, _files(s), s.line

    def similarity(photo, other_photo, size):
        """Similarity of two photos: cosine of their backbone embeddings (-1 to 1).

        Args:
            photo: the first photo (file).
            other_photo: the second photo (file).
            size: backbone size: 0.1b, 0.4b, 0.8b, 1b, 1b-4k or 5b.
        """
        return run.similarity(photo, other_photo, size)

    handlers = {"pose": pose, "seg": seg, "normal": normal, "pointmap": pointmap, "matting": matting,
                "pretrain": features}  # fmt: skip

    with gr.Blocks(
        title="Sapiens2: human pose, parts, normals, 3D, matting", delete_cache=DELETE_CACHE
    ) as demo:
        gr.Markdown(
            "# Sapiens2: human vision in one place\n"
            "Load a photo once, then run any tab on it (or **All tasks**). Every result has a "
            "before/after view, downloads, and an API (see *Use via API* at the bottom)."
        )
        with gr.Row():
            with gr.Column(scale=3):
                photo = photo_input(
                    label="Photo (upload, webcam or paste)",
                    sources=["upload", "webcam", "clipboard"],
                    height=340,
                )
            with gr.Column(scale=2):
                all_btn = gr.Button("Run all tasks", variant="secondary")
                all_status = gr.Textbox(label="All tasks", interactive=False, max_lines=2)
                gr.Markdown(
                    f"Photos up to {MAX_FILE_SIZE}; sides above 4096 px are downscaled for inference "
                    "and results mapped back. Weights download from the Hub on first use."
                )

        outputs: dict[str, list[gr.components.Component]] = {}
        controls: dict[str, list[gr.components.Component]] = {}
        buttons: dict[str, gr.Button] = {}
        with gr.Tabs():
            # Each tab: options, run button and examples on the left; results on the right
            # (outputs are made first, unrendered, because the examples need them).
            with gr.Tab("Pose", id="pose"):
                p_slider, p_info = _result_widgets("pose", "Pose")
                p_json = gr.JSON(label="Keypoints (308 named points per person)", height=260, render=False)
                p_files = _downloads("Downloads (308-point JSON, COCO-17, OpenPose BODY_25, PNG)")
                outputs["pose"] = [p_slider, p_json, p_files, p_info]
                with gr.Row():
                    with gr.Column(scale=1):
                        p_size = _size_dropdown(manager, "pose")
                        p_thr = checked_by_package(
                            gr.Slider(0, 1, value=0.3, step=0.05, label="Keypoint threshold")
                        )
                        p_flip = gr.Checkbox(False, label="Flip test (slower, a bit more accurate)")
                        p_face = gr.Checkbox(True, label="Face points")
                        p_body = gr.Checkbox(False, label="Body only (no hands, feet, face)")
                        p_boxes = gr.Checkbox(True, label="Person boxes")
                        p_max = checked_by_package(gr.Slider(1, 50, value=20, step=1, label="Max people"))
                        buttons["pose"] = gr.Button("Run pose", variant="primary")
                        controls["pose"] = [p_size, p_thr, p_flip, p_face, p_body, p_boxes, p_max]
                        _examples(photo, "pose", handlers["pose"], controls["pose"], outputs["pose"])
                    with gr.Column(scale=2):
                        _render(outputs["pose"])

            with gr.Tab("Body parts", id="seg"):
                s_slider, s_info = _result_widgets("seg", "Body parts")
                s_legend = gr.Image(label="Classes found", type="numpy", height=240, render=False)
                s_files = _downloads("Downloads (class ids PNG/NPY, colour PNG, blend PNG)")
                outputs["seg"] = [s_slider, s_legend, s_files, s_info]
                with gr.Row():
                    with gr.Column(scale=1):
                        s_size = _size_dropdown(manager, "seg")
                        s_opacity = checked_by_package(
                            gr.Slider(0, 1, value=0.5, step=0.05, label="Colour opacity")
                        )
                        s_classes = gr.Dropdown(
                            seg_classes,
                            value=[],
                            multiselect=True,
                            allow_custom_value=True,  # "left hand" works too; unknown names get a clear error
                            label="Show only (empty: all)",
                        )
                        buttons["seg"] = gr.Button("Run body parts", variant="primary")
                        controls["seg"] = [s_size, s_opacity, s_classes]
                        _examples(photo, "seg", handlers["seg"], controls["seg"], outputs["seg"])
                    with gr.Column(scale=2):
                        _render(outputs["seg"])

            with gr.Tab("Normals", id="normal"):
                n_slider, n_info = _result_widgets("normal", "Normals")
                n_files = _downloads("Downloads (normals NPY float16, PNG, mask PNG)")
                outputs["normal"] = [n_slider, n_files, n_info]
                with gr.Row():
                    with gr.Column(scale=1):
                        n_size = _size_dropdown(manager, "normal")
                        n_remove = gr.Checkbox(False, label="Remove background (runs body parts too)")
                        n_bg = checked_by_package(
                            gr.Radio(["black", "photo"], value="black", label="Background")
                        )
                        buttons["normal"] = gr.Button("Run normals", variant="primary")
                        controls["normal"] = [n_size, n_remove, n_bg]
                        _examples(photo, "normal", handlers["normal"], controls["normal"], outputs["normal"])
                    with gr.Column(scale=2):
                        _render(outputs["normal"])

            with gr.Tab("Pointmap / 3D", id="pointmap"):
                m_slider, m_info = _result_widgets("pointmap", "Depth")
                m_3d = gr.Model3D(
                    label="Point cloud (GLB)", display_mode="point_cloud", height=360, render=False
                )
                m_files = _downloads("Downloads (PLY, GLB, depth and XYZ NPY, depth PNG)")
                outputs["pointmap"] = [m_slider, m_3d, m_files, m_info]
                with gr.Row():
                    with gr.Column(scale=1):
                        m_size = _size_dropdown(manager, "pointmap")
                        m_seg = gr.Checkbox(True, label="Person only (runs body parts too)")
                        buttons["pointmap"] = gr.Button("Run pointmap", variant="primary")
                        controls["pointmap"] = [m_size, m_seg]
                        _examples(
                            photo, "pointmap", handlers["pointmap"], controls["pointmap"], outputs["pointmap"]
                        )
                    with gr.Column(scale=2):
                        _render(outputs["pointmap"])

            with gr.Tab("Matting", id="matting"):
                t_slider, t_info = _result_widgets("matting", "Matting")
                t_files = _downloads("Downloads (RGBA cut-out, alpha, composite)")
                outputs["matting"] = [t_slider, t_files, t_info]
                with gr.Row():
                    with gr.Column(scale=1):
                        t_size = _size_dropdown(manager, "matting")
                        t_color = gr.ColorPicker("#00b140", label="Background colour")
                        t_image = photo_input(
                            label="Background image (optional)", sources=["upload", "clipboard"], height=160
                        )
                        buttons["matting"] = gr.Button("Run matting", variant="primary")
                        controls["matting"] = [t_size, t_color, t_image]
                        _examples(
                            photo, "matting", handlers["matting"], controls["matting"], outputs["matting"]
                        )
                    with gr.Column(scale=2):
                        _render(outputs["matting"])

            with gr.Tab("Features", id="features"):
                f_slider, f_info = _result_widgets("pretrain", "Features (PCA)")
                f_json = gr.JSON(label="Summary", height=160, render=False)
                f_files = _downloads("Downloads (embedding NPY, PCA PNG)")
                outputs["pretrain"] = [f_slider, f_json, f_files, f_info]
                with gr.Row():
                    with gr.Column(scale=1):
                        f_size = _size_dropdown(manager, "pretrain")
                        buttons["pretrain"] = gr.Button("Run features", variant="primary")
                        controls["pretrain"] = [f_size]
                        f_other = photo_input(
                            label="Second photo (for similarity)",
                            sources=["upload", "webcam", "clipboard"],
                            height=180,
                        )
                        f_sim_btn = gr.Button("Compare the two photos")
                        f_score = gr.Number(label="Cosine similarity of the embeddings", precision=4)
                        f_sim_info = gr.Textbox(label="Similarity run info", interactive=False, max_lines=2)
                        _examples(
                            photo, "pretrain", handlers["pretrain"], controls["pretrain"], outputs["pretrain"]
                        )
                    with gr.Column(scale=2):
                        _render(outputs["pretrain"])

        api_names = {"pretrain": "features"}
        for task, handler in handlers.items():
            buttons[task].click(
                handler,
                inputs=[photo, *controls[task]],
                outputs=outputs[task],
                api_name=api_names.get(task, task),
                concurrency_id="models",
            )
        f_sim_btn.click(
            similarity, inputs=[photo, f_other, f_size], outputs=[f_score, f_sim_info],
            api_name="similarity", concurrency_id="models",
        )  # fmt: skip

        all_outputs = [c for task in handlers for c in outputs[task]]
        all_inputs = [photo, *(c for task in handlers for c in controls[task])]

        def all_tasks(
            photo,
            pose_size=None, threshold=None, flip_test=None, show_face=None, body_only=None,
            show_boxes=None, max_people=None,
            seg_size=None, opacity=None, classes=None,
            normal_size=None, remove_background=None, background=None,
            pointmap_size=None, use_segmentation=None,
            matting_size=None, background_color=None, background_image=None,
            features_size=None,
        ):  # fmt: skip
            """All tasks on one photo; options as in each task's endpoint (None: the default).
            A task that cannot run (e.g. its weights are missing) is skipped and named in the status.

            Args:
                photo: the photo (file).
                pose_size: pose model size.
                threshold: pose keypoint threshold (0-1).
                flip_test: pose flip test.
                show_face: draw face points.
                body_only: draw only the body.
                show_boxes: draw person boxes.
                max_people: at most this many people.
                seg_size: body-part model size.
                opacity: body-part colour opacity (0-1).
                classes: body-part classes to show (empty: all).
                normal_size: normal model size.
                remove_background: mask the person in the normals.
                background: normals background: black or photo.
                pointmap_size: pointmap model size.
                use_segmentation: person-only point cloud.
                matting_size: matting model size (1b).
                background_color: matting background colour '#rrggbb'.
                background_image: optional matting background photo (file).
                features_size: backbone size for features.
            """
            jobs = [
                ("pose", pose_size, {"threshold": threshold, "flip_test": flip_test, "show_face": show_face,
                                     "body_only": body_only, "show_boxes": show_boxes, "max_people": max_people}),
                ("seg", seg_size, {"opacity": opacity, "classes": classes or None}),
                ("normal", normal_size, {"remove_background": remove_background, "background": background}),
                ("pointmap", pointmap_size, {"use_segmentation": use_segmentation}),
                ("matting", matting_size, {"background_color": background_color,
                                           "background_image": background_image}),
                ("pretrain", features_size, {}),
            ]  # fmt: skip
            shown, status = run.run_all(photo, jobs)
            out: list[Any] = []
            for task in handlers:
                value = shown.get(task)
                out.extend(
                    _tab_values(task, value)
                    if isinstance(value, serving.Shown)
                    else [None] * len(outputs[task])
                )
            return [*out, status]

        all_btn.click(all_tasks, inputs=all_inputs, outputs=[*all_outputs, all_status], api_name="all",
                      concurrency_id="models")  # fmt: skip

        with gr.Accordion("About Sapiens2, licence and links", open=False):
            gr.Markdown(_about_markdown())

    demo.queue(max_size=max_queue, default_concurrency_limit=concurrency)
    return demo


def _examples(
    photo: gr.Image,
    task: str,
    handler: Callable[..., Any],
    controls: list[gr.components.Component],
    outputs: list[gr.components.Component],
) -> gr.Examples:
    """The example photos for one tab, run with the tab's default options and cached on first use."""
    defaults = [c.value for c in controls]

    def run_example(photo: Any) -> Any:
        return handler(photo, *defaults)

    return gr.Examples(
        examples=[[p] for p in EXAMPLES],
        inputs=[photo],
        outputs=outputs,
        fn=run_example,
        cache_examples=True,
        cache_mode="lazy",
        examples_per_page=8,
        label=f"Examples: click one to run {TASKS[task].title.split(' (')[0].lower()} on it",
        api_name=False,
        elem_id=f"{task}-examples",
    )


def _tab_values(task: str, s: serving.Shown) -> list[Any]:
    """The values of a tab's outputs for a result (same order as the tab's handler returns)."""
    pair = (s.before, s.after)
    if task == "pose":
        return [pair, s.data, _files(s), s.line]
    if task == "seg":
        return [pair, s.extra, _files(s), s.line]
    if task == "pointmap":
        return [pair, str(s.model3d) if s.model3d else None, _files(s), s.line]
    if task == "pretrain":
        return [pair, s.data, _files(s), s.line]
    return [pair, _files(s), s.line]


# ----------------------------------------------------------------------------- CLI


def _mcp_available() -> bool:
    """MCP tools only when the extra is installed (gradio[mcp]); never an import error."""
    try:
        return (
            importlib.util.find_spec("mcp") is not None and importlib.util.find_spec("gradio.mcp") is not None
        )
    except (ImportError, ValueError):
        return False


def _dtype(name: str | None) -> Any:
    if name in (None, "auto"):
        return None
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Sapiens2 Space: pose, body parts, normals, 3D, matting, features."
    )
    ap.add_argument("--host", default=None, help="address to bind (default 127.0.0.1; 0.0.0.0 for a LAN)")
    ap.add_argument("--port", type=int, default=None, help="port (default 7860 or the next free one)")
    ap.add_argument("--share", action="store_true", help="also open a public gradio.live link")
    ap.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    ap.add_argument("--size", default=None, help="default model size for every task that offers it")
    ap.add_argument(
        "--checkpoint", action="append", default=[], metavar="TASK=PATH",
        help=f"use this checkpoint file/folder for TASK whatever size is chosen (repeatable; also ${serving.CHECKPOINTS_ENV})",
    )  # fmt: skip
    ap.add_argument("--max-models", type=int, default=None, help="models kept loaded besides preloaded ones")
    ap.add_argument("--preload", action="store_true", help="load each task's default size before serving")
    ap.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile each model when it loads (local CUDA GPU only; costs start-up time)",
    )
    ap.add_argument("--concurrency", type=int, default=None, help="requests running models at once")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per Gradio-internal request
    try:
        checkpoints = {**serving.checkpoints_from_env(), **serving.parse_checkpoint_specs(args.checkpoint)}
        if args.size:
            sizes = {s for t in TASKS.values() for s in t.sizes}
            if args.size not in sizes:
                raise OptionError(
                    f"--size {args.size!r} is not a model size; choose one of: {', '.join(sorted(sizes))}."
                )
    except OptionError as err:
        raise SystemExit(f"error: {err}") from None
    max_models = args.max_models or (2 if ZERO_GPU else serving.DEFAULT_MAX_MODELS)
    manager = serving.ModelManager(
        device=args.device,
        dtype=_dtype(args.dtype),
        checkpoints=checkpoints,
        max_models=max_models,
        size=args.size,
        compile=args.compile,
    )
    if ZERO_GPU or args.preload:
        # ZeroGPU packs tensors placed on "cuda" before launch and maps them into every GPU
        # worker: the default size of each task stays warm; other sizes load on demand.
        manager.preload()  # failures are logged; those tasks report the error per request
    demo = build_demo(manager, concurrency=args.concurrency)
    launch(demo, host=args.host, port=args.port, share=args.share)


def launch(
    demo: gr.Blocks, *, host: str | None = None, port: int | None = None, share: bool = False, **extra: Any
):
    """Start the server the way the Space does (tests call this too, with ``prevent_thread_lock``)."""
    return demo.launch(
        server_name=host or os.environ.get("GRADIO_SERVER_NAME"),
        server_port=port,
        share=share,
        max_file_size=MAX_FILE_SIZE,
        allowed_paths=[str(ASSETS)],
        mcp_server=_mcp_available(),
        **extra,
    )


if __name__ == "__main__":
    main()
