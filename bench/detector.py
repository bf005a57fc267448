"""Person detector speed: our DETR-R50 vs transformers' DetrForObjectDetection, same weights.

Builds the real facebook/detr-resnet-50 shape (ResNet-50, d_model 256, 6+6 layers, 100 queries,
92 logits) with random weights (no download), saves it with save_pretrained, loads it through
our loader, and times one forward at DETR's working resolution (800x1066 for a 3:4 photo).

    python bench/detector.py                # CPU, median of 5 runs
    python bench/detector.py --device cuda --runs 20

Needs transformers (a test-only dependency). Prints one line per measurement and a summary.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sapiens2.models.detector import PersonDetector, preprocess  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(
    fn: Callable[[], object], runs: int, warmup: int, device: torch.device
) -> tuple[float, float, list[float]]:
    """Median wall time and median process CPU time of ``fn`` over ``runs`` calls after ``warmup``.

    CPU time (all threads) is reported too because wall time on a shared machine swings with
    other people's load; there the ratio of CPU times is the steadier comparison.
    """
    for _ in range(warmup):
        fn()
    _sync(device)
    walls, cpus = [], []
    for _ in range(runs):
        start, cpu = time.perf_counter(), time.process_time()
        fn()
        _sync(device)
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus), walls


def _ms(times: list[float]) -> list[int]:
    return [round(t * 1e3) for t in times]


def build_reference(folder: Path, seed: int = 0):
    """transformers' DETR-R50 (transformers ResNet backbone, random weights) saved into ``folder``."""
    from transformers import DetrConfig, DetrForObjectDetection, ResNetConfig

    torch.manual_seed(seed)
    labels = {i: ("person" if i == 1 else f"LABEL_{i}") for i in range(91)}  # COCO map: person is 1
    config = DetrConfig(
        use_timm_backbone=False,
        backbone_config=ResNetConfig(out_features=["stage4"]),
        num_labels=91,
        id2label=labels,
        label2id={v: k for k, v in labels.items()},
    )
    model = DetrForObjectDetection(config).eval()
    model.save_pretrained(folder)
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--height", type=int, default=800, help="input image height (resized by DETR's rule)")
    parser.add_argument("--width", type=int, default=1066)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--no-reference", action="store_true", help="skip transformers' model")
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    image = np.random.default_rng(0).integers(0, 256, (args.height, args.width, 3), dtype=np.uint8)
    pixels = preprocess(image, device)
    print(
        f"device={device} threads={torch.get_num_threads()} image={args.height}x{args.width} "
        f"network input={tuple(pixels.shape[2:])} runs={args.runs}"
    )

    with tempfile.TemporaryDirectory() as tmp:
        reference = build_reference(Path(tmp))
        ours = PersonDetector.load(tmp, device=device)

    # our detector's own input layout (channels_last on CPU), as PersonDetector feeds it
    ours_in = pixels.contiguous(memory_format=torch.channels_last) if ours.channels_last else pixels
    with torch.inference_mode():
        fwd, fwd_cpu, fwd_all = median_seconds(lambda: ours.model(ours_in), args.runs, args.warmup, device)
        print(
            f"ours forward         median {fwd * 1e3:8.1f} ms wall {fwd_cpu:6.2f} s CPU  runs {_ms(fwd_all)}"
        )
        e2e, e2e_cpu, _ = median_seconds(lambda: ours(image), args.runs, args.warmup, device)
        print(f"ours end-to-end      median {e2e * 1e3:8.1f} ms wall {e2e_cpu:6.2f} s CPU  (resize..NMS)")
        if args.no_reference:
            return 0
        reference = reference.to(device)
        ref, ref_cpu, ref_all = median_seconds(
            lambda: reference(pixel_values=pixels), args.runs, args.warmup, device
        )
        print(
            f"transformers forward median {ref * 1e3:8.1f} ms wall {ref_cpu:6.2f} s CPU  runs {_ms(ref_all)}"
        )
        logits, boxes = ours.model(ours_in)
        out = reference(pixel_values=pixels)
        diff = max((logits - out.logits).abs().max().item(), (boxes - out.pred_boxes).abs().max().item())
        print(
            f"ratio ours/transformers: wall {fwd / ref:.3f}, CPU time {fwd_cpu / max(ref_cpu, 1e-9):.3f}; "
            f"max |diff| logits/boxes {diff:.1e}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
