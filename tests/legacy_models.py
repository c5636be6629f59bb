"""Deterministic models behind the saved-file fixtures of tests/data/: a graph-captured static
model (conv + BatchNorm + ReLU, max pooling, a residual block, average pooling, an embedding bag
and a Linear head)
and a module-swapped dynamic one (an LSTM and a Linear). The fixtures were written by
`python -c "from tests import legacy_models; legacy_models.main('tests/data')"` (so the
models pickle under this module's name) with qbackend at 78fc84d, the last release of model
format 1; the tests load them with today's qbackend and compare against a fresh conversion of the
same model."""
from __future__ import annotations

import os
import sys

import torch
from torch import nn

FIXTURES = {"static": "static_cnn_v1.qb", "dynamic": "dynamic_lstm_v1.qb"}


class StaticNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.pool = nn.MaxPool2d(2)
        self.conv1 = nn.Conv2d(16, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 16, 1)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.table = nn.EmbeddingBag(1024, 16, mode="sum")
        self.head = nn.Linear(16 + 16, 10)

    def forward(self, x, ids, offsets):
        x = self.pool(self.stem(x))
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))) + x)
        return self.head(torch.cat([self.gap(x).flatten(1), self.table(ids, offsets)], dim=1))


class DynamicNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(12, 24, batch_first=True)
        self.fc = nn.Linear(24, 5)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.fc(out[:, -1])


def static_case():
    """(model, example inputs, calibration batches, evaluation batch, config)."""
    import qbackend

    torch.manual_seed(0)
    model = StaticNet().eval()
    with torch.no_grad():
        model.stem[1].running_mean.uniform_(-0.2, 0.2)
        model.stem[1].running_var.uniform_(0.5, 1.5)
    g = torch.Generator().manual_seed(1)

    def batch(n):
        x = torch.randn(n, 3, 16, 16, generator=g)
        ids = torch.randint(0, 1024, (n * 3,), generator=g)
        offsets = torch.arange(0, n * 3, 3)
        return x, ids, offsets

    calibration = [batch(4) for _ in range(3)]
    # the settings the fixture files were written with (defaults added since are turned off)
    config = qbackend.QuantConfig(weight_rounding="nearest", bias_correction=False, seven_bit_for_speed=False,
                                  activation=qbackend.config.ObserverSpec("histogram", {"dtype": torch.uint8}),
                                  embedding=qbackend.EmbeddingConfig(min_weights=0))
    return model, calibration[0], calibration, batch(5), config


def dynamic_case():
    """(model, evaluation batch, config)."""
    import qbackend

    torch.manual_seed(2)
    model = DynamicNet().eval()
    x = torch.randn(3, 7, 12, generator=torch.Generator().manual_seed(3))
    return model, (x,), qbackend.QuantConfig(mode="dynamic")


def build(kind: str):
    """(the quantized model, its evaluation batch) by today's qbackend."""
    import qbackend

    if kind == "static":
        model, example, calibration, evaluation, config = static_case()
        return qbackend.quantize(model, example, calibration, config=config), evaluation
    model, evaluation, config = dynamic_case()
    return qbackend.quantize_dynamic(model, config=config), evaluation


def main(folder: str) -> None:
    import qbackend

    os.makedirs(folder, exist_ok=True)
    for kind, name in FIXTURES.items():
        qmodel, _ = build(kind)
        qbackend.save(qmodel, os.path.join(folder, name))
        print(f"wrote {os.path.join(folder, name)}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "data"))
