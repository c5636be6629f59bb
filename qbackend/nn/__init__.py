"""Quantized modules: drop-in nn.Module replacements holding packed int8 weights.

  QuantizedLinear, DynamicQuantizedLinear, TokenQuantizedLinear, WeightOnlyLinear   (linear.py)
  Int4WeightOnlyLinear                                         (int4_linear.py: 4-bit group-wise weights)
  QuantizedConv2d, WeightOnlyConv2d                            (conv.py)
  QuantizedInvertedResidual                                    (inverted_residual.py: expand + depthwise + project fused)
  DynamicQuantizedLSTM                                         (lstm.py)
  QuantizedEmbedding, QuantizedEmbeddingBag                    (embedding.py: weight-only, rowwise 8/4-bit)
  FusedAttention                                               (attention.py: SDPA with its output quantize fused)
  LayerNormQuantize                                            (layer_norm.py: add + LayerNorm + quantize fused)
  GlobalAvgPoolQuantize                                        (pool.py: int8 global average pool + requantize)
  RMSNorm                                                      (rms_norm.py: decoder LLMs' norm in one call)
  (weight_tiles.py: tile_rows / tile_groups, the weight-only Linears' weight layout)

The static modules take and give plain uint8 tensors with the qparams they were built with (the
lowering wires them so activations stay in int8 between them); the dynamic and weight-only ones
take and give float tensors.
"""
from .conv import QuantizedConv2d, WeightOnlyConv2d
from .inverted_residual import QuantizedInvertedResidual
from .linear import DynamicQuantizedLinear, QuantizedLinear, TokenQuantizedLinear, WeightOnlyLinear
from .int4_linear import Int4WeightOnlyLinear
from .embedding import QuantizedEmbedding, QuantizedEmbeddingBag
from .lstm import DynamicQuantizedLSTM
from .attention import FusedAttention
from .layer_norm import LayerNormQuantize
from .pool import GlobalAvgPoolQuantize
from .rms_norm import RMSNorm

__all__ = ["QuantizedConv2d", "QuantizedInvertedResidual", "WeightOnlyConv2d", "QuantizedLinear", "DynamicQuantizedLinear", "TokenQuantizedLinear", "WeightOnlyLinear",
           "Int4WeightOnlyLinear",
           "DynamicQuantizedLSTM", "QuantizedEmbedding", "QuantizedEmbeddingBag", "FusedAttention",
           "LayerNormQuantize", "GlobalAvgPoolQuantize", "RMSNorm"]
