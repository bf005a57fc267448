"""Albedo, the task added to prove the registry: its head against a reference written here from
the spec (SAPIENS2_SPEC.md section 3) in the release's key names, its pipeline's rules against
the release's (vis_albedo.py, written here with cv2), and its visibility: shown in the page, API
and CLI only where a checkpoint is found (its weights are not on the Hub).
"""

from __future__ import annotations

import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tiny_checkpoints import RefAlbedoHead, tiny_albedo_head, zoo_shapes
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from test_fidelity import release_letterbox  # noqa: E402  (albedo is letterboxed as normals)

from sapiens2 import serving  # noqa: E402
from sapiens2.errors import CheckpointError, WeightsUnavailableError  # noqa: E402
from sapiens2.inputs.intake import load_image  # noqa: E402
from sapiens2.models import hub_cache  # noqa: E402
from sapiens2.models.checkpoints import CHECKPOINTS_ENV, Checkpoints  # noqa: E402
from sapiens2.models.loading import load_model  # noqa: E402
from sapiens2.models.nn.model import arch_from_shapes  # noqa: E402
from sapiens2.models.nn.outputs import DenseOutput, SegOutput  # noqa: E402
from sapiens2.models.zoo import TASKS  # noqa: E402
from sapiens2.tasks import registry  # noqa: E402
from sapiens2.tasks.albedo import AlbedoPipeline  # noqa: E402
from sapiens2.tasks.seg import SegPipeline  # noqa: E402

NET_H, NET_W = 1024, 768


@pytest.fixture(scope="module")
def albedo_checkpoint(tiny_checkpoints) -> tuple[Path, RefAlbedoHead]:
    """The tiny albedo checkpoint (the tiny normal backbone plus the reference head's random
    weights under ``decode_head.``, release key names) and that reference head."""
    seed = list(tiny_checkpoints).index("albedo")  # conftest seeds each task by its place
    return tiny_checkpoints["albedo"] / "model.safetensors", tiny_albedo_head(seed)


# ----------------------------------------------------------------------------- the model


@pytest.mark.slow
def test_the_head_equals_the_reference_on_tiny_random_weights(albedo_checkpoint) -> None:
    path, ref = albedo_checkpoint
    model = load_model("albedo", checkpoint=path, device="cpu", dtype=torch.float32)
    assert model.arch.task == "albedo" and model.arch.head.norm == "rms"
    feats = torch.randn(2, ref.input_conv[0].in_channels, 6, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, want = model.decode_head(feats), ref(feats)
    assert ours.shape == (2, 3, 96, 64)
    torch.testing.assert_close(ours, want, atol=1e-4, rtol=1e-4)
    # the whole model: the backbone's feature map through the same head, typed as DenseOutput
    x = torch.randn(1, 3, 96, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(x)
        tokens, grid = model.backbone(x)
        want = ref(model.backbone.feature_map(tokens, grid))
    assert isinstance(out, DenseOutput)
    torch.testing.assert_close(out.values, want, atol=1e-4, rtol=1e-4)


def test_the_tiny_checkpoint_is_written_in_the_release_norm_names(albedo_checkpoint) -> None:
    """SPEC section 3: each RMSNorm2d holds its ``nn.RMSNorm`` as ``norm``, so the norm keys end in
    ``.norm.weight`` and nothing sits directly at a norm's position."""
    from safetensors import safe_open

    path, _ = albedo_checkpoint
    with safe_open(str(path), framework="pt") as fh:
        keys = set(fh.keys())
    norms = {k for k in keys if k.startswith("decode_head.") and "norm" in k}
    want = {"decode_head.input_conv.1.norm.weight"}
    want |= {f"decode_head.upsample_blocks.{k}.2.norm.weight" for k in range(4)}
    want |= {f"decode_head.conv_layers.{i}.norm.weight" for i in (1, 4, 7)}
    assert norms == want
    direct = {"decode_head.input_conv.1.weight", "decode_head.conv_layers.1.weight"}
    assert not direct & keys


def test_norm_weights_directly_at_the_norms_position_are_refused(albedo_checkpoint, tmp_path) -> None:
    """A file with ``...conv_layers.1.weight`` (no ``.norm``) is not the release's layout: refused
    by name before any tensor is read, never loaded as instance norms with stray weights."""
    from safetensors.torch import load_file, save_file

    path, _ = albedo_checkpoint
    state = {k.replace(".norm.weight", ".weight"): v for k, v in load_file(path).items()}
    save_file(state, str(tmp_path / "flat.safetensors"))
    with pytest.raises(CheckpointError, match=r"unexpected keys: decode_head\.conv_layers\.1\.weight"):
        load_model("albedo", checkpoint=tmp_path / "flat.safetensors", device="cpu")


@pytest.mark.parametrize("kind", ["deconv", "pixel_shuffle", "pointmap"])
def test_every_head_kind_writes_and_reads_rms_norms_in_the_release_names(kind) -> None:
    """All heads build their norms with one helper, so an RMSNorm head of any kind keeps the
    release's ``.norm.weight`` names and reads back as the same configuration."""
    from sapiens2.models.nn.heads import HeadConfig, build_head, head_config_from_shapes

    k3 = ((8, 3), (4, 3))
    extra = {"scale_conv": ((8, 1),), "scale_mlp": ((48, 1),)} if kind == "pointmap" else {}
    if kind == "deconv":
        cfg = HeadConfig(kind, "conv_seg", 16, 29, upsample=((8, 4), (4, 4)), conv=((4, 1),), norm="rms")
    else:
        predictor = "conv_pointmap" if kind == "pointmap" else "conv_normal"
        cfg = HeadConfig(
            kind, predictor, 16, 3, input_conv=(16, 3), upsample=k3, conv=k3, norm="rms", **extra
        )
    state = build_head(cfg).state_dict()
    shapes = {f"decode_head.{k}": tuple(v.shape) for k, v in state.items()}
    norms = [k for k, v in shapes.items() if len(v) == 1 and not k.endswith(".bias") and "scale" not in k]
    assert norms and all(k.endswith(".norm.weight") for k in norms)
    read = head_config_from_shapes(shapes)
    assert (read.kind, read.norm, read.upsample, read.conv) == (kind, "rms", cfg.upsample, cfg.conv)


@pytest.mark.parametrize(
    ("size", "upsample"),
    [("0.4b", (768, 512, 256, 128)), ("1b", (768, 512, 256, 128)), ("5b", (1536, 768, 512, 256))],
)
def test_release_shapes_read_as_albedo_with_the_spec_widths(size, upsample) -> None:
    shapes = {k: v for k, v in zoo_shapes("normal", size).items() if not k.startswith("decode_head.")}
    hidden = shapes["backbone.cls_token"][-1]
    with torch.device("meta"):
        head = RefAlbedoHead(hidden, upsample)
    shapes |= {f"decode_head.{k}": tuple(v.shape) for k, v in head.state_dict().items()}
    info = arch_from_shapes(shapes)
    assert (info.task, info.size, info.head.norm) == ("albedo", size, "rms")
    assert info.head.widths()["upsample"] == list(upsample) and info.head.widths()["conv"] == [64, 32, 16]


# ----------------------------------------------------------------------------- the pipeline's rules


def field(c: int, h: int, w: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return F.interpolate(torch.randn(1, c, 6, 5, generator=gen), size=(h, w), mode="bicubic")


class Fake(nn.Module):
    """Returns ``make(x)`` and records the input."""

    def __init__(self, make) -> None:
        super().__init__()
        self.make, self.seen = make, []
        self.anchor = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor):
        self.seen.append(x.clone())
        return self.make(x)


def albedo_out(x: torch.Tensor) -> DenseOutput:
    # values spill outside [0, 1] so the clamp matters
    return DenseOutput(values=(0.5 + 0.6 * field(3, *x.shape[-2:], seed=4)).expand(len(x), -1, -1, -1))


def seg_out(x: torch.Tensor) -> SegOutput:
    return SegOutput(logits=4 * field(29, *x.shape[-2:], seed=5).expand(len(x), -1, -1, -1))


def photo(w: int, h: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([xx / w * 200, yy / h * 200, 100 + 80 * np.sin(xx / 37 + yy / 23)], -1)
    return np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)


def release_albedo(net: np.ndarray, box, out_hw, background: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """vis_albedo.py's rule: clamp [0, 1], crop the padding, bilinear to the photo, x255 cast to
    uint8, background grey 100. Returns (the float image before the cast, the picture)."""
    top, left, nh, nw = box
    crop = np.clip(net, 0, 1)[:, top : top + nh, left : left + nw].transpose(1, 2, 0)
    img = cv2.resize(np.ascontiguousarray(crop), (out_hw[1], out_hw[0]), interpolation=cv2.INTER_LINEAR)
    out = (img * 255).astype(np.uint8)
    out[background] = 100
    return img, out


def release_background(img: np.ndarray, logits_net: torch.Tensor) -> np.ndarray:
    """Seg class 0 at the photo's size: logits of the stretched input, bilinear, argmax."""
    up = F.interpolate(logits_net, size=img.shape[:2], mode="bilinear", align_corners=False)
    return (up[0].argmax(0) == 0).numpy()


@pytest.mark.slow
@pytest.mark.parametrize("wh", [(600, 471), (471, 600)])
def test_the_pipeline_follows_the_release_rules(wh) -> None:
    img = photo(*wh)
    model, seg = Fake(albedo_out), Fake(seg_out)
    pipe = AlbedoPipeline(model=model, seg=SegPipeline(model=seg))
    res = pipe(load_image(img, max_side=8192))
    ref_in, box = release_letterbox(img)
    mean = np.array([0.485, 0.456, 0.406]) * 255
    std = np.array([0.229, 0.224, 0.225]) * 255
    seen = model.seen[0][0].permute(1, 2, 0).double().numpy() * std + mean
    assert np.abs(seen - ref_in).max() < 1e-3  # letterboxed exactly as normals
    net = albedo_out(model.seen[0]).values[0].numpy()
    background = release_background(img, seg_out(seg.seen[0]).logits)
    assert np.array_equal(~res.mask, background)
    ref_float, want = release_albedo(net, box, img.shape[:2], background)
    np.testing.assert_allclose(res.albedo, ref_float, atol=1e-5)
    got = res.render()
    # cv2's and torch's float bilinear differ in the last bits, so the truncating cast may land
    # one grey level apart where x255 sits within 1e-5 x 255 of a whole number; equal elsewhere
    near = np.abs(ref_float * 255 - np.round(ref_float * 255)) < 255 * 1e-5
    diff = np.abs(got.astype(int) - want)
    assert diff.max() <= 1 and not (diff[~near & ~background[..., None].repeat(3, -1)]).any()
    assert (got[background] == 100).all() and res.albedo.min() >= 0 and res.albedo.max() <= 1
    assert np.array_equal(res.render(background="photo")[background], img[background])


def test_without_segmentation_every_pixel_is_kept(tmp_path) -> None:
    img = photo(300, 200)
    res = AlbedoPipeline(model=Fake(albedo_out))(img, use_segmentation=False)
    assert res.mask is None and res.albedo.shape == (200, 300, 3)
    names = sorted(p.name for p in res.save(tmp_path))
    assert names == ["image_albedo.npy", "image_albedo.png"]
    assert np.load(tmp_path / "image_albedo.npy").dtype == np.float16


# ----------------------------------------------------------------------------- where it shows


def test_hidden_without_a_checkpoint_and_off_the_space_preload(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("SAPIENS2_CHECKPOINTS", str(tmp_path))
    assert "albedo" in registry.declared() and "albedo" not in registry.all_tasks()
    assert registry.get("albedo").pipeline is AlbedoPipeline  # still runnable by name
    assert not any("albedo" in line for line in hub_cache.preload_from_hub())
    assert not any("albedo" in repo for repo in hub_cache.default_repos())
    with pytest.raises(
        WeightsUnavailableError, match=r"not on the Hugging Face Hub.*--checkpoint albedo=PATH"
    ):
        load_model("albedo", "1b")
    # the release's layout under $SAPIENS2_CHECKPOINTS shows it
    (tmp_path / "albedo").mkdir()
    (tmp_path / TASKS["albedo"].local_path("1b")).write_bytes(b"x")
    assert "albedo" in registry.all_tasks()


def test_a_checkpoint_shows_it_in_the_page_api_and_cli(
    albedo_checkpoint, tiny_checkpoints, monkeypatch, tmp_path
) -> None:
    from PIL import Image

    import app
    from sapiens2.cli import main

    path, _ = albedo_checkpoint
    monkeypatch.delenv("SAPIENS2_CHECKPOINTS", raising=False)
    names = list(registry.all_tasks(Checkpoints({"albedo": path})))
    assert names.index("albedo") == names.index("matting") + 1  # tab order: the zoo's row order
    manager = serving.ModelManager(device="cpu", checkpoints={"albedo": path, "seg": tiny_checkpoints["seg"]})
    demo = app.build_demo(manager, folders=serving.RequestFolders(tmp_path / "req"))
    tabs = [b.label for b in demo.blocks.values() if type(b).__name__ == "Tab"]
    assert "Albedo" in tabs
    api = demo.get_api_info()["named_endpoints"]
    assert [p["parameter_name"] for p in api["/albedo"]["parameters"]] == [
        "photo",
        "size",
        "use_segmentation",
        "background",
    ]
    Image.fromarray(photo(40, 30)).save(tmp_path / "p.png")
    code = main(["albedo", str(tmp_path / "p.png"), "--checkpoint", str(path), "--no-use-segmentation",
                 "--device", "cpu", "--out", str(tmp_path / "o")])  # fmt: skip
    assert code == 0
    out = np.asarray(Image.open(tmp_path / "o" / "p" / "p_albedo.png"))
    assert out.shape == (30, 40, 3)


def test_the_cli_names_it_only_with_a_checkpoint(monkeypatch, tmp_path, capsys) -> None:
    from sapiens2.cli import build_parser

    monkeypatch.delenv(CHECKPOINTS_ENV, raising=False)
    monkeypatch.setenv("SAPIENS2_CHECKPOINTS", str(tmp_path))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    # issue 44: every list names every task (the invalid-choice error always did); without weights
    # here albedo says what it needs
    assert "Needs --checkpoint (not on the Hub)" in " ".join(capsys.readouterr().out.split())
    assert build_parser().parse_args(["albedo", "x.png", "--checkpoint", "a.safetensors"]).task == "albedo"
