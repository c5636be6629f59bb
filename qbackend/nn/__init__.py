"""Quantized modules: drop-in nn.Module replacements holding packed int8 weights."""
