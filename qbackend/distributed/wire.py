"""Calibration statistics as bytes for the collectives, and back, without pickle: a JSON document
(dicts with string keys, lists, strings, numbers, booleans, None; every tensor a reference into a
table) followed by the tensors' raw bytes. Decoding builds only those values and CPU tensors of the
dtypes below, so bytes from another rank never run code."""
from __future__ import annotations

import json
import math

import torch

__all__ = ["WireError", "encode", "decode"]

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64, "int32": torch.int32,
           "uint8": torch.uint8, "int8": torch.int8, "bool": torch.bool, "bfloat16": torch.bfloat16,
           "float16": torch.float16}
_NAMES = {v: k for k, v in _DTYPES.items()}
_HEADER = 8  # bytes: the JSON document's length, little-endian
_ALIGN = 8


class WireError(ValueError):
    """A value that has no wire form (encoding), or malformed bytes (decoding)."""


def encode(value) -> torch.Tensor:
    """`value` (plain values, lists, tuples (sent as lists), string-keyed dicts and CPU tensors) as
    a uint8 tensor."""
    tensors: list[torch.Tensor] = []

    def plain(v, where):
        if isinstance(v, torch.Tensor):
            if v.device.type != "cpu" or v.dtype not in _NAMES:
                raise WireError(f"{where}: a {v.dtype} tensor on {v.device} has no wire form")
            tensors.append(v.detach().contiguous())
            return {"$tensor": len(tensors) - 1, "dtype": _NAMES[v.dtype], "shape": list(v.shape)}
        if isinstance(v, dict):
            if not all(isinstance(k, str) for k in v):
                raise WireError(f"{where}: dict keys must be strings")
            if "$tensor" in v:
                raise WireError(f"{where}: '$tensor' is a reserved key")
            return {k: plain(x, f"{where}.{k}") for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x, f"{where}[{i}]") for i, x in enumerate(v)]
        if v is None or isinstance(v, (bool, int, str)):
            return v
        if isinstance(v, float):
            return v if math.isfinite(v) else {"$float": repr(v)}
        raise WireError(f"{where}: a {type(v).__name__} has no wire form")

    doc = json.dumps(plain(value, "value"), separators=(",", ":")).encode()
    sizes = [t.numel() * t.element_size() for t in tensors]
    starts, at = [], _aligned(_HEADER + len(doc))
    for n in sizes:
        starts.append(at)
        at = _aligned(at + n)
    out = torch.zeros(at, dtype=torch.uint8)
    out[:_HEADER] = torch.tensor(list(len(doc).to_bytes(_HEADER, "little")), dtype=torch.uint8)
    out[_HEADER:_HEADER + len(doc)] = torch.frombuffer(bytearray(doc), dtype=torch.uint8)
    for t, n, start in zip(tensors, sizes, starts):
        if n:
            out[start:start + n] = t.reshape(-1).view(torch.uint8)
    return out


def _aligned(at: int) -> int:
    """Tensors start at multiples of 8 bytes, so decoding can view them in place."""
    return -(-at // _ALIGN) * _ALIGN


def decode(data: torch.Tensor):
    """The value `encode` gave `data` (a uint8 tensor; trailing padding ignored). Its tensors are
    views into `data` where it is aligned (writing to them writes to `data`)."""
    if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8 or data.dim() != 1:
        raise WireError("wire data must be a 1-D uint8 tensor")
    if data.numel() < _HEADER:
        raise WireError(f"wire data of {data.numel()} bytes has no header")
    length = int.from_bytes(data[:_HEADER].numpy().tobytes(), "little")
    if length > data.numel() - _HEADER:
        raise WireError(f"wire header says {length} bytes of document, only {data.numel() - _HEADER} follow")
    try:
        doc = json.loads(data[_HEADER:_HEADER + length].numpy().tobytes())
    except ValueError as exc:
        raise WireError(f"wire document is not JSON: {exc}") from exc
    refs = []

    def collect(v, where):
        if isinstance(v, dict):
            if "$tensor" in v:
                if set(v) != {"$tensor", "dtype", "shape"} or v["$tensor"] != len(refs) \
                        or v["dtype"] not in _DTYPES or not isinstance(v["shape"], list) \
                        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in v["shape"]):
                    raise WireError(f"{where}: malformed tensor reference {v!r}")
                refs.append(v)
                return
            if "$float" in v:
                if set(v) != {"$float"} or v["$float"] not in ("nan", "inf", "-inf"):
                    raise WireError(f"{where}: malformed float {v!r}")
                return
            for k, x in v.items():
                collect(x, f"{where}.{k}")
        elif isinstance(v, list):
            for i, x in enumerate(v):
                collect(x, f"{where}[{i}]")

    collect(doc, "value")
    tensors, at = [], _aligned(_HEADER + length)
    for ref in refs:
        dtype = _DTYPES[ref["dtype"]]
        size = torch.empty((), dtype=dtype).element_size()
        n = math.prod(ref["shape"]) * size
        if at + n > data.numel():
            raise WireError(f"wire data ends inside tensor {len(tensors)} ({ref['dtype']} {ref['shape']})")
        raw = data[at:at + n]
        if (data.storage_offset() + at) % size:
            raw = raw.clone()  # an unaligned buffer: copied before it is viewed as `dtype`
        tensors.append(raw.view(dtype).reshape(ref["shape"]))  # a view of `data`, which it keeps alive
        at = _aligned(at + n)

    def build(v):
        if isinstance(v, dict):
            if "$tensor" in v:
                return tensors[v["$tensor"]]
            if "$float" in v:
                return float(v["$float"])
            return {k: build(x) for k, x in v.items()}
        if isinstance(v, list):
            return [build(x) for x in v]
        return v

    return build(doc)
