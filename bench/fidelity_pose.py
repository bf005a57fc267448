"""Pose and features fidelity figures for docs/FIDELITY_POSE.md: before/after on the example photos.

    python bench/fidelity_pose.py            # everything below, tiny random weights, CPU

1. crops: pixels the pose network is fed vs the release's warp (cv2, float32 matrix), for the
   whole-image box and a person box on each photo: the previous float64 matrix, the cv2 backend
   and the torch (GPU) backend;
2. fallback box: keypoints with the old ``[0, 0, w, h]`` vs the release's ``[0, 0, w-1, h-1]``;
3. pickled bytes of what crosses the ZeroGPU boundary for a 12 MP photo: before (the interim
   stages sent the Intake in and the whole result back) and after (PosePrep / PoseRaw,
   FeaturesPrep / FeaturesRaw);
4. features input: cv2 INTER_LINEAR on uint8 vs the previous float bilinear;
5. bf16 pose: keypoints of an all-bf16 model and of one whose last layer (``conv_pose``) runs in
   float32 (patched here, for the experiment only), against the float32 model.

Numbers are for random weights (tiny checkpoint, 1024x768 input): they show how far a rule moves
the output, not accuracy.
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
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from before_input import stretch_to  # noqa: E402
from test_fidelity_pose import grey, people, release_crop  # noqa: E402
from tiny_checkpoints import make_tiny_checkpoint  # noqa: E402

from sapiens2.inputs.intake import load_image  # noqa: E402
from sapiens2.tasks.features import FeaturesPipeline, FeaturesRaw  # noqa: E402
from sapiens2.tasks.pose import PosePipeline  # noqa: E402
from sapiens2.tasks.pose.pose_crops import crop_people  # noqa: E402

PHOTOS = sorted(p for p in (ROOT / "assets").iterdir() if p.suffix in (".jpg", ".png"))


def old_crop(img: np.ndarray, box: list[float]) -> np.ndarray:
    """The previous crop: the same rule with a float64 matrix, bilinear / bicubic flags."""
    b = np.asarray(box, np.float64)
    c = (b[:2] + b[2:]) / 2
    w, h = (b[2:] - b[:2]) * 1.25
    w, h = (w, w / 0.75) if w > h * 0.75 else (h * 0.75, h)
    kx, ky = 767 / w, 1023 / h
    m = np.array([[kx, 0, kx * (0.5 * w - c[0])], [0, ky, ky * (0.5 * h - c[1])]])
    flag = cv2.INTER_CUBIC if min(kx, ky) >= 1 else cv2.INTER_LINEAR
    return cv2.warpAffine(img, m, (768, 1024), flags=flag)


def crops() -> None:
    print("\n## 1. crops vs the release (grey levels; share of values that differ)")
    print("| photo | box | previous (float64 matrix) | cv2 backend | torch backend |")
    print("|---|---|---|---|---|")
    for path in PHOTOS:
        img = load_image(path).rgb
        h, w = img.shape[:2]
        for label, box in (
            ("whole", [0, 0, w - 1, h - 1]),
            ("person", [0.3 * w, 0.2 * h, 0.55 * w, 0.9 * h]),
        ):
            ref = release_crop(img, box).astype(np.float64)
            cells = [_diff(old_crop(img, box), ref)]
            for backend in ("cv2", "torch"):
                x, _ = crop_people(img, np.array([box]), backend=backend)
                cells.append(_diff(grey(x[0]), ref))
            print(f"| {path.stem[:28]} {w}x{h} | {label} | " + " | ".join(cells) + " |")


def _diff(a: np.ndarray, ref: np.ndarray) -> str:
    d = np.abs(np.asarray(a, np.float64) - ref)
    return f"max {d.max():.2f}, {np.mean(d > 0.5) * 100:.4f}%"


def fallback(pipe: PosePipeline) -> None:
    print("\n## 2. whole-image box [0,0,w,h] (before) vs [0,0,w-1,h-1] (release): keypoint shift, px")
    print("| photo | median | p90 | max |")
    print("|---|---|---|---|")
    for path in PHOTOS:
        intake = load_image(path)
        h, w = intake.rgb.shape[:2]
        after = pipe(intake, flip_test=False)
        before = pipe(intake, boxes=[[0, 0, w, h]], flip_test=False)
        ok = (after.scores[0] > 0) & (before.scores[0] > 0)
        d = np.linalg.norm(after.keypoints[0][ok] - before.keypoints[0][ok], axis=-1)
        print(
            f"| {path.stem[:28]} {w}x{h} | {np.median(d):.2f} | {np.percentile(d, 90):.2f} | {d.max():.2f} |"
        )


def sizes(pipe: PosePipeline, feats: FeaturesPipeline) -> None:
    print("\n## 3. pickled bytes across the device boundary, 4000x3000 photo (MB)")
    img = cv2.resize(load_image(PHOTOS[-2]).rgb, (4000, 3000))
    intake = load_image(img)
    mb = lambda obj: f"{len(pickle.dumps(obj)) / 1e6:.3f}"  # noqa: E731
    print("| call | before: in | before: out | after: in | after: out |")
    print("|---|---|---|---|---|")
    for label, kw in (("pose, 5 caller boxes", {"boxes": people(4000, 3000, 5)}), ("pose, detector", {})):
        whole = pipe(intake, flip_test=False, **kw)
        prep = pipe.prepare(intake, **kw)
        [raw] = pipe.infer([prep], flip_test=False)
        print(f"| {label} | {mb(intake)} | {mb(whole)} | {mb(prep)} | {mb(raw)} |")
    whole = feats(intake)
    prep = feats.prepare(intake)
    [raw] = feats.infer([prep])
    print(f"| features, tiny (D=64) | {mb(intake)} | {mb(whole)} | {mb(prep)} | {mb(raw)} |")
    for dtype in (torch.float32, torch.bfloat16):  # a 0.1b raw's real shape (D=768), built directly
        real = FeaturesRaw(torch.zeros(768, dtype=dtype), torch.zeros(768, 64, 48, dtype=dtype), raw.info)
        print(f"| features 0.1b shape, {str(dtype)[6:]} raw | | | {mb(prep)} | {mb(real)} |")


def features_input() -> None:
    print("\n## 4. features input: cv2 INTER_LINEAR uint8 (after) vs float bilinear (before), grey levels")
    print("| photo | p99 | max |")
    print("|---|---|---|")
    for path in PHOTOS:
        img = load_image(path).rgb
        new = cv2.resize(img, (768, 1024), interpolation=cv2.INTER_LINEAR).astype(np.float64)
        old = grey(stretch_to(img, (1024, 768))[0])
        d = np.abs(new - old)
        print(
            f"| {path.stem[:28]} {img.shape[1]}x{img.shape[0]} | {np.percentile(d, 99):.2f} | {d.max():.2f} |"
        )


class Fp32Last(torch.nn.Module):
    """The head's last 1x1 conv in float32 on float32 input (what nn/heads.py would do)."""

    def __init__(self, conv: torch.nn.Conv2d) -> None:
        super().__init__()
        self.conv = conv.float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x.float())


def bf16_pose(checkpoint: Path) -> None:
    print(
        "\n## 5. bf16 pose vs float32: keypoint distance (px, points scoring > 0 in both) and heatmap levels"
    )
    print(
        "| photo | all bf16: median / p90 | last layer fp32: median / p90 | distinct heatmap values bf16 / fp32-last |"
    )
    print("|---|---|---|---|")
    pipes = {}
    pipes["f32"] = PosePipeline(checkpoint=checkpoint, detector=None)
    pipes["bf16"] = PosePipeline(checkpoint=checkpoint, dtype=torch.bfloat16, detector=None)
    pipes["last"] = PosePipeline(checkpoint=checkpoint, dtype=torch.bfloat16, detector=None)
    head = pipes["last"].model.decode_head
    setattr(head, head.predictor_name, Fp32Last(getattr(head, head.predictor_name)))
    for path in PHOTOS[:4]:
        intake = load_image(path)
        ref = pipes["f32"](intake, flip_test=False)
        cells, levels = [], []
        for name in ("bf16", "last"):
            res = pipes[name](intake, flip_test=False)
            ok = (ref.scores[0] > 0) & (res.scores[0] > 0)
            d = np.linalg.norm(res.keypoints[0][ok] - ref.keypoints[0][ok], axis=-1)
            cells.append(f"{np.median(d):.2f} / {np.percentile(d, 90):.2f}")
            with torch.inference_mode():
                x, _ = crop_people(
                    intake.work,
                    np.array([[0, 0, intake.work.shape[1] - 1, intake.work.shape[0] - 1]]),
                    dtype=torch.bfloat16,
                )
                levels.append(str(len(torch.unique(pipes[name].model(x).heatmaps[0, 0].float()))))
        print(f"| {path.stem[:28]} | {cells[0]} | {cells[1]} | {' / '.join(levels)} |")


def main() -> None:
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, cv2 {cv2.__version__}, CPU threads {torch.get_num_threads()}")
    with tempfile.TemporaryDirectory() as tmp:
        pose_ckpt = make_tiny_checkpoint("pose", Path(tmp) / "pose", seed=3)
        pose = PosePipeline(checkpoint=pose_ckpt, detector=None)
        feats = FeaturesPipeline(checkpoint=make_tiny_checkpoint("features", Path(tmp) / "pt", seed=5))
        crops()
        fallback(pose)
        sizes(pose, feats)
        features_input()
        bf16_pose(pose_ckpt)


if __name__ == "__main__":
    main()
