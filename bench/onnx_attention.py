"""One layer's attention three ways on the CPU: ONNX Runtime's fused ``com.microsoft.MultiHeadAttention``,
the MatMul/Softmax/MatMul graph the export writes, and torch's ``scaled_dot_product_attention``.

Answers whether fusing attention in the exported graph could make ONNX Runtime fp32 faster than
torch (docs/ONNX.md, "Speed"). Random inputs of the backbone's shapes; runs alternate; medians.

    python bench/onnx_attention.py                       # 0.1b at 1024x768: 12 heads, 3081 tokens
    python bench/onnx_attention.py --heads 16 --threads 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import onnxruntime as ort
import torch
from onnx import TensorProto, helper


def attention_graph(tokens: int, heads: int, head_dim: int, fused: bool) -> bytes:
    """A graph from q, k, v (1, tokens, heads x head_dim) to the attention output, same layout."""
    width = heads * head_dim
    io = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, tokens, width]) for n in ("q", "k", "v", "o")
    ]
    if fused:
        nodes = [
            helper.make_node(
                "MultiHeadAttention", ["q", "k", "v"], ["o"], domain="com.microsoft", num_heads=heads
            )
        ]
        inits = []
    else:
        inits = [
            helper.make_tensor("split", TensorProto.INT64, [4], [1, tokens, heads, head_dim]),
            helper.make_tensor("joined", TensorProto.INT64, [3], [1, tokens, width]),
            helper.make_tensor("scale", TensorProto.FLOAT, [], [head_dim**-0.5]),
        ]
        nodes = [helper.make_node("Reshape", [n, "split"], [f"{n}4"]) for n in ("q", "k", "v")]
        nodes += [
            helper.make_node("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3]),
            helper.make_node("Transpose", ["k4"], ["kh"], perm=[0, 2, 3, 1]),
            helper.make_node("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3]),
            helper.make_node("MatMul", ["qh", "kh"], ["scores"]),
            helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
            helper.make_node("Softmax", ["scaled"], ["weights"], axis=-1),
            helper.make_node("MatMul", ["weights", "vh"], ["oh"]),
            helper.make_node("Transpose", ["oh"], ["o4"], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", ["o4", "joined"], ["o"]),
        ]
    graph = helper.make_graph(nodes, "attention", io[:3], io[3:], inits)
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=64 * 48 + 9, help="3081: 1024x768 plus 9 prefix tokens")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    # ORT's pool spins after a run by default, which would steal the cores torch's next run needs
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sessions = {
        name: ort.InferenceSession(attention_graph(args.tokens, args.heads, args.head_dim, fused), opts)
        for name, fused in (("ORT MultiHeadAttention", True), ("ORT MatMul/Softmax/MatMul", False))
    }
    rng = np.random.default_rng(0)
    feed = {
        n: rng.standard_normal((1, args.tokens, args.heads * args.head_dim)).astype(np.float32) for n in "qkv"
    }
    q, k, v = (torch.from_numpy(feed[n]).view(1, args.tokens, args.heads, -1).transpose(1, 2) for n in "qkv")

    def sdpa() -> np.ndarray:
        with torch.inference_mode():
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return out.transpose(1, 2).reshape(1, args.tokens, -1).numpy()

    calls = {name: (lambda s=s: s.run(None, feed)[0]) for name, s in sessions.items()}
    calls["torch SDPA"] = sdpa
    reference = sdpa()
    for name, call in calls.items():
        print(f"{name}: max |diff| to torch {float(np.abs(call() - reference).max()):.2e}")
    times: dict[str, list[float]] = {name: [] for name in calls}
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    for _ in range(args.runs):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    torch_ms = statistics.median(times["torch SDPA"]) * 1e3
    for name, ts in times.items():
        ms = statistics.median(ts) * 1e3
        print(f"{name:28s} {ms:8.0f} ms  ({ms / torch_ms:.2f}x torch's time)")


if __name__ == "__main__":
    main()
