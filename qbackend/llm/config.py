"""LLMConfig: how `qbackend.quantize_llm` quantizes a decoder LLM's Linears (the weight scheme and
which modules stay in float)."""
from __future__ import annotations

from dataclasses import dataclass

WEIGHT_SCHEMES = ("int8",)


@dataclass(frozen=True)
class LLMConfig:
    """weights: "int8": int8 weights with one symmetric scale per output channel (the observer's
      range, nearest rounding), float32 activations, products in float32 (qbackend::woq_linear).
    lm_head: also quantize the output projection (the model's get_output_embeddings(), or the
      module named "lm_head"); with tied embeddings the input embedding stays float.
    skip: module names (or name prefixes at a dot) kept in float.
    """

    weights: str = "int8"
    lm_head: bool = True
    skip: tuple[str, ...] = ()

    def __post_init__(self):
        if self.weights not in WEIGHT_SCHEMES:
            raise ValueError(f"weights must be one of {', '.join(WEIGHT_SCHEMES)}, got {self.weights!r}")
        if not isinstance(self.lm_head, bool):
            raise TypeError(f"lm_head must be True or False, got {self.lm_head!r}")
        if isinstance(self.skip, str) or not all(isinstance(s, str) and s for s in self.skip):
            raise TypeError(f"skip must be a tuple of module names, got {self.skip!r}")
        object.__setattr__(self, "skip", tuple(self.skip))

    def skips(self, name: str) -> bool:
        return any(name == s or name.startswith(s + ".") for s in self.skip)
