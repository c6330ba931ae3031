"""Model zoo (torchvision style): CNN, ResNet-8/18/34 (CIFAR stem), VGG16 (CIFAR), MobileNetV2, and the
model registry :data:`MODELS` (name -> builder, hidden widths, prunable, supported input sizes).

A run may also bring its own model: run-config ``model = "package.module:function"`` names a builder
``function(num_classes, input_shape) -> torch.nn.Module`` (:data:`BUILDER_SIGNATURE`, :func:`load_builder`,
:func:`check_builder`; docs/bring-your-own.md).

Every constructor takes ``num_classes``, ``in_channels`` and a ``width`` multiplier that
scales hidden channels/units (never the input or the number of classes). CNN, VGG and
ResNet also take ``widths``: the explicit output width of each hidden layer in order
(:func:`hidden_widths` gives the full model's), so AdaptiveFL/HeteroFL build real
smaller submodels whose tensors are leading slices of the full model's.
"""

from __future__ import annotations

import importlib
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from torch import nn


def _w(channels: int, width: float) -> int:
    """Scaled channel count (at least 1)."""
    return max(1, int(round(channels * width)))


class CNN(nn.Module):
    """The 2-conv + 2-hidden-layer CNN used for MNIST/FMNIST by SHEFL and Fed-Ensemble."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 28, width: float = 1.0,
                 channels: tuple[int, int] = (32, 64), hidden: tuple[int, int] = (512, 128),
                 widths: tuple[int, ...] | None = None) -> None:
        super().__init__()
        c1, c2, h1, h2 = widths if widths is not None else [_w(c, width) for c in (*channels, *hidden)]
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, c1, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        )
        feat = c2 * (image_size // 4) ** 2
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(feat, h1), nn.ReLU(inplace=True),
            nn.Linear(h1, h2), nn.ReLU(inplace=True), nn.Linear(h2, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class MLP(nn.Module):
    """A multilayer perceptron for a table's F features (``model = "mlp"``): three ReLU hidden layers (16, 64, 256: deeper layers wider, so that the pool of AdaptiveFL's Sec. 3.2, which keeps shallow layers whole, grows strictly in size),
    width-prunable (each hidden layer's outputs a leading slice of the full model's, as AdaptiveFL and HeteroFL
    prune)."""

    def __init__(self, num_classes: int, in_features: int, width: float = 1.0, hidden: tuple[int, ...] = (16, 64, 256),
                 widths: tuple[int, ...] | None = None) -> None:
        super().__init__()
        sizes = [in_features, *(widths if widths is not None else [_w(h, width) for h in hidden])]
        layers: list[nn.Module] = []
        for a, b in zip(sizes, sizes[1:]):
            layers += [nn.Linear(a, b), nn.ReLU(inplace=True)]
        self.net = nn.Sequential(*layers, nn.Linear(sizes[-1], num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))


class BasicBlock(nn.Module):
    """ResNet basic block (two 3x3 convs) with a 1x1 projection shortcut when shapes change."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1,
                 norm: Callable[[int], nn.Module] = nn.BatchNorm2d, project: bool | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = norm(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = norm(planes)
        self.relu = nn.ReLU(inplace=True)
        self.planes = planes
        self.shortcut = nn.Sequential()
        # `project` follows the full model's structure; a width-pruned identity block whose
        # input is wider than its output adds the leading input channels (a leading slice of
        # the identity), so submodels stay exact slices of the full model.
        if project if project is not None else (stride != 1 or in_planes != planes):
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride, bias=False), norm(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        short = self.shortcut(x)
        if short.shape[1] != self.planes:
            short = short[:, : self.planes]
        return self.relu(out + short)


class ResNet(nn.Module):
    """ResNet with the CIFAR stem (3x3 conv, stride 1, no max-pool)."""

    def __init__(self, blocks: tuple[int, ...], planes: tuple[int, ...], num_classes: int = 10,
                 in_channels: int = 3, width: float = 1.0, norm: Callable[[int], nn.Module] = nn.BatchNorm2d,
                 widths: tuple[int, ...] | None = None, pool: int = 1, stem: int | None = None) -> None:
        super().__init__()
        # hidden layers: the stem (default: as wide as the first stage), then one width per basic block
        # (its conv1, conv2 and shortcut)
        full = [planes[0] if stem is None else stem] + [p for n, p in zip(blocks, planes, strict=True) for _ in range(n)]
        w = list(widths) if widths is not None else [_w(c, width) for c in full]
        if len(w) != len(full):
            raise ValueError(f"ResNet widths: {len(w)} given, {len(full)} hidden layers")
        self.conv1 = nn.Conv2d(in_channels, w[0], 3, 1, 1, bias=False)
        self.bn1 = norm(w[0])
        self.relu = nn.ReLU(inplace=True)
        layers, in_planes, k = [], w[0], 1
        for i, n in enumerate(blocks):
            stage = []
            for j in range(n):
                stride = 2 if (i > 0 and j == 0) else 1
                project = stride != 1 or full[k - 1] != full[k]
                stage.append(BasicBlock(in_planes, w[k], stride=stride, norm=norm, project=project))
                in_planes, k = w[k], k + 1
            layers.append(nn.Sequential(*stage))
        self.layers = nn.Sequential(*layers)
        # pool = 2: FedKD's avg_pool2d(4) on the 8x8 map of a 32x32 input, flattened channel-major
        # (so a width-sliced model's head is still a leading slice of the full head)
        self.pool = nn.AdaptiveAvgPool2d(pool)
        self.fc = nn.Linear(in_planes * pool * pool, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


def resnet8(num_classes: int = 10, in_channels: int = 3, width: float = 1.0, **kw) -> ResNet:
    """ResNet-8 as FENS uses it (FedKD's): 3 stages of one basic block, 128-256-512 channels, a 2x2
    average-pooled 2048-wide head; 4.9 M parameters on CIFAR-10 (docs/readings.md#fens-resnet8)."""
    return ResNet((1, 1, 1), (128, 256, 512), num_classes, in_channels, width, pool=2, **kw)


def resnet18(num_classes: int = 10, in_channels: int = 3, width: float = 1.0, **kw) -> ResNet:
    """ResNet-18 (He et al. 2016) with the CIFAR stem."""
    return ResNet((2, 2, 2, 2), (64, 128, 256, 512), num_classes, in_channels, width, **kw)


def resnet34(num_classes: int = 10, in_channels: int = 3, width: float = 1.0, **kw) -> ResNet:
    """ResNet-34 (He et al. 2016) with the CIFAR stem."""
    return ResNet((3, 4, 6, 3), (64, 128, 256, 512), num_classes, in_channels, width, **kw)


VGG16_CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


class VGG(nn.Module):
    """VGG with batch norm and a 2-hidden-layer classifier with dropout (AdaptiveFL authors' VGG16 projector)."""

    def __init__(self, cfg: tuple = VGG16_CFG, num_classes: int = 10, in_channels: int = 3, width: float = 1.0,
                 image_size: int = 32, hidden: int = 4096, widths: tuple[int, ...] | None = None,
                 norm: Callable[[int], nn.Module] = nn.BatchNorm2d, dropout: float = 0.5) -> None:
        super().__init__()
        full = [v for v in cfg if v != "M"] + [hidden, hidden]  # hidden layers: convs, then 2 FC
        w = list(widths) if widths is not None else [_w(c, width) for c in full]
        if len(w) != len(full):
            raise ValueError(f"VGG widths: {len(w)} given, {len(full)} hidden layers")
        layers: list[nn.Module] = []
        c, k, pools = in_channels, 0, 0
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(2))
                pools += 1
            else:
                out = w[k]
                k += 1
                layers += [nn.Conv2d(c, out, 3, padding=1), norm(out), nn.ReLU(inplace=True)]
                c = out
        self.features = nn.Sequential(*layers)
        spatial = max(1, image_size // 2**pools)
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(c * spatial * spatial, w[-2]), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(w[-2], w[-1]), nn.ReLU(inplace=True), nn.Dropout(dropout), nn.Linear(w[-1], num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


VGG16_SMALL = (32, 256)  # inputs below 32 pixels: last max-pool dropped, 256-wide head (AdaptiveFL authors, 1-channel data)


def vgg16(num_classes: int = 10, in_channels: int = 3, width: float = 1.0, image_size: int = 32, **kw) -> VGG:
    """VGG16 as AdaptiveFL's authors build it: five max-pools and a 4096-wide head for 32x32 inputs (CIFAR);
    below 32 pixels (28x28 FMNIST) the last max-pool is dropped and the head is 256 wide
    (docs/readings.md#adaptivefl-models)."""
    if image_size < VGG16_SMALL[0]:
        return VGG(VGG16_CFG[:-1], num_classes, in_channels, width, image_size, hidden=VGG16_SMALL[1], **kw)
    return VGG(VGG16_CFG, num_classes, in_channels, width, image_size, **kw)


def mobilenetv2(num_classes: int = 10, in_channels: int = 3, width: float = 1.0) -> nn.Module:
    """torchvision MobileNetV2 with a stride-1 stem for small (32x32) images."""
    from torchvision.models import MobileNetV2

    m = MobileNetV2(num_classes=num_classes, width_mult=width)
    stem = m.features[0][0]
    m.features[0][0] = nn.Conv2d(in_channels, stem.out_channels, 3, 1, 1, bias=False)
    return m


@dataclass(frozen=True)
class ModelSpec:
    """One entry of the model registry: how to build a model and what it supports.

    Parameters
    ----------
    builder : callable
        ``builder(num_classes, in_channels, image_size, width, **kw) -> nn.Module``; ``kw`` may hold ``widths``.
    kind : str
        ``"image"`` or ``"text"`` (text models are built by :mod:`hetfl.common.text` from ``text-model``); ``"any"``
        for a bring-your-own builder (checked by :func:`check_builder`).
    widths : tuple of int or None
        Output widths of the full model's hidden layers in forward order (layer k = index k-1); ``None`` when the
        model cannot be width-pruned (AdaptiveFL/HeteroFL need it).
    min_size : int
        Smallest square input side the architecture runs on (e.g. VGG16's five 2x2 max-pools need 32).
    batchnorm : bool
        Whether the builder takes ``norm`` (a BatchNorm factory), so that :func:`build_model` can ask for batch
        statistics.
    small : tuple of (int, tuple of int), optional
        ``(side, widths)``: inputs smaller than ``side`` pixels build a variant whose hidden widths are ``widths``
        (VGG16's 256-wide head on 28x28 data).
    """

    builder: Callable[..., nn.Module] | None
    kind: str = "image"
    widths: tuple[int, ...] | None = None
    min_size: int = 1
    batchnorm: bool = False
    small: tuple[int, tuple[int, ...]] | None = None

    @property
    def prunable(self) -> bool:
        """Whether the model takes per-layer `widths` (width-wise submodels)."""
        return self.widths is not None

    def hidden_widths(self, shape: tuple[int, ...] | None = None) -> tuple[int, ...] | None:
        """Output widths of the full model's hidden layers for inputs of `shape` (C, H, W)."""
        if self.small is not None and shape is not None and min(shape[1:]) < self.small[0]:
            return self.small[1]
        return self.widths

    def unsupported(self, kind: str, shape: tuple[int, ...]) -> str | None:
        """Why this model cannot take inputs of a dataset of `kind` and `shape` (C, H, W), or None if it can."""
        if self.kind == "any":
            return None
        if kind != self.kind:
            return f"it is a {self.kind} model and the dataset holds {kind} data"
        if kind == "image" and min(shape[1:]) < self.min_size:
            return f"it needs images of at least {self.min_size}x{self.min_size}, the dataset has {shape[1]}x{shape[2]}"
        return None


def _resnet_widths(blocks: tuple[int, ...], planes: tuple[int, ...], stem: int | None = None) -> tuple[int, ...]:
    return (planes[0] if stem is None else stem,) + tuple(p for n, p in zip(blocks, planes, strict=True) for _ in range(n))


_RESNETS = {"resnet8": ((1, 1, 1), (128, 256, 512), 2), "resnet18": ((2, 2, 2, 2), (64, 128, 256, 512), 1),
            "resnet34": ((3, 4, 6, 3), (64, 128, 256, 512), 1),
            # AdaptiveFL authors' ResNet-18: a 64-wide stem, stages 96-128-256-512 (docs/readings.md#adaptivefl-models)
            "resnet18-afl": ((2, 2, 2, 2), (96, 128, 256, 512), 1, 64)}  # blocks, planes, pooled grid[, stem]


def _resnet_builder(blocks: tuple[int, ...], planes: tuple[int, ...], pool: int, stem: int | None = None) -> Callable[..., nn.Module]:
    return lambda nc, c, h, width, **kw: ResNet(blocks, planes, nc, c, width, pool=pool, stem=stem, **kw)


MODELS: dict[str, ModelSpec] = {
    "cnn": ModelSpec(lambda nc, c, h, width, **kw: CNN(nc, c, h, width, **kw), widths=(32, 64, 512, 128), min_size=4),
    **{name: ModelSpec(_resnet_builder(*arch), widths=_resnet_widths(arch[0], arch[1], *arch[3:]), min_size=1, batchnorm=True)
       for name, arch in _RESNETS.items()},
    "vgg16": ModelSpec(lambda nc, c, h, width, **kw: vgg16(nc, c, width, image_size=h, **kw),
                       widths=tuple(v for v in VGG16_CFG if v != "M") + (4096, 4096), min_size=16, batchnorm=True,
                       small=(VGG16_SMALL[0], tuple(v for v in VGG16_CFG if v != "M") + (VGG16_SMALL[1],) * 2)),
    "mobilenetv2": ModelSpec(lambda nc, c, h, width: mobilenetv2(nc, c, width), min_size=1),
    "mlp": ModelSpec(lambda nc, f, _h, width, **kw: MLP(nc, f, width, **kw), kind="tabular", widths=(16, 64, 256)),
    "text": ModelSpec(None, kind="text"),
}
"""The single source of the run-config `model` choices (name -> :class:`ModelSpec`)."""

PRUNABLE = tuple(name for name, spec in MODELS.items() if spec.prunable)  # models that take per-layer `widths`


IMPORT_PATH = r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*"  # run-config `model` values besides the registry's names
BUILDER_SIGNATURE = "fn(num_classes: int, input_shape: tuple[int, ...]) -> torch.nn.Module"
"""What a bring-your-own model builder is: ``input_shape`` is (C, H, W) for images (uint8 pixels normalised per
channel, NCHW float32 batches) and (text-max-length,) for texts (int64 token ids of ``text-model``'s tokenizer); the
module maps a batch to logits of shape (batch, num_classes). docs/bring-your-own.md"""


def load_builder(ref: str) -> Callable[..., nn.Module]:
    """The builder a ``"package.module:function"`` import path names.

    Raises
    ------
    ValueError
        One line: the path is malformed, the module cannot be imported (the error it raised), or it has no callable
        of that name.
    """
    if not re.fullmatch(IMPORT_PATH, ref):
        raise ValueError(f"run-config key 'model' = {ref!r} is not an import path; expected 'package.module:function'")
    module, _, attr = ref.partition(":")
    try:
        mod = importlib.import_module(module)
    except Exception as err:  # noqa: BLE001 - whatever the module raises on import is the user's to see
        raise ValueError(f"run-config key 'model' = {ref!r}: cannot import module {module!r} ({type(err).__name__}: {err}); it must be "
                         "importable by the ServerApp and every ClientApp (installed, or on PYTHONPATH)") from err
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise ValueError(f"run-config key 'model' = {ref!r}: module {module!r} has no callable {attr!r}")
    return fn


def check_builder(ref: str, num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    """Build a bring-your-own model and run a batch of two zero inputs through it (no gradient); the model.

    Raises
    ------
    ValueError
        One line naming `ref`: it cannot be loaded (:func:`load_builder`), raises, returns no ``nn.Module``, fails on
        the batch, or returns no (2, num_classes) logits.
    """
    fn = load_builder(ref)
    try:
        model = fn(num_classes, tuple(input_shape))
    except Exception as err:  # noqa: BLE001 - the builder is user code
        raise ValueError(f"run-config key 'model' = {ref!r} raised {type(err).__name__}: {err} when called as fn({num_classes}, "
                         f"{tuple(input_shape)}); expected {BUILDER_SIGNATURE}") from err
    if not isinstance(model, nn.Module):
        raise ValueError(f"run-config key 'model' = {ref!r} returned {type(model).__name__}; expected {BUILDER_SIGNATURE}")
    x = torch.zeros((2, *input_shape)) if len(input_shape) == 3 else torch.zeros((2, *input_shape), dtype=torch.int64)
    try:
        with torch.no_grad():
            out = model.eval()(x)
    except Exception as err:  # noqa: BLE001
        raise ValueError(f"run-config key 'model' = {ref!r} fails on a batch of shape {tuple(x.shape)} ({type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''}); expected {BUILDER_SIGNATURE}") from err
    finally:
        model.train()
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, num_classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"run-config key 'model' = {ref!r} maps a batch of shape {tuple(x.shape)} to {got}; expected logits of shape "
                         f"(2, {num_classes})")
    return model


def model_spec(name: str) -> ModelSpec:
    """The registry's entry of a model name, or the spec of an import path (any input kind, not width-prunable)."""
    if name in MODELS:
        return MODELS[name]
    if re.fullmatch(IMPORT_PATH, name):
        return ModelSpec(None, kind="any")  # built by build_model through load_builder
    raise ValueError(f"unknown model {name!r}; expected one of {tuple(MODELS)} or 'package.module:function'")


def build_model(name: str, num_classes: int, in_shape: tuple[int, ...], width: float = 1.0,
                widths: tuple[int, ...] | None = None, batch_stats: bool = False) -> nn.Module:
    """Build a model by its registry name (image models: inputs of shape (C, H, W); `widths` sets each hidden layer),
    or by an import path ``package.module:function`` (``function(num_classes, in_shape)``; `in_shape` as the data
    gives it, (C, H, W) or (text-max-length,)).

    ``batch_stats=True`` builds BatchNorm with ``track_running_stats=False``: normalisation by the batch's own
    statistics in training and evaluation, no running buffers in the state (AdaptiveFL authors;
    docs/readings.md#adaptivefl-batchnorm). Models without BatchNorm ignore it.
    """
    if name not in MODELS and re.fullmatch(IMPORT_PATH, name):
        if widths is not None:
            raise ValueError(f"model {name!r} does not take per-layer widths; use one of {PRUNABLE}")
        return load_builder(name)(num_classes, tuple(in_shape))
    spec = MODELS.get(name)
    if spec is None or spec.builder is None:
        raise ValueError(f"unknown image model {name!r}; expected one of {[n for n, s in MODELS.items() if s.builder]}")
    if widths is not None and not spec.prunable:
        raise ValueError(f"model {name!r} does not take per-layer widths; use one of {PRUNABLE}")
    kw: dict = {} if widths is None else {"widths": tuple(widths)}
    if spec.kind == "tabular":  # in_shape = (F,): the table's feature count
        return spec.builder(num_classes, int(in_shape[0]), 0, width, **kw)
    c, h, _ = in_shape
    if batch_stats and spec.batchnorm:
        kw["norm"] = partial(nn.BatchNorm2d, track_running_stats=False)
    return spec.builder(num_classes, c, h, width, **kw)


def pruned_widths(full: tuple[int, ...], ratio: float, start: int) -> tuple[int, ...]:
    """AdaptiveFL Sec. 3.2: layers k <= start keep width d_k, layers k > start keep floor(d_k * ratio) (>= 1)."""
    return tuple(d if k <= start else max(1, int(d * ratio)) for k, d in enumerate(full, 1))


def hidden_widths(name: str, in_shape: tuple[int, int, int] | None = None) -> tuple[int, ...]:
    """Output widths of the full model's hidden layers for inputs of `in_shape`, in forward order (layer k = index k-1)."""
    spec = MODELS.get(name)
    if spec is None or spec.widths is None:
        raise ValueError(f"model {name!r} has no per-layer widths; use one of {PRUNABLE}, or give a model of one's own "
                         "as a width-prunable builder, SubmodelPool(build, widths=(...)) with build(widths) -> nn.Module "
                         "(docs/api.md#adaptivefl)")
    return spec.hidden_widths(in_shape)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# --- state <-> numpy ------------------------------------------------------------


def get_state(model: nn.Module) -> OrderedDict[str, np.ndarray]:
    """The model's full state (parameters and buffers) as NumPy arrays (copies)."""
    return OrderedDict((k, v.detach().cpu().numpy().copy()) for k, v in model.state_dict().items())


def set_state(model: nn.Module, state: dict[str, np.ndarray]) -> None:
    """Load NumPy arrays into the model, casting to each tensor's dtype; keys must match."""
    own = model.state_dict()
    missing, extra = set(own) - set(state), set(state) - set(own)
    if missing or extra:
        raise KeyError(f"state mismatch: missing {sorted(missing)[:5]}, unexpected {sorted(extra)[:5]}")
    for k, t in own.items():
        v = np.asarray(state[k])
        if tuple(v.shape) != tuple(t.shape):
            raise ValueError(f"state '{k}': shape {v.shape} != model shape {tuple(t.shape)}")
        t.copy_(torch.as_tensor(np.array(v, copy=True)).to(t.dtype))
