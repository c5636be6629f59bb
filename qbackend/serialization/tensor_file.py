"""The container of a qbackend model file: a safetensors file (8-byte little-endian header length, a
JSON header naming each tensor's dtype, shape and byte range, then the tensors' bytes), readable by
any safetensors reader. qbackend's own description of the model rides in the header's
`__metadata__` (string values only, as safetensors requires).

Reading checks the whole layout before returning anything: the header length against the file
size, every tensor's dtype, its byte count against its shape, byte ranges that tile the data
section exactly (no gap, no overlap, nothing after the last tensor). A violation raises
`ContainerError` naming what is wrong. No code runs: the header is JSON, the tensors are bytes.
"""
from __future__ import annotations

import json
import math
import struct

import torch

# safetensors' dtype names for the dtypes a qbackend model holds.
DTYPE_NAMES = {
    torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.uint16: "U16",
    torch.int32: "I32", torch.uint32: "U32", torch.int64: "I64", torch.uint64: "U64", torch.float16: "F16",
    torch.bfloat16: "BF16", torch.float32: "F32", torch.float64: "F64",
}
DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}
MAX_HEADER_BYTES = 1 << 30  # a header past this is a corrupt length, not a model


class ContainerError(ValueError):
    """The bytes are not a well-formed safetensors file."""


def write(path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """Write `tensors` (contiguous CPU tensors of DTYPE_NAMES' dtypes) and `metadata` to `path`."""
    header: dict = {"__metadata__": dict(metadata)}
    offset = 0
    blobs = []  # each tensor's bytes, as a view (written without a copy)
    for name, t in tensors.items():
        if t.dtype not in DTYPE_NAMES:
            raise TypeError(f"tensor {name!r}: dtype {t.dtype} cannot be stored")
        data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
        header[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + data.nbytes]}
        offset += data.nbytes
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    text += b" " * (-len(text) % 8)  # the data section starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(memoryview(data))


def _check_entry(name: str, entry) -> tuple[torch.dtype, list[int], int, int]:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise ContainerError(f"tensor {name!r}: header entry is not {{dtype, shape, data_offsets}}")
    dtype = DTYPES.get(entry["dtype"]) if isinstance(entry["dtype"], str) else None
    if dtype is None:
        raise ContainerError(f"tensor {name!r}: unknown dtype {entry['dtype']!r}")
    shape, offsets = entry["shape"], entry["data_offsets"]
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise ContainerError(f"tensor {name!r}: shape {shape!r} is not a list of sizes")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int and o >= 0 for o in offsets):
        raise ContainerError(f"tensor {name!r}: data_offsets {offsets!r} is not [begin, end]")
    begin, end = offsets
    itemsize = torch.empty((), dtype=dtype).element_size()
    if end - begin != math.prod(shape) * itemsize:
        raise ContainerError(f"tensor {name!r}: {end - begin} bytes for shape {shape} of {entry['dtype']}")
    return dtype, shape, begin, end


def read(data: bytes, source: str = "file") -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) of a safetensors file's bytes; the tensors are copies, not views of `data`."""
    if len(data) < 8:
        raise ContainerError(f"{source}: {len(data)} bytes, shorter than a safetensors header")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER_BYTES or 8 + n > len(data):
        raise ContainerError(f"{source}: header length {n} does not fit in the file's {len(data)} bytes "
                             "(truncated or corrupt)")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ContainerError(f"{source}: the header is not valid JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(header, dict):
        raise ContainerError(f"{source}: the header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise ContainerError(f"{source}: __metadata__ is not an object of strings")
    body = memoryview(data)[8 + n:]
    entries = sorted(((*_check_entry(name, e), name) for name, e in header.items()), key=lambda e: (e[2], e[3]))
    cursor = 0
    tensors = {}
    for dtype, shape, begin, end, name in entries:
        if begin != cursor:
            raise ContainerError(f"{source}: tensor {name!r} starts at byte {begin} of the data, expected {cursor} "
                                 "(gap or overlap)")
        if end > len(body):
            raise ContainerError(f"{source}: tensor {name!r} ends at byte {end}, past the data's {len(body)} bytes "
                                 "(truncated?)")
        cursor = end
        raw = bytearray(body[begin:end])
        t = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(shape)
    if cursor != len(body):
        raise ContainerError(f"{source}: {len(body) - cursor} bytes after the last tensor")
    return tensors, metadata
