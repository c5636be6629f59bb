"""QuantConfig.seven_bit_for_speed: without VNNI, static layers whose 7-bit route the 7-bit table
(dispatch.rules.SEVEN_BIT) measures more than 1.5x faster read 7-bit activations; the others keep
8 bits; False, a forced provider or an explicit reduce_range keep today's choice. Run in a child
under QBACKEND_ISA=avx2 (the CPU class is read once per process)."""
from __future__ import annotations

import json

from ..subprocess_utils import run_py

_CHILD = r"""
import json, warnings
import torch, qbackend
from torch import nn
warnings.simplefilter("ignore")
torch.manual_seed(0)
# a stem (no row), a 3x3 over 64 channels (the table's KxK row), a 1x1 over 64 (no row: 8 bits stay)
model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
                      nn.Conv2d(64, 8, 1)).eval()
g = torch.Generator().manual_seed(1)
cal = [torch.randn(4, 3, 12, 12, generator=g) for _ in range(3)]
x = torch.randn(3, 3, 12, 12, generator=g)
out = {"isa": qbackend.cpu_features().isa_class}
for tag, cfg in (("default", None), ("off", qbackend.QuantConfig(seven_bit_for_speed=False)),
                 ("forced", qbackend.QuantConfig(provider="native"))):
    q = qbackend.quantize(model, (cal[0],), cal, config=cfg)
    mods = [m for m in q.modules() if isinstance(m, qbackend.nn.QuantizedConv2d)]
    with torch.no_grad():
        ref, y = model(x), q(x)
    out[tag] = {"qmax": [q.qbackend_activations[m.x_value].qmax for m in mods],
                "providers": [m.provider for m in mods],
                "sqnr": float(10 * torch.log10(ref.pow(2).sum() / (ref - y).pow(2).sum()))}
print(json.dumps(out))
"""


def test_seven_bit_inputs_where_the_table_says_they_pay():
    proc = run_py(_CHILD, env={"QBACKEND_ISA": "avx2"}, timeout=300, check=True)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["isa"] == "avx2"
    # the stem (3 channels) and the 1x1 over 64 keep 8 bits on the exact native GEMM; the 3x3 over
    # 64 channels reads 7 bits on a library's conv
    assert res["default"]["qmax"] == [255, 127, 255], res
    assert res["default"]["providers"][0] == res["default"]["providers"][2] == "native"
    assert res["default"]["providers"][1] != "native"
    for tag in ("off", "forced"):
        assert res[tag]["qmax"] == [255, 255, 255] and res[tag]["providers"] == ["native"] * 3, res
    # 6 dB less on one layer's input: the output stays close to the all-8-bit model's
    assert res["off"]["sqnr"] > 35 and res["default"]["sqnr"] > res["off"]["sqnr"] - 6, res
