"""Model zoo (torchvision style): CNN, ResNet-8/18/34 (CIFAR stem), VGG16 (CIFAR), MobileNetV2.

Every constructor takes ``num_classes``, ``in_channels`` and a ``width`` multiplier that
scales hidden channels/units (never the input or the number of classes), so the same
code builds the full model and the width-reduced models AdaptiveFL/HeteroFL need.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import torch
from torch import nn


def _w(channels: int, width: float) -> int:
    """Scaled channel count (at least 1)."""
    return max(1, int(round(channels * width)))


class CNN(nn.Module):
    """The 2-conv + 2-hidden-layer CNN used for MNIST/FMNIST by SHEFL and Fed-Ensemble."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 28, width: float = 1.0,
                 channels: tuple[int, int] = (32, 64), hidden: tuple[int, int] = (512, 128)) -> None:
        super().__init__()
        c1, c2 = (_w(c, width) for c in channels)
        h1, h2 = (_w(h, width) for h in hidden)
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


class BasicBlock(nn.Module):
    """ResNet basic block (two 3x3 convs) with a 1x1 projection shortcut when shapes change."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1,
                 norm: Callable[[int], nn.Module] = nn.BatchNorm2d) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = norm(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = norm(planes)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride, bias=False), norm(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet with the CIFAR stem (3x3 conv, stride 1, no max-pool)."""

    def __init__(self, blocks: tuple[int, ...], planes: tuple[int, ...], num_classes: int = 10,
                 in_channels: int = 3, width: float = 1.0, norm: Callable[[int], nn.Module] = nn.BatchNorm2d) -> None:
        super().__init__()
        planes = tuple(_w(p, width) for p in planes)
        self.conv1 = nn.Conv2d(in_channels, planes[0], 3, 1, 1, bias=False)
        self.bn1 = norm(planes[0])
        self.relu = nn.ReLU(inplace=True)
        layers, in_planes = [], planes[0]
        for i, (n, p) in enumerate(zip(blocks, planes, strict=True)):
            stage = []
            for j in range(n):
                stage.append(BasicBlock(in_planes, p, stride=2 if (i > 0 and j == 0) else 1, norm=norm))
                in_planes = p
            layers.append(nn.Sequential(*stage))
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


def resnet8(num_classes: int = 10, in_channels: int = 3, width: float = 1.0, **kw) -> ResNet:
    """ResNet-8 as in FENS (3 stages of one basic block, 64-128-256 channels)."""
    return ResNet((1, 1, 1), (64, 128, 256), num_classes, in_channels, width, **kw)


def resnet18(num_classes: int = 10, in_channels: int = 3, width: float = 1.0, **kw) -> ResNet:
    """ResNet-18 (He et al. 2016) with the CIFAR stem."""
    return ResNet((2, 2, 2, 2), (64, 128, 256, 512), num_classes, in_channels, width, **kw)


def resnet34(num_classes: int = 10, in_channels: int = 3, width: float = 1.0, **kw) -> ResNet:
    """ResNet-34 (He et al. 2016) with the CIFAR stem."""
    return ResNet((3, 4, 6, 3), (64, 128, 256, 512), num_classes, in_channels, width, **kw)


VGG16_CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


class VGG(nn.Module):
    """VGG16 for 32x32 inputs with batch norm and the 512-4096-4096-C classifier (AdaptiveFL)."""

    def __init__(self, cfg: tuple = VGG16_CFG, num_classes: int = 10, in_channels: int = 3, width: float = 1.0,
                 image_size: int = 32, hidden: int = 4096) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c = in_channels
        pools = 0
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(2))
                pools += 1
            else:
                out = _w(v, width)
                layers += [nn.Conv2d(c, out, 3, padding=1), nn.BatchNorm2d(out), nn.ReLU(inplace=True)]
                c = out
        self.features = nn.Sequential(*layers)
        spatial = max(1, image_size // 2**pools)
        h = _w(hidden, width)
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(c * spatial * spatial, h), nn.ReLU(inplace=True),
            nn.Linear(h, h), nn.ReLU(inplace=True), nn.Linear(h, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def vgg16(num_classes: int = 10, in_channels: int = 3, width: float = 1.0, image_size: int = 32) -> VGG:
    """VGG16 (CIFAR variant)."""
    return VGG(VGG16_CFG, num_classes, in_channels, width, image_size)


def mobilenetv2(num_classes: int = 10, in_channels: int = 3, width: float = 1.0) -> nn.Module:
    """torchvision MobileNetV2 with a stride-1 stem for small (32x32) images."""
    from torchvision.models import MobileNetV2

    m = MobileNetV2(num_classes=num_classes, width_mult=width)
    stem = m.features[0][0]
    m.features[0][0] = nn.Conv2d(in_channels, stem.out_channels, 3, 1, 1, bias=False)
    return m


def build_model(name: str, num_classes: int, in_shape: tuple[int, int, int], width: float = 1.0) -> nn.Module:
    """Build a model by its run-config name for inputs of shape (C, H, W)."""
    c, h, _ = in_shape
    if name == "cnn":
        return CNN(num_classes, c, h, width)
    if name == "resnet8":
        return resnet8(num_classes, c, width)
    if name == "resnet18":
        return resnet18(num_classes, c, width)
    if name == "resnet34":
        return resnet34(num_classes, c, width)
    if name == "vgg16":
        return vgg16(num_classes, c, width, image_size=h)
    if name == "mobilenetv2":
        return mobilenetv2(num_classes, c, width)
    raise ValueError(f"unknown model {name!r}")


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
