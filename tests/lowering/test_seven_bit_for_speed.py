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
# examples of 4 rows: the 2048 -> 64 Linear is the table's row (M = 4, K >= 2048), the 64 -> 2048 one
# (K = 64) has none (8 bits stay); the last Linear reads per-token inputs (per_token_inputs="auto")
model = nn.Sequential(nn.Linear(64, 2048), nn.ReLU(), nn.Linear(2048, 64), nn.ReLU(), nn.Linear(64, 8)).eval()
g = torch.Generator().manual_seed(1)
cal = [torch.randn(4, 64, generator=g) for _ in range(3)]
x = torch.randn(4, 64, generator=g)
out = {"isa": qbackend.cpu_features().isa_class}
for tag, cfg in (("default", None), ("off", qbackend.QuantConfig(seven_bit_for_speed=False)),
                 ("forced", qbackend.QuantConfig(provider="native"))):
    q = qbackend.quantize(model, (cal[0],), cal, config=cfg)
    mods = [m for m in q.modules() if type(m) is qbackend.nn.QuantizedLinear]
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
    # the 64 -> 2048 Linear keeps 8 bits on the exact native GEMM; the 2048 -> 64 one reads 7 bits
    # on FBGEMM
    assert res["default"]["qmax"] == [255, 127], res
    assert res["default"]["providers"] == ["native", "fbgemm"], res
    for tag in ("off", "forced"):
        assert res[tag]["qmax"] == [255, 255] and res[tag]["providers"] == ["native"] * 2, res
    # 6 dB less on one layer's input: the output stays close to the all-8-bit model's
    assert res["off"]["sqnr"] > 25 and res["default"]["sqnr"] > res["off"]["sqnr"] - 6, res
