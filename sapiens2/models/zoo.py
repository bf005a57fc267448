"""The model zoo: backbone sizes and, per task, which checkpoints exist and where they live.

The rows of :data:`TASKS` are in tab order; each names its head kind, the head's predictor key
(which tells a checkpoint's task) and the typed output the model returns, so the model layer
needs no per-task branch.

Loading, the pipelines and the task declarations (``sapiens2.tasks.registry``) read this file;
facts come from the Sapiens2 release and its Hub model cards. A task registered later adds its
own row (``registry.register``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Network input (height, width) for every task checkpoint; the 1b-4k backbone takes 4x this.
INPUT_SIZE: tuple[int, int] = (1024, 768)
PATCH_SIZE = 16
NUM_REGISTER_TOKENS = 8
IMAGE_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGE_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)
HUB_ORG = "facebook"
WEIGHTS_LICENSE = "Sapiens2 License (see the model cards on the Hub)"
V1_LICENSE = "CC-BY-NC-4.0"
V1_LICENSE_URL = "https://creativecommons.org/licenses/by-nc/4.0/"


@dataclass(frozen=True)
class Rules:
    """What a model generation expects of its pixels and gives back, as data the pipelines read
    (docs/SAPIENS_V1.md): no task compares generation names.

    ``mean``/``std`` are on the 0-255 scale, RGB. ``dense_resize``: how seg/normal/depth make
    their network input ("release": each task's Sapiens2 rule; "stretch": the whole photo
    bilinearly to the input size, aspect ignored). ``seg_missing``: class ids of the 29-class set
    the model has no channel for (v1's 28 classes lack Eyeglass, id 2)."""

    generation: str
    license: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    dense_resize: str = "release"
    seg_missing: tuple[int, ...] = ()
    #: results say which generation and licence made them (the Space's own Sapiens2 need not)
    marked: bool = False
    #: the model runs only at its exported input (v1: a position embedding of 64x48 patches
    #: traced into the graph; an ExportedProgram's guards): Live offers it no faster input
    fixed_input: bool = False

    def mark(self, size: str | None) -> str:
        """What the page shows beside a result ("Sapiens v1 · 1b · CC-BY-NC-4.0"; "" unmarked)."""
        if not self.marked:
            return ""
        plain = (size or "custom").removeprefix(V1_PREFIX).removesuffix(V1_BF16)
        return f"{self.generation} · {plain} · {self.license}"


SAPIENS2_RULES = Rules(
    "Sapiens2", "Sapiens2 License", tuple(255 * m for m in IMAGE_MEAN), tuple(255 * s for s in IMAGE_STD)
)
#: The lite demo's numbers (the training configs use exact ImageNet x255; < 0.3 grey levels apart).
V1_RULES = Rules("Sapiens v1", V1_LICENSE, (123.5, 116.5, 103.5), (58.5, 57.0, 57.5), "stretch", (2,),
                 marked=True, fixed_input=True)  # fmt: skip
#: v1 sizes are ``v1-<size>`` (TorchScript, fp32) and ``v1-<size>-bf16`` (the ExportedProgram).
V1_PREFIX, V1_BF16 = "v1-", "-bf16"
V1_FORMATS = {"": "torchscript", V1_BF16: "bfloat16"}


def is_v1(size: str | None) -> bool:
    return bool(size) and str(size).startswith(V1_PREFIX)


def rules_for(size: str | None) -> Rules:
    """The rules of a zoo size (a custom file's come from its model: ``model.rules``)."""
    return V1_RULES if is_v1(size) else SAPIENS2_RULES


def v1_parts(size: str) -> tuple[str, str]:
    """ "v1-1b-bf16" -> ("1b", "bfloat16"); "v1-0.3b" -> ("0.3b", "torchscript")."""
    plain = size.removeprefix(V1_PREFIX)
    if plain.endswith(V1_BF16):
        return plain.removesuffix(V1_BF16), V1_FORMATS[V1_BF16]
    return plain, V1_FORMATS[""]


@dataclass(frozen=True)
class Arch:
    """One backbone size as published (the loader still reads real widths from the checkpoint)."""

    size: str
    hidden: int
    layers: int
    heads: int
    head_dim: int
    ffn_hidden: int
    params_b: float
    tflops_1024x768: float | None
    tokenizer_layers: int = 0  # > 0 only for the 4K window tokenizer


ARCHS: dict[str, Arch] = {
    a.size: a
    for a in (
        Arch("0.1b", 768, 12, 12, 64, 3072, 0.114, 0.342),
        Arch("0.4b", 1024, 24, 16, 64, 4096, 0.398, 1.260),
        Arch("0.8b", 1280, 32, 16, 80, 5120, 0.818, 2.592),
        Arch("1b", 1536, 40, 24, 64, 6144, 1.462, 4.715),
        Arch("1b-4k", 1536, 40, 24, 64, 6144, 1.607, None, tokenizer_layers=4),
        Arch("5b", 2432, 56, 32, 76, 9728, 5.071, 15.722),
    )
}
# Sapiens v1 (plain ViT; SAPIENS_V1_SPEC.md 1.1). Params and FLOPs of 0.3b and 1b are the model
# cards'; 0.6b and 2b scale 1b's by layers x width^2 (the rule that gives 0.3b's card value).
_V1 = (
    Arch("0.3b", 1024, 24, 16, 64, 4096, 0.336, 1.242),
    Arch("0.6b", 1280, 32, 16, 80, 5120, 0.65, 2.58),
    Arch("1b", 1536, 40, 24, 64, 6144, 1.169, 4.647),
    Arch("2b", 1920, 48, 32, 60, 7680, 2.19, 8.71),
)
ARCHS.update({V1_PREFIX + a.size + end: a for a in _V1 for end in V1_FORMATS})
#: v1 embed width -> its size (a file of another width is a custom model)
V1_SIZE_OF_WIDTH = {a.hidden: a.size for a in _V1}


@dataclass(frozen=True)
class TaskSpec:
    """A task's checkpoints: which sizes exist, where they live, which head they carry."""

    name: str  # short id used in repo and file names
    sizes: tuple[str, ...]
    head: str | None  # head kind in sapiens2.models.nn.heads, None for the bare backbone
    default_size_gpu: str
    default_size_cpu: str
    #: key name of the head's final conv ("conv_pose"): it says which task a checkpoint is for
    predictor: str | None = None
    #: the typed output ``model(pixels)`` returns, a class name in sapiens2.models.nn.outputs
    output: str = "DenseOutput"
    #: the Hub holds its weights; when False the task shows only where a local checkpoint is found
    on_hub: bool = True
    #: the release's word for the task in repo, file and folder names, when not ``name`` (the
    #: backbone's checkpoints are "pretrain": ``facebook/sapiens2-pretrain-0.4b``)
    release_name: str | None = None

    @property
    def release(self) -> str:
        """The task's word in the release's repo, file and folder names."""
        return self.release_name or self.name

    #: v1's network input when not 1024x768 (its pretrain models run at 1024x1024)
    v1_input: tuple[int, int] | None = None

    def repo_id(self, size: str) -> str:
        self.check_size(size)
        if is_v1(size):
            plain, fmt = v1_parts(size)
            return f"{HUB_ORG}/sapiens-{self.release}-{plain}-{fmt}"
        return f"{HUB_ORG}/sapiens2-{self.release}-{size}"

    def filename(self, size: str) -> str:
        """The original release file name (the Hub repos also hold ``model.safetensors``)."""
        self.check_size(size)
        if is_v1(size):  # v1 repos hold one .pt2 whose name changed over time: it is listed, not named
            plain, fmt = v1_parts(size)
            return f"sapiens_{plain}_*_{fmt}.pt2"
        # the release writes "1b_4k" in file names ("sapiens2_1b_4k_pretrain.safetensors"); the
        # size keeps its hyphen everywhere else (repo ids, the API)
        return f"sapiens2_{size.replace('-', '_')}_{self.release}.safetensors"

    def local_path(self, size: str) -> str:
        """Relative path under ``$SAPIENS2_CHECKPOINTS`` (the release's folder layout; for v1 the
        lite layout's folder ``v1/<mode>/<task>/checkpoints/sapiens_<size>``, one file in it)."""
        if is_v1(size):
            plain, fmt = v1_parts(size)
            return f"v1/{fmt}/{self.release}/checkpoints/sapiens_{plain}"
        return f"{self.release}/{self.filename(size)}"

    def input_size(self, size: str) -> tuple[int, int]:
        if is_v1(size):
            return self.v1_input or INPUT_SIZE
        return (4 * INPUT_SIZE[0], 4 * INPUT_SIZE[1]) if size.endswith("-4k") else INPUT_SIZE

    def rules(self, size: str | None) -> Rules:
        return rules_for(size)

    def default_size(self, cuda: bool) -> str:
        return self.default_size_gpu if cuda else self.default_size_cpu

    def check_size(self, size: str) -> None:
        if size not in self.sizes:
            from ..errors import OptionError

            raise OptionError(
                f"Size {size!r} does not exist for {self.name}; choose one of: {', '.join(self.sizes)}."
            )


_SIZES4 = ("0.4b", "0.8b", "1b", "5b")


def _v1(*sizes: str, bf16: tuple[str, ...] = ()) -> tuple[str, ...]:
    """v1 zoo sizes: TorchScript for ``sizes``, ExportedProgram (bf16) for ``bf16``: the repos
    SAPIENS_V1_SPEC.md 1.4 saw (pose: the 308-keypoint models; 17/133 are local files)."""
    return (*(V1_PREFIX + s for s in sizes), *(V1_PREFIX + s + V1_BF16 for s in bf16))


_V1_ALL = ("0.3b", "0.6b", "1b", "2b")

TASKS: dict[str, TaskSpec] = {
    t.name: t
    for t in (
        TaskSpec(
            "pose",
            _SIZES4 + _v1("0.3b", "0.6b", "1b", bf16=("1b",)),
            "deconv",
            "1b",
            "0.4b",
            "conv_pose",
            "PoseOutput",
        ),
        TaskSpec(
            "seg",
            _SIZES4 + _v1("0.3b", "0.6b", "1b", bf16=("1b",)),
            "deconv",
            "1b",
            "0.4b",
            "conv_seg",
            "SegOutput",
        ),
        TaskSpec(
            "normal",
            _SIZES4 + _v1(*_V1_ALL, bf16=_V1_ALL),
            "pixel_shuffle",
            "1b",
            "0.4b",
            "conv_normal",
            "NormalOutput",
        ),
        TaskSpec("pointmap", _SIZES4, "pointmap", "1b", "0.4b", "conv_pointmap", "PointmapOutput"),
        # Sapiens v1 only (relative depth): its 1b and 2b repos were seen, 0.3b/0.6b presumed
        TaskSpec("depth", _v1(*_V1_ALL), "v1", "v1-1b", "v1-1b", "conv_depth", "DepthOutput"),
        TaskSpec("matting", ("1b",), "pixel_shuffle", "1b", "1b", "conv_matting", "MattingOutput"),
        # the release ships albedo; its weights are not on the Hub yet (local checkpoints only)
        TaskSpec("albedo", _SIZES4, "pixel_shuffle", "1b", "0.4b", "conv_albedo", on_hub=False),
        TaskSpec(
            "features",
            ("0.1b", "0.4b", "0.8b", "1b", "1b-4k", "5b", *_v1(*_V1_ALL, bf16=("1b",))),
            None,
            "0.1b",
            "0.1b",
            output="FeaturesOutput",
            release_name="pretrain",
            v1_input=(1024, 1024),
        ),
    )
}

#: Pointmap scale = canonical focal / actual focal, canonical focal in network-input pixels.
POINTMAP_CANONICAL_FOCAL = 768.0


@dataclass(frozen=True)
class DetectorSpec:
    """The person detector used for top-down pose (see sapiens2.models.detector)."""

    repo_id: str
    filename: str
    revision: str | None
    local_path: str  # relative path under $SAPIENS2_CHECKPOINTS
    license: str


DETECTOR = DetectorSpec(
    repo_id="facebook/detr-resnet-50",
    filename="model.safetensors",
    revision=None,
    local_path="detector/detr-resnet-50.safetensors",
    license="Apache-2.0",
)


def get_task(task: str) -> TaskSpec:
    """Look a task up by name, with an error that lists the valid names."""
    try:
        return TASKS[task]
    except KeyError:
        from ..errors import OptionError

        raise OptionError(f"Unknown task {task!r}; choose one of: {', '.join(TASKS)}.") from None
