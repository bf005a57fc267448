"""Our backbone and every head against the transformers reference, on the same tiny weights."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_checkpoints import TASK_NAMES, make_tiny_model, write_header_only, zoo_shapes

import sapiens2
from sapiens2.errors import InputImageError
from sapiens2.models.nn.model import arch_from_shapes, build_from_shapes
from sapiens2.models.zoo import ARCHS, is_v1

# Non-square everywhere (6x4 patch grid); the pointmap scale MLP is sized for its config's
# image_size, so its parity model is built for 256x192 (grid 16x12 -> 8x6 -> 4x3 -> 2x2).
HW = {task: (96, 64) for task in TASK_NAMES} | {"pointmap": (256, 192)}
OVERRIDES = {"pointmap": {"image_size": (256, 192)}}


def _pairs(task: str, ref_out, ours_out) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, reference tensor, our tensor) for every output of ``task``."""
    if task == "features":
        b, d, h, w = ours_out.patch_features.shape
        ref_patches = ref_out.last_hidden_state[:, 9:].transpose(1, 2).reshape(b, d, h, w)
        return [
            ("cls", ref_out.pooler_output, ours_out.cls_embedding),
            ("patches", ref_patches, ours_out.patch_features),
        ]
    return {
        "pose": lambda: [("heatmaps", ref_out.heatmaps, ours_out.heatmaps)],
        "seg": lambda: [("logits", ref_out.logits, ours_out.logits)],
        "normal": lambda: [("normals", ref_out.normals, ours_out.normals)],
        "pointmap": lambda: [
            ("pointmap", ref_out.pointmaps, ours_out.pointmap),
            ("scale", ref_out.scales, ours_out.scale),
        ],
        "matting": lambda: [
            ("foreground", ref_out.foregrounds, ours_out.foreground),
            ("alpha", ref_out.alphas, ours_out.alpha),
        ],
    }[task]()


@pytest.fixture(scope="module")
def parity_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[torch.nn.Module, Path]]:
    root = tmp_path_factory.mktemp("parity")
    out = {}
    for i, task in enumerate(TASK_NAMES):
        ref = make_tiny_model(task, seed=10 + i, **OVERRIDES.get(task, {}))
        ref.save_pretrained(root / task)
        out[task] = (ref, root / task)
    return out


@pytest.mark.parametrize("task", TASK_NAMES)
def test_parity_with_transformers_fp32_rope(task: str, parity_models) -> None:
    ref, folder = parity_models[task]
    ours = sapiens2.load_model(task, checkpoint=folder, device="cpu", rope_dtype=torch.float32)
    x = torch.randn(2, 3, *HW[task], generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        pairs = _pairs(task, ref(pixel_values=x), ours(x))
    h, w = HW[task]
    expected_shapes = {
        "heatmaps": (2, 308, h // 4, w // 4),
        "logits": (2, 29, h, w),
        "normals": (2, 3, h, w),
        "pointmap": (2, 3, h, w),
        "scale": (2, 1),
        "foreground": (2, 3, h, w),
        "alpha": (2, 1, h, w),
        "cls": (2, 64),
        "patches": (2, 64, h // 16, w // 16),
    }
    for name, r, o in pairs:
        assert tuple(o.shape) == expected_shapes[name]
        assert o.dtype == torch.float32
        assert r.abs().max() > 1e-3, f"{name}: reference output is ~0, the comparison would prove nothing"
        diff = (r - o).abs().max().item()
        assert diff <= 1e-4, f"{task}/{name}: max abs diff {diff:.2e}"


@pytest.mark.parametrize("task", ["pose", "features"])
def test_release_bf16_rope_stays_close(task: str, parity_models) -> None:
    ref, folder = parity_models[task]
    ours = sapiens2.load_model(task, checkpoint=folder, device="cpu")  # rope_dtype=None: release
    assert ours.rope_dtype is None
    x = torch.randn(1, 3, *HW[task], generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        pairs = _pairs(task, ref(pixel_values=x), ours(x))
    for name, r, o in pairs:
        diff = (r - o).abs().max().item()
        scale = r.abs().max().item()
        assert diff > 0, f"{name}: identical to fp32 RoPE, so the bf16 path did not run"
        assert diff <= 2e-2 * scale, f"{name}: bf16 RoPE moved the output by {diff:.2e} (scale {scale:.2e})"


def test_state_dict_keeps_checkpoint_names_and_values(parity_models) -> None:
    """q/k/v are fused into one projection in memory; state_dict() must give back the file."""
    _, folder = parity_models["pose"]
    ours = sapiens2.load_model("pose", checkpoint=folder, device="cpu")
    saved = load_file(str(folder / "model.safetensors"))
    mine = ours.state_dict()
    assert sorted(mine) == sorted(saved)
    for key, value in saved.items():
        assert torch.equal(mine[key], value), key


def _storages(tensors) -> dict[int, int]:
    """data pointer -> bytes of each distinct storage behind ``tensors``."""
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}


def test_fused_model_round_trips_to_release_names_without_extra_memory(parity_models, tmp_path) -> None:
    """pose's tiny backbone has full and grouped-query layers, QK-norm, registers, layer scale."""
    _, folder = parity_models["pose"]
    saved = load_file(str(folder / "model.safetensors"))
    ours = sapiens2.load_model("pose", checkpoint=folder, device="cpu", rope_dtype=torch.float32)
    names = [n for n, _ in ours.named_parameters()]
    assert "backbone.blocks.1.attn.qkv.weight" in names and not any(".attn.wq." in n for n in names)
    # parameters hold the file's bytes once: the fused q/k/v replaced the parts, none kept aside
    params = _storages(ours.parameters())
    assert sum(params.values()) == sum(t.numel() * t.element_size() for t in saved.values())
    # state_dict() gives release names as views of the fused weights, not copies
    mine = ours.state_dict()
    assert set(_storages(mine.values())) <= set(params)
    # save -> strict load: through the loader (strict key check) and into a fresh module
    path = tmp_path / "round_trip.safetensors"
    save_file({k: v.clone() for k, v in mine.items()}, str(path))  # clone: views share storage
    again = sapiens2.load_model("pose", checkpoint=path, device="cpu", rope_dtype=torch.float32)
    fresh, _ = build_from_shapes({k: tuple(v.shape) for k, v in saved.items()}, rope_dtype=torch.float32)
    fresh.to_empty(device="cpu").load_state_dict(mine, strict=True)
    x = torch.randn(1, 3, *HW["pose"], generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        expected = ours(x).heatmaps
        assert torch.equal(again(x).heatmaps, expected)
        assert torch.equal(fresh.eval()(x).heatmaps, expected)


def test_arch_read_from_shapes(parity_models) -> None:
    _, folder = parity_models["pointmap"]
    info = sapiens2.describe_checkpoint(folder)
    assert info["task"] == "pointmap" and info["size"] is None
    assert (info["hidden"], info["layers"], info["heads"], info["head_dim"]) == (64, 4, 4, 16)
    assert info["kv_heads"] == [4, 2, 2, 4]
    assert info["registers"] == 8 and info["ffn_hidden"] == 128
    assert info["head"] == {
        "kind": "pointmap",
        "outputs": 3,
        "input_conv": 64,
        "upsample": [16, 8, 4, 4],
        "conv": [4, 4, 4],
        "scale_conv": [16, 8, 4],
        "scale_mlp": [16, 8, 1],
    }


# Sapiens v1 sizes are graph files (TorchScript/ExportedProgram): never read by safetensors shapes
@pytest.mark.slow
@pytest.mark.parametrize("size", [s for s in ARCHS if not is_v1(s)])
def test_zoo_sizes_are_recognised_from_shapes(size: str, tmp_path: Path) -> None:
    shapes = zoo_shapes("features", size)
    params = sum(math.prod(s) for s in shapes.values())
    assert abs(params / 1e9 - ARCHS[size].params_b) <= 0.01 * ARCHS[size].params_b
    info = sapiens2.describe_checkpoint(write_header_only(tmp_path / "x.safetensors", shapes))
    assert info["size"] == size
    assert info["tokenizer_layers"] == ARCHS[size].tokenizer_layers
    model, arch = build_from_shapes(shapes)  # meta device: no memory
    assert model.size == size and model.task == "features" and arch.size == size


@pytest.mark.parametrize("task", [t for t in TASK_NAMES if sapiens2.TASKS[t].head])
def test_release_heads_are_recognised(task: str) -> None:
    info = arch_from_shapes(zoo_shapes(task, "1b"))
    assert info.task == task and info.size == "1b"
    assert info.head.kind == sapiens2.TASKS[task].head


def test_bad_inputs_raise_clear_errors(parity_models) -> None:
    _, folder = parity_models["features"]
    model = sapiens2.load_model("features", checkpoint=folder, device="cpu")
    cases = [
        (torch.zeros(3, 64, 48), "4-D tensor (B, 3, H, W), got shape (3, 64, 48)"),
        (torch.zeros(1, 1, 64, 48), "3 colour channels"),
        (torch.zeros(1, 3, 100, 48), "multiples of 16, got 100x48"),
        (torch.zeros(1, 3, 64, 0), "multiples of 16"),
        (
            torch.zeros(1, 3, 64, 48, device="meta"),
            "The input is on meta but the model on cpu; move it first",
        ),
    ]
    for x, message in cases:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
            model(x)
        assert isinstance(err.value, InputImageError)


def test_pointmap_scale_branch_names_its_input_size(parity_models) -> None:
    _, folder = parity_models["pointmap"]  # built for 256x192
    model = sapiens2.load_model("pointmap", checkpoint=folder, device="cpu")
    with pytest.raises(InputImageError, match="1024x768 for the released pointmap models"):
        model(torch.zeros(1, 3, 64, 48))


def test_tiny_pointmap_fixture_runs_at_network_input(tiny_checkpoints) -> None:
    model = sapiens2.load_model("pointmap", checkpoint=tiny_checkpoints["pointmap"], device="cpu")
    with torch.inference_mode():
        out = model(torch.zeros(1, 3, 1024, 768))
    assert out.pointmap.shape == (1, 3, 1024, 768) and out.scale.shape == (1, 1)


# ---- the 1b-4k window tokenizer (no transformers counterpart) ----


def _add_tokenizer(src: Path, dst: Path, layers: int = 2, seed: int = 0) -> Path:
    """A tiny pretrain checkpoint plus random tokenizer tensors (the release's key names)."""
    tensors = load_file(str(src / "model.safetensors"))
    d = tensors["cls_token"].shape[-1]
    g = torch.Generator().manual_seed(seed)
    extra = {"tokenizer.w_cls": (1, 1, d), "tokenizer.local_pos_embed": (1, 17, d)}
    for i in range(layers):
        p = f"tokenizer.blocks.{i}."
        extra |= {p + "ln1.weight": (d,), p + "ln2.weight": (d,)}
        for w in ("wq", "wk", "wv", "proj"):
            extra |= {p + f"attn.{w}.weight": (d, d), p + f"attn.{w}.bias": (d,)}
        extra |= {p + "ffn.w12.weight": (8 * d, d), p + "ffn.w12.bias": (8 * d,)}
        extra |= {p + "ffn.w3.weight": (d, 4 * d), p + "ffn.w3.bias": (d,)}
    for name, shape in extra.items():
        tensors[name] = 0.1 * torch.randn(shape, generator=g) + (1.0 if name.endswith("ln1.weight") else 0.0)
    dst.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dst))
    return dst


@pytest.fixture(scope="module")
def tiny_4k(parity_models, tmp_path_factory) -> Path:
    return _add_tokenizer(parity_models["features"][1], tmp_path_factory.mktemp("4k") / "tiny4k.safetensors")


def test_tokenizer_shapes_and_4k_grid(tiny_4k: Path) -> None:
    info = sapiens2.describe_checkpoint(tiny_4k)
    assert info["tokenizer_layers"] == 2 and info["size"] is None
    model = sapiens2.load_model("features", checkpoint=tiny_4k, device="cpu")
    assert len(model.tokenizer.blocks) == 2 and model.tokenizer.window == 4
    with torch.inference_mode():
        out = model(torch.zeros(1, 3, 4096, 3072))
    assert out.patch_features.shape == (1, 64, 64, 48)
    assert out.cls_embedding.shape == (1, 64)
    with pytest.raises(InputImageError, match="multiples of 64"):
        model(torch.zeros(1, 3, 1024, 784))


def test_tokenizer_pools_each_window_with_its_cls(tiny_4k: Path) -> None:
    """Window (i, j) of the output equals the blocks run on that window's 16 patches alone."""
    model = sapiens2.load_model("features", checkpoint=tiny_4k, device="cpu")
    tok = model.tokenizer
    x = torch.randn(1, 8 * 12, 64, generator=torch.Generator().manual_seed(3))  # an 8x12 patch grid
    with torch.inference_mode():
        out = tok(x, 8, 12, chunk=5)  # several chunks, one of them partial
        grid = x.view(8, 12, 64)
        for i, j in [(0, 0), (1, 2), (0, 2)]:
            window = grid[4 * i : 4 * i + 4, 4 * j : 4 * j + 4].reshape(1, 16, 64)
            t = torch.cat((tok.w_cls, window), dim=1) + tok.local_pos_embed
            for blk in tok.blocks:
                t = blk(t)
            torch.testing.assert_close(out[0, i * 3 + j], t[0, 0], atol=1e-5, rtol=1e-5)


# ---- RoPE numerics ----


def _release_rope(x: torch.Tensor, h: int, w: int, prefix: int) -> torch.Tensor:
    """The release's RoPE written out step by step from the spec (2.4): bfloat16 periods,
    coordinates, angles and sin/cos; x cast to bfloat16, only patch tokens rotated, cast back."""
    bf = {"dtype": torch.bfloat16}
    hd = x.shape[-1]
    periods = 100.0 ** (2 * torch.arange(hd // 4, **bf) / (hd // 2))
    ys = torch.arange(0.5, h, **bf) / h
    xs = torch.arange(0.5, w, **bf) / w
    coords = torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1).flatten(0, 1) * 2.0 - 1.0
    angles = (2 * math.pi * coords[:, :, None] / periods[None, None, :]).flatten(1, 2).tile(2)
    cos, sin = torch.cos(angles), torch.sin(angles)
    xb = x.to(torch.bfloat16)
    patches = xb[..., prefix:, :]
    rot_half = torch.cat((-patches[..., hd // 2 :], patches[..., : hd // 2]), dim=-1)
    rotated = patches * cos + rot_half * sin
    return torch.cat((xb[..., :prefix, :], rotated), dim=-2).to(x.dtype)


def test_release_rope_is_reproduced_bit_for_bit() -> None:
    from sapiens2.models.nn.backbone import RopeTable, apply_rope

    h, w, hd, prefix = 6, 4, 16, 9
    g = torch.Generator().manual_seed(4)
    q, k = (torch.randn(2, 3, prefix + h * w, hd, generator=g) for _ in range(2))
    cos, sin = RopeTable(hd, prefix)(h, w, torch.device("cpu"), None)
    ours_q, ours_k = apply_rope(q, k, cos, sin)
    assert ours_q.dtype == torch.float32
    assert torch.equal(ours_q, _release_rope(q, h, w, prefix))
    assert torch.equal(ours_k, _release_rope(k, h, w, prefix))
    fp32_q, _ = apply_rope(q, k, *RopeTable(hd, prefix)(h, w, torch.device("cpu"), torch.float32))
    assert 0 < (fp32_q - ours_q).abs().max() <= 0.02 * q.abs().max()  # the two behaviours differ, slightly
