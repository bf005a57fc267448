"""Export a Sapiens2 task model to ONNX (the network only; docs/ONNX.md).

The file takes ``pixel_values`` (float32, (N, 3, H, W), RGB, already normalised) with a dynamic
batch axis and gives the typed output's tensors under the names of ``onnx_runtime.OUTPUTS``. What a
consumer needs to preprocess and read it (input size, mean/std, outputs, keypoint or class names,
package version) goes into the file's metadata (:func:`metadata`), so nothing else is needed.

The release computes RoPE in bfloat16 even in an fp32 run; ONNX Runtime has no bfloat16
arithmetic on the CPU, so the export computes each product in float32 and rounds it to bfloat16
with a Cast pair, which gives the same numbers (:func:`_rope_as_bfloat16`).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import OptionError
from .nn import backbone as backbone_module
from .onnx_runtime import need, output_names
from .zoo import IMAGE_MEAN, IMAGE_STD, INPUT_SIZE, get_task

OPSET = 18
#: Files whose weights exceed this go to one external data file beside the .onnx (protobuf's 2 GB cap).
EXTERNAL_DATA_BYTES = 1_800_000_000


def _version() -> str:
    # the package's root module is loaded before any of its submodules; importing it here would
    # run against the layer order (docs/DESIGN.md)
    return str(getattr(sys.modules[__name__.split(".")[0]], "__version__", "unknown"))


def metadata(task: str, size: str | None, input_hw: tuple[int, int], dtype: str) -> dict[str, str]:
    """The ``metadata_props`` of an exported file (strings; lists and maps as JSON)."""
    props = {
        "sapiens2.task": task,
        "sapiens2.size": size or "custom",
        "sapiens2.dtype": dtype,
        "sapiens2.input_height": str(input_hw[0]),
        "sapiens2.input_width": str(input_hw[1]),
        "sapiens2.mean": json.dumps([round(m * 255.0, 4) for m in IMAGE_MEAN]),
        "sapiens2.std": json.dumps([round(s * 255.0, 4) for s in IMAGE_STD]),
        "sapiens2.channel_order": "RGB",
        "sapiens2.value_range": "0-255",
        "sapiens2.input": "pixel_values: float32 (N, 3, H, W) = (rgb - mean) / std",
        "sapiens2.outputs": json.dumps({name: meaning for name, _, meaning in output_names(task)}),
        "sapiens2.version": _version(),
    }
    from ..data.metadata import KEYPOINT_NAMES, SEG_CLASS_NAMES

    # the channel names an output's declared type has (keypoints of heatmaps, classes of logits)
    labels = {
        "PoseOutput": ("sapiens2.keypoints", KEYPOINT_NAMES),
        "SegOutput": ("sapiens2.classes", SEG_CLASS_NAMES),
    }
    if get_task(task).output in labels:
        key, names = labels[get_task(task).output]
        props[key] = json.dumps(list(names))
    return props


class _Graph(nn.Module):
    """The model with its typed output flattened to the tensors of :func:`output_names`."""

    def __init__(self, model: nn.Module, fields: list[str]) -> None:
        super().__init__()
        self.model, self.fields = model, fields

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(pixel_values)
        return tuple(getattr(out, f).float() for f in self.fields)


def export_onnx(
    task: str,
    out: str | os.PathLike,
    *,
    size: str | None = None,
    checkpoint: str | os.PathLike | None = None,
    int8: bool = False,
    fp16: bool = False,
) -> Path:
    """Write ``task``'s network as an ONNX file at ``out`` and return its path.

    ``size`` / ``checkpoint`` pick the weights as :func:`~sapiens2.models.loading.load_model`
    does. ``int8``: weights quantised to int8 after an fp32 export (ONNX Runtime's dynamic
    quantisation: faster on a CPU, approximate). ``fp16``: half-precision weights and
    activations (for GPUs; the input and outputs stay float32).
    """
    from .loading import load_model

    need("onnx"), need("onnxruntime")  # before minutes of loading and tracing
    if int8 and fp16:
        raise OptionError("Choose int8 or fp16, not both.")
    if checkpoint is not None and str(checkpoint).lower().endswith(".onnx"):
        raise OptionError(f"{checkpoint} is an ONNX file already; export from a .safetensors checkpoint.")
    target = check_target(out)
    dtype = torch.float16 if fp16 else torch.float32
    model = load_model(task, size, checkpoint=checkpoint, device="cpu", dtype=dtype)
    return export_model(model, target, int8=int8)


def check_target(out: str | os.PathLike) -> Path:
    """``out`` as a path for a new .onnx file, or OptionError."""
    target = Path(out).expanduser()
    if target.suffix.lower() != ".onnx":
        raise OptionError(f"The ONNX file's name must end in .onnx, got {str(out)!r}.")
    if target.is_dir():
        raise OptionError(f"{target} is a folder; give a file name ending in .onnx.")
    if not target.parent.is_dir():
        raise OptionError(f"The folder {target.parent} does not exist.")
    return target


def export_model(
    model: nn.Module, out: Path, *, int8: bool = False, input_hw: tuple[int, int] | None = None
) -> Path:
    """Export a loaded Sapiens2 model (from ``load_model``, on the CPU) to ``out``; see
    :func:`export_onnx`. ``input_hw``: another fixed input than the zoo's (models trained at
    another size; the tests' quick files)."""
    from tqdm import tqdm

    from .v1_model import V1Model

    if isinstance(model, V1Model):  # a Sapiens v1 graph: no module of ours to trace
        raise OptionError(
            f"{model.task}: ONNX export covers Sapiens2 checkpoints; this Sapiens v1 model is a "
            "TorchScript / ExportedProgram graph, which runs with torch (docs/SAPIENS_V1.md)."
        )
    task, size = model.task, model.size
    hw = tuple(input_hw) if input_hw else (get_task(task).input_size(size) if size else INPUT_SIZE)
    dtype = next(model.parameters()).dtype
    kind = "int8" if int8 else {torch.float16: "fp16"}.get(dtype, "fp32")
    # a bar the CLI shows and gr.Progress(track_tqdm=True) relays: tracing is the long step
    bar = tqdm(total=3 if int8 else 2, desc=f"Exporting {task} to ONNX ({kind})", unit="step", leave=False)
    with bar, tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        raw = _trace(model, Path(tmp) / "raw.onnx", hw)
        bar.update()
        if int8:
            raw = _quantize(raw, Path(tmp) / "int8.onnx")
            bar.update()
        _finish(raw, out, metadata(task, size, hw, kind))
        bar.update()
    return out


def _trace(model: nn.Module, raw: Path, hw: tuple[int, int]) -> Path:
    names = output_names(model.task)
    graph = _Graph(model, [f for _, f, _ in names]).eval()
    example = torch.zeros(2, 3, *hw)  # batch 2: nothing in the graph may take the batch for 1
    with _traceable(model, hw), torch.no_grad(), warnings.catch_warnings():
        # the tracer warns about the input checks' Python branches, fixed for a fixed H, W
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        # the TorchScript exporter: the dynamo one gives the same graph 8x slower here
        torch.onnx.export(
            graph,
            (example,),
            str(raw),
            input_names=["pixel_values"],
            output_names=[n for n, _, _ in names],
            dynamic_axes={"pixel_values": {0: "batch"}, **{n: {0: "batch"} for n, _, _ in names}},
            opset_version=OPSET,
            dynamo=False,
        )
    return raw


def _quantize(src: Path, dst: Path) -> Path:
    """Dynamic quantisation, int8 weights (QInt8), of the MatMuls (the transformer's linear layers)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src = _weights_as_initializers(src, dst.with_name("weights.onnx"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its advice to pre-process is for static quantisation
        quantize_dynamic(
            src,
            dst,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul"],
            use_external_data_format=src.stat().st_size > EXTERNAL_DATA_BYTES or _has_external(src),
        )
    return dst


def _weights_as_initializers(src: Path, dst: Path) -> Path:
    """``src`` with its large Constant nodes as initializers: the quantiser reads weights only from
    initializers, and the exporter writes the fused qkv weights (made when the model loads) as
    Constant nodes."""
    import onnx
    from onnx import numpy_helper

    proto = onnx.load(str(src))
    keep = []
    for node in proto.graph.node:
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        if node.op_type == "Constant" and value is not None and len(value.dims) == 2 and min(value.dims) > 1:
            tensor = numpy_helper.from_array(numpy_helper.to_array(value), node.output[0])
            proto.graph.initializer.append(tensor)
        else:
            keep.append(node)
    del proto.graph.node[:]
    proto.graph.node.extend(keep)
    large = sum(t.ByteSize() for t in proto.graph.initializer) > EXTERNAL_DATA_BYTES
    onnx.save_model(proto, str(dst), save_as_external_data=large, location=dst.name + ".data")
    return dst


def quantize_file(src: str | os.PathLike, out: str | os.PathLike) -> Path:
    """An int8 copy of an exported fp32 file (as ``export_onnx(..., int8=True)`` writes it, without
    exporting again)."""
    import onnx

    src, target = Path(src), check_target(out)
    props = {p.key: p.value for p in onnx.load(str(src), load_external_data=False).metadata_props}
    if props.get("sapiens2.dtype") != "fp32":
        raise OptionError(
            f"{src} is not an fp32 Sapiens2 export (sapiens2.dtype {props.get('sapiens2.dtype')})."
        )
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        raw = _quantize(src, Path(tmp) / "int8.onnx")
        _finish(raw, target, {**props, "sapiens2.dtype": "int8"})
    return target


def _has_external(path: Path) -> bool:
    return any(p != path for p in path.parent.iterdir() if p.name.startswith(path.stem))


def _finish(src: Path, out: Path, props: dict[str, str]) -> None:
    """Stamp the metadata, write ``out`` (external data when large) and run the full check."""
    import onnx

    proto = onnx.load(str(src))
    del proto.metadata_props[:]
    onnx.helper.set_model_props(proto, props)
    large = proto.ByteSize() > EXTERNAL_DATA_BYTES if _fits_proto(proto) else True
    data = out.with_name(out.name + ".data")
    for stale in (out, data):
        stale.unlink(missing_ok=True)
    if large:
        onnx.save_model(proto, str(out), save_as_external_data=True, location=data.name)
    else:
        onnx.save_model(proto, str(out))
    onnx.checker.check_model(str(out), full_check=True)


def _fits_proto(proto: Any) -> bool:
    try:
        proto.ByteSize()
    except Exception:  # protobuf refuses to size a message over 2 GB
        return False
    return True


@contextmanager
def _traceable(model: nn.Module, hw: tuple[int, int]) -> Iterator[None]:
    """The model as the exporter can write it, same numbers: the RoPE table frozen at the export's
    grid as float32 constants (rotated as the release does in bfloat16, :func:`_rope_as_bfloat16`,
    when the table is bfloat16), grouped K/V repeated for SDPA (the exporter has no grouped SDPA),
    parameters without grad (the tracer keeps them as constants)."""
    bb = model.backbone if hasattr(model, "backbone") else model
    grid = (hw[0] // bb.config.stride, hw[1] // bb.config.stride)
    cos, sin = bb._rope(*grid, torch.device("cpu"), bb.rope_dtype)
    bf16 = cos.dtype == torch.bfloat16
    table = (cos.float(), sin.float()) if bf16 else (cos, sin)
    torch.onnx.register_custom_op_symbolic("aten::rms_norm", _rms_norm_symbolic, OPSET)
    saved = (bb._rope, backbone_module.apply_rope, backbone_module.F)
    grads = {p: p.requires_grad for p in model.parameters()}
    bb._rope = lambda *_: table
    if bf16:
        backbone_module.apply_rope = _rope_as_bfloat16
    backbone_module.F = _ExportFunctional()
    model.requires_grad_(False)
    try:
        yield
    finally:
        bb._rope, backbone_module.apply_rope, backbone_module.F = saved
        for p, grad in grads.items():
            p.requires_grad_(grad)


def _rms_norm_symbolic(g: Any, x: Any, normalized_shape: Any, weight: Any, eps: Any) -> Any:
    """``aten::rms_norm`` (albedo's head) in opset-18 operators: ONNX has RMSNormalization only
    from opset 23, which ONNX Runtime's older releases and onnxruntime-web lack."""
    from torch.onnx import symbolic_helper as sh

    dims = len(sh._get_const(normalized_shape, "is", "normalized_shape"))
    value = None if sh._is_none(eps) else sh._get_const(eps, "f", "eps")
    axes = g.op("Constant", value_t=torch.arange(-dims, 0, dtype=torch.long))
    mean = g.op("ReduceMean", g.op("Mul", x, x), axes, keepdims_i=1)
    eps_t = g.op("Constant", value_t=torch.tensor(torch.finfo(torch.float32).eps if value is None else value))
    out = g.op("Div", x, g.op("Sqrt", g.op("Add", mean, eps_t)))
    return out if sh._is_none(weight) else g.op("Mul", out, weight)


class _ExportFunctional:
    """``torch.nn.functional`` for the backbone during an export: SDPA with grouped K/V repeated."""

    def __getattr__(self, name: str) -> Any:
        return getattr(F, name)

    @staticmethod
    def scaled_dot_product_attention(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, enable_gqa: bool = False
    ) -> torch.Tensor:
        if enable_gqa:
            k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
        return F.scaled_dot_product_attention(q, k, v)


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(torch.float32)


def _rope_as_bfloat16(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``backbone.apply_rope`` with bfloat16 tables, in float32 arithmetic rounded to bfloat16
    after every operation (what a bfloat16 multiply or add does), for runtimes without bfloat16."""
    half = q.shape[-1] // 2
    out = []
    for x in (q, k):
        xb = _bf16(x.float())
        prod = _bf16(xb * cos)
        first = _bf16(prod[..., :half] + _bf16(xb[..., half:] * sin[:, :half]))
        second = _bf16(prod[..., half:] + _bf16(xb[..., :half] * sin[:, half:]))
        out.append(torch.cat((first, second), dim=-1).to(x.dtype))
    return out[0], out[1]
