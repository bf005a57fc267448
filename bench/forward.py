"""Forward-pass benchmark: this package's Sapiens2 backbone vs the transformers implementation.

Both run the same config and the same (random) weights: transformers builds the model and writes
it with ``save_pretrained``; ``sapiens2.load_model`` loads that folder. Runs alternate between the
implementations, each timing is the median of ``--runs``; the ratio (ours / transformers) is
printed last. Not a test: numbers depend on the machine and on what else runs on it.

    python bench/forward.py                                   # CPU, 0.1b at 512x384, fp32
    python bench/forward.py --size 1b --hw 1024 768 --dtype bf16 --device cuda
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sapiens2 import load_model  # noqa: E402
from sapiens2.models.zoo import ARCHS  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def reference_model(size: str, hw: tuple[int, int], dtype: torch.dtype, device: str):
    """transformers' Sapiens2Model with the zoo's published shape for ``size`` (random weights)."""
    from transformers import Sapiens2Config, Sapiens2Model

    arch = ARCHS[size]
    if arch.tokenizer_layers:
        raise SystemExit("transformers has no 4K window tokenizer; benchmark 1b instead of 1b-4k")
    config = Sapiens2Config(
        hidden_size=arch.hidden,
        intermediate_size=arch.ffn_hidden,
        num_hidden_layers=arch.layers,
        num_attention_heads=arch.heads,
        num_key_value_attention_heads=arch.heads // 2,
        image_size=hw,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return Sapiens2Model(config).to(device=device, dtype=dtype).eval()


def products_only(model, x: torch.Tensor):
    """A forward reduced to our backbone's matrix products and attention kernels (same weights,
    shapes and calls; nothing between them): the floor any implementation of these FLOPs meets."""
    import torch.nn.functional as F

    b, (h, w) = x.shape[0], x.shape[2:]
    p = model.config.patch_size
    n = model.num_prefix_tokens + (h // p) * (w // p)
    t = torch.randn(b, n, model.config.hidden, dtype=x.dtype, device=x.device)
    hid = torch.randn(b, n, model.config.ffn_hidden, dtype=x.dtype, device=x.device)
    qkv = {}
    for blk in model.blocks:
        a = blk.attn
        if a.kv_heads not in qkv:
            q = torch.randn(b, a.heads, n, a.head_dim, dtype=x.dtype, device=x.device)
            kv = torch.randn(2, b, a.kv_heads, n, a.head_dim, dtype=x.dtype, device=x.device)
            qkv[a.kv_heads] = (q, kv[0], kv[1])

    def run(pixels: torch.Tensor) -> None:
        model.patch_embed(pixels)
        for blk in model.blocks:
            a, f = blk.attn, blk.ffn
            F.linear(t, a.qkv.weight, a.qkv.bias)
            F.scaled_dot_product_attention(*qkv[a.kv_heads], enable_gqa=a.kv_heads != a.heads)
            F.linear(t, a.proj.weight, a.proj.bias)
            F.linear(t, f.w12.weight, f.w12.bias)
            F.linear(hid, f.w3.weight, f.w3.bias)

    return run


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, x: torch.Tensor, device: str) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) of one call."""
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    fn(x)
    sync(device)
    return time.perf_counter() - wall, time.process_time() - cpu


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="0.1b", choices=[s for s in ARCHS if not s.endswith("-4k")])
    ap.add_argument("--hw", nargs=2, type=int, default=(512, 384), metavar=("H", "W"))
    ap.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--runs", type=int, default=5, help="timed runs per implementation (after 1 warm-up)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument(
        "--clock",
        default="wall",
        choices=["wall", "cpu"],
        help="the clock of the table (ratios are printed by both); cpu: this process's CPU time, "
        "steadier than wall time on a shared CPU (use with --threads 1)",
    )
    ap.add_argument(
        "--floor",
        action="store_true",
        help="also time our matrix products and attention kernels alone (the floor)",
    )
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype, device, hw = DTYPES[args.dtype], args.device, tuple(args.hw)

    ref = reference_model(args.size, hw, dtype, device)
    with tempfile.TemporaryDirectory() as tmp:
        ref.save_pretrained(tmp)
        ours = load_model("features", args.size, checkpoint=tmp, device=device, dtype=dtype)
        ours_fp32_rope = load_model(
            "features", args.size, checkpoint=tmp, device=device, dtype=dtype, rope_dtype=torch.float32
        )
    x = torch.randn(args.batch, 3, *hw, device=device, dtype=dtype)
    impls = {
        "transformers": lambda t: ref(pixel_values=t).last_hidden_state,
        "ours (release bf16 RoPE)": lambda t: ours(t).patch_features,
        "ours (fp32 RoPE)": lambda t: ours_fp32_rope(t).patch_features,
    }
    if args.floor:
        impls["products only (floor)"] = products_only(ours, x)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in impls}
    with torch.inference_mode():
        for fn in impls.values():  # warm-up (kernels, caches, allocator)
            fn(x)
        for _ in range(args.runs):
            for name, fn in impls.items():  # alternate so drifting machine load hits all alike
                times[name].append(timed(fn, x, device))
    report(args, times)


def report(args: argparse.Namespace, times: dict[str, list[tuple[float, float]]]) -> None:
    hw = tuple(args.hw)
    flops = None
    if ARCHS[args.size].tflops_1024x768 and hw == (1024, 768):
        flops = ARCHS[args.size].tflops_1024x768 * 1e12 * args.batch
    load = f", load average {os.getloadavg()[0]:.1f}" if args.device == "cpu" else ""
    print(
        f"torch {torch.__version__}, size {args.size}, input {args.batch}x3x{hw[0]}x{hw[1]}, {args.dtype} "
        f"on {args.device}, threads {torch.get_num_threads()}{load}, median of {args.runs}, {args.clock} clock"
    )
    pick = 1 if args.clock == "cpu" else 0
    for name, ts in times.items():
        m = statistics.median(t[pick] for t in ts)
        rate = f", {flops / m / 1e12:.1f} TFLOP/s" if flops else ""
        runs = ", ".join(f"{t[pick] * 1000:.0f}" for t in ts)
        print(f"  {name:26s} {m * 1000:9.1f} ms  (runs: {runs}){rate}")
    rows = [("ours(fp32 RoPE)", "ours (fp32 RoPE)"), ("ours", "ours (release bf16 RoPE)")]
    if args.floor:
        rows.append(("floor", "products only (floor)"))
    for label, name in rows:
        ratio = [
            statistics.median(t[i] for t in times[name])
            / statistics.median(t[i] for t in times["transformers"])
            for i in (1, 0)
        ]
        print(f"ratio {label}/transformers: {ratio[0]:.3f} by CPU time, {ratio[1]:.3f} by wall clock")


if __name__ == "__main__":
    main()
