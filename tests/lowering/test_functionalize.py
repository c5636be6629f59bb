"""Capture's fast path (lowering/functionalize.py) gives the graph run_decompositions({}) gives:
the same ops, and the same quantized model bit for bit, on CNNs and transformers; graphs with other
ops, or with mutations a view would see, take the slow path."""
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
         "mobilenet_v2": dict(batch_size=2, image_size=32, residual_gamma=0.3),
         "bert_base": dict(batch_size=2, seq_len=16, num_hidden_layers=2),
         "transformer_outliers": dict(batch_size=2, seq_len=16)}


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


class EveryTransformerOp(nn.Module):
    """The transformer-side ops the fast path knows: reshapes that are views (of a contiguous value,
    and of a transposed one to its own shape), permute, `to` that converts and `to` that returns
    its input, type_as that converts, position ids from a mask (ne, cumsum), embedding, layer_norm,
    SDPA with a bool mask, select, tanh."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.pos = nn.Embedding(40, 16)
        self.ln = nn.LayerNorm(16)
        self.qkv = nn.Linear(16, 48)
        self.out = nn.Linear(16, 16)

    def forward(self, ids, mask):
        positions = torch.cumsum(ids.ne(0).to(torch.int32), dim=1).type_as(mask) * mask
        h = self.ln(self.emb(ids) + self.pos(positions))
        b, t, _ = h.shape
        qkv = self.qkv(h).reshape(b, t, 3, 2, 8).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        keep = mask.to(torch.bool)[:, None, None, :].expand(b, 1, t, t)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        a = a.reshape(b, 2, t, 8).transpose(1, 2).reshape(b, t, 16).to(torch.float32)
        return torch.tanh(self.out(a + h)[:, 0])


def _inputs(model):
    if isinstance(model, EveryTransformerOp):
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(1, 50, (2, 7), generator=g)
        return ids, torch.ones(2, 7, dtype=torch.int32)
    return (torch.randn(2, 3, 8, 8),)


def _export(model, inputs):
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    args, _ = _dynamic_shapes(inputs, {})
    return torch.export.export(model, inputs, dynamic_shapes=dict(zip(_arg_names(model, len(inputs)), args)),
                               strict=False)


def _targets(gm):
    _remove_dropout(gm)
    gm.graph.eliminate_dead_code()
    return collections.Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")


def _case(name):
    kw = SMALL[name]
    return MODELS[name](num_calibration_batches=1, num_eval_batches=1, **kw) if kw else MODELS[name]()


_IN_CI = ["digits_cnn", "resnet18", pytest.param("mobilenet_v2", marks=pytest.mark.slow), "bert_base",
          "transformer_outliers"]


def _leaves(out):
    return [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("name", _IN_CI + ["every_op", "every_transformer_op"])
def test_fast_path_gives_the_decomposed_graph(name):
    if name in ("every_op", "every_transformer_op"):
        torch.manual_seed(0)
        model = (EveryOp() if name == "every_op" else EveryTransformerOp()).eval()
        inputs, others = _inputs(model), None
    else:
        case = _case(name)
        model, inputs, others = case.model, tuple(case.example_inputs), case.evaluation[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = _export(model, inputs)
        fast = ep.module()
        assert functionalize(fast)
        slow = ep.run_decompositions({}).module()
    # the slow path's flatten computes its size as the product of symbolic sizes; ours folds the
    # static ones (the same view)
    a, b = _targets(fast), _targets(slow)
    for extra in ("<built-in function mul>", "<built-in function floordiv>", "aten.sym_size.int"):
        a.pop(extra, None), b.pop(extra, None)
    assert a == b
    if others is None:  # another batch size than the example's
        others = tuple(torch.cat([x, x[:1]]) for x in inputs)
        if isinstance(model, EveryOp):
            others = (torch.randn_like(others[0]),)
    with torch.no_grad():
        got, want, ref = _leaves(fast(*others)), _leaves(slow(*others)), _leaves(model(*others))
    assert len(got) == len(want) == len(ref) > 0
    for g, w, r in zip(got, want, ref):
        assert torch.equal(g, w)
        assert torch.allclose(g, r, rtol=1e-5, atol=1e-6)


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
            got, want = _leaves(fast(*batch)), _leaves(slow(*batch))
            assert got and len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
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
        return torch.sin(x).transpose(1, 2)


class _TransposeThenMutate(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        y = self.conv(x)
        t = y.transpose(2, 3)
        y.relu_()  # t aliases y
        return t + 1


class _CopyingReshape(nn.Module):
    def forward(self, x):
        return torch.tanh(x).transpose(2, 3).reshape(x.shape[0], -1)


class _TypeAsItself(nn.Module):
    def forward(self, x):
        return torch.tanh(x).type_as(x)


class _ToWithCopy(nn.Module):
    def forward(self, x):
        return torch.tanh(x).to(torch.float32, copy=True)


@pytest.mark.parametrize("model", [_MutatesInput(), _ViewThenMutate(), _OtherOp(), _TransposeThenMutate(),
                                   _CopyingReshape(), _TypeAsItself(), _ToWithCopy()], ids=type)
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
