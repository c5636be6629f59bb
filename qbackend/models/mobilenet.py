"""MobileNetV2 in torchvision's layout (width 1.0): ``features`` = ConvBNReLU 3x3 stride 2 (3 -> 32),
17 inverted residual blocks, ConvBNReLU 1x1 (320 -> 1280); then global average pooling and
``classifier`` = Dropout(0.2) + Linear(1280, num_classes). Written here because torchvision does not
import beside torch 2.13.

ConvBNReLU is Conv2d (no bias) + BatchNorm2d + ReLU6; an inverted residual block is an optional
1x1 expansion ConvBNReLU, a depthwise 3x3 ConvBNReLU (groups = channels) and a linear 1x1
projection (Conv2d + BatchNorm2d, no activation), with the residual add ``x + self.conv(x)`` when
the stride is 1 and the input and output channels match.

``mobilenet_v2()`` builds the bare random-init model (torchvision init: Kaiming-normal fan_out
convs, BatchNorm 1/0, Linear N(0, 0.01); seeded); ``mobilenet_v2_case()`` builds a ModelCase with
BatchNorm statistics set from synthetic low-frequency ImageNet-normalized images (see
``qbackend.models.synthetic``) and calibration/evaluation batches of such images.
``residual_gamma`` sets the weight of the last BatchNorm of each block with a residual add
(default 1.0, torchvision's init); see ``qbackend.models.synthetic`` on why one might lower it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .case import seeded
from .synthetic import image_model_case, torchvision_init


def _make_divisible(v: float, divisor: int = 8, min_value: int | None = None) -> int:
    """Round channels to a multiple of `divisor`, never going down by more than 10%."""
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class ConvBNReLU(nn.Sequential):
    """Conv2d (no bias, 'same' padding) + BatchNorm2d + ReLU6; groups=in_planes makes it depthwise."""

    def __init__(self, in_planes: int, out_planes: int, kernel_size: int = 3, stride: int = 1, groups: int = 1):
        padding = (kernel_size - 1) // 2
        super().__init__(
            nn.Conv2d(in_planes, out_planes, kernel_size, stride, padding, groups=groups, bias=False),
            nn.BatchNorm2d(out_planes),
            nn.ReLU6(inplace=True),
        )


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand, 3x3 depthwise, 1x1 project, residual where the shapes allow."""

    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int):
        super().__init__()
        if stride not in (1, 2):
            raise ValueError(f"stride should be 1 or 2, got {stride}")
        self.stride = stride
        hidden_dim = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(ConvBNReLU(inp, hidden_dim, kernel_size=1))  # pointwise expansion
        layers += [
            ConvBNReLU(hidden_dim, hidden_dim, stride=stride, groups=hidden_dim),  # depthwise 3x3
            nn.Conv2d(hidden_dim, oup, 1, 1, 0, bias=False),  # pointwise linear projection
            nn.BatchNorm2d(oup),
        ]
        self.conv = nn.Sequential(*layers)
        self.out_channels = oup

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


# t (expansion), c (output channels), n (repeats), s (stride of the first repeat)
INVERTED_RESIDUAL_SETTING = [
    [1, 16, 1, 1],
    [6, 24, 2, 2],
    [6, 32, 3, 2],
    [6, 64, 4, 2],
    [6, 96, 3, 1],
    [6, 160, 3, 2],
    [6, 320, 1, 1],
]


class MobileNetV2(nn.Module):
    """MobileNetV2 as torchvision defines it (random init), for the zoo."""

    def __init__(self, num_classes: int = 1000, width_mult: float = 1.0, dropout: float = 0.2,
                 residual_gamma: float = 1.0):
        super().__init__()
        round_nearest = 8
        input_channel = _make_divisible(32 * width_mult, round_nearest)
        self.last_channel = _make_divisible(1280 * max(1.0, width_mult), round_nearest)
        features: list[nn.Module] = [ConvBNReLU(3, input_channel, stride=2)]
        for t, c, n, s in INVERTED_RESIDUAL_SETTING:
            output_channel = _make_divisible(c * width_mult, round_nearest)
            for i in range(n):
                features.append(InvertedResidual(input_channel, output_channel, s if i == 0 else 1, expand_ratio=t))
                input_channel = output_channel
        features.append(ConvBNReLU(input_channel, self.last_channel, kernel_size=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(p=dropout), nn.Linear(self.last_channel, num_classes))
        torchvision_init(self, linear_std=0.01)
        for m in self.modules():  # the last BatchNorm of each block with a residual add
            if isinstance(m, InvertedResidual) and m.use_res_connect and residual_gamma != 1.0:
                nn.init.constant_(m.conv[-1].weight, residual_gamma)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = F.adaptive_avg_pool2d(x, (1, 1))
        x = torch.flatten(x, 1)
        x = self.classifier(x)
        return x


def mobilenet_v2(num_classes: int = 1000, width_mult: float = 1.0, seed: int = 0,
                 residual_gamma: float = 1.0) -> MobileNetV2:
    """Random-init MobileNetV2, eval mode, weights drawn with `seed`."""
    with seeded(seed):
        return MobileNetV2(num_classes, width_mult, residual_gamma=residual_gamma).eval()


def mobilenet_v2_case(*, batch_size: int = 8, num_calibration_batches: int = 4, num_eval_batches: int = 2,
                      image_size: int = 224, num_classes: int = 1000, width_mult: float = 1.0,
                      residual_gamma: float = 1.0, seed: int = 0):
    """MobileNetV2 ModelCase on synthetic images (static mode, logits, no metric)."""
    return image_model_case("mobilenet_v2", mobilenet_v2(num_classes, width_mult, seed, residual_gamma),
                            batch_size=batch_size,
                            num_calibration_batches=num_calibration_batches, num_eval_batches=num_eval_batches,
                            image_size=image_size, seed=seed)
