"""ResNet-18 and ResNet-50 in torchvision's layout (conv1 7x7 stride 2, bn1, relu, maxpool,
layer1..layer4, avgpool, fc), written here because torchvision does not import beside torch 2.13.

As in torchvision, each block holds ONE ``self.relu = nn.ReLU(inplace=True)`` module and calls it
at several sites (twice in BasicBlock, three times in Bottleneck): a lowering that maps modules to
call sites one-to-one must cope with it. The stride of a Bottleneck sits on its 3x3 conv (ResNet
v1.5), the downsample is a 1x1 conv + BatchNorm.

``resnet18()`` / ``resnet50()`` build the bare random-init model (torchvision init, seeded);
``resnet18_case()`` / ``resnet50_case()`` build a ModelCase: BatchNorm statistics set from
synthetic low-frequency ImageNet-normalized images (see ``qbackend.models.synthetic``), then
calibration and evaluation batches of such images. ``residual_gamma`` sets the weight of each
residual branch's last BatchNorm (bn2 / bn3; torchvision's ``zero_init_residual`` is 0.0, the
default 1.0 is torchvision's default init); below 1 the random network is far less chaotic, see
``qbackend.models.synthetic``.
"""
from __future__ import annotations

from typing import Type, Union

import torch
from torch import nn

from .case import seeded
from .synthetic import image_model_case, torchvision_init


def conv3x3(in_planes: int, out_planes: int, stride: int = 1, groups: int = 1, dilation: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=dilation, groups=groups,
                     bias=False, dilation=dilation)


def conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """ResNet-18's block: two 3x3 convs and the residual add."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)  # called twice in forward
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class Bottleneck(nn.Module):
    """ResNet-50's block: 1x1, 3x3, 1x1 convs and the residual add."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        width = planes
        self.conv1 = conv1x1(inplanes, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = conv1x1(width, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)  # called three times in forward
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        out = self.relu(out)
        out = self.conv3(out)
        out = self.bn3(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


Block = Type[Union[BasicBlock, Bottleneck]]


class ResNet(nn.Module):
    """ResNet as torchvision defines it (random init), for the zoo."""

    def __init__(self, block: Block, layers: list[int], num_classes: int = 1000, residual_gamma: float = 1.0):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        torchvision_init(self)
        if residual_gamma != 1.0:  # torchvision's zero_init_residual, with any value
            for m in self.modules():
                if isinstance(m, Bottleneck):
                    nn.init.constant_(m.bn3.weight, residual_gamma)
                elif isinstance(m, BasicBlock):
                    nn.init.constant_(m.bn2.weight, residual_gamma)

    def _make_layer(self, block: Block, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                conv1x1(self.inplanes, planes * block.expansion, stride),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.maxpool(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        x = self.fc(x)
        return x


def resnet18(num_classes: int = 1000, seed: int = 0, residual_gamma: float = 1.0) -> ResNet:
    """Random-init ResNet-18 (BasicBlock, [2, 2, 2, 2]), eval mode, weights drawn with `seed`."""
    with seeded(seed):
        return ResNet(BasicBlock, [2, 2, 2, 2], num_classes, residual_gamma).eval()


def resnet50(num_classes: int = 1000, seed: int = 0, residual_gamma: float = 1.0) -> ResNet:
    """Random-init ResNet-50 (Bottleneck, [3, 4, 6, 3]), eval mode, weights drawn with `seed`."""
    with seeded(seed):
        return ResNet(Bottleneck, [3, 4, 6, 3], num_classes, residual_gamma).eval()


def resnet18_case(*, batch_size: int = 8, num_calibration_batches: int = 4, num_eval_batches: int = 2,
                  image_size: int = 224, num_classes: int = 1000, residual_gamma: float = 1.0, seed: int = 0):
    """ResNet-18 ModelCase on synthetic images (static mode, logits, no metric)."""
    return image_model_case("resnet18", resnet18(num_classes, seed, residual_gamma), batch_size=batch_size,
                            num_calibration_batches=num_calibration_batches, num_eval_batches=num_eval_batches,
                            image_size=image_size, seed=seed)


def resnet50_case(*, batch_size: int = 8, num_calibration_batches: int = 4, num_eval_batches: int = 2,
                  image_size: int = 224, num_classes: int = 1000, residual_gamma: float = 1.0, seed: int = 0):
    """ResNet-50 ModelCase on synthetic images (static mode, logits, no metric)."""
    return image_model_case("resnet50", resnet50(num_classes, seed, residual_gamma), batch_size=batch_size,
                            num_calibration_batches=num_calibration_batches, num_eval_batches=num_eval_batches,
                            image_size=image_size, seed=seed)
