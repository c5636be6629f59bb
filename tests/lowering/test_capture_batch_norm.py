"""Eval-mode batch norms traced as one op (lowering/capture_batch_norm.py): capture gives the graph
it gives with the modules traced as themselves (node for node: targets, arguments, output sizes and
strides, module paths), on both of capture's paths; the modules get their own forward back, also
when export fails; modules it must not touch keep their forward during the trace."""
from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
from torch import nn

from qbackend.lowering import capture as capture_module
from qbackend.lowering import capture_batch_norm
from qbackend.lowering.capture import CaptureError, capture
from qbackend.models import MODELS


def _signature(gm):
    """Each node's op, target, arguments (other nodes by position), output metadata and module path."""
    index = {n: i for i, n in enumerate(gm.graph.nodes)}
    out = []
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        tensor = isinstance(v, torch.Tensor)
        args = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: f"%{index[a]}")
        out.append((n.op, str(n.target), str(args), tuple(v.shape) if tensor else None,
                    tuple(v.stride()) if tensor else None, v.dtype if tensor else None,
                    str(n.meta.get("nn_module_stack"))))
    return out


def _both(model, inputs, monkeypatch, slow_path=False):
    """capture() with the stand-in and with each module traced as itself."""
    if slow_path:
        monkeypatch.setattr(capture_module, "functionalize", lambda gm: False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with_op = capture(model, inputs)
        monkeypatch.setattr(capture_module, "batch_norms_as_one_op", lambda m: contextlib.nullcontext())
        plain = capture(model, inputs)
    return with_op, plain


class _Mixed(nn.Module):
    """BatchNorm1d/2d, momentum None, no affine parameters, a channels-last input, and an op the
    fast path does not know (flip)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8, momentum=None)
        self.bn_plain = nn.BatchNorm2d(8, affine=False)
        self.bn1 = nn.BatchNorm1d(8, eps=1e-3)

    def forward(self, x):
        y = self.bn_plain(self.bn(self.conv(x.contiguous(memory_format=torch.channels_last))))
        return self.bn1(torch.flip(y, [3]).mean((2, 3)))


def _randomize_statistics(model):
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)


@pytest.mark.parametrize("slow_path", [False, True])
@pytest.mark.parametrize("name", ["digits_cnn", "resnet18", "mixed"])
def test_capture_gives_the_same_graph(name, slow_path, monkeypatch):
    if name == "mixed":
        torch.manual_seed(0)
        model, inputs = _Mixed().eval(), (torch.randn(2, 3, 8, 8),)
        _randomize_statistics(model)
    else:
        kw = {} if name == "digits_cnn" else dict(batch_size=2, image_size=32)
        case = MODELS[name](num_calibration_batches=1, num_eval_batches=1, **kw)
        model, inputs = case.model, tuple(case.example_inputs)
    with_op, plain = _both(model, inputs, monkeypatch, slow_path)
    assert _signature(with_op) == _signature(plain)
    assert sum(str(n.target) == "aten._native_batch_norm_legit_no_training.default" for n in with_op.graph.nodes) \
        == sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()) > 0
    assert all("forward" not in vars(m) for m in model.modules())
    other = tuple(torch.cat([x, x[:1] * 0.5]) for x in inputs)  # another batch size
    with torch.no_grad():
        want = model(*other)
        got = with_op(*other)
    got = got[0] if isinstance(got, (tuple, list)) else got
    want = want[0] if isinstance(want, (tuple, list)) else want
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got, plain(*other)[0] if isinstance(plain(*other), (tuple, list)) else plain(*other))


def test_modules_get_their_forward_back_when_export_fails():
    class Fails(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm2d(4)

        def forward(self, x):
            y = self.bn(x)
            return y if bool(y.sum() > 0) else -y  # data-dependent control flow: export raises

    model = Fails().eval()
    with pytest.raises(CaptureError):
        capture(model, (torch.randn(2, 4, 3, 3),))
    assert "forward" not in vars(model.bn)


class _OwnForward(nn.BatchNorm2d):
    def forward(self, x):
        return super().forward(x) * 2


def test_only_plain_eval_modules_with_statistics_are_replaced():
    plain = nn.BatchNorm2d(4).eval()
    training = nn.BatchNorm2d(4).train()
    no_stats = nn.BatchNorm2d(4, track_running_stats=False).eval()
    subclass = _OwnForward(4).eval()
    patched = nn.BatchNorm2d(4).eval()
    patched.forward = lambda x: x  # an instance forward of the user's: kept
    holder = nn.ModuleList([plain, training, no_stats, subclass, patched])
    with capture_batch_norm.batch_norms_as_one_op(holder):
        assert "forward" in vars(plain)
        assert all("forward" not in vars(m) for m in (training, no_stats, subclass))
        assert vars(patched)["forward"](1) == 1
        x = torch.randn(2, 4, 3, 3)
        plain.running_mean.uniform_()
        # run eagerly, the stand-in is the module's own eval-mode batch norm
        assert torch.equal(plain(x), nn.functional.batch_norm(x, plain.running_mean, plain.running_var,
                                                                plain.weight, plain.bias, False, 0.1, plain.eps))
    assert "forward" not in vars(plain) and vars(patched)["forward"](1) == 1


def test_a_training_mode_batch_norm_still_captures_as_before(monkeypatch):
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)).eval()
    model[1].train()  # a training-mode BN: traced as itself, capture's result unchanged
    with_op, plain = _both(model, (torch.randn(2, 3, 4, 4),), monkeypatch, slow_path=True)
    assert _signature(with_op) == _signature(plain)
    assert not any("capture_batch_norm" in str(n.target) for n in with_op.graph.nodes)


def test_the_modules_input_check_still_applies():
    model = nn.Sequential(nn.Flatten(), nn.BatchNorm2d(4)).eval()  # a 2-D input to BatchNorm2d
    with pytest.raises(CaptureError, match="expected 4D input"):
        capture(model, (torch.randn(2, 4, 1, 1),))
    assert "forward" not in vars(model[1])
