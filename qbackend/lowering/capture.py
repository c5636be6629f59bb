"""Graph capture: an nn.Module and example inputs -> a torch.fx.GraphModule of ATen ops.

Why torch.export (non-strict) and not torch.fx.symbolic_trace: symbolic tracing fails on ordinary
Python in forward (HuggingFace BertModel: "'Proxy' object does not support item assignment"),
while export runs the real Python and records the ATen ops, so BERT, ResNet and friends all
capture. Its graph is also normalised: nn.ReLU, F.relu, torch.relu and x.relu_() all become
aten.relu, which the pattern matcher relies on, and every node carries the module path it came
from (`nn_module_stack`), which names the quantized layers and resolves per-name config overrides.

Choices:
* which input sizes stay free (`Dim.AUTO`, export specialises the ones the model fixes, e.g.
  channels) is `dynamic_dims` (QuantConfig.dynamic_dims): "auto" frees the batch (dim 0) of every
  input and every dim of integer inputs (token ids, masks) and of floating inputs of rank <= 3
  (sequences), so transformers take other sequence lengths, but keeps the spatial sizes of
  floating inputs of rank >= 4 (images, volumes) as the example had them: symbolic image sizes
  make export reason about every conv's output size with sympy (MobileNetV2: 2.4 s against 0.9 s
  with only the batch free). "all" frees every dim of every input, "batch" only dim 0. The sizes
  the graph fixes are checked at the converted model's entry (nn/inputs.py);
* the graph is functional (relu_ -> relu, add_ -> add), so each value has one producer and no op
  mutates a value another op reads; batch_norm appears as
  aten._native_batch_norm_legit_no_training (eval mode): `run_decompositions({})` makes it so
  without decomposing anything else, and functionalize.py does the same by hand, in milliseconds
  instead of a re-trace, for graphs of the ops it knows (most CNNs);
* eval-mode nn.BatchNorm modules trace as one opaque op and are written back as the batch_norm
  node export gives (capture_batch_norm.py): tracing them costs most of a CNN's export otherwise;
* dropout (a no-op in eval; after functionalisation it is an aten.clone) and plain clones (a copy
  of a value nothing mutates) are removed, and dead code (e.g. an unused pooler) with them.
"""
from __future__ import annotations

import contextlib
import operator

import torch
from torch import fx
from torch.export import Dim
from torch.utils._pytree import tree_map

from .capture_batch_norm import batch_norms_as_one_op, restore_batch_norms
from .functionalize import eval_batch_norms, functionalize
from .graph_utils import quiet_treespec_deprecation

aten = torch.ops.aten


class CaptureError(RuntimeError):
    """torch.export could not capture the model."""


def free_dims(x: torch.Tensor, dynamic_dims: str = "auto") -> range:
    """The dims of example input `x` that capture leaves free under the `dynamic_dims` policy."""
    if dynamic_dims == "batch" or (dynamic_dims == "auto" and x.is_floating_point() and x.dim() >= 4):
        return range(min(x.dim(), 1))
    return range(x.dim())


def _dynamic_shapes(args: tuple, kwargs: dict, dynamic_dims: str = "auto"):
    def spec(x):
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            return None
        return {i: Dim.AUTO for i in free_dims(x, dynamic_dims)}

    return tree_map(spec, args), tree_map(spec, kwargs)


def capture(model: torch.nn.Module, example_inputs: tuple, example_kwargs: dict | None = None,
            dynamic_dims: str = "auto") -> fx.GraphModule:
    """The model's forward as a functional ATen GraphModule (parameters as get_attr nodes), with
    the input sizes `dynamic_dims` names free (see the module docstring)."""
    kwargs = dict(example_kwargs or {})
    ds_args, ds_kwargs = _dynamic_shapes(tuple(example_inputs), kwargs, dynamic_dims)
    dynamic = {**dict(zip(_arg_names(model, len(example_inputs)), ds_args)), **ds_kwargs} or None
    try:
        with quiet_treespec_deprecation():
            with batch_norms_as_one_op(model), _no_stack_traces():
                ep = torch.export.export(model, tuple(example_inputs), kwargs, dynamic_shapes=dynamic, strict=False)
            gm = ep.module()
            restore_batch_norms(gm)
            if not functionalize(gm):  # (it recompiles gm)
                gm = ep.run_decompositions({}).module()
                if restore_batch_norms(gm):
                    eval_batch_norms(gm)
    except Exception as exc:  # noqa: BLE001  (any capture failure leads to the module-swap fallback)
        raise CaptureError(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}") \
            from exc
    changed = _remove_dropout(gm)
    if gm.graph.eliminate_dead_code() or changed:
        gm.recompile()
    return gm


@contextlib.contextmanager
def _no_stack_traces():
    """torch.fx records no source traceback on the nodes it traces within the block (torch.fx.config's
    own switch, restored after): nothing reads them, and recording them cost 6-13% of a CNN's export."""
    before = torch.fx.config.do_not_emit_stack_traces
    torch.fx.config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        torch.fx.config.do_not_emit_stack_traces = before


def _arg_names(model: torch.nn.Module, n: int) -> list[str]:
    import inspect

    params = [p for p in inspect.signature(model.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind == p.VAR_POSITIONAL for p in inspect.signature(model.forward).parameters.values()) \
            or len(params) < n:
        raise CaptureError("forward takes *args; pass example inputs the signature names")
    return [p.name for p in params[:n]]


_DROPOUT = {aten.dropout.default, aten.feature_dropout.default, aten.alpha_dropout.default}


def _remove_dropout(gm: fx.GraphModule) -> bool:
    """Dropout and plain clones bypassed (the former erased); whether anything changed."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and (node.target in _DROPOUT or _is_plain_clone(node)):
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
            changed = True
        elif (node.op == "call_function" and node.target is aten.native_dropout.default):
            for user in list(node.users):
                if user.target is operator.getitem and user.args[1] == 0:
                    user.replace_all_uses_with(node.args[0])
                    changed = True
    return changed


def _is_plain_clone(node: fx.Node) -> bool:
    return node.target is aten.clone.default and node.kwargs.get("memory_format") in (None, torch.preserve_format)
