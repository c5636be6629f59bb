"""The channels-last calibration graph (qbackend/lowering/calibration_graph.py): what it records is
what the prepared graph records (observer ranges equal up to the FP32 convolutions' rounding, the
same histogram windows), views of channels-last values work (as reshapes), the outputs come back
contiguous, the prepared graph convert rewrites is untouched, and graphs with ops outside its list
run as prepared."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import qbackend
from qbackend.lowering.calibration_graph import calibration_graph

pytestmark = pytest.mark.filterwarnings("ignore::qbackend.lowering.convert.FP32FallbackWarning")


class FlattenCNN(nn.Module):
    """Flattens a 4x4 feature map (a view of a channels-last value must not fail) and also returns
    the feature map itself (a 4-D output)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 8, 3, stride=2, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        y = torch.relu(self.conv2(torch.relu(self.bn(self.conv1(x)))))
        return self.fc(torch.flatten(y, 1)), y


class Erf(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return torch.special.erf(self.conv(x))


def _batches(n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, 3, 8, 8, generator=g),) for _ in range(n)]


def _model():
    torch.manual_seed(0)
    m = FlattenCNN()
    m.bn.running_mean.uniform_(-0.5, 0.5)
    m.bn.running_var.uniform_(0.5, 2.0)
    return m.eval()


def test_records_what_the_prepared_graph_records():
    model, data = _model(), _batches()
    fast = qbackend.prepare(model, data[0])
    plain = qbackend.prepare(model, data[0])
    plain._prepared._calibration_gm = None  # the prepared graph itself
    qbackend.calibrate(fast, data)
    qbackend.calibrate(plain, data)
    assert fast._prepared.calibration_module() is not fast._prepared.gm
    a, b = fast.observers(), plain.observers()
    assert a.keys() == b.keys() and len(a) >= 3
    for name in a:
        (lo_a, hi_a), (lo_b, hi_b) = a[name].chosen_range(), b[name].chosen_range()
        assert lo_a == pytest.approx(lo_b, rel=1e-5, abs=1e-6) and hi_a == pytest.approx(hi_b, rel=1e-5, abs=1e-6)
        assert a[name].count == b[name].count
    out_fast, map_fast = fast(*data[0])
    out_plain, map_plain = plain(*data[0])
    assert map_fast.is_contiguous() and out_fast.is_contiguous()
    torch.testing.assert_close(out_fast, out_plain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(map_fast, model(*data[0])[1], rtol=1e-5, atol=1e-5)
    # the converted models agree: same layers, int8 outputs within a level of each other
    qa, qb = qbackend.convert(fast), qbackend.convert(plain)
    x = _batches(1, seed=9)[0]
    assert set(qa.qbackend_layers) == set(qb.qbackend_layers) == {"conv1", "conv2", "fc"}
    torch.testing.assert_close(qa(*x)[0], qb(*x)[0], rtol=0, atol=0.05)


def test_prepared_graph_keeps_its_views_and_layout():
    model, data = _model(), _batches()
    prepared = qbackend.prepare(model, data[0])
    targets = [str(n.target) for n in prepared._prepared.gm.graph.nodes]
    calib = prepared._prepared.calibration_module()
    calib_targets = [str(n.target) for n in calib.graph.nodes]
    assert "aten.view.default" in targets and "aten.view.default" not in calib_targets
    assert "aten.reshape.default" in calib_targets
    assert "contiguous" not in targets and calib_targets.count("contiguous") == 2  # the input, the 4-D output


def test_graphs_with_other_ops_run_as_prepared():
    torch.manual_seed(0)
    prepared = qbackend.prepare(Erf().eval(), _batches(1)[0])
    assert calibration_graph(prepared._prepared.gm) is None
    assert prepared._prepared.calibration_module() is prepared._prepared.gm
    qbackend.calibrate(prepared, _batches(2))
    assert qbackend.convert(prepared)(*_batches(1)[0]).shape == (4, 4, 6, 6)


def test_models_without_convolutions_run_as_prepared():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4)).eval()
    prepared = qbackend.prepare(model, (torch.randn(2, 3, 5, 8),))
    assert prepared._prepared.calibration_module() is prepared._prepared.gm
