"""Calibration-time methods that change weights or scales, on tensors and statistics (no graphs:
the lowering's passes call them with what they found in the graph).

  gptq.py          GPTQ rounding of static Linears' and convs' int8 weights from their input's
                   Hessian, and bias correction
  smoothquant.py   SmoothQuant's per-channel factors, searched on sampled calibration rows
  per_token.py     a Linear input's output error quantized per tensor or per token, on sampled rows
  sampling.py      the fixed-seed samples of output channels the searches measure their errors on
"""
