"""Quantize a trained CNN to INT8 and see what it costs: prepare, calibrate, convert, compare.

    python examples/quantize_and_compare.py

The model is the small CNN of qbackend.models.digits, trained in a few seconds on scikit-learn's
bundled 8x8 digits (no download). Swap in your own model, batches and metric.
"""
import torch

import qbackend
from qbackend.models.digits import top1_percent, train_digits_cnn

# An FP32 model in eval mode, and data split into train / calibration / test (images [N, 1, 8, 8]).
model, split, _ = train_digits_cnn()
calibration = [split.x_calib[i:i + 32] for i in range(0, len(split.x_calib), 32)]
test = [split.x_test[i:i + 32] for i in range(0, len(split.x_test), 32)]


def top1(m: torch.nn.Module) -> float:
    """The metric compare reports for both models: test top-1 (%), higher is better."""
    return top1_percent(m, split.x_test, split.y_test)


# 1. prepare: capture the model with torch.export, fold BatchNorm, fuse conv+relu, insert observers.
prepared = qbackend.prepare(model, (calibration[0],))

# 2. calibrate: run representative batches through it (FP32 forward + range statistics).
with torch.no_grad():
    for x in calibration:
        prepared(x)

# 3. convert: the INT8 model, an ordinary nn.Module; explain() says where each layer runs and why.
qmodel = qbackend.convert(prepared)
print(qbackend.explain(qmodel).to_markdown())
print()

# 4. compare: per-layer SQNR against FP32 (one pass with hooks), the output's error, the metric.
result = qbackend.compare(model, qmodel, test, metric=top1)
print(result.to_markdown())
print()
worst = result.ranked()[0]
print(f"most sensitive layer: {worst.name} (its own SQNR {worst.local_sqnr_db:.1f} dB); "
      f"top-1 FP32 {result.metric['fp32']:.2f}% -> INT8 {result.metric['int8']:.2f}%")
