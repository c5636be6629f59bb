"""The model-level fuzzer: small random models from a seeded generator, quantized end to end with
the public API (qbackend.quantize: capture, fold, fuse, calibrate, convert, route), each checked
three ways:

  accuracy    SQNR of the int8 model's output against FP32 on held-out inputs, at least the floor
              of its class (FLOORS, set from a first run of 300 models: the worst model of each
              class less a margin; tools/fuzz_models.py prints the distribution)
  round trip  qbackend.save + qbackend.load: the reloaded model's output bit-identical
  compile     torch.compile(int8 model) (where asked: it costs seconds): SQNR against eager of at
              least COMPILE_FLOOR dB (inductor may reorder the float ops between int8 kernels)

Classes (`CLASSES`): "cnn" (1-4 convs of kernel 1/3/5, stride 1/2, dense / depthwise / grouped,
BatchNorm, ReLU, residual adds, max pooling, then a Linear head), "mlp" (1-4 Linears with ReLU /
GELU, optionally a residual), "encoder" (1-2 transformer blocks: LayerNorm, attention through
scaled_dot_product_attention, GELU feed-forward, residuals; one block in three of four models). Inputs are drawn with a per-model
scale and offset so that zero points land anywhere in the range.
"""
from __future__ import annotations

import math
import os
import random
import tempfile
import warnings

import torch
import torch.nn.functional as F
from torch import nn

CLASSES = ("cnn", "mlp", "encoder")
# dB, from the first run of 300 models (benchmarks/results/xeon_icelake/fuzz.md has the distribution)
FLOORS = {"cnn": 18.0, "mlp": 14.0, "encoder": 12.0}
COMPILE_FLOOR = 40.0


class _ConvBlock(nn.Module):
    def __init__(self, c_in, c_out, k, stride, groups, bn, relu, residual):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, stride, k // 2, groups=groups, bias=not bn)
        self.bn = nn.BatchNorm2d(c_out) if bn else None
        self.relu = relu
        self.residual = residual and c_in == c_out and stride == 1

    def forward(self, x):
        y = self.conv(x)
        if self.bn is not None:
            y = self.bn(y)
        if self.residual:
            y = y + x
        return F.relu(y) if self.relu else y


class RandomCNN(nn.Module):
    """Conv blocks, optional max pooling, global average pooling, a Linear head."""

    def __init__(self, rng: random.Random, c_in: int, classes: int):
        super().__init__()
        blocks, c = [], c_in
        for i in range(rng.randint(1, 4)):
            kind = rng.choice(["dense", "dense", "depthwise", "grouped"]) if i else "dense"
            k = rng.choice([1, 3, 3, 5])
            stride = rng.choice([1, 1, 2])
            if kind == "depthwise":
                c_out, groups = c, c
            elif kind == "grouped" and c % 2 == 0:
                groups = 2
                c_out = 2 * rng.randint(2, 12)
            else:
                groups, c_out = 1, rng.choice([4, 8, 16, 24, 32])
            blocks.append(_ConvBlock(c, c_out, k, stride, groups, rng.random() < 0.5, rng.random() < 0.8,
                                     rng.random() < 0.4))
            c = c_out
        self.blocks = nn.ModuleList(blocks)
        self.pool = rng.random() < 0.3
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        if self.pool and min(x.shape[-2:]) >= 2:
            x = F.max_pool2d(x, 2)
        return self.head(x.mean((2, 3)))


class RandomMLP(nn.Module):
    """Linears with ReLU / GELU, optionally a residual over an equal-width pair."""

    def __init__(self, rng: random.Random, d_in: int, d_out: int):
        super().__init__()
        widths = [d_in] + [rng.choice([8, 16, 32, 64, 96, 128]) for _ in range(rng.randint(0, 3))] + [d_out]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.acts = [rng.choice(["relu", "gelu", "none"]) for _ in self.layers[:-1]]
        self.residual = rng.random() < 0.3

    def forward(self, x):
        for layer, act in zip(self.layers[:-1], self.acts):
            y = layer(x)
            y = F.relu(y) if act == "relu" else F.gelu(y) if act == "gelu" else y
            x = y + x if self.residual and y.shape == x.shape else y
        return self.layers[-1](x)


class _Block(nn.Module):
    def __init__(self, d, heads, ffn):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, d)
        x = self.ln1(x + self.proj(a))
        return self.ln2(x + self.fc2(F.gelu(self.fc1(x))))


class RandomEncoder(nn.Module):
    """1-2 post-LayerNorm transformer blocks over [batch, sequence, d], then a Linear head."""

    def __init__(self, rng: random.Random, d: int, classes: int):
        super().__init__()
        heads = rng.choice([1, 2, 4])
        self.blocks = nn.ModuleList(_Block(d, heads, rng.choice([2, 4]) * d) for _ in range(rng.choice([1, 1, 1, 2])))
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def make_model(seed: int, cls: str | None = None):
    """(class, model in eval mode, example input, calibration batches, evaluation inputs)."""
    rng = random.Random(seed)
    cls = cls or CLASSES[seed % len(CLASSES)]
    torch.manual_seed(seed)
    batch = rng.choice([1, 2, 4])
    if cls == "cnn":
        c_in, hw = rng.choice([1, 3, 4, 8]), rng.choice([8, 12, 16, 20])
        model = RandomCNN(rng, c_in, rng.choice([2, 10]))
        shape = (batch, c_in, hw, hw)
    elif cls == "mlp":
        d = rng.choice([4, 16, 32, 64, 100])
        model = RandomMLP(rng, d, rng.choice([1, 4, 10]))
        shape = (batch, d)
    else:
        d = rng.choice([16, 32, 64])
        model = RandomEncoder(rng, d, rng.choice([2, 8]))
        shape = (batch, rng.choice([4, 8, 16]), d)
    model.eval()
    for m in model.modules():  # BatchNorm statistics other than the identity
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    scale, offset = 10 ** rng.uniform(-1, 1), rng.choice([0.0, 0.0, 1.0, -1.0]) * rng.uniform(0, 2)

    def draw():
        return torch.randn(shape) * scale + offset * scale
    # at least 32 rows each: with fewer, a one-output model's SQNR is a ratio of a few values near 0
    calib = [(draw(),) for _ in range(max(4, 32 // batch))]
    evals = [draw() for _ in range(max(2, 32 // batch))]
    return cls, model, calib[0][0], calib, evals


def sqnr(ref: torch.Tensor, y: torch.Tensor) -> float:
    noise = float((ref.double() - y.double()).pow(2).sum())
    signal = float(ref.double().pow(2).sum())
    return math.inf if noise == 0 else 10 * math.log10(max(signal, 1e-30) / noise)


def check_model(seed: int, cls: str | None = None, compile_: bool = False) -> dict:
    """Runs one model's checks; returns its record (class, sqnr, floor, providers, failures)."""
    import qbackend
    cls, model, example, calib, evals = make_model(seed, cls)
    rec = {"seed": seed, "class": cls, "failures": []}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qmodel = qbackend.quantize(model, (example,), calib)
    rec["providers"] = sorted({f"{r.kind}:{r.route.provider}" for r in qmodel.qbackend_layers.values()
                               if r.route is not None})
    with torch.no_grad():
        ref = torch.cat([model(x) for x in evals])
        y = torch.cat([qmodel(x) for x in evals])
    rec["sqnr"] = sqnr(ref, y)
    rec["floor"] = FLOORS[cls]
    if not torch.isfinite(y).all():
        rec["failures"].append("non-finite int8 output")
    elif rec["sqnr"] < FLOORS[cls]:
        rec["failures"].append(f"SQNR {rec['sqnr']:.1f} dB < floor {FLOORS[cls]} dB")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.qb")
        qbackend.save(qmodel, path)
        loaded = qbackend.load(path)
    with torch.no_grad():
        y2 = torch.cat([loaded(x) for x in evals])
    if not torch.equal(y, y2):
        rec["failures"].append(f"save/load round trip differs (max |diff| {float((y - y2).abs().max()):.3g})")
    if compile_:
        compiled = torch.compile(qmodel)
        with torch.no_grad():
            yc = torch.cat([compiled(x) for x in evals])
        rec["compile_sqnr"] = sqnr(y, yc)
        if rec["compile_sqnr"] < COMPILE_FLOOR:
            rec["failures"].append(f"torch.compile differs from eager: SQNR {rec['compile_sqnr']:.1f} dB")
    return rec


__all__ = ["CLASSES", "FLOORS", "COMPILE_FLOOR", "make_model", "check_model", "sqnr"]
