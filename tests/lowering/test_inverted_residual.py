"""The inverted-residual pass (lowering/inverted_residual.py) on a small MobileNetV2: every block
becomes one QuantizedInvertedResidual where the fusion table lists the chain for this CPU, whose
outputs equal its layers run one by one, bit for bit, at several batch sizes, in the forward plan
and after save / load; the layers' records and `layer()` still find each layer; hooks on a layer,
QuantConfig(fusions=False) and a forced provider keep the layers separate; on a CPU class the table
does not list (QBACKEND_ISA=avx2 in CI's rerun) nothing is fused."""
from __future__ import annotations

import threading

import pytest
import torch

import qbackend
from qbackend.dispatch import route
from qbackend.dispatch.cpu import cpu_features
from qbackend.dispatch import rules
from qbackend.dispatch.rules import FUSIONS, fusion
from qbackend.models.mobilenet import mobilenet_v2_case
from qbackend.nn import QuantizedConv2d
from qbackend.nn.inverted_residual import QuantizedInvertedResidual
from qbackend.report.plan_profile import profile_plan

FUSES = fusion("inverted_residual", cpu_features().isa_class) is not None


@pytest.fixture(scope="module")
def case():
    return mobilenet_v2_case(image_size=48, width_mult=0.5, num_classes=10, batch_size=4, num_calibration_batches=2,
                             num_eval_batches=1)


@pytest.fixture(scope="module")
def qmodel(case):
    return qbackend.quantize(case.model, case.example_inputs, case.calibration)


def _blocks(qmodel):
    return [m for m in qmodel.modules() if isinstance(m, QuantizedInvertedResidual)]


def _layer_by_layer(qmodel, x):
    """The model's output with every block's layers called one by one (a hook on each depthwise
    conv keeps a block off its fused call)."""
    handles = [b.depthwise.register_forward_hook(lambda *a: None) for b in _blocks(qmodel)]
    try:
        with torch.no_grad():
            return qmodel(x)
    finally:
        for h in handles:
            h.remove()


def test_fusion_rows_name_their_evidence():
    import pathlib
    results = pathlib.Path(__file__).parents[2] / "benchmarks" / "results"
    for row in FUSIONS:
        assert (results / row.evidence.split("#")[0]).is_file(), row.evidence


@pytest.mark.skipif(FUSES, reason="this CPU class fuses inverted residuals")
def test_nothing_fused_where_the_table_has_no_row(qmodel):
    assert not _blocks(qmodel)


@pytest.mark.skipif(not FUSES, reason="the fusion table lists no inverted-residual row for this CPU class")
class TestFused:
    def test_every_block_is_fused_and_equals_its_layers(self, qmodel):
        blocks = _blocks(qmodel)
        assert len(blocks) == 17
        assert sum(b.expand is None for b in blocks) == 1 and sum(b.project.has_accum for b in blocks) == 10
        for batch in (1, 3, 8):
            x = torch.randn(batch, 3, 48, 48, generator=torch.Generator().manual_seed(batch))
            with torch.no_grad():
                first, replayed = qmodel(x), qmodel(x)  # the second call records and replays the plan
                again = qmodel(x)
            ref = _layer_by_layer(qmodel, x)
            assert torch.equal(first, ref) and torch.equal(replayed, ref) and torch.equal(again, ref)

    def test_the_plan_runs_one_op_per_block(self, qmodel):
        x = torch.randn(2, 3, 48, 48)
        with torch.no_grad():
            qmodel(x), qmodel(x)
            plan, _ = qmodel.recorded_plan(x)
        assert sum("native_inverted_residual" in s for s in plan.step_names) == 17
        summary = qmodel.forward_plan_summary()[0]
        assert f"{len(qmodel.qbackend_layers)} of {len(qmodel.qbackend_layers)} layers" in summary, summary
        steps = profile_plan(qmodel, x, repeats=2).steps
        block = next(s for s in steps if s.module == "features.3.conv.fused_2")
        assert block.layer == "features.3.conv.0.0+features.3.conv.1.0+features.3.conv.2"

    def test_records_and_layer_lookup(self, qmodel):
        fused = {n: r for n, r in qmodel.qbackend_layers.items() if "fused into one native call" in r.why}
        assert len(fused) == 17 * 3 - 1  # the first block has no expansion
        for name, record in fused.items():
            assert record.route.provider == "native"
            layer = qmodel.layer(name)
            assert isinstance(layer, QuantizedConv2d) and layer.provider == "native"
        assert "features.3.conv.1.0" in fused
        assert qmodel.layer("features.3.conv.1.0") is qmodel.inner.get_submodule("features.3.conv.fused_2.depthwise")

    def test_compare_sees_every_layer(self, case, qmodel):
        report = qbackend.compare(case.model, qmodel, case.evaluation)
        by_name = {layer.name: layer for layer in report.layers}
        assert by_name["features.3.conv.1.0"].sqnr_db is not None
        assert all(layer.sqnr_db is not None for layer in report.layers)

    def test_save_and_load(self, qmodel, tmp_path):
        x = torch.randn(3, 3, 48, 48)
        with torch.no_grad():
            y = qmodel(x)
        qbackend.save(qmodel, tmp_path / "m.qb")
        loaded = qbackend.load(tmp_path / "m.qb")
        assert len(_blocks(loaded)) == 17
        with torch.no_grad():
            assert torch.equal(loaded(x), y) and torch.equal(loaded(x), y)
        # loading routes every layer again: a fused block's layers take the fusion's route
        info = loaded.qbackend_layers["features.2.conv.1.0"]
        assert "fused into one native call" in info.why
        for block in _blocks(loaded):
            for layer in block.layers:
                assert layer.packed.provider.name == "native" and layer.packed._forms is None

    def test_loaded_where_the_table_has_no_row(self, qmodel, tmp_path, monkeypatch):
        """A CPU whose fusion table lists no row: each layer gets its own route, and the blocks run
        their layers one by one, with the same result where the providers stay the same."""
        x = torch.randn(2, 3, 48, 48)
        with torch.no_grad():
            y = qmodel(x)
        qbackend.save(qmodel, tmp_path / "m.qb")
        monkeypatch.setattr(rules, "FUSIONS", ())
        loaded = qbackend.load(tmp_path / "m.qb")
        info = loaded.qbackend_layers["features.2.conv.1.0"]
        assert "fused" not in info.why and info.route == route(info.kind, info.shape, by_batch=info.route_by_batch)
        assert not any(b.fused for b in _blocks(loaded))
        with torch.no_grad():
            loaded(x), loaded(x)
            out = loaded(x)
            plan, _ = loaded.recorded_plan(x)
        assert not any("native_inverted_residual" in s for s in plan.step_names)
        same_providers = all(layer.packed.provider.name == "native" and layer.packed._forms is None
                             for b in _blocks(loaded) for layer in b.layers)
        assert torch.equal(out, y) if same_providers else torch.allclose(out, y, atol=0.2)

    def test_switched_off_or_forced_provider_keeps_layers_separate(self, case):
        off = qbackend.quantize(case.model, case.example_inputs, case.calibration,
                                config=qbackend.QuantConfig(fusions=False))
        assert not _blocks(off)
        forced = qbackend.quantize(case.model, case.example_inputs, case.calibration,
                                   config=qbackend.QuantConfig(provider="onednn"))
        assert not _blocks(forced)

    def test_concurrent_forwards_equal_serial_ones(self, qmodel):
        xs = [torch.randn(b, 3, 48, 48, generator=torch.Generator().manual_seed(40 + b)) for b in (1, 2, 3, 5)]
        with torch.no_grad():
            serial = [qmodel(x) for x in xs]
        results = [None] * len(xs)

        def run(i):
            with torch.no_grad():
                for _ in range(3):
                    results[i] = qmodel(xs[i])

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(xs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(torch.equal(r, s) for r, s in zip(results, serial))

    def test_depthwise_separable_chain_with_activations(self):
        """MobileNetV1's depthwise-separable conv (depthwise + ReLU -> 1x1 + ReLU, no expansion, no
        residual) is a chain too; its projection's activation runs in the fused call."""
        torch.manual_seed(3)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 40, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(40, 40, 3, stride=2, padding=1, groups=40), torch.nn.ReLU(),
            torch.nn.Conv2d(40, 24, 1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
            torch.nn.Linear(24, 5)).eval()
        data = [(torch.randn(4, 3, 20, 20),) for _ in range(3)]
        q = qbackend.quantize(model, data[0], data)
        blocks = _blocks(q)
        assert len(blocks) == 1 and blocks[0].expand is None and blocks[0].project.post_op == "relu"
        x = torch.randn(3, 3, 20, 20)
        with torch.no_grad():
            y = q(x)
            q(x)
            assert torch.equal(q(x), y) and torch.equal(_layer_by_layer(q, x), y)

    def test_wrong_residual_argument(self, qmodel):
        block = next(b for b in _blocks(qmodel) if b.project.has_accum)
        x = torch.zeros(1, block.layers[0].packed.in_channels, 6, 6, dtype=torch.uint8)
        with pytest.raises(ValueError, match="built with a residual input"):
            block(x)


def test_config_checks_fusions():
    with pytest.raises(TypeError, match="fusions must be True or False"):
        qbackend.QuantConfig(fusions="yes")
