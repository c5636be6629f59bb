"""Small models that exercise the lowering's patterns (the model zoo has the real architectures)."""
from __future__ import annotations

import torch
from torch import nn


class ResidualCNN(nn.Module):
    """stem conv-bn-relu -> maxpool -> a basic block (one ReLU module reused) with an identity add
    -> a downsampling block (strided conv + 1x1 downsample conv) -> avgpool -> flatten -> fc."""

    def __init__(self, c: int = 8, classes: int = 5):
        super().__init__()
        self.conv1 = nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.b1c1, self.b1bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.b1c2, self.b1bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.b2c1, self.b2bn1 = nn.Conv2d(c, 2 * c, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(2 * c)
        self.b2c2, self.b2bn2 = nn.Conv2d(2 * c, 2 * c, 3, padding=1, bias=False), nn.BatchNorm2d(2 * c)
        self.down = nn.Sequential(nn.Conv2d(c, 2 * c, 1, stride=2, bias=False), nn.BatchNorm2d(2 * c))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * c, classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        y = self.relu(self.b1bn1(self.b1c1(x)))
        x = self.relu(self.b1bn2(self.b1c2(y)) + x)
        y = self.relu(self.b2bn1(self.b2c1(x)))
        x = self.relu(self.b2bn2(self.b2c2(y)) + self.down(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand + ReLU6, depthwise 3x3 + ReLU6, 1x1 project, x + block(x)."""

    def __init__(self, c: int = 8, t: int = 4):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.ReLU6(inplace=True))
        h = c * t
        self.block = nn.Sequential(nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU6(inplace=True),
                                   nn.Conv2d(h, h, 3, padding=1, groups=h, bias=False), nn.BatchNorm2d(h),
                                   nn.ReLU6(inplace=True), nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))
        self.head = nn.Linear(c, 3)

    def forward(self, x):
        x = self.stem(x)
        x = x + self.block(x)
        return self.head(x.mean((2, 3)))


class MLP(nn.Module):
    """linear+relu, linear+gelu -> linear (int8 chained), and one Linear called twice. Its weights
    depend on `seed` only (not on the global RNG), so tests are reproducible in any order."""

    def __init__(self, d: int = 32, seed: int = 0):
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.fc1, self.fc2, self.fc3 = nn.Linear(d, 64), nn.Linear(64, 64), nn.Linear(64, d)
            self.shared = nn.Linear(d, d)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.fc2(torch.relu(self.fc1(x))))
        y = self.fc3(h)
        return self.shared(self.shared(y) + y)


def init_bn(model: nn.Module, seed: int = 0) -> nn.Module:
    """Non-trivial BatchNorm statistics and affine parameters, so folding is really tested."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=g) * 0.2)
            m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(n, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(n, generator=g) * 0.2)
    return model.eval()


def sqnr(ref: torch.Tensor, out: torch.Tensor) -> float:
    ref, out = ref.double(), out.double()
    return float(10 * torch.log10(ref.pow(2).sum() / (ref - out).pow(2).sum().clamp_min(1e-30)))


class CatCNN(nn.Module):
    """Two branches (conv+relu, conv) concatenated along channels, then a conv and a head."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.left = nn.Conv2d(c, c, 1)
        self.right = nn.Conv2d(c, c, 3, padding=1)
        self.merge = nn.Conv2d(2 * c, c, 1)
        self.head = nn.Linear(c, 4)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        y = torch.cat([torch.relu(self.left(x)), self.right(x)], dim=1)
        return self.head(torch.relu(self.merge(y)).mean((2, 3)))


class Outlier(nn.Module):
    """One layer that quantizes badly: fc2's input has one channel ~1000x the others (fc1's
    channel 0 scaled 1000x, fc2's weights scaled back so the FP32 function is unchanged), so
    per-tensor INT8 crushes every other channel of that input to zero. Seeded by construction."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 64), nn.Linear(64, 64), nn.Linear(64, 8)
        for fc in (self.fc1, self.fc2, self.fc3):
            nn.init.normal_(fc.weight, std=0.3, generator=g)
            nn.init.normal_(fc.bias, std=0.1, generator=g)
        with torch.no_grad():
            self.fc1.weight[0] *= 1000
            self.fc1.bias[0] = 1000 * self.fc1.bias[0].abs()
            self.fc2.weight[:, 0] /= 1000

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))
