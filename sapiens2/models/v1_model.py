"""A Sapiens v1 graph (TorchScript or ExportedProgram) behind the interface the pipelines use.

``model(pixel_values)`` takes what every pipeline feeds a Sapiens2 model (RGB normalised with
Sapiens2's mean/std) and returns the task's typed output. In between it applies v1's own rules,
read from the zoo (:data:`sapiens2.models.zoo.V1_RULES`): the input is renormalised to v1's
mean/std (one exact per-channel affine map), a fixed-batch graph gets padded batches, and a
28-class segmentation gains the channels of the 29-class set it lacks (Eyeglass) at a logit no
pixel picks, so names, palette, legends and borrowed masks stay the 29-class ones.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError
from .nn.outputs import FeaturesOutput, TaskOutput, output_type
from .zoo import SAPIENS2_RULES, Rules

#: the logit given to a class the model has no channel for: below any real logit, finite (softmax-safe)
MISSING_LOGIT = -1.0e4
#: output channels a v1 graph of each output type gives (SAPIENS_V1_SPEC.md 1.2): a file given
#: for the wrong task is named at its first forward instead of giving nonsense
V1_CHANNELS = {"PoseOutput": (17, 133, 308), "SegOutput": (28,), "NormalOutput": (3,), "DepthOutput": (1,)}


class V1Model(nn.Module):
    """A loaded v1 graph with its rules. ``graph``: the ScriptModule or the ExportedProgram's
    module; ``batch``: the graph's fixed batch size (None: any)."""

    def __init__(
        self,
        graph: nn.Module,
        *,
        task: str,
        output: str,
        rules: Rules,
        size: str | None,
        fmt: str,
        input_hw: tuple[int, int],
        batch: int | None = None,
    ) -> None:
        super().__init__()
        self.graph = graph
        self.task, self.output_name, self.rules, self.size, self.format = task, output, rules, size, fmt
        self.input_hw, self.batch = tuple(input_hw), batch
        self.keypoints: int | None = None  # a pose file's keypoint count when its name says it
        s2_mean, s2_std = torch.tensor(SAPIENS2_RULES.mean), torch.tensor(SAPIENS2_RULES.std)
        mean, std = torch.tensor(rules.mean), torch.tensor(rules.std)
        # x2 = (p - m2) / s2  ->  x1 = (p - m1) / s1 = x2 * s2 / s1 + (m2 - m1) / s1
        self.register_buffer("scale", (s2_std / std).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("shift", ((s2_mean - mean) / std).view(1, 3, 1, 1), persistent=False)

    def train(self, mode: bool = True) -> V1Model:
        # an ExportedProgram's module refuses train()/eval(); the graphs are inference-only anyway
        self.training = mode
        return self

    def v1_input(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Sapiens2-normalised pixels -> v1-normalised, in float32."""
        return pixel_values.float() * self.scale + self.shift

    def forward(self, pixel_values: torch.Tensor) -> TaskOutput:
        x = self.v1_input(pixel_values)
        dtype = next(self.graph.parameters()).dtype
        out = self._run(x.to(dtype)).float()
        return self._typed(out)

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        """The graph's output for ``x``; a fixed-batch graph runs padded batches of its size."""
        if self.batch is None or len(x) == self.batch:
            return _first(self.graph(x))
        parts = []
        for lo in range(0, len(x), self.batch):
            part = x[lo : lo + self.batch]
            pad = self.batch - len(part)
            if pad:
                part = torch.cat([part, part.new_zeros((pad, *part.shape[1:]))])
            parts.append(_first(self.graph(part))[: self.batch - pad])
        return torch.cat(parts)

    def _typed(self, out: torch.Tensor) -> TaskOutput:
        cls = output_type(self.output_name)
        want = V1_CHANNELS.get(self.output_name)
        if want is not None and (out.ndim != 4 or out.shape[1] not in want):
            raise CheckpointError(
                f"{getattr(self, 'checkpoint_path', 'This v1 file')} gives an output of shape "
                f"{tuple(out.shape)}; a Sapiens v1 {self.task} model gives {' or '.join(map(str, want))} "
                "channels. Pass the file for this task."
            )
        if cls is FeaturesOutput:  # v1 exports the patch grid only: its mean stands in for a CLS token
            return FeaturesOutput(cls_embedding=out.mean(dim=(-2, -1)), patch_features=out)
        for index in self.rules.seg_missing if self.output_name == "SegOutput" else ():
            filler = out.new_full((out.shape[0], 1, *out.shape[2:]), MISSING_LOGIT)
            out = torch.cat([out[:, :index], filler, out[:, index:]], dim=1)
        return cls.from_head(out)

    def describe(self) -> dict[str, Any]:
        return {"generation": self.rules.generation, "format": self.format, "size": self.size}


def _first(out: Any) -> torch.Tensor:
    """The pretrain graphs return a 1-tuple; the others a tensor."""
    while isinstance(out, (tuple, list)):
        out = out[0]
    return out


__all__ = ["MISSING_LOGIT", "V1Model"]
