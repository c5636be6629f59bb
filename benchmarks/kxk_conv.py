"""The KxK convolutions with groups 1 of ResNet-18, ResNet-50 and MobileNetV2 (3x3s, the 7x7 stem,
MobileNetV2's first conv, small-image stems with 1 and 3 input channels) on the three providers (native: a GEMM over gathered taps; oneDNN;
FBGEMM), at batch 1 and 32, with and without a fused int8 residual (ResNet-18's blocks end in a
3x3 conv with the residual): the measurement behind the native provider's KxK conv2d row in
qbackend/dispatch/rules.py.

    python benchmarks/kxk_conv.py [--threads 2] [--quick] [--stems] [--out benchmarks/results/kxk_conv.md]

--stems: only the convs over 1-3 input channels (the stems rule's rows).

Timing and table as benchmarks/pointwise_conv.py (uint8 channels-last input, relu, uint8 output;
ratio = the faster of oneDNN and FBGEMM / native, > 1: native is faster).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pointwise_conv import run_table  # noqa: E402

# (model, c_in, c_out, input h = w, kernel, stride, padding): every distinct KxK conv with groups 1
# (torchvision v1.5 ResNets: the stride sits in the 3x3 conv).
LAYERS = [("R18/R50", 3, 64, 224, 7, 2, 3), ("R18/R50", 64, 64, 56, 3, 1, 1), ("R18", 64, 128, 56, 3, 2, 1),
          ("R50", 128, 128, 56, 3, 2, 1), ("R18/R50", 128, 128, 28, 3, 1, 1), ("R18", 128, 256, 28, 3, 2, 1),
          ("R50", 256, 256, 28, 3, 2, 1), ("R18/R50", 256, 256, 14, 3, 1, 1), ("R18", 256, 512, 14, 3, 2, 1),
          ("R50", 512, 512, 14, 3, 2, 1), ("R18/R50", 512, 512, 7, 3, 1, 1), ("MBv2", 3, 32, 224, 3, 2, 1),
          ("digits", 1, 16, 8, 3, 1, 1), ("digits", 16, 32, 8, 3, 1, 1), ("CIFAR", 3, 16, 32, 3, 1, 1),
          ("CIFAR", 3, 64, 32, 3, 1, 1)]

if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--stems" in argv:
        argv.remove("--stems")
        sys.exit(run_table("KxK stems (1-3 input channels): native vs oneDNN vs FBGEMM",
                           [layer for layer in LAYERS if layer[1] <= 3], argv))
    sys.exit(run_table("KxK convolutions with groups 1: native vs oneDNN vs FBGEMM", LAYERS, argv))
