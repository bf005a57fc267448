"""Where a backbone forward's GPU time goes: kernels by CUDA time, grouped, against the floor.

For one size at 1024x768 (bf16, random weights): our forward, the same forward reduced to its
matrix products and attention (``bench/forward.py``'s floor), the SDPA call alone with each
backend, and the profiler's top kernels grouped into matrix products, attention and the rest.

    python bench/gpu_kernels.py --size 1b --json kernels.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu  # noqa: E402  (bench/gpu.py: random models as load_model loads them)


def ms(fn: Any, runs: int = 20) -> float:
    with torch.inference_mode():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def group(name: str) -> str:
    low = name.lower()
    if any(k in low for k in ("gemm", "cutlass", "sm90_xmma", "nvjet", "ampere_bf16", "matmul")):
        return "matrix products"
    if any(k in low for k in ("flash", "fmha", "attention", "cudnn", "sdpa")):
        return "attention"
    return "other"


def sdpa_backends(model: Any, batch: int, hw: tuple[int, int]) -> dict[str, float]:
    """One layer's SDPA at the model's shapes, per backend, grouped K/V and repeated K/V."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    a = model.blocks[0].attn
    n = model.num_prefix_tokens + (hw[0] // 16) * (hw[1] // 16)
    q = torch.randn(batch, a.heads, n, a.head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(batch, a.kv_heads, n, a.head_dim, device="cuda", dtype=torch.bfloat16) for _ in "kv")
    rep = a.heads // a.kv_heads
    kr, vr = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    out: dict[str, float] = {}
    flops = 4 * batch * a.heads * n * n * a.head_dim
    for name, backend in [
        ("flash", SDPBackend.FLASH_ATTENTION),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
    ]:
        for label, args, gqa in [("gqa", (q, k, v), rep > 1), ("repeated", (q, kr, vr), False)]:
            try:
                with sdpa_kernel([backend]):
                    t = ms(lambda a=args, g=gqa: F.scaled_dot_product_attention(*a, enable_gqa=g))
                out[f"{name} {label}"] = t
                print(f"  sdpa {name:9s} {label:8s} {t:7.3f} ms  {flops / t / 1e9:6.0f} TFLOP/s", flush=True)
            except RuntimeError as err:
                out[f"{name} {label}"] = None
                print(f"  sdpa {name:9s} {label:8s} unavailable: {str(err)[:80]}", flush=True)
    return out


def with_unfused_rms_norm(fn: Any) -> Any:
    """``fn()`` with the backbone's CUDA RMSNorm in its unfused form (a norm reduction, then
    fp32 multiplies), the form used before the fused kernel: a before/after in one run."""
    from sapiens2.models.nn import backbone

    fused = backbone.F.rms_norm

    def unfused(x: torch.Tensor, shape: Any, weight: Any = None, eps: float = 1e-6) -> torch.Tensor:
        r = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32)
        return torch.mul(x, torch.rsqrt(r.square() / x.shape[-1] + eps)).to(x.dtype)

    backbone.F.rms_norm = unfused
    try:
        return fn()
    finally:
        backbone.F.rms_norm = fused


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    hw = (1024, 768)
    dev = torch.device("cuda")
    model = gpu.loaded_copy(gpu.random_model("features", args.size, dev), torch.bfloat16)
    x = torch.randn(args.batch, 3, *hw, device=dev, dtype=torch.bfloat16)
    flops = gpu.count_flops(lambda: model(x), model)
    floor = gpu.forward_bench.products_only(model, x)
    res: dict[str, Any] = {"size": args.size, "batch": args.batch, "gflop": flops / 1e9}
    res["ours_ms"] = ms(lambda: model(x))
    res["ours_unfused_rmsnorm_ms"] = with_unfused_rms_norm(lambda: ms(lambda: model(x)))
    res["floor_ms"] = ms(lambda: floor(x))
    print(
        f"{args.size} b{args.batch}: {flops / 1e12:.2f} TFLOP; ours {res['ours_ms']:.2f} ms "
        f"(unfused RMSNorm {res['ours_unfused_rmsnorm_ms']:.2f} ms); floor {res['floor_ms']:.2f} ms"
    )
    res["sdpa_ms_one_layer"] = sdpa_backends(model, args.batch, hw)

    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            model(x)
        torch.cuda.synchronize()
    kernels = defaultdict(lambda: [0.0, 0])
    for ev in prof.key_averages():
        t = getattr(ev, "self_device_time_total", None) or getattr(ev, "self_cuda_time_total", 0)
        if t:
            kernels[ev.key][0] += t / 3e3  # us over 3 runs -> ms per forward
            kernels[ev.key][1] += ev.count // 3
    groups: dict[str, float] = defaultdict(float)
    for name, (t, _) in kernels.items():
        groups[group(name)] += t
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:25]
    res["groups_ms"] = dict(groups)
    res["top_kernels"] = [{"name": k[:160], "ms": t, "calls": c} for k, (t, c) in top]
    print("groups (ms per forward): " + ", ".join(f"{g} {t:.2f}" for g, t in groups.items()))
    for k, (t, c) in top:
        print(f"  {t:7.3f} ms  x{c:4d}  {k[:110]}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
