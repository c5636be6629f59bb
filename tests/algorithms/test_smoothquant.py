"""SmoothQuant (qbackend/algorithms/smoothquant.py, qbackend/lowering/smoothquant.py): the folds are exact in FP32 (both forms, on toy
blocks and on the pre-LN outlier transformer), the per-channel quantize border matches the
reference, the search never smooths without a gain, the smoothed int8 model beats the unsmoothed
one where activations have outlier channels, and it survives save/load."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import qbackend
from qbackend.lowering.pipeline import prepare_graph
from qbackend.algorithms.smoothquant import ChannelStats, factors_for
from qbackend.lowering.smoothquant import fold_fp32
from qbackend.nn import LayerNormQuantize
from qbackend.nn.quant import Quantize
from qbackend.ops import reference

from ..lowering.layer_reference import check_layers
from ..lowering.toy_models import sqnr

pytestmark = pytest.mark.filterwarnings("ignore::qbackend.lowering.convert.FP32FallbackWarning")
SQ = qbackend.QuantConfig(smoothquant=qbackend.SmoothQuantConfig())
OFF = qbackend.QuantConfig(smoothquant=None)


class LNBlock(nn.Module):
    """LayerNorm with outlier channels -> two Linears; post_ln: the LayerNorm output is also added
    to the result (a residual, as in BERT), so it cannot be folded into the LayerNorm."""

    def __init__(self, post_ln: bool, dim: int = 64, outliers: bool = True):
        super().__init__()
        self.post_ln = post_ln
        self.ln = nn.LayerNorm(dim)
        self.a, self.b = nn.Linear(dim, 96), nn.Linear(dim, dim)
        with torch.no_grad():
            self.ln.bias.normal_(0, 0.1)
            if outliers:
                self.ln.weight[:3] *= torch.tensor([30.0, 60.0, 100.0])

    def forward(self, x):
        h = self.ln(x)
        y = torch.cat([self.a(h), self.b(h)], dim=-1)
        return y + torch.cat([h, h, h[..., :32]], dim=-1) if self.post_ln else y


def _calibrated(model, batches, config=SQ):
    prepared = prepare_graph(model, batches[0], config)
    with torch.no_grad():
        for b in batches:
            prepared.gm(*b)
    return prepared


def _batches(n=3, shape=(4, 8, 64), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=g),) for _ in range(n)]


@pytest.mark.parametrize("post_ln, fold", [(False, "layer_norm"), (True, "quantize")])
def test_fold_fp32_is_exact(post_ln, fold):
    torch.manual_seed(0)
    model = LNBlock(post_ln).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batches = _batches()
    prepared = _calibrated(model, batches)
    assert [g.fold for g in prepared.smooth_groups] == [fold]
    group = prepared.smooth_groups[0]
    stats = prepared.gm.get_submodule(group.stats)
    weights = [model.a.weight, model.b.weight]
    s = factors_for(stats.absmax, weights, 0.5)
    assert float(s.max() / s.min()) > 10  # the outlier channels get large factors: a real change
    gm = copy.deepcopy(prepared.gm)
    fold_fp32(gm, [n for n in gm.graph.nodes if n.name == group.value.name][0],
              [n for n in gm.graph.nodes if n.name in {op.anchor.name for op in group.ops}], s, fold)
    x = torch.randn(3, 5, 64)
    with torch.no_grad():
        ref, out = model(x), gm(x)
    ref, out = (ref[0] if isinstance(ref, tuple) else ref), (out[0] if isinstance(out, tuple) else out)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # the folds made new tensors: the user's parameters are untouched
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_fold_fp32_exact_on_the_outlier_transformer():
    from qbackend.models import MODELS

    case = MODELS["transformer_outliers"](batch_size=2, seq_len=16, num_calibration_batches=2, num_eval_batches=1,
                                          num_hidden_layers=2)
    prepared = _calibrated(case.model, case.calibration)
    folds = sorted(g.fold for g in prepared.smooth_groups)
    assert folds.count("layer_norm") == 4  # 2 blocks x (attention LayerNorm, FFN LayerNorm)
    gm = copy.deepcopy(prepared.gm)
    by_name = {n.name: n for n in gm.graph.nodes}
    for group in prepared.smooth_groups:
        stats = prepared.gm.get_submodule(group.stats)
        weights = [prepared.gm.get_parameter(op.weight.target) for op in group.ops]
        fold_fp32(gm, by_name[group.value.name], [by_name[op.anchor.name] for op in group.ops],
                  factors_for(stats.absmax, weights, 0.6), group.fold)
    with torch.no_grad():
        ref = case.output(case.model(*case.evaluation[0]))
        out = gm(*case.evaluation[0])
    out = out[0] if isinstance(out, (tuple, list)) else case.output(out)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("post_ln", [False, True])
def test_smoothquant_beats_plain_int8_on_outliers(post_ln):
    torch.manual_seed(1)
    model = LNBlock(post_ln).eval()
    cal, x = _batches(4), torch.randn(4, 8, 64)
    with torch.no_grad():
        ref = model(x)
    plain = qbackend.quantize(model, cal[0], cal, config=OFF)
    smooth = qbackend.quantize(model, cal[0], cal)  # the default, "auto": LayerNorm outputs
    gain = sqnr(ref, smooth(x)) - sqnr(ref, plain(x))
    assert gain > 8.0, gain
    info = [v.smoothquant for v in smooth.qbackend_activations.values() if v.smoothquant is not None]
    assert len(info) == 1 and info[0]["alpha"] is not None
    assert info[0]["error"] < 0.5 * info[0]["error_unsmoothed"]
    assert info[0]["fold"] == ("quantize" if post_ln else "layer_norm")
    # the post-LN fold divides in the value's quantize border (here fused with the LayerNorm)
    borders = [m for m in smooth.modules()
               if isinstance(m, (Quantize, LayerNormQuantize)) and m.channel_divisor is not None]
    assert len(borders) == (1 if post_ln else 0)
    # the LayerNorm itself runs fused with its quantize either way (pre-LN: with the folded weights)
    assert sum(isinstance(m, LayerNormQuantize) for m in smooth.modules()) == 1
    assert check_layers(smooth, x) == 2  # each int8 layer exact on the integers it received


def test_no_gain_means_no_smoothing():
    torch.manual_seed(2)
    model = LNBlock(False, outliers=False).eval()
    cal, x = _batches(2), torch.randn(2, 8, 64)
    cfg = qbackend.QuantConfig(smoothquant=qbackend.SmoothQuantConfig(min_gain=0.99))
    smooth = qbackend.quantize(model, cal[0], cal, config=cfg)
    plain = qbackend.quantize(model, cal[0], cal, config=OFF)
    info = [v.smoothquant for v in smooth.qbackend_activations.values() if v.smoothquant is not None]
    assert info and all(i["alpha"] is None for i in info)
    assert torch.equal(smooth(x), plain(x))


def test_quantize_channel_divisor_matches_reference():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 7, 24, generator=g) * 4
    d = torch.rand(24, generator=g) * 10 + 0.05
    for dtype, zp in ((torch.uint8, 131), (torch.int8, -3)):
        m = Quantize(0.031, zp, dtype, channel_divisor=d)
        expected = reference.quantize(x, (d * 0.031).float(), torch.full((24,), zp), dtype, axis=2)
        assert torch.equal(m(x), expected)
        m.set_qparams(0.05, zp)  # rebinding keeps the divisor
        assert torch.equal(m(x), reference.quantize(x, (d * 0.05).float(), torch.full((24,), zp), dtype, axis=2))
    for bad in (torch.zeros(4), torch.tensor([1.0, float("nan")]), torch.ones(2, 2), torch.ones(0)):
        with pytest.raises(ValueError, match="channel_divisor"):
            Quantize(0.1, 0, torch.uint8, channel_divisor=bad)


def test_channel_stats_sample_and_absmax():
    stats = ChannelStats("v", sample_rows=50)
    g = torch.Generator().manual_seed(4)
    xs = [torch.randn(3, 11, 8, generator=g) for _ in range(4)]
    xs[1][0, 0, 2] = float("nan")  # these rows are skipped
    xs[2][1, 3, 5] = -float("inf")
    for x in xs:
        stats(x)
    rows = torch.cat([x.reshape(-1, 8) for x in xs])
    finite = rows[torch.isfinite(rows).all(dim=1)]
    assert stats.rows_seen == len(finite) == 130
    torch.testing.assert_close(stats.absmax, finite.abs().amax(dim=0), rtol=0, atol=0)
    assert stats.sample.shape == (50, 8)
    # every sampled row is one of the rows seen, no duplicates
    match = (stats.sample[:, None, :] == finite[None]).all(dim=-1)
    assert bool((match.sum(dim=1) == 1).all())
    assert len({tuple(r.tolist()) for r in stats.sample}) == 50


def test_auto_smooths_layer_norm_outputs_only():
    class Mixed(nn.Module):  # a LayerNorm-fed Linear and a Linear fed by another Linear's float output
        def __init__(self):
            super().__init__()
            self.ln, self.a, self.b = nn.LayerNorm(64), nn.Linear(64, 64), nn.Linear(64, 32)

        def forward(self, x):
            return self.b(torch.tanh(self.a(self.ln(x))))

    model = Mixed().eval()
    cal = _batches(1)
    auto = _calibrated(model, cal, qbackend.QuantConfig())
    every = _calibrated(model, cal, SQ)
    assert [[op.name for op in g.ops] for g in auto.smooth_groups] == [["a"]]
    assert sorted(op.name for g in every.smooth_groups for op in g.ops) == ["a", "b"]
    assert _calibrated(model, cal, OFF).smooth_groups == []


def _search(prepared, sq, monkeypatch):
    """(Smoothing, the alphas whose error the search measured) for the prepared graph's one value."""
    from qbackend.algorithms import smoothquant as search
    from qbackend.lowering.fold import get_attr_value

    tried, factors = [], search._factors
    monkeypatch.setattr(search, "_factors", lambda a, w, alpha: tried.append(alpha) or factors(a, w, alpha))
    (group,) = prepared.smooth_groups
    name = prepared.plan.observed[group.value]
    sm = search.choose(group.fold, prepared.gm.get_submodule(group.stats), prepared.observers()[name],
                       [get_attr_value(prepared.gm, op.weight) for op in group.ops], [op.config for op in group.ops],
                       [op.name for op in group.ops], sq)
    monkeypatch.undo()
    return sm, tried


def test_alpha_search_tries_every_other_alpha_then_the_best_ones_neighbours(monkeypatch):
    torch.manual_seed(3)
    prepared = _calibrated(LNBlock(False).eval(), _batches(2))
    grid = qbackend.SmoothQuantConfig().alphas
    full, tried_all = _search(prepared, qbackend.SmoothQuantConfig(exhaustive=True), monkeypatch)
    assert tried_all == list(grid)
    errors = {}
    for alpha in grid:  # each alpha's error alone: a one-point grid
        one, _ = _search(prepared, qbackend.SmoothQuantConfig(alphas=(alpha,), min_gain=0.0), monkeypatch)
        errors[alpha] = one.error if one.alpha == alpha else float("inf")  # inf: no better than none
    assert full.alpha == min(grid, key=errors.get) and full.error == errors[full.alpha]
    coarse, tried = _search(prepared, qbackend.SmoothQuantConfig(), monkeypatch)
    first = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert tried[:6] == first
    best = min(first, key=errors.get)
    assert sorted(tried[6:]) == [a for a in grid if abs(a - best) - 0.1 < 1e-9 and a not in first]
    assert coarse.alpha == min(tried, key=errors.get) and coarse.error == errors[coarse.alpha]


def test_config_validation():
    for bad in ({"alphas": ()}, {"alphas": (0.5, 1.5)}, {"sample_rows": 4}, {"min_gain": 1.0},
                {"exhaustive": "yes"}):
        with pytest.raises(ValueError):
            qbackend.SmoothQuantConfig(**bad)
    for bad in (0.5, "on", True):
        with pytest.raises(TypeError, match="smoothquant"):
            qbackend.QuantConfig(smoothquant=bad)


def test_smoothed_model_saves_and_loads(tmp_path):
    torch.manual_seed(5)
    model = LNBlock(True).eval()
    cal, x = _batches(2), torch.randn(2, 8, 64)
    qmodel = qbackend.quantize(model, cal[0], cal, config=SQ)
    path = tmp_path / "sq.qb"
    qbackend.save(qmodel, path)
    loaded = qbackend.load(path)
    assert torch.equal(loaded(x), qmodel(x))
    assert any(isinstance(m, (Quantize, LayerNormQuantize)) and m.channel_divisor is not None
               for m in loaded.modules())
