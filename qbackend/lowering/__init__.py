"""Lowering: an FP32 nn.Module -> a graph of int8 ops.

  capture.py      torch.export (non-strict, dynamic sizes, functional ATen) -> GraphModule
  fold.py         BatchNorm folded into the conv/linear before it
  patterns.py     which conv2d/linear calls become int8 ops, with the residual add and activation
                  they absorb; which ops carry int8 values unchanged (transparent)
  plan.py         which values are observed, which flow in int8
  prepare.py      observers inserted -> the model to calibrate
  layers.py       one layer: weight quantization, provider routing, packing, qbackend.nn module
  convert.py      the calibrated graph rewritten into int8 modules, quantize/dequantize at borders
  module_swap.py  the fallback when capture fails (and quantize_dynamic's path)
"""
