"""Weight-only quantized embeddings: nn.Embedding / nn.EmbeddingBag with their table stored
rowwise-quantized (8 or 4 bits per value, a scale and bias per row; qbackend.ops.embedding) and
looked up by an embedding provider (the built-in kernel or fbgemm_gpu's). Outputs are float32,
like the float modules'; the forward signatures and bag semantics are theirs (sum / mean,
offsets or fixed-length 2-D input, per_sample_weights, include_last_offset, padding_idx)."""
from __future__ import annotations

import torch
from torch import nn

from ..core.generation import Tracked
from ..ops.embedding import PackedEmbeddingTable, quantize_rowwise

BAG_MODES = ("sum", "mean")


def _index_tensor(t, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be an int32 or int64 tensor, got {t.dtype}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} must be a CPU tensor, got device {t.device}")
    return t.contiguous()


class _QuantizedTable(Tracked, nn.Module):
    def __init__(self, packed: PackedEmbeddingTable):
        super().__init__()
        if not isinstance(packed, PackedEmbeddingTable):
            raise TypeError(f"packed must be a PackedEmbeddingTable, got {type(packed).__name__}")
        self.packed = packed

    @property
    def num_embeddings(self) -> int:
        return self.packed.num_embeddings

    @property
    def embedding_dim(self) -> int:
        return self.packed.dim

    @property
    def bits(self) -> int:
        return self.packed.bits

    @property
    def provider(self) -> str:
        return self.packed.provider_name

    def _table_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, bits={self.bits}, "
                f"qparams={str(self.packed.qparams_dtype).replace('torch.', '')}, provider={self.provider}")


class QuantizedEmbedding(_QuantizedTable):
    """nn.Embedding with a rowwise-quantized table: input indices of any shape -> [*shape, dim] fp32."""

    def __init__(self, packed: PackedEmbeddingTable, padding_idx: int | None = None):
        super().__init__(packed)
        self.padding_idx = padding_idx  # as in nn.Embedding: it only affects training, kept for the record

    @classmethod
    def from_float(cls, emb: nn.Embedding, bits: int = 8, qparams_dtype: torch.dtype = torch.float16,
                   provider: str = "builtin") -> "QuantizedEmbedding":
        if emb.max_norm is not None:
            raise ValueError("nn.Embedding with max_norm renormalises its table at lookup; it stays FP32")
        table = quantize_rowwise(emb.weight, bits, qparams_dtype)
        return cls(PackedEmbeddingTable(table, emb.embedding_dim, bits, provider), emb.padding_idx)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self.packed.lookup(_index_tensor(input, "input"))

    def extra_repr(self) -> str:
        return self._table_repr() + (f", padding_idx={self.padding_idx}" if self.padding_idx is not None else "")


class QuantizedEmbeddingBag(_QuantizedTable):
    """nn.EmbeddingBag (sum / mean) with a rowwise-quantized table; fp32 [bags, dim] out."""

    def __init__(self, packed: PackedEmbeddingTable, mode: str = "sum", padding_idx: int | None = None,
                 include_last_offset: bool = False):
        super().__init__(packed)
        if mode not in BAG_MODES:
            raise ValueError(f"mode must be one of {', '.join(BAG_MODES)} (max stays FP32), got {mode!r}")
        if padding_idx is not None and not -packed.num_embeddings <= padding_idx < packed.num_embeddings:
            raise ValueError(f"padding_idx {padding_idx} is outside the table's {packed.num_embeddings} rows")
        self.mode = mode
        self.padding_idx = None if padding_idx is None else padding_idx % packed.num_embeddings
        self.include_last_offset = bool(include_last_offset)

    @classmethod
    def from_float(cls, bag: nn.EmbeddingBag, bits: int = 8, qparams_dtype: torch.dtype = torch.float16,
                   provider: str = "builtin") -> "QuantizedEmbeddingBag":
        if bag.max_norm is not None:
            raise ValueError("nn.EmbeddingBag with max_norm renormalises its table at lookup; it stays FP32")
        table = quantize_rowwise(bag.weight, bits, qparams_dtype)
        return cls(PackedEmbeddingTable(table, bag.embedding_dim, bits, provider), bag.mode, bag.padding_idx,
                   bag.include_last_offset)

    def forward(self, input: torch.Tensor, offsets: torch.Tensor | None = None,
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        input = _index_tensor(input, "input")
        if per_sample_weights is not None:
            if not isinstance(per_sample_weights, torch.Tensor) or per_sample_weights.dtype != torch.float32:
                raise TypeError("per_sample_weights must be a float32 tensor")
            if per_sample_weights.shape != input.shape:
                raise ValueError(f"per_sample_weights must have the shape of input {tuple(input.shape)}, got "
                                 f"{tuple(per_sample_weights.shape)}")
            per_sample_weights = per_sample_weights.reshape(-1).contiguous()
        if input.dim() == 2:
            if offsets is not None:
                raise ValueError("offsets must be None when input is 2-D (each row is one bag)")
            bags, length = input.shape
            offsets = torch.arange(bags, dtype=input.dtype) * length
            return self.packed.bag(input.reshape(-1), offsets, self.mode, per_sample_weights, False,
                                   -1 if self.padding_idx is None else self.padding_idx)
        elif input.dim() == 1:
            if offsets is None:
                raise ValueError("offsets are required when input is 1-D")
            offsets = _index_tensor(offsets, "offsets")
            if offsets.dtype != input.dtype:
                offsets = offsets.to(input.dtype)
        else:
            raise ValueError(f"input must be 1-D (with offsets) or 2-D (fixed-length bags), got {input.dim()}-D")
        return self.packed.bag(input, offsets, self.mode, per_sample_weights, self.include_last_offset,
                               -1 if self.padding_idx is None else self.padding_idx)

    def extra_repr(self) -> str:
        s = self._table_repr() + f", mode={self.mode}"
        if self.padding_idx is not None:
            s += f", padding_idx={self.padding_idx}"
        return s + (", include_last_offset=True" if self.include_last_offset else "")
