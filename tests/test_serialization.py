"""qbackend.save / load: round trips, bad files, routes decided again on the loading machine (an
8-bit model loaded on an AVX2-only CPU keeps its 8-bit activations on the native AVX2 GEMM), explain,
provider overrides."""
from __future__ import annotations

import json
import textwrap

import pytest
import torch

import qbackend
from qbackend.cli import main as cli_main
from qbackend.serialization import ModelFileError
from qbackend.nn import QuantizedConv2d, QuantizedLinear

from .lowering.toy_models import MLP, ResidualCNN, init_bn, sqnr
from .subprocess_utils import run_py

pytestmark = pytest.mark.filterwarnings("ignore::qbackend.lowering.convert.FP32FallbackWarning",
                                        "ignore::FutureWarning")


# Whether this machine's hardware has VNNI (QBACKEND_ISA can mask it, not add it): without it the
# libraries saturate 8-bit activations, so a conversion here already gives 7-bit inputs to the
# layers no provider runs exactly.
VNNI_HARDWARE = qbackend.cpu_features().avx512_vnni.usable or qbackend.cpu_features().avx_vnni.usable


def _img(n, seed):
    return torch.randn(n, 3, 16, 16, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    model = init_bn(ResidualCNN())
    q = qbackend.quantize(model, (_img(2, 0),), [_img(4, s) for s in range(1, 4)])
    return model, q


def _int8_layers(q):
    return [m for m in q.modules() if isinstance(m, (QuantizedConv2d, QuantizedLinear))]


def test_round_trip(cnn, tmp_path):
    _, q = cnn
    path = tmp_path / "cnn.qb"
    qbackend.save(q, path)
    q2 = qbackend.load(path)
    x = _img(3, 9)
    assert torch.equal(q2(x), q(x))
    assert [r["provider"] for r in qbackend.explain(q2)] == [r["provider"] for r in qbackend.explain(q)]
    assert q2.qbackend_rebind == {"requantized": [], "rerouted": {}}
    assert q2.qbackend_activations == q.qbackend_activations


def test_round_trip_dynamic_and_module_swap(tmp_path):
    model = MLP().eval()
    q = qbackend.quantize_dynamic(model)
    qbackend.save(q, tmp_path / "d.qb")
    x = torch.randn(5, 32)
    # The module-swapped model keeps the user's MLP: loading rebuilds it only when told to trust it.
    assert qbackend.serialization.inspect_file(tmp_path / "d.qb")["classes"] == ["tests.lowering.toy_models:MLP"]
    with pytest.raises(ModelFileError, match=r"classes outside qbackend and torch.nn \(tests.lowering.toy_models:MLP\)"):
        qbackend.load(tmp_path / "d.qb")
    assert torch.equal(qbackend.load(tmp_path / "d.qb", classes=[MLP])(x), q(x))
    from tests.lowering import toy_models
    assert torch.equal(qbackend.load(tmp_path / "d.qb", classes=[toy_models])(x), q(x))
    with pytest.raises(TypeError, match="classes must hold classes or modules"):
        qbackend.load(tmp_path / "d.qb", classes=["MLP"])


def test_save_rejects_other_models(tmp_path):
    with pytest.raises(TypeError, match="qbackend.convert"):
        qbackend.save(MLP().eval(), tmp_path / "x.qb")
    with pytest.raises(FileNotFoundError):
        qbackend.load(tmp_path / "missing.qb")


_CHILD = textwrap.dedent("""
    import json, sys, warnings, torch
    import qbackend
    from qbackend.nn import QuantizedConv2d, QuantizedLinear
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        q = qbackend.load(sys.argv[1])
    x = torch.load(sys.argv[2])
    torch.save(q(x), sys.argv[3])
    mods = [m for m in q.modules() if isinstance(m, (QuantizedConv2d, QuantizedLinear))]
    print(json.dumps({"isa": qbackend.cpu_features().isa_class,
                      "providers": [r["provider"] for r in qbackend.explain(q)],
                      "rules": [r["why"] for r in qbackend.explain(q)],
                      "requantized": len(q.qbackend_rebind["requantized"]),
                      "x_zp_max": max(m.x_zero_point for m in mods),
                      "warned": [str(w.message) for w in caught if "requantized" in str(w.message)]}))
""")


@pytest.mark.parametrize("isa", ["avx2", "avx512_vnni"])
def test_load_on_another_isa(cnn, tmp_path, isa):
    if isa == "avx512_vnni" and not qbackend.cpu_features().avx512_vnni.usable:
        pytest.skip("QBACKEND_ISA cannot raise the ISA above the hardware's (no AVX512-VNNI here)")
    model, q = cnn
    path, xin, yout = tmp_path / "m.qb", tmp_path / "x.pt", tmp_path / "y.pt"
    qbackend.save(q, path)
    x = _img(3, 21)
    torch.save(x, xin)
    proc = run_py(_CHILD.replace("sys.argv[1]", repr(str(path))).replace("sys.argv[2]", repr(str(xin)))
                  .replace("sys.argv[3]", repr(str(yout))), env={"QBACKEND_ISA": isa}, timeout=300, check=True)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    y = torch.load(yout)
    assert res["isa"] == isa
    from qbackend.dispatch import rules

    for info, provider in zip(q.qbackend_layers.values(), res["providers"]):
        expect = rules.choose(info.kind, isa, info.shape).provider
        if isa == "avx2" and provider != expect:  # 8-bit inputs: the exact route where the rule's saturates
            assert provider == "native", (info, provider, expect)
        elif provider != expect:  # avx512_vnni: exactness may force the other one
            assert provider == expect, (info, provider, expect)
    with torch.no_grad():
        ref = model(x)
    # 8-bit activations stay 8-bit on both: under avx2 the native AVX2 GEMM runs the convs and
    # Linear exactly (same sums; the epilogue's float rounding may differ by an LSB).
    assert res["requantized"] == 0 and not res["warned"]
    if isa == "avx2":
        assert "native" in res["providers"]
        assert sqnr(q(x), y) > 40 and sqnr(ref, y) > sqnr(ref, q(x)) - 0.5
    else:
        assert torch.equal(y, q(x))


def test_load_under_avx2_requantizes_only_inputs_without_an_exact_route(tmp_path):
    """A grouped conv with 4 channels per group has no exact 8-bit route without VNNI (FBGEMM and
    oneDNN saturate, the native GEMM runs groups 1): loading under QBACKEND_ISA=avx2 requantizes that
    conv's input alone to 7 bits; the dense convs around it keep 8 bits on the native GEMM."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3, padding=1, groups=2), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3, padding=1)).eval()
    q = qbackend.quantize(model, (_img(2, 0),), [_img(4, s) for s in range(1, 4)])
    if not VNNI_HARDWARE:  # converted without VNNI: the grouped conv's input has 7 bits from the start
        mods = [m for m in q.modules() if isinstance(m, QuantizedConv2d)]
        assert [q.qbackend_activations[m.x_value].qmax for m in mods] == [255, 127, 255]
        assert [m.provider == "native" for m in mods] == [True, False, True]
        return
    path, xin, yout = tmp_path / "g.qb", tmp_path / "x.pt", tmp_path / "y.pt"
    qbackend.save(q, path)
    x = _img(3, 21)
    torch.save(x, xin)
    code = _CHILD.replace("sys.argv[1]", repr(str(path))).replace("sys.argv[2]", repr(str(xin))) \
        .replace("sys.argv[3]", repr(str(yout)))
    code += "print(json.dumps({'values': q.qbackend_rebind['requantized'], 'x_values': [m.x_value for m in mods], " \
            "'x_qmax': [q.qbackend_activations[m.x_value].qmax for m in mods]}))\n"
    proc = run_py(code, env={"QBACKEND_ISA": "avx2"}, timeout=300, check=True)
    lines = proc.stdout.strip().splitlines()
    res, extra = json.loads(lines[-2]), json.loads(lines[-1])
    assert extra["values"] == [extra["x_values"][1]] and res["warned"]
    assert extra["x_qmax"][0] == 255 and extra["x_qmax"][1] == 127 and extra["x_qmax"][2] == 255
    assert res["providers"][0] == res["providers"][2] == "native" and res["providers"][1] != "native"
    with torch.no_grad():
        ref = model(x)
    assert sqnr(ref, torch.load(yout)) > sqnr(ref, q(x)) - 6


def test_explain_and_cli(cnn, tmp_path, capsys):
    _, q = cnn
    rows = qbackend.explain(q)
    assert [r["layer"] for r in rows] == list(q.qbackend_layers)
    for r in rows:
        assert r["provider"] == q.layer(r["layer"]).provider and r["why"]
    assert rows.rows[2]["fused"] == "+residual relu"  # b1c2
    path = tmp_path / "m.qb"
    qbackend.save(q, path)
    assert cli_main(["explain", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| b1c2 | conv2d | static |" in out and "saved on" in out
    assert cli_main(["explain", str(tmp_path / "nope.qb")]) == 2


def test_provider_overrides():
    model = MLP().eval()
    x = torch.randn(6, 32)
    cfg = qbackend.QuantConfig(provider="onednn", by_name={"fc2": qbackend.QuantConfig(provider="fbgemm")})
    q = qbackend.quantize(model, (x,), [x], config=cfg)
    providers = {r["layer"]: r["provider"] for r in qbackend.explain(q)}
    assert providers == {"fc1": "onednn", "fc2": "fbgemm", "fc3": "onednn", "shared": "onednn", "shared@1": "onednn"}
    assert all("forced" in r["why"] for r in qbackend.explain(q))
    with pytest.raises(ValueError, match="provider must be one of"):
        qbackend.QuantConfig(provider="mkl")
    code = textwrap.dedent("""
        import torch, warnings, qbackend
        warnings.simplefilter("ignore")
        from tests.lowering.toy_models import MLP
        x = torch.randn(6, 32)
        q = qbackend.quantize(MLP().eval(), (x,), [x])
        print(sorted({r["provider"] for r in qbackend.explain(q)}))
    """)
    proc = run_py(code, env={"QBACKEND_PROVIDER": "reference"}, timeout=300, check=True)
    assert proc.stdout.strip().splitlines()[-1] == "['reference']"


@pytest.mark.parametrize("forced", [None, "onednn"])
def test_loading_routes_a_dynamic_lstm_again(tmp_path, forced):
    """A dynamic LSTM's products are routed again where the model is loaded (packed on other
    providers where it was saved); a forced provider stays."""
    from tests.legacy_models import DynamicNet

    torch.manual_seed(2)
    model = DynamicNet().eval()
    x = torch.randn(3, 7, 12, generator=torch.Generator().manual_seed(3))
    q = qbackend.quantize_dynamic(model, config=qbackend.QuantConfig(mode="dynamic", provider=forced))
    lstm = q.layer("lstm")
    fresh = lstm.providers
    if forced is not None:
        assert fresh == {"ih": [forced], "hh": [forced]}
    # as if saved where the rules chose otherwise: every product on a provider other than today's
    elsewhere = {k: next(p for p in ("fbgemm", "onednn", "native") if p not in v) for k, v in fresh.items()}
    lstm.w_ih = [w.with_provider(elsewhere["ih"]) for w in lstm.w_ih]
    lstm.w_hh = [[w.with_provider(elsewhere["hh"]) for w in ws] for ws in lstm.w_hh]
    path = tmp_path / "lstm.qb"
    qbackend.save(q, path)
    loaded = qbackend.load(path, classes=[DynamicNet])
    row = next(r for r in qbackend.explain(loaded) if r["layer"] == "lstm")
    if forced is None:
        assert loaded.layer("lstm").providers == fresh
        assert row["why"].startswith(f"re-routed on this machine ({'/'.join(sorted(set(elsewhere.values())))} "
                                     "before): dynamic LSTM (providers: "), row["why"]
        assert loaded.qbackend_rebind["rerouted"]["lstm"][1] == row["provider"]
    else:
        assert loaded.layer("lstm").providers == {k: [v] for k, v in elsewhere.items()}
        assert "lstm" not in loaded.qbackend_rebind["rerouted"]
    with torch.no_grad():
        ref = model(x)
        assert sqnr(ref, loaded(x)) > 30
