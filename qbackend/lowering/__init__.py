"""Lowering: an FP32 nn.Module -> a graph of int8 ops. The flow, pass by pass, is pipeline.py.

  pipeline.py      the prepare and convert passes, in order (start here)
  prepare.py       prepare's passes: capture, fold, match, plan, observers and statistics
  convert.py       convert's passes: qparams, smoothing, rewrite to int8 modules, clean-ups
  capture.py       torch.export (non-strict, dynamic sizes, functional ATen) -> GraphModule
  fold.py          BatchNorm folded into the conv/linear before it
  patterns.py      which conv2d/linear calls become int8 ops, with the residual add and activation
                   they absorb; which ops carry int8 values unchanged (transparent)
  plan.py          which values are observed, which flow in int8
  embeddings.py    embedding lookups -> rowwise-quantized tables
  smoothquant.py   SmoothQuant's graph side: candidate values, folding the factors
  attention.py     attention cores -> the fused kernel, where routed there
  layer_norm.py    (add +) LayerNorm + quantize fused
  layer_spec.py    what one layer to quantize is, and the shape it is routed at
  layers.py        one layer built: weight quantization, routing, its module (layer_modules.py;
                   tune mode's bench: layer_tuning.py)
  records.py       the layer and activation records of the converted model
  module_swap.py   the fallback when capture fails (and quantize_dynamic's path)
  graph_utils.py   small helpers over fx graphs
"""
