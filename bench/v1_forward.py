"""Forward time of a Sapiens v1 0.3b-shaped pose model as TorchScript and as an ExportedProgram
(both loaded through ``sapiens2.load_model``, as the pipelines get them) against a Sapiens2 0.4b
pose model, random weights, 1024x768, batch 1. Not a test: numbers depend on the machine.

    python bench/v1_forward.py --runs 3 --out /tmp/v1bench   # formats alternate within each round
    python bench/v1_forward.py --layers 2 --runs 1   # the same widths, 2 of the 24 layers (a busy CPU)

The v1 graph is a plain ViT of the spec's 0.3b shape (1024 wide, 24 layers, 16 heads, FFN 4096,
class token, absolute position embedding, LayerNorm, GELU) with v1's pose head (deconvs 768, 768;
1x1 convs 768, 768; 308 heatmaps); the ExportedProgram runs in float32 (the package's CPU
default) and in bfloat16 (the v1 demos' precision).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from sapiens2 import load_model  # noqa: E402


class Block(nn.Module):
    def __init__(self, c: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(c, eps=1e-6), nn.LayerNorm(c, eps=1e-6)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc1, self.fc2 = nn.Linear(c, ffn), nn.Linear(ffn, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class V1Pose(nn.Module):
    """The spec's v1 0.3b backbone + pose head (SAPIENS_V1_SPEC.md 1.1-1.2)."""

    def __init__(self, c: int = 1024, layers: int = 24, heads: int = 16, ffn: int = 4096) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, c, 16, 16, padding=2)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c))
        self.pos_embed = nn.Parameter(torch.randn(1, 1 + 64 * 48, c) * 0.02)
        self.blocks = nn.Sequential(*[Block(c, heads, ffn) for _ in range(layers)])
        self.ln = nn.LayerNorm(c, eps=1e-6)

        def up(i: int, o: int) -> list[nn.Module]:
            return [nn.ConvTranspose2d(i, o, 4, 2, 1, bias=False), nn.InstanceNorm2d(o), nn.SiLU()]

        def conv(i: int, o: int) -> list[nn.Module]:
            return [nn.Conv2d(i, o, 1), nn.InstanceNorm2d(o), nn.SiLU()]

        self.head = nn.Sequential(
            *up(c, 768), *up(768, 768), *conv(768, 768), *conv(768, 768), nn.Conv2d(768, 308, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.patch_embed(x)
        b, c, h, w = f.shape
        t = torch.cat([self.cls_token.expand(b, -1, -1), f.flatten(2).transpose(1, 2)], 1) + self.pos_embed
        t = self.ln(self.blocks(t))[:, 1:]
        return self.head(t.transpose(1, 2).reshape(b, c, h, w))


def load() -> str:
    return Path("/proc/loadavg").read_text().split(" ")[0]


def timed_rounds(
    models: dict[str, nn.Module], x: torch.Tensor, runs: int
) -> dict[str, list[tuple[float, float]]]:
    """``runs`` rounds, each timing every model once in turn, so a change of load touches every
    format alike: (wall seconds, CPU seconds of this process) per forward. The CPU seconds are
    the work done whatever else runs (with 2 threads, about twice the wall time on an idle
    machine); the 1-minute load average is printed before and after each forward."""
    out: dict[str, list[tuple[float, float]]] = {name: [] for name in models}
    with torch.inference_mode():
        for name, model in models.items():
            t0, c0 = time.perf_counter(), time.process_time()
            model(x)  # warm-up (not counted)
            print(f"warm-up {name}: {time.perf_counter() - t0:.2f} s, CPU {time.process_time() - c0:.2f} s "
                  f"(load now {load()})", flush=True)  # fmt: skip
        for r in range(runs):
            for name, model in models.items():
                before = load()
                t0, c0 = time.perf_counter(), time.process_time()
                model(x)
                out[name].append((time.perf_counter() - t0, time.process_time() - c0))
                wall, cpu = out[name][-1]
                print(
                    f"round {r + 1} {name}: {wall:.2f} s, CPU {cpu:.2f} s (load {before} -> {load()})",
                    flush=True,
                )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("/tmp/v1bench"))
    ap.add_argument("--skip-bf16", action="store_true", help="leave out the bfloat16 run (emulated on a CPU)")
    ap.add_argument("--layers", type=int, default=24, help="backbone layers of both models (published: 24)")
    args = ap.parse_args()
    args.out = args.out / f"layers{args.layers}"
    args.out.mkdir(parents=True, exist_ok=True)
    x = torch.randn(1, 3, 1024, 768)
    torch.manual_seed(0)
    ts, ep = args.out / "sapiens_0.3b_bench_torchscript.pt2", args.out / "sapiens_0.3b_bench_bfloat16.pt2"
    if not ts.exists() or not ep.exists():
        ref = V1Pose(layers=args.layers).eval()
        with torch.no_grad():
            torch.jit.save(torch.jit.trace(ref, x, check_trace=False), str(ts))
            torch.export.save(torch.export.export(ref, (x,)), str(ep))
        del ref
    s2 = args.out / "sapiens2_0.4b_pose"
    if not (s2 / "model.safetensors").exists():
        from tiny_checkpoints import make_tiny_checkpoint

        make_tiny_checkpoint(
            "pose", s2, hidden_size=1024, intermediate_size=4096, num_hidden_layers=args.layers,
            num_attention_heads=16, num_key_value_attention_heads=8,
            num_first_full_attention_layers=min(8, args.layers // 2),
            num_last_full_attention_layers=min(8, args.layers - args.layers // 2),
            head_config={"upsample_out_channels": [1024, 768], "conv_out_channels": [512, 512, 256]},
        )  # fmt: skip
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, layers {args.layers}, "
          f"load average {os.getloadavg()}")  # fmt: skip
    models = {}
    for name, path, dtype in (("v1 0.3b TorchScript fp32", ts, None), ("v1 0.3b ExportedProgram fp32", ep, None),
                              ("v1 0.3b ExportedProgram bf16", ep, "bf16"), ("Sapiens2 0.4b fp32", s2, None)):  # fmt: skip
        if dtype == "bf16" and args.skip_bf16:
            continue
        models[name] = load_model("pose", checkpoint=path, device="cpu", dtype=dtype)
        print(f"{name}: size {models[name].size}", flush=True)
    for name, seconds in timed_rounds(models, x, args.runs).items():
        wall, cpu = (statistics.median(s[i] for s in seconds) for i in (0, 1))
        print(f"{name}: median {wall:.2f} s per forward, CPU {cpu:.2f} s "
              f"({', '.join(f'{w:.2f}' for w, _ in seconds)})")  # fmt: skip


if __name__ == "__main__":
    main()
