"""Capture's fast path (lowering/functionalize.py) gives the graph run_decompositions({}) gives:
the same ops, and the same quantized model bit for bit; graphs with other ops take the slow path."""
from __future__ import annotations

import collections
import warnings

import pytest
import torch
from torch import nn

import qbackend
from qbackend.lowering import capture as capture_module
from qbackend.lowering.capture import _arg_names, _dynamic_shapes, _remove_dropout
from qbackend.lowering.functionalize import functionalize
from qbackend.models import MODELS

SMALL = {"digits_cnn": {}, "resnet18": dict(batch_size=2, image_size=32, residual_gamma=0.3),
         "mobilenet_v2": dict(batch_size=2, image_size=32, residual_gamma=0.3)}


class EveryOp(nn.Module):
    """Each op the fast path knows, in place where it has an in-place form, a value read after its
    mutation, and a flatten with a symbolic batch."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 1)
        self.mix = nn.Conv2d(16, 8, 1)
        self.fc = nn.Linear(8 * 4 * 4, 5)
        self.head = nn.Linear(8, 5)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        y = self.bn(self.conv(x))
        y.relu_()
        z = torch.nn.functional.hardtanh(self.conv2(y), 0.0, 6.0, inplace=True)
        z = z + y  # y read after relu_ mutated it
        z.add_(1.0)
        z = z * torch.sigmoid(z)
        z = torch.nn.functional.silu(z, inplace=True)
        z = torch.nn.functional.hardswish(z) + torch.nn.functional.hardsigmoid(z) + torch.nn.functional.gelu(z)
        z = self.mix(torch.cat([torch.nn.functional.max_pool2d(z, 2), torch.nn.functional.avg_pool2d(z, 2)], 1))
        return self.fc(self.drop(torch.flatten(z, 1))) + self.head(z.mean(dim=(2, 3)))


def _export(model, x):
    args, _ = _dynamic_shapes((x,), {})
    return torch.export.export(model, (x,), dynamic_shapes=dict(zip(_arg_names(model, 1), args)), strict=False)


def _targets(gm):
    _remove_dropout(gm)
    gm.graph.eliminate_dead_code()
    return collections.Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")


def _case(name):
    kw = SMALL[name]
    return MODELS[name](num_calibration_batches=1, num_eval_batches=1, **kw) if kw else MODELS[name]()


_IN_CI = ["digits_cnn", "resnet18", pytest.param("mobilenet_v2", marks=pytest.mark.slow)]


@pytest.mark.parametrize("name", _IN_CI + ["every_op"])
def test_fast_path_gives_the_decomposed_graph(name):
    if name == "every_op":
        torch.manual_seed(0)
        model, x = EveryOp().eval(), torch.randn(2, 3, 8, 8)
    else:
        case = _case(name)
        model, x = case.model, case.example_inputs[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = _export(model, x)
        fast = ep.module()
        assert functionalize(fast)
        slow = ep.run_decompositions({}).module()
    # the slow path's flatten computes its size as the product of symbolic sizes; ours folds the
    # static ones (the same view)
    a, b = _targets(fast), _targets(slow)
    for extra in ("<built-in function mul>", "<built-in function floordiv>", "aten.sym_size.int"):
        a.pop(extra, None), b.pop(extra, None)
    assert a == b
    x2 = torch.randn_like(x[:1].expand(3, *x.shape[1:]).contiguous())
    with torch.no_grad():
        assert torch.equal(fast(x2), model(x2)) or torch.allclose(fast(x2), model(x2), rtol=1e-5, atol=1e-6)
        assert torch.equal(fast(x2), slow(x2))


@pytest.mark.parametrize("name", _IN_CI)
def test_quantized_model_is_the_same_on_both_paths(name, monkeypatch):
    case = _case(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = qbackend.quantize(case.model, case.example_inputs, case.calibration)
        monkeypatch.setattr(capture_module, "functionalize", lambda gm: False)
        slow = qbackend.quantize(case.model, case.example_inputs, case.calibration)
    with torch.no_grad():
        for batch in case.evaluation:
            assert torch.equal(fast(*batch), slow(*batch))
    assert [dict(r) for r in qbackend.explain(fast)] == [dict(r) for r in qbackend.explain(slow)]


class _MutatesInput(nn.Module):
    def forward(self, x):
        x.relu_()
        return x * 2


class _ViewThenMutate(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        y = self.conv(x)
        f = torch.flatten(y, 1)
        y.relu_()  # f aliases y: the mutation shows through it
        return f


class _OtherOp(nn.Module):
    def forward(self, x):
        return torch.tanh(x).transpose(1, 2)


@pytest.mark.parametrize("model", [_MutatesInput(), _ViewThenMutate(), _OtherOp()], ids=type)
def test_other_graphs_are_left_to_run_decompositions(model):
    x = torch.randn(2, 3, 4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = _export(model.eval(), x.clone())
    gm = ep.module()
    code = gm.code
    assert not functionalize(gm)
    assert gm.code == code
    # and the captured graph (slow path) still computes the model
    with torch.no_grad():
        got = capture_module.capture(model, (x.clone(),))(x.clone())
        assert torch.allclose(got, model(x.clone()))
