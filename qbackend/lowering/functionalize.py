"""Capture's fast path: the graph torch.export gives (its training IR), made functional by hand
when it holds only ops this module knows, so that `ExportedProgram.run_decompositions({})` (a full
re-trace of the model: most of a CNN's prepare time, 16 s of MobileNetV2's on a 2-core Xeon) runs
only for the other graphs.

The result is the graph run_decompositions({}) gives for those ops (tests/lowering/
test_functionalize.py compares the two op for op, and the quantized models bit for bit, on CNNs and
on the zoo's transformers):
* in-place ops (relu_, hardtanh_, add_, ...) on a value an earlier op made become their
  functional form, and every later reader of the value reads the result instead;
* eval-mode batch_norm becomes aten._native_batch_norm_legit_no_training plus getitem 0;
* flatten of a contiguous value becomes a view to the flattened sizes (aten.sym_size and
  multiplications for the dimensions the export left symbolic);
* reshape becomes a view where the value is contiguous or keeps its shape (where a view is what
  the decomposition gives too);
* `to` becomes aten._to_copy where it converts (dtype or device), and nothing (its input) where
  it would return its input;
* view ops (view, transpose, permute, unsqueeze, expand, slice, select), type_as where it
  converts, and the transformer ops (embedding, layer_norm, scaled_dot_product_attention, the
  attention-mask and position-id arithmetic) are kept.

Any other op, an in-place op on a graph input, parameter or view, an in-place op on a value some
view reads, a flatten of a non-contiguous value, a reshape that would copy, or a type_as that
would return its input makes `functionalize` return False and leave the graph as it was.
"""
from __future__ import annotations

import operator

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.fx.operator_schemas import normalize_function

aten = torch.ops.aten

# Ops that read their inputs, write a new tensor, and are left alone by run_decompositions({}).
FUNCTIONAL = frozenset({
    aten.conv2d.default, aten.linear.default, aten.add.Tensor, aten.mul.Tensor, aten.relu.default,
    aten.hardtanh.default, aten.relu6.default, aten.adaptive_avg_pool2d.default, aten.max_pool2d.default,
    aten.avg_pool2d.default, aten.mean.dim, aten.cat.default, aten.sigmoid.default, aten.silu.default,
    aten.hardswish.default, aten.hardsigmoid.default, aten.gelu.default, aten.dropout.default,
    aten.embedding.default, aten.layer_norm.default, aten.scaled_dot_product_attention.default,
    aten.tanh.default, aten.gather.default, aten.index.Tensor, aten.arange.default, aten.new_ones.default,
    aten.ge.Scalar, aten.__and__.Tensor, aten.ne.Scalar, aten.cumsum.default,
})
# Ops whose result aliases their input (never "made": an in-place op on them is not taken).
VIEWS = frozenset({
    aten.view.default, aten.transpose.int, aten.permute.default, aten.unsqueeze.default, aten.expand.default,
    aten.slice.Tensor, aten.select.int,
})
# Ops that make no tensor.
NO_TENSOR = frozenset({aten.sym_size.int, aten._assert_tensor_metadata.default})
_TO = frozenset({aten.to.dtype, aten.to.device, aten.to.dtype_layout})
_TYPE_AS = aten.type_as.default  # kept (the decomposition keeps it) where it converts
_RESHAPE = aten.reshape.default
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
        elif node.target is _RESHAPE:
            _replace(graph, node, aten.view.default, node.args[:2], {})
        elif node.target in _TO:
            _to(graph, node)
    graph.lint()
    gm.recompile()
    return True


def _supported(graph: fx.Graph) -> bool:
    made = set()  # values an earlier op made: fresh tensors no one else aliases
    bases = set()  # values a view (or an aliasing `to`) reads
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        t = node.target
        if t in _IN_PLACE:
            if node.args[0] not in made:
                return False
        elif t is _BATCH_NORM:
            if not _eval_batch_norm(node):
                return False
        elif t in VIEWS or t is _FLATTEN or t is _RESHAPE:
            x = node.args[0]
            if not isinstance(x, fx.Node):
                return False
            if (t is _FLATTEN and not _contiguous(x)) or (t is _RESHAPE and not _reshape_is_view(node)):
                return False
            bases.add(x)
            continue  # a view of x: not a fresh value
        elif t in _TO:
            kind = _to_kind(node)
            if kind is None:
                return False
            if kind == "alias":
                bases.add(node.args[0])
                continue
        elif t is _TYPE_AS:
            if _to_kind(node) != "copy":
                return False
        elif t in NO_TENSOR:
            continue
        elif t not in FUNCTIONAL:
            return False
        made.add(node)
    # an in-place op on a value a view reads would show through the view
    return not any(n.op == "call_function" and n.target in _IN_PLACE and n.args[0] in bases for n in graph.nodes)


def _same(a, b) -> bool:
    """Whether two sizes are the same without a guard (symbolic sizes: the same expression)."""
    return statically_known_true(a == b) if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt) else a == b


def _reshape_is_view(node: fx.Node) -> bool:
    """A reshape that the decomposition makes a view: of a contiguous value, or to its own shape."""
    x, out = node.args[0].meta.get("val"), node.meta.get("val")
    if not isinstance(x, torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    return _contiguous(node.args[0]) or (x.dim() == out.dim() and all(_same(a, b) for a, b in zip(x.shape, out.shape)))


def _to_kind(node: fx.Node) -> str | None:
    """"alias" for a `to` that returns its input, "copy" for one that converts, None for one this
    module does not take (copy=True, a memory format, a value without metadata)."""
    x, out = node.args[0], node.meta.get("val")
    if not isinstance(x, fx.Node) or not isinstance(x.meta.get("val"), torch.Tensor) or not isinstance(out, torch.Tensor):
        return None
    call = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True)
    kwargs = call.kwargs if call is not None else None
    if kwargs is None or kwargs.get("copy") or kwargs.get("memory_format") not in (None, torch.preserve_format) \
            or kwargs.get("layout") not in (None, torch.strided):
        return None
    val = x.meta["val"]
    return "alias" if (val.dtype, val.device) == (out.dtype, out.device) else "copy"


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


def _replace(graph: fx.Graph, node: fx.Node, target, args: tuple, kwargs: dict) -> fx.Node:
    with graph.inserting_before(node):
        new = graph.call_function(target, tuple(args), kwargs)
    new.meta = dict(node.meta)
    node.replace_all_uses_with(new)
    graph.erase_node(node)
    return new


def _to(graph: fx.Graph, node: fx.Node) -> None:
    if _to_kind(node) == "alias":
        node.replace_all_uses_with(node.args[0])
        graph.erase_node(node)
        return
    out = node.meta["val"]
    call = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True)
    kwargs = {"dtype": out.dtype}  # and the device where the call names one, as the decomposition writes it
    if call.kwargs.get("device") is not None:
        kwargs["device"] = out.device
    _replace(graph, node, aten._to_copy.default, (node.args[0],), kwargs)


def eval_batch_norms(gm: fx.GraphModule) -> None:
    """Only the batch-norm step above: every eval-mode aten.batch_norm of gm (a graph otherwise
    functional already) as aten._native_batch_norm_legit_no_training plus getitem 0."""
    empty: dict = {}
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is _BATCH_NORM:
            if not _eval_batch_norm(node):
                raise ValueError(f"{node.name}: only eval-mode batch_norm nodes (9 positional args) are rewritten")
            _batch_norm(gm.graph, node, empty)
    gm.graph.lint()
    gm.recompile()


def _eval_batch_norm(node: fx.Node) -> bool:
    """Whether an aten.batch_norm node is in eval mode with its 9 arguments positional (the form
    _batch_norm rewrites)."""
    training = node.args[5] if len(node.args) > 5 else node.kwargs.get("training")
    return training is False and len(node.args) == 9


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
