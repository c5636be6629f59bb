"""Eval-mode batch norms as one opaque op while torch.export traces a model, and back afterwards.

Traced as itself, an eval-mode nn.BatchNorm runs torch's batch-norm decomposition on fake tensors
to learn its output's metadata: with a symbolic batch, about 5 ms of sympy per layer, a third of
ResNet-18's export and more of MobileNetV2's (53 of them). During capture each such module's
forward is replaced by `qbackend::capture_batch_norm` (same inputs, output shaped like x), whose fake
impl makes the output without tracing anything; `restore_batch_norms` then writes each of its nodes
as the `aten.batch_norm` node export gives for the module (training False, the module's momentum
and eps), so the graph that leaves capture is the one export would have given.

Only modules of exactly the BatchNorm1d/2d/3d classes, in eval mode, with running statistics and
without a forward of their own are replaced; any other keeps its forward and traces as before.
"""
from __future__ import annotations

import contextlib
import types

import torch
from torch import fx, nn

aten = torch.ops.aten

_LIB = torch.library.Library("qbackend", "FRAGMENT")
_LIB.define("capture_batch_norm(Tensor x, Tensor? weight, Tensor? bias, Tensor running_mean, Tensor running_var, "
            "float momentum, float eps) -> Tensor")
CAPTURE_BATCH_NORM = torch.ops.qbackend.capture_batch_norm.default


def _eager(x, weight, bias, running_mean, running_var, momentum, eps):
    return aten.batch_norm(x, weight, bias, running_mean, running_var, False, momentum, eps,
                           torch.backends.cudnn.enabled)


def _fake(x, weight, bias, running_mean, running_var, momentum, eps):
    return torch.empty_like(x)


_LIB.impl("capture_batch_norm", _eager, "CompositeExplicitAutograd")
torch.library.register_fake("qbackend::capture_batch_norm", _fake, lib=_LIB)

_CLASSES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def _replaceable(module: nn.Module) -> bool:
    return type(module) in _CLASSES and not module.training and module.track_running_stats \
        and module.running_mean is not None and module.running_var is not None and "forward" not in vars(module)


def _forward(self, x):
    self._check_input_dim(x)  # the module's own check (BatchNorm2d: 4-D input), as its forward makes it
    momentum = 0.0 if self.momentum is None else self.momentum
    return CAPTURE_BATCH_NORM(x, self.weight, self.bias, self.running_mean, self.running_var, momentum, self.eps)


@contextlib.contextmanager
def batch_norms_as_one_op(model: nn.Module):
    """Within the block, the model's replaceable batch norms (module docstring) run as
    qbackend::capture_batch_norm; their own forward is back afterwards, also on an exception."""
    replaced = [m for m in model.modules() if _replaceable(m)]
    for m in replaced:
        m.forward = types.MethodType(_forward, m)
    try:
        yield
    finally:
        for m in replaced:
            vars(m).pop("forward", None)


def restore_batch_norms(gm: fx.GraphModule) -> int:
    """Writes every qbackend::capture_batch_norm node of gm's graph as aten.batch_norm (eval mode),
    its metadata kept; returns how many. The caller recompiles gm (capture does, after its other
    rewrites)."""
    graph = gm.graph
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not CAPTURE_BATCH_NORM:
            continue
        x, weight, bias, mean, var, momentum, eps = node.args
        with graph.inserting_before(node):
            bn = graph.call_function(aten.batch_norm.default,
                                     (x, weight, bias, mean, var, False, momentum, eps, torch.backends.cudnn.enabled))
        bn.meta = dict(node.meta)
        node.replace_all_uses_with(bn)
        graph.erase_node(node)
        count += 1
    return count
