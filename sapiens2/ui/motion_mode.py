"""The Video tab's motion mode: ``/motion`` makes a clip's 3D motion (pose + pointmap) and shows
it in a 3D viewer, through ``sapiens2.serving.motion_requests``. The tab adds it with :func:`add_motion_mode`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gradio as gr

from ..serving.motion_requests import MotionRequests
from ..serving.present import clip_info, running
from ..tasks.pose.pose_tracking import TrackingOptions
from .error_board import BOARD, reported, shown_error, warn
from .inputs import refuse
from .widgets import whole_number


def motion_endpoint(ends: Any) -> Callable[..., list[Any]]:
    """``/motion``: the Video tab's endpoints object ``ends`` (its requests, limits, manager)."""
    requests = MotionRequests(ends.requests)

    def motion(
        clip: Any,
        size: str | None = None,
        stride: int = 1,
        max_frames: int | None = None,
        detect_every: int = 5,
        smoothing: bool = True,
        progress: gr.Progress = gr.Progress(),
        request: gr.Request = None,
    ) -> list[Any]:
        """3D motion of every tracked person of a short clip: pose and the pointmap (with body
        parts for the people's mask) over the same frames; keypoints in metres, gaps of up to 5
        frames bridged, smoothed in 3D. Returns the frames read and the pose drawing as WebM, the
        downloads (an animated skeleton per person as GLB, the 3D keypoints as NPZ and CSV, a BVH,
        then the pose pass's files: tracks, COCO and OpenPose keypoints, CSV, NPZ, videos),
        a summary, a run line and the motion GLB for the 3D viewer.

        Args:
            clip: the video file (MP4, WebM, MOV or GIF), uploaded to this app.
            size: model size of pose and pointmap (None: each task's default on this server).
            stride: process every stride-th frame (1 = all).
            max_frames: stop with an error if more frames than this would be processed (None: the server's limit).
            detect_every: run the person detector on every K-th processed frame; boxes are tracked in between.
            smoothing: smooth keypoints over time per person (One-Euro filter, in 2D and in 3D).
        """
        with BOARD.catching(request, "motion", "The 3D motion"):
            return run(clip, size, stride, max_frames, detect_every, smoothing, progress)

    def run(
        clip: Any, size: Any, stride: Any, max_frames: Any, detect_every: Any, smoothing: Any, progress: Any
    ) -> list[Any]:
        refuse(clip)  # a clip not uploaded to this app (or expired) reaches here as its refusal
        if not isinstance(smoothing, bool) and smoothing is not None:
            raise gr.Error(f"smoothing must be true or false, got {smoothing!r}.", title="Invalid option")

        def report(done: int, planned: int | None) -> None:
            progress((done, planned or done), desc="Frames (pose, then pointmap)", unit="frames")

        with reported(ends.manager):
            tracking = TrackingOptions(
                detect_every=whole_number(detect_every, "detect_every", 5), smoothing=smoothing is not False
            )
            result = requests.run(
                clip, size, stride=whole_number(stride, "stride", 1),
                max_frames=whole_number(max_frames, "max_frames", requests.video.limits.max_frames),
                tracking=tracking, progress=report,
            )  # fmt: skip
        warn(result.notices)
        sizes = " and ".join(dict.fromkeys(str(s) for s in result.details.get("sizes", {}).values()))
        what = running("3D motion", sizes or "default", ends.manager.device, "models")
        people = f"{result.people} {'person' if result.people == 1 else 'people'}"
        line = clip_info(
            f"{what}, {result.frames} frames, {people} at {result.fps:.3g} fps", result.timing, result.notices,
            {"motion_s": "3D motion and its files"}, rest="pose and pointmap",  # the passes share one call
        )  # fmt: skip
        source = result.pose.source_video
        # the pose pass's downloads (tracks, COCO, OpenPose, CSV, NPZ, videos) stay beside the motion's
        files = dict.fromkeys(str(p) for p in [*result.files, *result.pose.files])
        return [
            None if source is None else str(source),
            str(result.pose.video),
            list(files),
            result.summary(),
            line,
            str(result.glb),
        ]

    return motion


def add_motion_mode(ends: Any, inputs: list[Any], outputs: list[Any], concurrency_id: str) -> None:
    """A button and a 3D viewer under the tab's widgets: ``inputs`` = clip, size, stride, max
    frames, detect every, smoothing; ``outputs`` = frames read, result, downloads, summary, run info."""
    button = gr.Button("Make 3D motion (pose + pointmap)", variant="secondary", elem_id="video-motion-button")
    view = gr.Model3D(
        label="3D motion: one animated skeleton per person (the GLB plays here, imports into Blender)",
        elem_id="video-motion", height=420, display_mode="solid",
    )  # fmt: skip
    info = outputs[-1]
    button.click(
        motion_endpoint(ends), inputs=inputs, outputs=[*outputs, view], api_name="motion",
        concurrency_id=concurrency_id,
    ).failure(shown_error("motion", False), None, [info], api_visibility="private", queue=False)  # fmt: skip


__all__ = ["add_motion_mode", "motion_endpoint"]
