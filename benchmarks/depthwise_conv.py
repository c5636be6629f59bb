"""The depthwise convolutions of MobileNetV2 (3x3, groups = channels) on the three providers
(native: VNNI dot products over 4-tap groups of rows laid out once per thread; oneDNN; FBGEMM),
at batch 1 and 32, with and without a fused int8 residual: the measurement behind the native
provider's depthwise conv2d row in qbackend/dispatch/rules.py.

    python benchmarks/depthwise_conv.py [--threads 2] [--quick] [--out benchmarks/results/depthwise_conv.md]

Timing and table as benchmarks/pointwise_conv.py (uint8 channels-last input, relu, uint8 output;
ratio = the faster of oneDNN and FBGEMM / native, > 1: native is faster). FBGEMM's depthwise
kernel takes 7-bit activations only on some paths; its column is what it does with 8-bit ones.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pointwise_conv import run_table  # noqa: E402

# (model, c_in, c_out, input h = w, kernel, stride, padding, groups): every distinct depthwise conv
# of MobileNetV2 (torchvision layout, 224 x 224 input).
LAYERS = [("MBv2", c, c, hw, 3, s, 1, c) for c, hw, s in
          [(32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1), (192, 28, 2), (384, 14, 1),
           (576, 14, 1), (576, 14, 2), (960, 7, 1)]]

if __name__ == "__main__":
    sys.exit(run_table("Depthwise convolutions: native vs oneDNN vs FBGEMM", LAYERS))
