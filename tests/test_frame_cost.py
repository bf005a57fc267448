"""The CPU estimate's figure (``serving/frame_cost.py``, ``models/cost.py``): a forward's
multiply-accumulates are parameters x tokens plus its attention, which grows with the tokens'
square; a frame's seconds add per-pixel costs and no constant (issue 44 item 5: a fixed 5 s a
frame, really a tiny model's attention, made "about 2.5 min" of a 33 s run). Formulas only: no
wall-clock bound."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sapiens2 import serving
from sapiens2.models import cost
from sapiens2.models.zoo import ARCHS
from sapiens2.serving import frame_cost
from sapiens2.serving.frame_cost import (
    attention_macs,
    forward_macs,
    frame_network_pixels,
    served_forward_macs,
    served_frame_macs,
)
from sapiens2.tasks import registry

SEG = registry.get("seg")


def test_the_attention_term_grows_with_the_square_of_the_tokens() -> None:
    assert attention_macs(24, 1024, 2 * 768) == 4 * attention_macs(24, 1024, 768)
    assert attention_macs(24, 1024, 3072) == 2 * 24 * 3072**2 * 1024  # scores and values' mix per layer
    arch = ARCHS["0.4b"]
    for hw, tokens in (((1024, 768), 3072), ((512, 384), 768)):
        want = arch.params_b * 1e9 * tokens + attention_macs(arch.layers, arch.hidden, tokens)
        assert forward_macs(SEG, "0.4b", hw) == pytest.approx(want)
    big, small = forward_macs(SEG, "0.4b", (1024, 768)), forward_macs(SEG, "0.4b", (512, 384))
    assert 4 < big / small < 16  # between parameters x tokens (4x) and attention alone (16x)


def test_behind_the_4k_tokenizer_the_attention_counts_its_coarser_tokens() -> None:
    arch = ARCHS["1b-4k"]
    assert frame_cost._published_shape(arch) == (arch.layers, arch.hidden, 64)
    assert frame_cost._published_shape(ARCHS["1b"]) == (40, 1536, 16)


def test_a_loaded_model_reads_its_layers_and_width_from_its_config(tiny_checkpoints) -> None:
    """The tiny test model (4 layers of width 64): nearly all of its forward at 1024x768 is the
    attention that parameters x tokens missed."""
    manager = serving.ModelManager(device="cpu", checkpoints={"seg": tiny_checkpoints["seg"]})
    pipe = manager.get(SEG, None)
    params = sum(p.numel() for p in pipe.model.parameters())
    macs = served_forward_macs(manager, SEG, "custom")
    attention = attention_macs(4, 64, 3072)
    assert macs == pytest.approx(params * 3072 + attention)
    assert attention > 0.8 * macs
    assert served_frame_macs(manager, SEG, "custom", SEG.defaults()) == (macs, "")
    # a model without a configuration (a v1 graph, an ONNX file): its published size's, else none
    assert frame_cost._loaded_shape(SimpleNamespace(), "0.4b") == (24, 1024, 16)
    assert frame_cost._loaded_shape(SimpleNamespace(), None) is None


def test_a_frame_s_cpu_seconds_have_no_constant_and_follow_the_pixels() -> None:
    assert cost.cpu_frame_seconds(0.0, 0, 0) == 0.0
    net = frame_network_pixels(registry.get("pointmap"), "0.4b", {"use_segmentation": True})
    assert net == 2 * 1024 * 768  # the pointmap's forward and its borrowed segmentation's
    assert frame_network_pixels(SEG, "0.4b", {}, (512, 384)) == 512 * 384
    one = cost.cpu_frame_seconds(1e10, 1024 * 768, 640 * 480)
    assert cost.cpu_frame_seconds(1e10, 1024 * 768, 2 * 640 * 480) - one == pytest.approx(
        640 * 480 * cost.CPU_FRAME_PIXEL_S
    )
    assert one == pytest.approx(
        1e10 / cost.CPU_MACS_PER_S
        + 1024 * 768 * cost.CPU_NETWORK_PIXEL_S
        + 640 * 480 * cost.CPU_FRAME_PIXEL_S
    )
