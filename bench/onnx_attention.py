"""Attention three ways on the CPU: ONNX Runtime's fused ``com.microsoft.MultiHeadAttention``,
the MatMul/Softmax/MatMul graph the export writes, and torch's ``scaled_dot_product_attention``.

Answers whether fusing attention in the exported graph makes ONNX Runtime fp32 faster than torch
(docs/ONNX.md, "Speed"). Random inputs and weights of the backbone's shapes; runs alternate; medians.

One layer (default), or ``--forward SIZE``: the whole features network of that size exported as
the package exports it, its attention rewritten into fused nodes (:func:`fuse_attention`), and
torch, ORT and ORT with fused attention timed on one 1024x768 input.

    python bench/onnx_attention.py                       # 0.1b at 1024x768: 12 heads, 3081 tokens
    python bench/onnx_attention.py --heads 16 --threads 1
    python bench/onnx_attention.py --forward 0.1b --runs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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


def fuse_attention(proto: Any, heads: int) -> int:
    """Rewrite, in place, every SDPA pattern of ``proto`` (an ``onnx.ModelProto``) with ``heads``
    heads as one fused node; returns how many were fused. The pattern is what the TorchScript
    exporter writes for ``F.scaled_dot_product_attention(q, k, v)`` (default scale, no mask, q/k/v
    as (batch, heads, tokens, head_dim)) and the backbone's transpose/reshape after it::

        Mul(q, s) . MatMul . Mul(Transpose(k, 0 1 3 2), s) -> Softmax(-1) -> MatMul(., v)
            -> Transpose(0 2 1 3) -> Reshape(batch, tokens, width)

    The node takes q as (batch, tokens, width) and k, v as they are; its output is already
    (batch, tokens, width); its default scale is SDPA's, 1/sqrt(head_dim). Nodes the rewrite
    leaves unused are removed. The file then runs only in ONNX Runtime."""
    graph = proto.graph
    nodes = list(graph.node)
    producer = {out: n for n in nodes for out in n.output}
    users: dict[str, list[Any]] = {}
    for n in nodes:
        for name in n.input:
            users.setdefault(name, []).append(n)

    def only_user(name: str, op: str) -> Any:
        found = users.get(name, [])
        return found[0] if len(found) == 1 and found[0].op_type == op else None

    def attr(node: Any, name: str) -> Any:
        return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), None)

    replaced: dict[int, list[Any]] = {}  # id of the Reshape -> the nodes that take its place
    for soft in (n for n in nodes if n.op_type == "Softmax" and attr(n, "axis") in (-1, 3)):
        scores = producer.get(soft.input[0])
        out = only_user(soft.output[0], "MatMul")
        if scores is None or scores.op_type != "MatMul" or out is None or out.input[0] != soft.output[0]:
            continue
        q_scaled, k_scaled = (producer.get(i) for i in scores.input)
        if not (q_scaled and k_scaled and q_scaled.op_type == k_scaled.op_type == "Mul"):
            continue
        if not _same_value(producer, q_scaled.input[1], k_scaled.input[1]):  # sqrt(scale) both sides
            continue
        k_t = producer.get(k_scaled.input[0])
        if k_t is None or k_t.op_type != "Transpose" or list(attr(k_t, "perm") or []) != [0, 1, 3, 2]:
            continue
        back = only_user(out.output[0], "Transpose")
        if back is None or list(attr(back, "perm") or []) != [0, 2, 1, 3]:
            continue
        joined = only_user(back.output[0], "Reshape")
        if joined is None:
            continue
        q, k, v = q_scaled.input[0], k_t.input[0], out.input[1]
        tag = soft.name or soft.output[0]
        shape = f"{tag}/fused_q_shape"
        graph.initializer.append(helper.make_tensor(shape, TensorProto.INT64, [3], [0, 0, -1]))
        replaced[id(joined)] = [
            helper.make_node("Transpose", [q], [f"{tag}/fused_q_bsnh"], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [f"{tag}/fused_q_bsnh", shape], [f"{tag}/fused_q"]),
            helper.make_node(
                "MultiHeadAttention",
                [f"{tag}/fused_q", k, v],
                list(joined.output),
                name=f"{tag}/MultiHeadAttention",
                domain="com.microsoft",
                num_heads=heads,
            ),
        ]
    if not replaced:
        return 0
    rebuilt = [new for n in nodes for new in replaced.get(id(n), [n])]
    del graph.node[:]
    graph.node.extend(_live(rebuilt, [o.name for o in graph.output]))
    if not any(o.domain == "com.microsoft" for o in proto.opset_import):
        proto.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    used = {i for n in graph.node for i in n.input}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return len(replaced)


def _same_value(producer: dict[str, Any], a: str, b: str) -> bool:
    """``a`` and ``b`` are one tensor, or made by two nodes of one kind from the same inputs (the
    exporter computes SDPA's sqrt(scale) once for q and once for k)."""
    if a == b:
        return True
    na, nb = producer.get(a), producer.get(b)
    return bool(
        na and nb and na.op_type == nb.op_type and list(na.input) == list(nb.input) and not na.attribute
    )


def _live(nodes: list[Any], outputs: list[str]) -> list[Any]:
    """``nodes`` (in order) that the graph's ``outputs`` depend on."""
    producer = {out: n for n in nodes for out in n.output}
    needed, stack = set(), list(outputs)
    while stack:
        n = producer.get(stack.pop())
        if n is None or id(n) in needed:
            continue
        needed.add(id(n))
        stack.extend(i for i in n.input if i)
    return [n for n in nodes if id(n) in needed]


def whole_forward(size: str, threads: int, runs: int) -> None:
    """torch, ORT and ORT with fused attention on the ``size`` features network at 1024x768."""
    import onnx

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    from sapiens2.models.onnx_export import export_model

    sys.path.insert(0, str(root / "bench"))
    from request import shape_model

    model = shape_model("features", size, torch.device("cpu"), torch.float32)
    heads = model.config.heads
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    with tempfile.TemporaryDirectory() as tmp:
        plain = export_model(model, Path(tmp) / "plain.onnx")
        proto = onnx.load(str(plain))
        print(f"fused {fuse_attention(proto, heads)} attention layers", flush=True)
        fused = Path(tmp) / "fused.onnx"
        onnx.save_model(proto, str(fused), save_as_external_data=True, location="fused.onnx.data")
        del proto
        sessions = {"ORT": plain, "ORT fused attention": fused}
        sessions = {name: ort.InferenceSession(str(path), opts) for name, path in sessions.items()}
    x = torch.randn(1, 3, 1024, 768, generator=torch.Generator().manual_seed(0))
    feed = {"pixel_values": x.numpy()}

    def torch_forward() -> np.ndarray:
        with torch.inference_mode():
            return model(x).patch_features.numpy()

    calls = {"torch": torch_forward}
    calls |= {name: (lambda s=s: s.run(None, feed)[1]) for name, s in sessions.items()}
    _report(calls, runs, "torch")


def _report(calls: dict[str, Any], runs: int, base: str) -> None:
    """Each call's max difference to ``base``'s output, then ``runs`` alternating rounds, medians."""
    reference = calls[base]()
    for name, call in calls.items():
        diff = float(np.abs(call() - reference).max() / np.abs(reference).max())
        print(f"{name}: max |diff| / max |{base}| {diff:.2e}")
    times: dict[str, list[float]] = {name: [] for name in calls}
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    for _ in range(runs):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    base_s = statistics.median(times[base])
    for name, ts in times.items():
        t = statistics.median(ts)
        print(f"{name:28s} {t * 1e3:8.0f} ms  ({t / base_s:.2f}x {base}'s time)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=64 * 48 + 9, help="3081: 1024x768 plus 9 prefix tokens")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--forward", metavar="SIZE", help="the whole features network of this size instead")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.forward:
        whole_forward(args.forward, args.threads, args.runs)
        return
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
    _report(calls, args.runs, "torch SDPA")


if __name__ == "__main__":
    main()
