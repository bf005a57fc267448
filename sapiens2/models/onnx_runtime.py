"""An exported ``.onnx`` file run by ONNX Runtime, behind the model interface the pipelines use.

:class:`OnnxModel` is an ``nn.Module`` whose ``model(pixel_values)`` returns the task's typed output
(``sapiens2.models.nn.outputs``), with ``task``, ``size`` and ``checkpoint_path`` as ``load_model``
sets them; so every pipeline, clip, batch and Live stage runs it unchanged, with the package's own
pre- and post-processing. Tensors come back on the CPU in float32 (the pipelines finish there).
The file's metadata (``sapiens2.*``, written by :mod:`sapiens2.models.onnx_export`) says its task,
size and outputs.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import CheckpointError, DeviceError, InputImageError, OptionError
from ..runtime.threads import configure_cpu_threads
from .nn.outputs import TaskOutput, output_type
from .zoo import TASKS, get_task

#: Per output type: (ONNX output name, field of the output dataclass, meaning). ``{task}``: the task's name.
OUTPUTS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "FeaturesOutput": (
        ("cls", "cls_embedding", "(N, D) CLS embedding after the final norm"),
        ("patch_features", "patch_features", "(N, D, H/16, W/16) patch features after the final norm"),
    ),
    "PoseOutput": (("heatmaps", "heatmaps", "(N, K, H/4, W/4) keypoint heatmaps, K = sapiens2.keypoints"),),
    "SegOutput": (("logits", "logits", "(N, C, H, W) class logits, C = sapiens2.classes"),),
    "NormalOutput": (("normal", "normals", "(N, 3, H, W) surface normals (x, y, z), not unit length"),),
    "PointmapOutput": (
        ("pointmap", "pointmap", "(N, 3, H, W) canonical camera-space points; divide by scale for metres"),
        ("scale", "scale", "(N, 1) canonical focal (768 px at the input) / the photo's focal"),
    ),
    "MattingOutput": (
        ("foreground", "foreground", "(N, 3, H, W) premultiplied RGB foreground in [0, 1]"),
        ("alpha", "alpha", "(N, 1, H, W) alpha in [0, 1]"),
    ),
    "DenseOutput": (("{task}", "values", "(N, C, H, W) the head's {task} map as it is"),),
}


def output_names(task: str) -> list[tuple[str, str, str]]:
    """(ONNX name, output field, meaning) of ``task``'s outputs, in the file's order."""
    rows = OUTPUTS.get(get_task(task).output, OUTPUTS["DenseOutput"])
    return [(n.format(task=task), f, m.format(task=task)) for n, f, m in rows]


#: Execution providers used when present, best first (CPU is always there).
PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
_GPU_PROVIDERS = PROVIDERS[:2]


def is_onnx(path: str | os.PathLike | None) -> bool:
    """``path`` names an ONNX file (by its suffix)."""
    return path is not None and str(path).lower().endswith(".onnx")


def onnxruntime_available() -> bool:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def need(module: str) -> Any:
    """``onnx`` or ``onnxruntime``, imported; OptionError saying how to install it (the onnx extra)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise OptionError(
            f"ONNX export and ONNX Runtime need {module}: pip install 'sapiens2-space[onnx]' "
            "(onnx and onnxruntime)."
        ) from None


def _ort() -> Any:
    return need("onnxruntime")


def providers_for(device: str | torch.device | None) -> list[str]:
    """The execution providers for ``device``: None = every one present (GPU first), "cpu" = CPU
    only, "cuda" = the GPU ones (DeviceError when ONNX Runtime has none)."""
    have = set(_ort().get_available_providers())
    kind = None if device is None else torch.device(device).type
    if kind == "cpu":
        return ["CPUExecutionProvider"]
    chosen = [p for p in PROVIDERS if p in have]
    if kind is not None and not any(p in have for p in _GPU_PROVIDERS):
        raise DeviceError(
            f"This ONNX Runtime has no GPU provider for device {device!r} (it has: {', '.join(sorted(have))}); "
            "install onnxruntime-gpu, or run on the CPU."
        )
    return chosen


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The ``sapiens2.*`` metadata of an exported file (CheckpointError when it has none)."""
    onnx = need("onnx")
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"No ONNX file at {path}.")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as err:  # onnx raises protobuf's DecodeError and others for damaged files
        raise CheckpointError(
            f"Could not read {path} as ONNX ({err}): the file is damaged or not ONNX."
        ) from None
    props = {p.key: p.value for p in proto.metadata_props}
    # the weights' element count (int8 files: the quantised weights), for cost estimates
    props[".parameters"] = str(sum(math.prod(t.dims) for t in proto.graph.initializer))
    if props.get("sapiens2.task") not in TASKS:
        raise CheckpointError(
            f"{path} is an ONNX file without Sapiens2 metadata (sapiens2.task): export it with "
            "`sapiens2 export TASK --format onnx`."
        )
    return props


def describe_onnx(path: str | os.PathLike) -> dict[str, object]:
    """What an exported file holds (task, size or None, dtype, input size, outputs), from its metadata."""
    props = read_metadata(path)
    size = props.get("sapiens2.size")
    return {
        "path": str(path),
        "task": props["sapiens2.task"],
        "size": None if size in (None, "custom") else size,
        "format": "onnx",
        "dtype": props.get("sapiens2.dtype", "fp32"),
        "input_hw": [int(props["sapiens2.input_height"]), int(props["sapiens2.input_width"])],
        "outputs": json.loads(props.get("sapiens2.outputs", "{}")),
        "version": props.get("sapiens2.version"),
        "parameters": int(props[".parameters"]),
    }


class OnnxModel(nn.Module):
    """An exported Sapiens2 network run by ONNX Runtime; ``model(pixel_values)`` as the torch model's."""

    def __init__(self, path: str | os.PathLike, device: str | torch.device | None = None) -> None:
        super().__init__()
        ort = _ort()
        info = describe_onnx(path)
        self.task: str = str(info["task"])
        self.size: str | None = info["size"]  # type: ignore[assignment]
        self.onnx_dtype = str(info["dtype"])
        self.input_hw = tuple(info["input_hw"])  # type: ignore[arg-type]
        self.checkpoint_path = str(path)
        self.parameter_count = int(info["parameters"])  # type: ignore[call-overload]
        self.arch = None  # widths are not in the file; memory estimates use the zoo's size
        options = ort.SessionOptions()
        options.log_severity_level = 3  # ORT's warnings about unused initializers are not the user's
        options.intra_op_num_threads = configure_cpu_threads()  # the same CPU share as torch's
        try:
            self.session = ort.InferenceSession(str(path), options, providers=providers_for(device))
        except Exception as err:  # ORT raises its own Fail/InvalidGraph types
            raise CheckpointError(f"ONNX Runtime could not load {path}: {err}") from None
        self.providers = list(self.session.get_providers())
        names = output_names(self.task)
        have = [o.name for o in self.session.get_outputs()]
        if have != [n for n, _, _ in names]:
            raise CheckpointError(f"{path} has outputs {have}; a Sapiens2 {self.task} file has {names}.")
        self._fields = [f for _, f, _ in names]
        self.output_type = output_type(TASKS[self.task].output)
        # the pipelines read the model's device and dtype from its first parameter: CPU float32 is
        # where the inputs are made and the outputs come back
        self._anchor = nn.Parameter(torch.zeros(1), requires_grad=False)

    @property
    def runtime(self) -> str:
        return f"onnxruntime ({self.providers[0].replace('ExecutionProvider', '')}, {self.onnx_dtype})"

    def check_input(self, pixel_values: Any) -> None:
        """InputImageError for anything but a (B, 3, H, W) tensor at the file's input size."""
        if not isinstance(pixel_values, torch.Tensor) or pixel_values.ndim != 4 or pixel_values.shape[1] != 3:
            shape = tuple(getattr(pixel_values, "shape", ()))
            raise InputImageError(
                f"Expected a (B, 3, H, W) tensor, got {type(pixel_values).__name__} {shape}."
            )
        if tuple(pixel_values.shape[2:]) != self.input_hw:
            h, w = self.input_hw
            raise InputImageError(
                f"This ONNX model was exported for {h}x{w} inputs, got "
                f"{pixel_values.shape[2]}x{pixel_values.shape[3]}: run it at {h}x{w}."
            )

    def forward(self, pixel_values: torch.Tensor) -> TaskOutput:
        self.check_input(pixel_values)
        x = np.ascontiguousarray(pixel_values.detach().to("cpu", torch.float32).numpy())
        outs = self.session.run(None, {"pixel_values": x})
        return self.output_type(**{f: torch.from_numpy(o) for f, o in zip(self._fields, outs, strict=True)})


def load_onnx(task: str, path: str | os.PathLike, device: str | torch.device | None = None) -> OnnxModel:
    """The ``.onnx`` file at ``path`` as ``task``'s model (CheckpointError when it is another task's)."""
    get_task(task)
    model = OnnxModel(path, device)
    if model.task != task:
        raise CheckpointError(
            f"{path} is an ONNX {model.task} model, not {task}: load it with "
            f"load_model({model.task!r}, checkpoint=...) or pass a {task} file."
        )
    return model.eval()
