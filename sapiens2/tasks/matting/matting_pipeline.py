"""Matting: a photo in, alpha and the (premultiplied) foreground colours at the original size out.

As transformers' port does (matting has no other published path): the image is stretched to the
network input (bilinear with antialias on the uint8 image, as its processor does), both outputs
are resized back bilinearly (no antialias) and clamped to [0, 1]. Composite = clamp(fg + (1 - alpha) * background).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...errors import InputImageError
from ...inputs.intake import Intake, load_image
from ...inputs.network import resize_hwc, stretch_antialiased
from ...models.zoo import get_task
from ...outputs.writers import NOW, Writer
from ..base import Pipeline, TaskResult
from ..dense import DensePrep, DenseRaw, chunked_forward, start_result, to_cpu32
from ..options import Option
from ..registry import Task, Video
from ..result_record import ResultArray, array_record
from .matting_render import CHROMA_GREEN


@dataclass(kw_only=True)
class MattingResult(TaskResult):
    """Alpha matte and premultiplied foreground colours at the original size."""

    foreground: np.ndarray  # (H, W, 3) float32 in [0, 1], premultiplied by alpha
    alpha: np.ndarray  # (H, W) float32 in [0, 1]

    def render(self, *, background: Any = CHROMA_GREEN) -> np.ndarray:
        """The person over ``background``: an (r, g, b) tuple or '#rrggbb' (default chroma green
        (0, 177, 64)), or an image of any size and mode (resized to cover, centre-cropped)."""
        from .matting_render import composite

        return composite(self.foreground, self.alpha, background)

    def cutout(self) -> np.ndarray:
        """(H, W, 4) uint8 RGBA: the predicted foreground colours (un-premultiplied) and alpha."""
        from .matting_render import rgba_cutout

        return rgba_cutout(self.foreground, self.alpha)

    def save(
        self,
        out_dir: str | Path,
        *,
        background: Any = CHROMA_GREEN,
        rendered: np.ndarray | None = None,
        writer: Writer = NOW,
    ) -> list[Path]:
        """Writes ``<name>_cutout.png`` (RGBA), ``<name>_alpha.png`` (grey, alpha x 255) and
        ``<name>_composite.png`` (over ``background``); returns their paths. ``rendered``: a
        composite already made (e.g. with the viewer's background) to write instead."""
        from ...outputs.export import safe_path, write_png

        alpha8 = np.clip(self.alpha * 255.0 + 0.5, 0, 255).astype(np.uint8)
        composite = self.render(background=background) if rendered is None else rendered
        pictures = {"_cutout.png": self.cutout(), "_alpha.png": alpha8, "_composite.png": composite}
        return [write_png(safe_path(out_dir, self.name, s), p, writer=writer) for s, p in pictures.items()]


@dataclass
class MattingRaw(DenseRaw):
    """``MattingPipeline.infer``'s per-photo output at network resolution (float32)."""

    both: np.ndarray | None = None  # (4, h, w): premultiplied foreground RGB, then alpha


class MattingPipeline(Pipeline):
    """Matting: ``MattingPipeline("1b")(photo)`` -> :class:`MattingResult`."""

    task = "matting"

    def __call__(self, image: Any) -> MattingResult:
        return self.run_stages(image)

    def prepare(self, intake: Intake, *, input_hw: Any = None, **_: Any) -> DensePrep:
        """transformers' input (the only published one for matting): antialiased bilinear, uint8.
        ``input_hw``: another network input (:meth:`~sapiens2.tasks.base.Pipeline.input_size`)."""
        return DensePrep(stretch_antialiased(intake.work, self.input_size(input_hw)))

    def infer(self, batch: list[DensePrep], **_: Any) -> list[MattingRaw]:
        raws = [MattingRaw() for _ in batch]
        for a, out in chunked_forward(self, [p.pixels for p in batch], [r.timing for r in raws]):
            both = torch.cat([out.foreground, out.alpha], dim=1)  # one array across the boundary
            for j, item in enumerate(both):
                raws[a + j].both = to_cpu32(item)
        return raws

    def finish(self, raw: MattingRaw, intake: Intake, **_: Any) -> MattingResult:
        """As transformers: bilinear (no antialias) to the photo, clamped to [0, 1]."""
        info, notices = start_result(self, intake, raw)
        both = raw.both
        if not np.isfinite(both).all():
            notices.append("The matting model returned non-finite values; they were set to 0.")
            both = np.nan_to_num(both, nan=0.0, posinf=1.0, neginf=0.0)
        # each output resized on its own, channel-last: both arrive contiguous, nothing is copied
        fg = resize_hwc(both[:3].transpose(1, 2, 0), intake.size_hw)
        alpha = resize_hwc(both[3], intake.size_hw)
        for arr in (fg, alpha):
            np.clip(arr, 0.0, 1.0, out=arr)
        return MattingResult(
            image=intake.rgb,
            info=info,
            notices=notices,
            downscaled=intake.downscaled,
            name=intake.name,
            foreground=fg,
            alpha=alpha,
        )


# ----------------------------------------------------------------------------- declaration


def _render_args(render_opts: Mapping[str, Any]) -> dict[str, Any]:
    """The two background options -> render's ``background``: the image when one is given."""
    image = render_opts.get("background_image")
    if image is None:
        return {"background": render_opts.get("background_color", CHROMA_GREEN)}
    try:
        return {"background": load_image(image).rgb}
    except InputImageError as err:  # say which of the two images is the problem
        raise InputImageError(f"Background image: {err}") from None


#: The photo's downloads are pictures (PNG composites), so no raw file; a clip keeps alpha only.
ARRAYS = (
    ResultArray("alpha", "float16", "alpha per pixel"),
    ResultArray("foreground", "float16", "premultiplied foreground RGB", in_clip=False),
)


TASK = Task(
    spec=get_task("matting"),
    pipeline=MattingPipeline,
    tab="Matting",
    button="Run matting",
    summary="Matting: alpha matte and cut-out of the person, composited over a background.",
    result_label="Matting",
    downloads="Downloads (RGBA cut-out, alpha, composite)",
    options=(
        Option(
            "background_color",
            "color",
            "#00b140",
            "render",
            "Background colour",
            "background colour as '#rrggbb'",
        ),
        Option(
            "background_image",
            "image",
            None,
            "render",
            "Background image (optional)",
            "a background photo, used instead of the colour",
        ),
    ),
    render_args=_render_args,
    cli_aliases={"background_color": ("--background",)},
    video=Video(),
    arrays=ARRAYS,
    record=array_record(ARRAYS),
)
