"""Fidelity and boundary-size measurements behind docs/FIDELITY.md (CPU, no weights needed).

    python bench/fidelity.py            # all four measurements

1. Segmentation input: p99 / max grey-level difference from the release's rule (cv2 INTER_AREA
   shrinking, INTER_CUBIC enlarging) of the old torch bilinear stretch and of the new one, on
   the photos in assets/.
2. Letterbox: photos whose letterboxed size differs from the release's truncation when rounded
   (the old rule), and the p99 grey-level difference of the old canvas from the release's.
3. bf16: distinct depth / normal-x values at network resolution of a tiny random model, fp32
   vs bf16 with every layer in bf16 (before) vs bf16 with fp32 final layers (after).
4. Pickled bytes per task for a 4000x3000 photo: before (the whole intake in, the full result
   back, as the interim one-call infer did) and after (prep and raw of the stages).
"""

from __future__ import annotations

import pickle
import sys
import tempfile
from pathlib import Path

import cv2
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from before_input import letterbox, stretch_to  # noqa: E402

from sapiens2.inputs.intake import load_image  # noqa: E402
from sapiens2.inputs.network import letterbox_release, network_batch, stretch_release  # noqa: E402
from sapiens2.models.zoo import IMAGE_MEAN, IMAGE_STD  # noqa: E402

MEAN, STD = np.array(IMAGE_MEAN) * 255, np.array(IMAGE_STD) * 255
PHOTOS = sorted(p for p in (ROOT / "assets").iterdir() if p.suffix in (".jpg", ".png"))


def pixels(x: torch.Tensor) -> np.ndarray:
    return x[0].permute(1, 2, 0).double().numpy() * STD + MEAN


def seg_input() -> None:
    print("1. seg input vs release (p99 / max grey levels): old bilinear | new")
    for path in PHOTOS:
        rgb = load_image(path).work
        h, w = rgb.shape[:2]
        flag = cv2.INTER_AREA if 768 < w else cv2.INTER_CUBIC
        ref = cv2.resize(rgb, (768, 1024), interpolation=flag).astype(np.float64)
        old = np.abs(pixels(stretch_to(rgb)) - ref)
        new = np.abs(stretch_release(rgb).astype(np.float64) - ref)
        print(
            f"   {path.name[:40]:40s} {w}x{h}: {np.quantile(old, 0.99):5.1f} / {old.max():5.1f} | "
            f"{np.quantile(new, 0.99):.1f} / {new.max():.1f}"
        )


def letterbox_shift() -> None:
    print("2. letterbox vs release: old inner size (rounded) | release (truncated) | old p99 grey diff")
    for path in PHOTOS:
        rgb = load_image(path).work
        ref, pad = letterbox_release(rgb)
        h, w = rgb.shape[:2]
        s = min(1024 / h, 768 / w)
        old_hw = (min(1024, round(h * s)), min(768, round(w * s)))
        old = np.abs(pixels(letterbox(rgb)[0]) - ref)
        print(f"   {path.name[:40]:40s} {w}x{h}: {old_hw} | {pad.inner_hw} | {np.quantile(old, 0.99):.1f}")


def bf16_distinct() -> None:
    from tiny_checkpoints import make_tiny_checkpoint

    from sapiens2.models.loading import load_model

    print("3. distinct values at network resolution: fp32 | all-bf16 (before) | bf16 + fp32 heads (after)")
    x8, _ = letterbox_release(load_image(PHOTOS[0]).work)
    root = Path(tempfile.mkdtemp())
    for task, name, ch in (("pointmap", "pointmap", 2), ("normal", "normals", 0)):
        ck = make_tiny_checkpoint(task, root / task, seed=1)
        counts = []
        for dt, all_bf16 in ((torch.float32, False), (torch.bfloat16, True), (torch.bfloat16, False)):
            model = load_model(task, checkpoint=ck, device="cpu", dtype=dt)
            if all_bf16:
                model = model.to(torch.bfloat16)
            with torch.inference_mode():
                out = getattr(model(network_batch([x8], "cpu", dt)), name)[0, ch]
            counts.append(torch.unique(out.float()).numel())
        print(f"   {task} channel {ch}: {counts[0]} | {counts[1]} | {counts[2]}")


def boundary_bytes() -> None:
    import test_fidelity as tf

    from sapiens2.tasks.matting import MattingPipeline
    from sapiens2.tasks.normal import NormalPipeline
    from sapiens2.tasks.pointmap import PointmapPipeline
    from sapiens2.tasks.seg import SegPipeline

    print("4. pickled MB at 4000x3000: before args / before result | after prep / after raw")
    item = load_image(np.zeros((3000, 4000, 3), np.uint8))
    cases = [
        (SegPipeline, tf.seg_model, {}),
        (NormalPipeline, tf.normal_model, {"remove_background": True}),
        (PointmapPipeline, tf.pointmap_model, {"use_segmentation": True}),
        (MattingPipeline, tf.matting_model, {}),
    ]
    for cls, make, opts in cases:
        kwargs = (
            {"seg": SegPipeline(model=tf.seg_model())} if cls in (NormalPipeline, PointmapPipeline) else {}
        )
        pipe = cls(model=make(), **kwargs)
        prep = pipe.prepare(item, **opts)
        [raw] = pipe.infer([prep], **opts)
        result = pipe.finish(raw, item, **opts)
        mb = [len(pickle.dumps(o)) / 2**20 for o in ([item], [result], [prep], [raw])]
        print(f"   {pipe.task:9s} {mb[0]:6.1f} / {mb[1]:6.1f} | {mb[2]:5.2f} / {mb[3]:5.2f}")


if __name__ == "__main__":
    seg_input()
    letterbox_shift()
    bf16_distinct()
    boundary_bytes()
