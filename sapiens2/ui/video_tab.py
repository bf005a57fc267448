"""The Video tab and its endpoints: ``/video`` (run a clip) and ``/video_plan`` (check a clip and
estimate the run before starting it). Requests go through ``sapiens2.serving.video``; the GPU
work through the app's one GPU entry (``sapiens2.ui.gpu``), one call per clip.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gradio as gr

from ..errors import OptionError
from ..inputs.limits import MAX_FILE_BYTES
from ..serving.present import CLIP_PARTS, clip_info, running
from ..serving.video import VideoRequests
from ..tasks.pose.pose_tracking import TrackingOptions
from ..tasks.registry import Task
from ..video.reader import VideoLimits
from .error_board import BOARD, reported, shown_error, warn
from .gpu import gpu_device
from .inputs import clip_input, refuse
from .motion_mode import add_motion_mode
from .page_runner import Runner
from .widgets import OUTPUT_FILES, checked_by_package, size_dropdown, whole_number

#: What one clip may cost in this app (uploads are capped at MAX_FILE_BYTES by Gradio too).
APP_VIDEO_LIMITS = VideoLimits(max_bytes=MAX_FILE_BYTES, max_seconds=60.0, max_frames=150)
STRIDE_MAX = 10
DETECT_EVERY_MAX = 30


def limits_markdown(limits: VideoLimits) -> str:
    side = limits.max_side
    return (
        f"**Limits:** clips up to {limits.max_bytes / 2**20:.0f} MB and {limits.max_seconds:g} s, "
        f"at most {limits.max_frames} processed frames (after the stride: a longer clip fits with a "
        f"larger stride), frames up to {limits.max_pixels / 1e6:.1f} MP; frames above {side} px on "
        "the long side are downscaled. Beyond a limit the run stops with an error saying which. "
        "The output is a silent WebM (VP8) at the clip's frame rate divided by the stride."
    )


def _task_name(task: Any, tasks: Mapping[str, Task]) -> str:
    """A video task (one of ``tasks``, the server's video tasks) by its name or tab label."""
    for decl in tasks.values():
        if task in (decl.name, decl.tab):
            return decl.name
    names = ", ".join(tasks)
    raise OptionError(f"Video runs the tasks {names}; got {task!r}.")


def default_task(tasks: Mapping[str, Task]) -> str:
    """The name of the tab's first video task (the first in tab order)."""
    if not tasks:
        raise OptionError("No task declares video.")
    return next(iter(tasks))


def task_choices(tasks: Mapping[str, Task]) -> list[tuple[str, str]]:
    """The tab's task radio: (tab label, name) of every video task the server shows."""
    return [(t.tab, t.name) for t in tasks.values()]


def _task_list(tasks: Mapping[str, Task]) -> str:
    return ", ".join(tasks)


def _tracking_tasks(tasks: Mapping[str, Task]) -> str:
    names = [t.name for t in tasks.values() if t.video and t.video.detect]
    return " and ".join(names) or "tasks that detect people"


class VideoEndpoints:
    """The tab's two endpoint functions over one :class:`VideoRequests`."""

    def __init__(self, run: Runner, limits: VideoLimits = APP_VIDEO_LIMITS) -> None:
        self.manager = run.manager
        self.tasks = run.manager.video_tasks()  # the video tasks this server shows
        self.requests = VideoRequests(
            run.manager, run.requests.folders, gpu_device(run.manager), limits, announce=gr.Info
        )

    def size_label(self, job: Any) -> str:
        """The model's size as the photo tabs label it ("custom" for a --checkpoint model)."""
        return self.manager.key(job.task, job.size)[1]

    def job(self, clip: Any, task: Any, size: Any, stride: Any, max_frames: Any, **tracking: Any) -> Any:
        return self.requests.job(
            self.tasks[_task_name(task, self.tasks)],
            clip,
            size,
            stride=whole_number(stride, "stride", 1),
            max_frames=whole_number(max_frames, "max_frames", self.requests.limits.max_frames),
            tracking=TrackingOptions(**tracking),
        )

    def plan(self, clip: Any, task: Any, size: Any, stride: Any, max_frames: Any) -> str:
        if clip is None:
            return "Upload a clip to see its frame count and the time the run will take."
        refuse(clip)  # an error, as the run's: an API caller sees the refusal as such
        try:
            with reported(self.manager):
                job = self.job(clip, task, size, stride, max_frames)
        except gr.Error as err:
            return f"Cannot run this clip: {err.message}"
        info, plan = job.plan.info, job.plan
        estimate = self.requests.estimate(job)
        return (
            f"{info.width}x{info.height} at {info.fps:.3g} fps, {info.duration_s:.1f} s; "
            f"every {plan.stride} frame(s), output at {plan.fps_out:.3g} fps. "
            f"{job.task.tab} {self.size_label(job)}: {estimate.line(self.manager.cuda)}"
        )

    def run(
        self,
        clip: Any,
        task: Any,
        size: Any,
        stride: Any,
        max_frames: Any,
        detect_every: Any,
        smoothing: Any,
        progress: Callable[..., Any],
    ) -> list[Any]:
        refuse(clip)
        if not isinstance(smoothing, bool) and smoothing is not None:
            raise gr.Error(f"smoothing must be true or false, got {smoothing!r}.", title="Invalid option")

        def report(done: int, planned: int | None) -> None:
            progress((done, planned or done), desc="Frames", unit="frames")

        with reported(self.manager):
            job = self.job(
                clip, task, size, stride, max_frames,
                detect_every=whole_number(detect_every, "detect_every", 5), smoothing=smoothing is not False,
            )  # fmt: skip
            result = self.requests.run(job, report)
        warn(result.notices)
        what = running(job.task.tab, self.size_label(job), self.manager.device)
        line = clip_info(
            f"{what}, {result.frames} frames at {result.fps:.3g} fps",
            result.timing,
            result.notices,
            CLIP_PARTS,
        )
        return [
            str(result.source_video),
            str(result.video),
            [str(p) for p in result.files],
            result.summary(),
            line,
        ]


def video_endpoint(ends: VideoEndpoints) -> Callable[..., list[Any]]:
    first = default_task(ends.tasks)

    def video(
        clip: Any,
        task: str = first,
        size: str | None = None,
        stride: int = 1,
        max_frames: int | None = None,
        detect_every: int = 5,
        smoothing: bool = True,
        progress: gr.Progress = gr.Progress(),
        request: gr.Request = None,
    ) -> list[Any]:
        with BOARD.catching(request, "video", "The clip"):
            return ends.run(clip, task, size, stride, max_frames, detect_every, smoothing, progress)

    # the API docs, from the declarations (the tasks that declare video)
    video.__doc__ = f"""Run a task on every stride-th frame of a short clip; returns the frames read and the
        rendered result as browser-playable WebM videos, the downloads, a summary and a run line.

        Args:
            clip: the video file (MP4, WebM, MOV or GIF), uploaded to this app.
            task: one of {_task_list(ends.tasks)}.
            size: model size (None: the task's default on this server).
            stride: process every stride-th frame (1 = all); the output keeps the clip's duration.
            max_frames: stop with an error if more frames than this would be processed (None: the server's limit).
            detect_every: {_tracking_tasks(ends.tasks)}: run the person detector on every K-th processed frame; boxes are tracked in between.
            smoothing: {_tracking_tasks(ends.tasks)}: smooth keypoints over time per person (One-Euro filter).
        """
    return video


def plan_endpoint(ends: VideoEndpoints) -> Callable[..., str]:
    first = default_task(ends.tasks)

    def video_plan(
        clip: Any, task: str = first, size: str | None = None, stride: int = 1, max_frames: int | None = None
    ) -> str:
        return ends.plan(clip, task, size, stride, max_frames)

    video_plan.__doc__ = f"""Check a clip against this server's limits and estimate the run before starting it.

        Args:
            clip: the video file (MP4, WebM, MOV or GIF), uploaded to this app.
            task: one of {_task_list(ends.tasks)}.
            size: model size (None: the task's default).
            stride: process every stride-th frame.
            max_frames: the most frames to process (None: the server's limit).
        """
    return video_plan


def video_tab(run: Runner, concurrency_id: str, limits: VideoLimits = APP_VIDEO_LIMITS) -> None:
    """The Video tab: a clip, a task and its size, stride and limits, pose tracking options;
    the frames read and the result side by side, downloads and a summary."""
    ends = VideoEndpoints(run, limits)
    manager = run.manager
    choices = task_choices(ends.tasks)
    first = default_task(ends.tasks)
    with gr.Tab("Video", id="video"):
        with gr.Row():
            with gr.Column(scale=1):
                clip = clip_input(label="Clip (MP4, WebM, MOV or GIF)", elem_id="video-clip")
                task = checked_by_package(gr.Radio(choices, value=first, label="Task"))
                first_task = ends.tasks[first]
                size = size_dropdown(manager.sizes(first_task), manager.default_size(first_task))
                stride = checked_by_package(gr.Slider(1, STRIDE_MAX, value=1, step=1, label="Frame stride"))
                max_frames = checked_by_package(
                    gr.Slider(1, limits.max_frames, value=limits.max_frames, step=1, label="Max frames")
                )
                with gr.Accordion("People over time", open=False):
                    detect_every = checked_by_package(
                        gr.Slider(1, DETECT_EVERY_MAX, value=5, step=1, label="Detect people every K frames")
                    )
                    smoothing = gr.Checkbox(True, label="Smooth keypoints (One-Euro filter)")
                plan = gr.Textbox(label="Before running", interactive=False, lines=2, elem_id="video-plan")
                button = gr.Button("Run on the clip", variant="primary")
                gr.Markdown(limits_markdown(limits))
            with gr.Column(scale=2):
                with gr.Row():
                    source = gr.Video(label="Frames read", elem_id="video-source", loop=True)
                    result = gr.Video(label="Result", elem_id="video-result", loop=True)
                info = gr.Textbox(label="Run info", interactive=False, max_lines=2, elem_id="video-info")
                files = gr.File(
                    label="Downloads: video, JSON, ZIP, NPZ",
                    file_count="multiple",
                    interactive=False,
                    elem_classes=[OUTPUT_FILES],
                    elem_id="video-files",
                )
                summary = gr.JSON(label="Summary", height=240)
                add_motion_mode(  # /motion: pose + pointmap -> 3D motion (sapiens2.ui.motion_mode)
                    ends, [clip, size, stride, max_frames, detect_every, smoothing],
                    [source, result, files, summary, info], concurrency_id,
                )  # fmt: skip

    def sizes(task_value: str) -> Any:
        chosen = ends.tasks[_task_name(task_value, ends.tasks)]
        return gr.Dropdown(choices=list(manager.sizes(chosen)), value=manager.default_size(chosen))

    task.change(sizes, inputs=task, outputs=size, api_visibility="private")
    planned = [clip, task, size, stride, max_frames]
    gr.on(
        [clip.change, task.change, size.change, stride.release, max_frames.release],
        plan_endpoint(ends),
        inputs=planned,
        outputs=plan,
        api_name="video_plan",
    )
    button.click(
        video_endpoint(ends),
        inputs=[*planned, detect_every, smoothing],
        outputs=[source, result, files, summary, info],
        api_name="video",
        concurrency_id=concurrency_id,
    ).failure(shown_error("video", False), None, [info], api_visibility="private", queue=False)
