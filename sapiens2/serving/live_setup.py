"""What a live viewer chose (:class:`LiveOptions`), checked into what a frame needs (:class:`LiveSetup`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import OptionError, Sapiens2Error
from ..models.zoo import SAPIENS2_RULES, V1_RULES, Rules
from ..tasks.pointmap.frame_depth_colours import DepthScale
from ..tasks.pose.pose_tracking import PoseTracking, TrackingOptions
from ..tasks.registry import Task
from .cache import ModelManager

#: The model size a live view starts with where the task offers it (else the task's default).
LIVE_SIZE = "0.4b"
#: The network inputs offered: key -> (H, W), None = the checkpoint's own (the release's
#: 1024x768). The others run faster but are not what the weights were trained on.
INPUTS: dict[str, tuple[int, int] | None] = {"release": None, "768x576": (768, 576), "512x384": (512, 384)}
#: Frames with a longer side are downscaled first (INTER_AREA): a webcam's 1080p gains nothing.
MAX_SIDE = 1280
#: A frame arriving this long after the previous one was rendered starts the stream afresh (tracks,
#: colour scale, figures): the camera was stopped and started again.
RESTART_AFTER_S = 3.0


def input_label(key: str) -> str:
    """How the knob names an input: the release's, or faster and not the release's."""
    hw = INPUTS.get(key)
    if hw is None:
        return "1024x768 (the release's input)"
    return f"{hw[0]}x{hw[1]} (faster; not the release's input)"


@dataclass(frozen=True)
class LiveOptions:
    """What a viewer chose. ``task``: a task that declares ``video`` (looked up by the caller);
    ``size``: None = :data:`LIVE_SIZE` where offered; ``input``: a key of :data:`INPUTS`;
    ``task_options``: the task's own options (e.g. matting's ``background_color`` or
    ``background_image``, pointmap's ``use_segmentation``), checked against its declaration;
    names the task does not declare are left out (one viewer's knobs serve every task);
    ``tracking``: pose over time."""

    task: Task
    size: str | None = None
    input: str = "release"
    flip_test: bool = False
    task_options: Mapping[str, Any] = field(default_factory=dict)
    tracking: TrackingOptions = TrackingOptions()


@dataclass
class LiveSetup:
    """What a choice of options resolves to (kept until the options change)."""

    key: tuple[Any, ...]
    decl: Task
    size: str
    size_label: str
    hw: tuple[int, int] | None
    input_note: str
    infer_opts: dict[str, Any]
    render_opts: dict[str, Any]  # every rendering option, defaults filled in
    given: dict[str, Any]  # the rendering options the viewer gave
    mark: str = ""  # "Sapiens v1 · 1b · CC-BY-NC-4.0" beside the model's name ("" for Sapiens2)
    keypoints: str = ""  # a pose model's keypoint set other than the 308 one, once it has run ("COCO-17")
    seconds: int = 0  # what a frame's call reserves (models/cost.py); 0: not priced yet
    detect_seconds: int = 0  # what a detection call reserves
    people: PoseTracking | None = None
    scale: DepthScale | None = None


def model_label(setup: LiveSetup) -> str:
    """How the readout and the tab name the model: "Pose v1-1b · Sapiens v1 · 1b · CC-BY-NC-4.0",
    and a v1 pose model's keypoint set once known ("... · COCO-17 keypoints")."""
    marks = [m for m in (setup.mark, setup.keypoints and f"{setup.keypoints} keypoints") if m]
    return " · ".join([f"{setup.decl.tab} {setup.size_label}", *marks])


def live_size(manager: ModelManager, task: Task, size: str | None = None) -> str:
    """The model size a live view of ``task`` runs: ``size`` when given (checked; OptionError
    names the sizes), else :data:`LIVE_SIZE` where the task offers it, else the task's default."""
    if not size:
        size = LIVE_SIZE if LIVE_SIZE in manager.sizes(task) else None
    return manager.resolve_size(task, size)


def model_rules(manager: ModelManager, task: Task, size: str) -> Rules:
    """The rules of the model a live view of ``task`` runs, known before it loads: those of the
    operator's checkpoint (a Sapiens v1 graph or not, from its bytes), else of the zoo size."""
    if task.name not in manager.checkpoints:
        return task.spec.rules(size)
    from ..models.v1_files import is_graph_checkpoint

    try:
        return V1_RULES if is_graph_checkpoint(manager.checkpoints[task.name]) else SAPIENS2_RULES
    except Sapiens2Error:  # an unreadable file: its load reports what is wrong
        return SAPIENS2_RULES


def live_setup(manager: ModelManager, options: LiveOptions) -> LiveSetup:
    """Check ``options`` (OptionError naming the bad one) into what a frame needs, not yet priced
    (:meth:`LiveSession.step` prices it once its models are loaded)."""
    decl = options.task
    if not isinstance(decl, Task) or decl.video is None:
        names = ", ".join(t.name for t in manager.video_tasks().values())
        raise OptionError(f"Live runs the tasks {names}; got {getattr(decl, 'name', decl)!r}.")
    if options.input not in INPUTS:
        raise OptionError(f"The live input must be one of {', '.join(INPUTS)}; got {options.input!r}.")
    if not isinstance(options.flip_test, bool):
        raise OptionError(f"flip_test must be true or false; got {options.flip_test!r}.")
    size = live_size(manager, decl, options.size)
    declared = {o.name for o in decl.options}
    values = {k: v for k, v in options.task_options.items() if v is not None and k in declared}
    if "flip_test" in declared:
        values["flip_test"] = options.flip_test
    infer_opts, render_opts = decl.split(values, gpu=manager.cuda)
    hw, note = INPUTS[options.input], input_label(options.input)
    rules = model_rules(manager, decl, size)
    if hw is not None and getattr(decl.pipeline, "fixed_input", False):
        hw, note = None, f"1024x768 ({decl.tab} runs only at the release's input)"
    elif hw is not None and rules.fixed_input:
        hw, note = None, f"1024x768 (a {rules.generation} model runs only at the input it was exported at)"
    key = (decl, size, hw, infer_opts.get("flip_test"), options.tracking)
    given = {k: render_opts[k] for k in values if k in render_opts}
    label = manager.key(decl, size)[1]
    return LiveSetup(key, decl, size, label, hw, note, infer_opts, render_opts, given, rules.mark(size))
