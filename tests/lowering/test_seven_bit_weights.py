"""QuantConfig.seven_bit_for_speed's 7-bit weights: without VNNI, static convs (groups 1) and Linears
that the native provider runs get weights on [-64, 64] (rules.SEVEN_BIT_WEIGHTS), which the native
GEMM multiplies with AVX2's pair products; depthwise convs, `seven_bit_for_speed=False`, a weight
observer with its own range and a forced provider keep 8-bit weights; the output stays close to the
8-bit model's, and a saved model loads with the same weights and outputs. Run in a child under
QBACKEND_ISA=avx2 (the CPU class is read once per process)."""
from __future__ import annotations

import json

import pytest

from qbackend.core.extension import _C

from ..subprocess_utils import run_py

_CHILD = r"""
import json, os, tempfile, warnings
import torch, qbackend
from torch import nn
from qbackend.core.extension import _C
from qbackend.config import ObserverSpec, QuantConfig
warnings.simplefilter("ignore")
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.ReLU(),
                      nn.Conv2d(16, 64, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                      nn.Linear(64 * 2 * 2, 256), nn.ReLU(), nn.Linear(256, 10)).eval()
g = torch.Generator().manual_seed(1)
cal = [torch.randn(4, 3, 16, 16, generator=g) for _ in range(3)]
x = torch.randn(4, 3, 16, 16, generator=g)
own = QuantConfig(weight=ObserverSpec("per_channel_minmax", {"dtype": torch.int8, "symmetric": True, "axis": 0,
                                                             "qmin": -100, "qmax": 100}))
out = {"isa": qbackend.cpu_features().isa_class}
with torch.no_grad():
    ref = model(x)
def describe(q):
    layers = [m for m in q.modules() if type(m).__name__ in ("QuantizedConv2d", "QuantizedLinear")]
    with torch.no_grad():
        y = q(x)
    return {"max_w": [int(m.packed.weight.int().abs().max()) for m in layers],
            "groups": [getattr(m.packed, "groups", 1) for m in layers],
            "providers": [m.packed.provider.name for m in layers],
            "kernels": [_C.native_kernel_for(m.packed.packed) if m.packed.provider.name == "native"
                        and getattr(m.packed, "groups", 1) == 1 else "" for m in layers],
            "why": [r.get("why", "") for r in qbackend.explain(q).rows],
            "sqnr": float(10 * torch.log10(ref.pow(2).sum() / (ref - y).pow(2).sum())), "y": y}
for tag, cfg in (("default", None), ("off", QuantConfig(seven_bit_for_speed=False)), ("own_range", own),
                 ("forced", QuantConfig(provider="native"))):
    q = qbackend.quantize(model, (cal[0],), cal, config=cfg)
    d = describe(q)
    if tag == "default":
        path = os.path.join(tempfile.mkdtemp(), "m.qb")
        qbackend.save(q, path)
        loaded = describe(qbackend.load(path))
        out["loaded_same"] = torch.equal(loaded["y"], d["y"]) and loaded["max_w"] == d["max_w"]
        out["loaded_kernels"] = loaded["kernels"]
    d.pop("y")
    out[tag] = d
print(json.dumps(out))
"""


@pytest.mark.skipif(not _C.native_isa(), reason="the native GEMM needs AVX2")
def test_seven_bit_weights_where_the_native_gemm_runs_them():
    proc = run_py(_CHILD, env={"QBACKEND_ISA": "avx2"}, timeout=300, check=True)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["isa"] == "avx2"
    d = res["default"]
    assert d["providers"] == ["native"] * 5, res
    # the stem, the strided conv and the 256 x 256 Linear on 7 bits (pair products); the depthwise conv
    # and the 10-wide classifier (below the table's Linear size) keep 8
    assert [w <= 64 for w in d["max_w"]] == [True, False, True, True, False], res
    assert d["max_w"][0] == 64 or d["max_w"][2] == 64, res  # the grid's end is used
    assert d["kernels"] == ["avx2_pairs", "", "avx2_pairs", "avx2_pairs", "avx2"], res
    assert sum("7-bit weights" in w for w in d["why"]) == 3, d["why"]
    assert res["loaded_same"] and res["loaded_kernels"] == d["kernels"], res
    for tag in ("off", "forced"):
        assert all(w > 64 for w in res[tag]["max_w"]), (tag, res[tag])
        assert not any("7-bit weights" in w for w in res[tag]["why"]), (tag, res[tag])
    assert all(64 < w <= 100 for w in res["own_range"]["max_w"]), res["own_range"]
    # 7-bit weights cost some SQNR, not much
    assert res["off"]["sqnr"] > 25 and d["sqnr"] > res["off"]["sqnr"] - 6, res


def test_seven_bit_test_of_a_weight():
    """The reload's test of saved weights: both ends of [-64, 64] in, one level past either out
    (-128 included, which int8's abs leaves negative)."""
    import torch

    from qbackend.nn.weights import is_seven_bit

    assert is_seven_bit(torch.tensor([[-64, 0, 64]], dtype=torch.int8))
    for v in (65, -65, 127, -128):
        assert not is_seven_bit(torch.tensor([[v, 5, -3]], dtype=torch.int8)), v
