"""Capture's fast path: the graph torch.export gives (its training IR), made functional by hand
when it holds only ops this module knows, so that `ExportedProgram.run_decompositions({})` (a full
re-trace of the model: most of a CNN's prepare time, 16 s of MobileNetV2's on a 2-core Xeon) runs
only for the other graphs.

The result is the graph run_decompositions({}) gives for those ops (tests/lowering/
test_functionalize.py compares the two node for node):
* in-place ops (relu_, hardtanh_, add_, ...) on a value an earlier op made become their
  functional form, and every later reader of the value reads the result instead;
* eval-mode batch_norm becomes aten._native_batch_norm_legit_no_training plus getitem 0;
* flatten of a contiguous value becomes a view to the flattened sizes (aten.sym_size and
  multiplications for the dimensions the export left symbolic).

Any other op, an in-place op on a graph input, parameter or view, or a flatten of a non-contiguous
value makes `functionalize` return False and leave the graph as it was.
"""
from __future__ import annotations

import operator

import torch
from torch import fx

aten = torch.ops.aten

# Ops that read their inputs, write a new tensor, and are left alone by run_decompositions({}).
FUNCTIONAL = frozenset({
    aten.conv2d.default, aten.linear.default, aten.add.Tensor, aten.mul.Tensor, aten.relu.default,
    aten.hardtanh.default, aten.relu6.default, aten.adaptive_avg_pool2d.default, aten.max_pool2d.default,
    aten.avg_pool2d.default, aten.mean.dim, aten.cat.default, aten.sigmoid.default, aten.silu.default,
    aten.hardswish.default, aten.hardsigmoid.default, aten.gelu.default, aten.dropout.default,
})
_IN_PLACE = {
    aten.relu_.default: aten.relu.default, aten.hardtanh_.default: aten.hardtanh.default,
    aten.add_.Tensor: aten.add.Tensor, aten.mul_.Tensor: aten.mul.Tensor, aten.silu_.default: aten.silu.default,
    aten.hardswish_.default: aten.hardswish.default, aten.hardsigmoid_.default: aten.hardsigmoid.default,
    aten.sigmoid_.default: aten.sigmoid.default,
}
_BATCH_NORM = aten.batch_norm.default
_FLATTEN = aten.flatten.using_ints


def functionalize(gm: fx.GraphModule) -> bool:
    """Rewrite gm's graph in place as described above; False (graph untouched) where it holds
    anything else."""
    if not _supported(gm.graph):
        return False
    graph = gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    empty: dict = {}  # one (0,)-sized example value for every batch norm's unused statistics outputs
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in _IN_PLACE:
            _out_of_place(graph, node, order)
        elif node.target is _BATCH_NORM:
            _batch_norm(graph, node, empty)
        elif node.target is _FLATTEN:
            _flatten(graph, node)
    graph.lint()
    gm.recompile()
    return True


def _supported(graph: fx.Graph) -> bool:
    made = set()  # values an earlier op made: fresh tensors no one else aliases
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        t = node.target
        if t in _IN_PLACE:
            if node.args[0] not in made:
                return False
        elif t is _BATCH_NORM:
            training = node.args[5] if len(node.args) > 5 else node.kwargs.get("training")
            if training is not False or len(node.args) != 9:
                return False
        elif t is _FLATTEN:
            x = node.args[0]
            if not isinstance(x, fx.Node) or not _contiguous(x) or any(
                    u.target in _IN_PLACE and u.args[0] is x for u in x.users):
                return False
            continue  # a view of x: not a fresh value
        elif t not in FUNCTIONAL:
            return False
        made.add(node)
    return True


def _contiguous(node: fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.is_contiguous()


def _out_of_place(graph: fx.Graph, node: fx.Node, order: dict) -> None:
    value = node.args[0]
    with graph.inserting_after(node):
        result = graph.call_function(_IN_PLACE[node.target], node.args, node.kwargs)
    result.meta = dict(node.meta)
    node.replace_all_uses_with(result)
    for user in list(value.users):
        if user is not node and user is not result and order.get(user, -1) > order[node]:
            user.replace_input_with(value, result)
    order[result] = order[node]
    graph.erase_node(node)


def _batch_norm(graph: fx.Graph, node: fx.Node, empty: dict) -> None:
    x, weight, bias, mean, var, _training, momentum, eps = node.args[:8]
    val = node.meta.get("val")
    with graph.inserting_before(node):
        bn = graph.call_function(aten._native_batch_norm_legit_no_training.default,
                                 (x, weight, bias, mean, var, momentum, eps))
        out = graph.call_function(operator.getitem, (bn, 0))
    bn.meta = dict(node.meta)
    if isinstance(val, torch.Tensor):
        # a fake tensor made per node costs ~1 ms of dispatch; the statistics are never read
        stat = empty.get(val.dtype)
        if stat is None:
            stat = empty[val.dtype] = val.new_empty((0,))
        bn.meta["val"] = (val, stat, stat)
    out.meta = dict(node.meta)
    node.replace_all_uses_with(out)
    graph.erase_node(node)


def _flatten(graph: fx.Graph, node: fx.Node) -> None:
    x = node.args[0]
    start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
    end = node.args[2] if len(node.args) > 2 else node.kwargs.get("end_dim", -1)
    shape = x.meta["val"].shape
    rank = max(len(shape), 1)
    start, end = start % rank, end % rank
    sizes = []
    with graph.inserting_before(node):
        def size(d):
            if isinstance(shape[d], int):
                return shape[d]
            s = graph.call_function(aten.sym_size.int, (x, d))
            s.meta["val"] = shape[d]
            return s

        for d in range(len(shape)):
            if start < d <= end:
                sizes.append(_mul(graph, sizes.pop(), size(d)))
            else:
                sizes.append(size(d))
        view = graph.call_function(aten.view.default, (x, sizes))
    view.meta = dict(node.meta)
    node.replace_all_uses_with(view)
    graph.erase_node(node)


def _mul(graph: fx.Graph, a, b):
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    m = graph.call_function(operator.mul, (a, b))
    m.meta["val"] = (a.meta["val"] if isinstance(a, fx.Node) else a) * (b.meta["val"] if isinstance(b, fx.Node) else b)
    return m
