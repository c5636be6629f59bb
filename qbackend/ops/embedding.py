"""Rowwise-quantized embedding tables: the Python side of the embedding ops (csrc/ops/embedding_ops.cpp).

* `quantize_rowwise(weight, bits, qparams_dtype)`: a float table [rows, dim] -> the fused uint8 table
  (per row: the row's scale and bias in fp16 or fp32, then the 8-bit or packed 4-bit data; value =
  scale * q + bias, bias = the row's minimum, rounded down); `dequantize_rowwise` inverts it (fp32).
  With fp16 qparams this is fbgemm_gpu's table-batched row layout, so every provider shares it.
* The embedding providers, as a table like the GEMM providers: `builtin` (qbackend's own csrc
  kernel: fp16 or fp32 qparams, padding_idx), `fbgemm` (FBGEMM's JIT embedding kernels through
  csrc, from libtorch: fp16 qparams, no padding_idx) and `fbgemm_gpu` (fbgemm_gpu's table-batched
  lookup, when `fbgemm-gpu-cpu` is installed: fp16 qparams, no padding_idx). All validate indices
  and offsets with the same checks before any row is read, and give the same fp32 bits.
* `PackedEmbeddingTable`: one table in one provider's layout; it pickles as the canonical fused
  table and repacks for another provider (`with_provider`), like the packed GEMM weights.
* The ops' fake impls (torch.compile / torch.export).
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Callable

import torch

from ..core.generation import Tracked
from ..core.extension import _C  # noqa: F401  (loads the .so, which registers the ops)
from ..core.state_version import check_state_version

ops = torch.ops.qbackend
QPARAMS_DTYPES = (torch.float16, torch.float32)
MODES = {"sum": 0, "mean": 1}
FORMAT_VERSION = 1


# ---- quantization -----------------------------------------------------------------------------

def data_bytes(dim: int, bits: int) -> int:
    return dim if bits == 8 else dim // 2


def _round_toward(x: torch.Tensor, dtype: torch.dtype, up: bool) -> torch.Tensor:
    """x (fp64) rounded to dtype, then moved one step up (down) where it fell below (above) x."""
    r = x.to(dtype)
    off = (r.double() < x) if up else (r.double() > x)
    step = torch.nextafter(r, torch.full_like(r, float("inf") if up else float("-inf")))
    return torch.where(off, step, r)


def quantize_rowwise(weight: torch.Tensor, bits: int = 8, qparams_dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """The fused rowwise table of a float [rows, dim] weight (see the module docstring). The scale
    and bias are rounded to qparams_dtype first and the levels chosen for the rounded values, so
    dequantizing gives each level exactly as the kernels compute it."""
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
        raise TypeError(f"weight must be a float tensor, got "
                        f"{weight.dtype if isinstance(weight, torch.Tensor) else type(weight).__name__}")
    if weight.dim() != 2 or weight.shape[0] == 0 or weight.shape[1] == 0:
        raise ValueError(f"weight must be a non-empty 2-D [rows, dim] table, got shape {tuple(weight.shape)}")
    if bits not in (8, 4):
        raise ValueError(f"bits must be 8 or 4, got {bits!r}")
    if qparams_dtype not in QPARAMS_DTYPES:
        raise TypeError(f"qparams_dtype must be torch.float16 or torch.float32, got {qparams_dtype}")
    rows, dim = weight.shape
    if bits == 4 and dim % 2:
        raise ValueError(f"4-bit tables need an even embedding dim (two values per byte), got {dim}")
    w = weight.detach().to(torch.float64)
    if not bool(torch.isfinite(w).all()):
        raise ValueError("the embedding table contains NaN or inf; it cannot be quantized")
    levels = (1 << bits) - 1
    lo, hi = w.amin(1), w.amax(1)
    # bias rounded down and scale up (to qparams_dtype), so every value lies in [bias, bias +
    # levels * scale] and is off by at most half a level (fp16 scales of small rows are subnormal)
    bias = _round_toward(lo, qparams_dtype, up=False)
    scale = _round_toward((hi - bias.double()) / levels, qparams_dtype, up=True)
    if not (bool(torch.isfinite(bias).all()) and bool(torch.isfinite(scale).all())):
        raise ValueError("the table's values exceed the float16 range of the row scale/bias; use "
                         "qparams_dtype=torch.float32")
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # constant rows: q = 0
    q = torch.round((w - bias.double()[:, None]) / scale.double()[:, None]).clamp_(0, levels).to(torch.uint8)
    if bits == 4:
        q = q[:, 0::2] | (q[:, 1::2] << 4)
    qp = torch.stack([scale, bias], 1).contiguous().view(torch.uint8).reshape(rows, -1)
    return torch.cat([qp, q], 1).contiguous()


def _table_parts(table: torch.Tensor, dim: int, bits: int):
    nb = data_bytes(dim, bits)
    qp_bytes = table.shape[1] - nb
    if qp_bytes not in (4, 8):
        raise ValueError(f"table rows of {table.shape[1]} bytes do not hold {nb} data bytes plus a scale and bias")
    qp_dtype = torch.float16 if qp_bytes == 4 else torch.float32
    # a fresh dense copy: .contiguous() keeps a one-row slice's row stride (rows x 1 counts as
    # contiguous), which view() rejects when the row length is odd
    qp = table[:, :qp_bytes].clone(memory_format=torch.contiguous_format).reshape(-1).view(qp_dtype).reshape(-1, 2)
    return table[:, qp_bytes:], qp[:, 0], qp[:, 1], qp_dtype


def dequantize_rowwise(table: torch.Tensor, dim: int, bits: int) -> torch.Tensor:
    """The fp32 values of a fused table: scale * q + bias, in fp32 like the kernels (one fma)."""
    data, scale, bias, _ = _table_parts(table, dim, bits)
    if bits == 4:
        q = torch.stack([data & 0x0F, data >> 4], 2).reshape(table.shape[0], dim)
    else:
        q = data
    # fma(scale, q, 0 + bias) == scale * q + bias rounded once: exact in fp64, then one rounding
    return (scale.double()[:, None] * q.double() + bias.double()[:, None]).float()


def qparams_dtype_of(table: torch.Tensor, dim: int, bits: int) -> torch.dtype:
    return _table_parts(table, dim, bits)[3]


# ---- providers --------------------------------------------------------------------------------

@dataclass(frozen=True)
class EmbeddingProvider:
    """A provider of rowwise-quantized embedding lookups (one record of EMBEDDING_PROVIDERS)."""

    name: str
    available: Callable[[], bool]
    # (qparams dtype, bits, dim, padding_idx or -1) -> why it cannot run such a table, or None
    refuses_table: Callable[..., str | None]
    pack: Callable            # (table, dim, bits) -> packed
    unpack: Callable          # (packed, dim, bits) -> table
    # (packed, dim, bits, rows, indices 1-D, offsets, mode, per_sample_weights, include_last_offset, padding_idx)
    bag: Callable
    routed: bool = True       # a candidate of the rule table

    def refuses(self, op: str, shape) -> str | None:
        """Why it cannot run the op instance (op "embedding_bag"; shape keys rows, dim, bits,
        fp16_qparams, padding_idx as in qbackend.dispatch.rules), or None."""
        if op != "embedding_bag":
            return f"it has no {op}"
        qparams = torch.float16 if shape.get("fp16_qparams", 1) else torch.float32
        return self.refuses_table(qparams, shape["bits"], shape["dim"], 0 if shape.get("padding_idx", 0) else -1)

    def exact_8bit(self, op: str | None = None, shape=None) -> bool:
        return True  # weight-only: the activations stay float


def _builtin_bag(packed, dim, bits, rows, indices, offsets, mode, psw, include_last_offset, padding_idx):
    return ops.embedding_bag_rowwise(packed, dim, bits, indices, offsets, MODES[mode], psw, include_last_offset,
                                     padding_idx)


@functools.cache
def _fbgemm_gpu_available() -> bool:
    try:
        import fbgemm_gpu  # noqa: F401
    except Exception:  # noqa: BLE001  (missing, or built for another torch: not available)
        return False
    return hasattr(torch.ops.fbgemm, "int_nbit_split_embedding_codegen_lookup_function")


def _fbgemm_refuses(qparams_dtype: torch.dtype, bits: int, dim: int, padding_idx: int) -> str | None:
    if qparams_dtype != torch.float16:
        return "FBGEMM's embedding kernels take fp16 scale/bias"
    if padding_idx >= 0:
        return "FBGEMM's embedding kernels have no padding_idx"
    return None


def _fbgemm_gpu_refuses(qparams_dtype: torch.dtype, bits: int, dim: int, padding_idx: int) -> str | None:
    if not _fbgemm_gpu_available():
        return "fbgemm_gpu is not installed (pip install fbgemm-gpu-cpu==1.8.0, the `embeddings` extra)"
    if dim % 4:
        return "fbgemm_gpu's quantized tables need an embedding dim divisible by 4"
    return _fbgemm_refuses(qparams_dtype, bits, dim, padding_idx)


def _fbgemm_bag(packed, dim, bits, rows, indices, offsets, mode, psw, include_last_offset, padding_idx):
    if padding_idx >= 0:
        raise ValueError("the fbgemm embedding provider has no padding_idx; use the builtin one")
    return ops.fbgemm_embedding_bag(packed, dim, bits, indices, offsets, MODES[mode], psw, include_last_offset)


@functools.cache
def _tbe_constants(bits: int, dim: int):
    from fbgemm_gpu.split_embedding_configs import SparseType, sparse_type_to_int

    ty = SparseType.INT8 if bits == 8 else SparseType.INT4
    return {
        "uvm_weights": torch.empty(0, dtype=torch.uint8),
        "weights_placements": torch.tensor([3], dtype=torch.int32),  # EmbeddingLocation.HOST
        "weights_offsets": torch.zeros(1, dtype=torch.int64),
        "weights_tys": torch.tensor([sparse_type_to_int(ty)], dtype=torch.uint8),
        "D_offsets": torch.tensor([0, dim], dtype=torch.int32),
        "total_D": dim, "max_int2_D": 0, "max_int4_D": dim if bits == 4 else 0,
        "max_int8_D": dim if bits == 8 else 0, "max_float16_D": 0, "max_float32_D": 0,
        "output_dtype": sparse_type_to_int(SparseType.FP32),
        "lxu_cache_weights": torch.empty(0, 0, dtype=torch.uint8),
        "lxu_cache_locations": torch.empty(0, dtype=torch.int32),
        "row_alignment": 1,
    }


def _fbgemm_gpu_bag(packed, dim, bits, rows, indices, offsets, mode, psw, include_last_offset, padding_idx):
    if padding_idx >= 0:
        raise ValueError("the fbgemm_gpu provider has no padding_idx; use the builtin one")
    ops.embedding_bag_check(rows, indices, offsets, MODES[mode], psw, include_last_offset, padding_idx)
    if not include_last_offset:  # fbgemm_gpu wants the end of the last bag too
        offsets = torch.cat([offsets, offsets.new_tensor([indices.numel()])])
    if offsets.numel() <= 1:
        return torch.empty(0, dim)
    return torch.ops.fbgemm.int_nbit_split_embedding_codegen_lookup_function(
        dev_weights=packed.view(-1), indices=indices, offsets=offsets, pooling_mode=MODES[mode],
        indice_weights=psw, **_tbe_constants(bits, dim))


def _same(table, dim, bits):
    return table  # every provider reads the canonical layout


EMBEDDING_PROVIDERS: dict[str, EmbeddingProvider] = {
    "builtin": EmbeddingProvider("builtin", lambda: True, lambda *a: None, _same, _same, _builtin_bag),
    "fbgemm": EmbeddingProvider("fbgemm", lambda: True, _fbgemm_refuses, _same, _same, _fbgemm_bag),
    "fbgemm_gpu": EmbeddingProvider("fbgemm_gpu", _fbgemm_gpu_available, _fbgemm_gpu_refuses, _same, _same,
                                    _fbgemm_gpu_bag),
}


def get_embedding_provider(name: str) -> EmbeddingProvider:
    if name not in EMBEDDING_PROVIDERS:
        raise ValueError(f"unknown embedding provider {name!r}; choose one of {', '.join(EMBEDDING_PROVIDERS)}")
    return EMBEDDING_PROVIDERS[name]


# ---- the packed table ---------------------------------------------------------------------------

class PackedEmbeddingTable(Tracked):
    """One rowwise-quantized table in one provider's layout. Pickles (and deep-copies) as the
    canonical fused table plus metadata, and repacks when loaded."""

    def __init__(self, table: torch.Tensor, dim: int, bits: int, provider: str = "builtin"):
        if not isinstance(table, torch.Tensor) or table.dtype != torch.uint8 or table.dim() != 2:
            raise TypeError("table must be a 2-D uint8 tensor (quantize_rowwise's result)")
        self.dim, self.bits = int(dim), int(bits)
        self.num_embeddings = int(table.shape[0])
        self.qparams_dtype = qparams_dtype_of(table, self.dim, self.bits)
        self.provider = get_embedding_provider(provider)
        why = self.provider.refuses_table(self.qparams_dtype, self.bits, self.dim, -1)
        if why is not None:
            raise ValueError(f"embedding provider {provider!r} cannot hold this table: {why}")
        self.packed = self.provider.pack(table.detach().contiguous(), self.dim, self.bits)
        self.saved_provider = self.provider.name  # differs after loading where that one cannot run

    @property
    def provider_name(self) -> str:
        return self.provider.name

    def table(self) -> torch.Tensor:
        """The canonical fused table (builtin layout)."""
        return self.provider.unpack(self.packed, self.dim, self.bits)

    def nbytes(self) -> int:
        return self.packed.numel() * self.packed.element_size()

    def bag(self, indices: torch.Tensor, offsets: torch.Tensor, mode: str = "sum",
            per_sample_weights: torch.Tensor | None = None, include_last_offset: bool = False,
            padding_idx: int = -1) -> torch.Tensor:
        return self.provider.bag(self.packed, self.dim, self.bits, self.num_embeddings, indices, offsets, mode,
                                 per_sample_weights, include_last_offset, padding_idx)

    def lookup(self, indices: torch.Tensor) -> torch.Tensor:
        """Rows (no pooling): [*indices.shape, dim]."""
        flat = indices.reshape(-1).contiguous()
        offsets = torch.arange(flat.numel(), dtype=flat.dtype)
        return self.bag(flat, offsets).view(*indices.shape, self.dim)

    def __getstate__(self) -> dict:
        return {"format_version": FORMAT_VERSION, "table": self.table(), "dim": self.dim, "bits": self.bits,
                "provider": self.provider.name}

    def __setstate__(self, state: dict) -> None:
        check_state_version(state.get("format_version"), (FORMAT_VERSION,), "PackedEmbeddingTable state")
        provider = state["provider"]
        table = state["table"]
        if get_embedding_provider(provider).refuses_table(qparams_dtype_of(table, state["dim"], state["bits"]),
                                                    state["bits"], state["dim"], -1) is not None:
            # saved where that provider ran (e.g. fbgemm_gpu installed), loaded where it cannot:
            # the builtin kernel holds any table; qbackend.load then routes it for this machine
            self.__init__(table, state["dim"], state["bits"], "builtin")
            self.saved_provider = provider
            return
        self.__init__(table, state["dim"], state["bits"], provider)

    @classmethod
    def from_state(cls, state: dict, provider: str | None = None) -> "PackedEmbeddingTable":
        obj = cls.__new__(cls)
        obj.__setstate__(dict(state, provider=provider or state["provider"]))
        return obj

    def with_provider(self, provider: str) -> "PackedEmbeddingTable":
        return type(self).from_state(self.__getstate__(), provider)

    def __deepcopy__(self, memo):
        return type(self).from_state(copy.deepcopy(self.__getstate__(), memo))

    def __repr__(self) -> str:
        return (f"PackedEmbeddingTable(num_embeddings={self.num_embeddings}, dim={self.dim}, bits={self.bits}, "
                f"qparams={str(self.qparams_dtype).replace('torch.', '')}, provider={self.provider.name!r})")


# ---- fake impls -------------------------------------------------------------------------------

@torch.library.register_fake("qbackend::embedding_bag_rowwise")
def _embedding_bag_rowwise_fake(table, dim, bits, indices, offsets, mode, per_sample_weights=None,
                                include_last_offset=False, padding_idx=-1):
    bags = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    return table.new_empty((bags, dim), dtype=torch.float32)


@torch.library.register_fake("qbackend::fbgemm_embedding_bag")
def _fbgemm_embedding_bag_fake(table, dim, bits, indices, offsets, mode, per_sample_weights=None,
                               include_last_offset=False):
    bags = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    return table.new_empty((bags, dim), dtype=torch.float32)


@torch.library.register_fake("qbackend::embedding_rowwise")
def _embedding_rowwise_fake(table, dim, bits, indices):
    return table.new_empty((*indices.shape, dim), dtype=torch.float32)


@torch.library.register_fake("qbackend::embedding_bag_check")
def _embedding_bag_check_fake(num_rows, indices, offsets, mode, per_sample_weights=None, include_last_offset=False,
                              padding_idx=-1):
    return None
