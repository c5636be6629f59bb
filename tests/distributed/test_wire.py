"""The wire form of calibration states (qbackend.distributed.wire): values round-trip exactly,
and malformed bytes from another rank raise WireError instead of building anything."""
from __future__ import annotations

import json
import math

import pytest
import torch

from qbackend.distributed.wire import WireError, decode, encode


def test_round_trip_of_every_kind_of_value():
    value = {"ints": [0, -3, 2 ** 62], "floats": [0.1, -0.0, math.inf, -math.inf], "none": None, "flag": True,
             "text": "ünïcode", "nested": {"t": torch.arange(12, dtype=torch.int64).reshape(3, 4)},
             "tensors": [torch.randn(5, dtype=dt).to(dt) for dt in (torch.float32, torch.float64, torch.bfloat16,
                                                                    torch.float16)]
             + [torch.tensor([1, -2], dtype=torch.int8), torch.tensor([3], dtype=torch.uint8),
                torch.tensor([True, False]), torch.tensor([7], dtype=torch.int32), torch.empty(0, 4)],
             "tuple": (1, 2)}
    back = decode(torch.cat([encode(value), torch.zeros(9, dtype=torch.uint8)]))  # padding is ignored
    assert back["ints"] == value["ints"] and back["none"] is None and back["flag"] is True
    assert back["text"] == value["text"] and back["tuple"] == [1, 2]
    assert back["floats"][:3] == [0.1, -0.0, math.inf] and back["floats"][3] == -math.inf
    assert math.copysign(1, back["floats"][1]) == -1
    assert torch.equal(back["nested"]["t"], value["nested"]["t"])
    for a, b in zip(back["tensors"], value["tensors"]):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    assert math.isnan(decode(encode(math.nan)))
    noncontiguous = torch.randn(4, 6)[:, ::2]
    assert torch.equal(decode(encode(noncontiguous)), noncontiguous)


@pytest.mark.parametrize("value,what", [(object(), "object"), ({1: 2}, "keys"), (torch.zeros(2, dtype=torch.complex64),
                                                                            "complex64"), ({"$tensor": 0}, "reserved")])
def test_values_without_a_wire_form_are_refused(value, what):
    with pytest.raises(WireError, match=what):
        encode(value)


def _raw(doc, payload: bytes = b"") -> torch.Tensor:
    text = json.dumps(doc).encode()
    data = len(text).to_bytes(8, "little") + text + payload
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


@pytest.mark.parametrize("data,match", [
    (torch.zeros(3, dtype=torch.uint8), "no header"),
    (torch.zeros(2, 4, dtype=torch.uint8), "1-D uint8"),
    (torch.tensor([255] * 8 + [0], dtype=torch.uint8), "bytes of document"),
    (_raw("x")[:-1], "bytes of document"),
    (torch.frombuffer(bytearray((3).to_bytes(8, "little") + b"{x}"), dtype=torch.uint8), "not JSON"),
    (_raw({"$tensor": 0, "dtype": "float32", "shape": [4]}, b"\0" * 8), "ends inside tensor"),
    (_raw({"$tensor": 0, "dtype": "object", "shape": [1]}), "malformed tensor"),
    (_raw({"$tensor": 1, "dtype": "float32", "shape": [1]}), "malformed tensor"),
    (_raw({"$tensor": 0, "dtype": "float32", "shape": [-1]}), "malformed tensor"),
    (_raw({"$tensor": 0, "dtype": "float32", "shape": [1], "extra": 1}), "malformed tensor"),
    (_raw({"$float": "1e5"}), "malformed float"),
])
def test_malformed_bytes_raise(data, match):
    with pytest.raises(WireError, match=match):
        decode(data)
