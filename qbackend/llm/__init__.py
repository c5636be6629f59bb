"""Decoder LLMs: quantize_llm swaps a causal LM's Linears for weight-only int8 or int4 modules in
place (quantize.py), as an LLMConfig says (config.py); Llama-style layers then run natively
(decoder_layers.py)."""
from .config import LLMConfig, WEIGHT_SCHEMES
from .quantize import quantize_llm

__all__ = ["LLMConfig", "WEIGHT_SCHEMES", "quantize_llm"]
