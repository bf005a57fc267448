"""What a run costs: the seconds of GPU one call reserves, and the seconds a clip takes on a CPU.

One module holds the whole model. A task declares only the shape of its work (:class:`Work`:
forwards per image, one crop per person, the person detector); the models it borrows count as
more forwards; the FLOPs per size come from the zoo. The server combines: one call's
reservation is :func:`reservation` of the work of everything in the call and of the weights a
fresh worker must move first. ZeroGPU's own arithmetic (the node's duration factor, what a
visitor's quota is charged) stays in :mod:`sapiens2.zerogpu.quota`.

Each constant is an estimate with a margin; what ``bench/gpu.py`` checked on a GPU, and what only
ZeroGPU can show, is in docs/PERFORMANCE.md ("GPU figures and their targets"). ``bench/gpu.py``
reads ``CUDA_INIT_S``, ``MOVE_BYTES_PER_S`` and ``SUSTAINED_TFLOPS`` by name.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ..zerogpu.quota import DAILY_QUOTA_S, duration_factor, gpu_request
from .zoo import ARCHS

#: Seconds a fresh worker spends starting CUDA (and ZeroGPU's fork) before the first tensor moves.
CUDA_INIT_S = 3.0
#: Bytes per second a fresh worker moves to the GPU: ZeroGPU reads the packed weights from disk
#: first, and that read, not PCIe, bounds it.
MOVE_BYTES_PER_S = 1.5e9
#: Sustained rate of a forward on a ZeroGPU slice (half a GPU), in the zoo's FLOP figures.
SUSTAINED_TFLOPS = 50.0
#: Fixed seconds of one call's device work besides its forwards (input moves, kernel launches).
CALL_OVERHEAD_S = 0.5
#: The 1b-4k backbone has no published FLOPs: 16x the tokens of a 1b forward.
TFLOPS_1B_4K = 16 * 4.715
#: A photo's person detection (DETR at its own resolution, with its pre- and post-processing).
DETECT_PHOTO_S = 1.0
#: One person detection inside a clip's call (frames are small: mostly pre/post-processing).
DETECT_GPU_S = 0.25
#: People per frame a clip's reservation assumes for a task that crops each person.
VIDEO_PEOPLE = 2
#: Seconds per frame a clip's call waits on the server when a frame's input follows the results
#: before it (pose: the batch finished, the tracker, the next crops, two round trips). Decoding,
#: rendering and encoding run in the server outside the call; a clip whose inputs are all
#: prepared before the call (``tracked=False``) waits for nothing.
FRAME_HOST_S = 0.03
#: Never ask for less than a worker's bare start.
MIN_CALL_S = 5
#: Never ask for more than a visitor without an account can start on the slowest node: the
#: request times the node's factor must fit that visitor's daily quota, or it is refused unrun.
MAX_CALL_S = int(DAILY_QUOTA_S["anonymous"] // duration_factor())
#: Multiply-accumulates per second of a forward on a 2-core CPU, its attention counted
#: (``serving.frame_cost``; docs/PERFORMANCE.md, "Numbers behind the code").
CPU_MACS_PER_S = 4.0e10
#: Seconds per network-input pixel of each forward that its multiply-accumulates miss: the heads'
#: full-resolution layers, normalising the input, reducing the outputs (seg's logits, pose's
#: heatmaps); about 0.8 s a 1024x768 forward (docs/VIDEO.md, "The CPU estimate").
CPU_NETWORK_PIXEL_S = 1.0e-6
#: Seconds per clip frame pixel: decoding the frame, resizing the result to it, rendering, two VP8
#: encodes; about 0.46 s a 1280x720 frame (docs/VIDEO.md, "The CPU estimate").
CPU_FRAME_PIXEL_S = 5.0e-7


@dataclass(frozen=True)
class Work:
    """The shape of one image's device work, as a task declares it for a request's options.

    ``forwards``: forwards of the task's own model per image (per person with ``people``).
    ``people``: None when the image is one input; else the task crops each person, at most this
    many on a photo (a clip assumes :data:`VIDEO_PEOPLE`). ``detector``: people are found by the
    person detector first. ``borrowed``: forwards of other tasks' models per image (the body-part
    segmentation a foreground needs)."""

    forwards: int = 1
    people: int | None = None
    detector: bool = False
    borrowed: int = 0


def tflops(size: str) -> float:
    """Published FLOPs (in the zoo's units) of one forward of ``size`` at the network input."""
    arch = ARCHS.get(size)
    return arch.tflops_1024x768 if arch and arch.tflops_1024x768 else TFLOPS_1B_4K


def forward_seconds(size: str, images: int = 1) -> float:
    """Generous seconds of GPU for one call's forwards of ``images`` inputs of a backbone size."""
    return CALL_OVERHEAD_S + images * tflops(size) / SUSTAINED_TFLOPS


def photo_seconds(size: str, work: Work) -> float:
    """Seconds of device work for one photo (start-up excluded): one forward of every crop (or the
    image) and of each borrowed model together, plus the detector."""
    images = work.forwards * (work.people or 1) + work.borrowed
    return forward_seconds(size, images) + (DETECT_PHOTO_S if work.detector else 0.0)


def clip_seconds(size: str, work: Work, frames: int, batch: int, detect_every: int) -> float:
    """Seconds of device work of a clip's one call for ``frames`` frames (start-up excluded):
    forwards in batches of ``batch`` frames for the task's model and each borrowed one, a person
    detection every ``detect_every`` frames (with the detector), and for a task whose frames
    follow the results (the detector's: tracked) the waits on the server between batches."""
    per_frame = work.forwards * (VIDEO_PEOPLE if work.people else 1)
    models = 1 + work.borrowed
    full, last = divmod(frames, batch)
    seconds = full * forward_seconds(size, batch * per_frame) * models
    seconds += forward_seconds(size, last * per_frame) * models if last else 0.0
    if work.detector:
        seconds += DETECT_GPU_S * math.ceil(frames / detect_every) + FRAME_HOST_S * frames
    return seconds


def frame_seconds(size: str, work: Work) -> float:
    """Seconds of device work of one live camera frame's call (start-up excluded): the forwards
    of its crops (:data:`VIDEO_PEOPLE` people for a task that crops each) or of the frame, and of
    each borrowed model. Its person detection is a call of its own (:func:`detect_seconds`)."""
    per_frame = work.forwards * (VIDEO_PEOPLE if work.people else 1)
    return forward_seconds(size, per_frame) * (1 + work.borrowed)


def detect_seconds(frames: int) -> float:
    """Seconds of device work of one call detecting the people in ``frames`` small frames."""
    return CALL_OVERHEAD_S + DETECT_GPU_S * frames


def weight_bytes(sizes: Iterable[str | None]) -> int:
    """bf16 bytes of the published weights of models of these sizes (0 for an unknown size)."""
    return int(sum(2e9 * ARCHS[s].params_b for s in sizes if s in ARCHS))


def resident_for(server_bytes: int, *own_sizes: Iterable[str | None]) -> int:
    """The weights a call's fresh worker moves: the server's resident models, and at least the
    call's own (``own_sizes``: the model sizes of each of its jobs, weighed per job)."""
    return max(server_bytes, sum(weight_bytes(sizes) for sizes in own_sizes))


def start_seconds(resident_bytes: int) -> float:
    """A fresh worker's start: CUDA, then moving ``resident_bytes`` of weights to the GPU."""
    return CUDA_INIT_S + resident_bytes / MOVE_BYTES_PER_S


def reservation(work_s: float, resident_bytes: int) -> int:
    """THE reservation of one GPU call: a fresh worker's start with ``resident_bytes`` resident,
    plus ``work_s`` seconds of device work; whole seconds, rounded up, within
    [MIN_CALL_S, MAX_CALL_S]. Every GPU call of the app asks for this (ZeroGPU then multiplies
    it by its node's duration factor when it checks the visitor's quota)."""
    return clamp(start_seconds(resident_bytes) + max(0.0, float(work_s)))


def photos_reservation(photos: Iterable[tuple[str, Work, int]], resident_bytes: int) -> int:
    """The reservation of one call running photos: ``(size, work, images)`` per job."""
    return reservation(
        sum(photo_seconds(size, work) * images for size, work, images in photos), resident_bytes
    )


def frame_reservation(size: str, work: Work, resident_bytes: int) -> int:
    """The reservation of one live camera frame's call (:func:`frame_seconds`)."""
    return reservation(frame_seconds(size, work), resident_bytes)


def detect_reservation(frames: int, resident_bytes: int) -> int:
    """The reservation of one call detecting the people in ``frames`` frames."""
    return reservation(detect_seconds(frames), resident_bytes)


def within_quota(call_s: float, quota_s: int) -> bool:
    """Whether a call reserving ``call_s`` seconds is charged at most ``quota_s`` of quota."""
    return gpu_request(call_s).charged_s <= quota_s


def call_fits(work_s: float, resident_bytes: int, quota_s: int | None = None) -> bool:
    """Whether a call of ``work_s`` seconds of device work with ``resident_bytes`` to move fits
    ``quota_s`` seconds of quota (None: the longest call a visitor can start, unrounded)."""
    seconds = work_s + start_seconds(resident_bytes)
    return seconds <= MAX_CALL_S if quota_s is None else within_quota(seconds, quota_s)


def work_budget(resident_bytes: int, call_s: float = MAX_CALL_S) -> float:
    """Seconds of device work a call of ``call_s`` (by default the longest a visitor can start)
    leaves after a fresh worker's start with ``resident_bytes`` resident: how much a planner may
    put in one call whose reservation then stays within ``call_s``."""
    return call_s - start_seconds(resident_bytes)


def clamp(seconds: float) -> int:
    """Whole seconds, rounded up, within [MIN_CALL_S, MAX_CALL_S]."""
    return int(min(MAX_CALL_S, max(MIN_CALL_S, math.ceil(seconds))))


def cpu_frame_seconds(macs: float, network_pixels: int, frame_pixels: int) -> float:
    """Seconds one clip frame takes on a CPU: its forwards' ``macs`` multiply-accumulates, what
    those forwards cost per pixel of their ``network_pixels`` (all forwards' inputs together)
    beyond them, and the frame's own ``frame_pixels`` (decode, resize, render, encode). No fixed
    term: a small model on a small clip costs little."""
    return cpu_forward_seconds(macs) + network_pixels * CPU_NETWORK_PIXEL_S + frame_pixels * CPU_FRAME_PIXEL_S


def cpu_forward_seconds(macs: float) -> float:
    """Seconds a CPU's forwards take for ``macs`` multiply-accumulates (no per-frame overhead)."""
    return macs / CPU_MACS_PER_S
