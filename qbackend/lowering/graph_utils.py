"""Small helpers over captured ATen graphs: concrete example shapes, float tensor values, the
module path a node came from."""
from __future__ import annotations

import contextlib
import warnings

import torch
from torch import fx


def hint(size) -> int:
    """The example value of a (possibly symbolic) size."""
    if isinstance(size, int):
        return size
    node = getattr(size, "node", None)
    if node is not None and getattr(node, "hint", None) is not None:
        return int(node.hint)
    return int(size)


EXAMPLE_SHAPE = "qbackend_example_shape"


def node_value(arg):
    """The example value export recorded for a node (meta["val"]: a FakeTensor for tensors), or
    None for a non-node argument or a node without one."""
    return arg.meta.get("val") if isinstance(arg, fx.Node) else None


def bound_args(node: fx.Node, names: tuple[str, ...]) -> dict:
    """A call's arguments by name: the positional ones named in schema order by `names`, then
    the keyword ones."""
    bound = dict(zip(names, node.args))
    bound.update(node.kwargs)
    return bound


def example_shape(node) -> tuple[int, ...] | None:
    """The shape the node's value had with the user's example inputs, or None if not a tensor.

    That is the shape recorded by `record_example_shapes` when the capture ran on other inputs
    (a batch of one is captured as two), else the export's hint."""
    if isinstance(node, fx.Node) and EXAMPLE_SHAPE in node.meta:
        return node.meta[EXAMPLE_SHAPE]
    val = node_value(node)
    if not isinstance(val, torch.Tensor):
        return None
    return tuple(hint(s) for s in val.shape)


class _ShapeRecorder(fx.Interpreter):
    def run_node(self, n: fx.Node):
        result = super().run_node(n)
        if isinstance(result, torch.Tensor):
            n.meta[EXAMPLE_SHAPE] = tuple(int(s) for s in result.shape)
        return result


def record_example_shapes(gm: fx.GraphModule, args: tuple, kwargs: dict | None = None) -> None:
    """Run the captured graph once on (args, kwargs) and record each tensor value's shape in its
    node (read back by `example_shape`). For when the capture used other example inputs than
    the ones the model will be routed and tuned for: torch.export gives a size-1 dimension the
    hint 2, so a batch-1 example is captured as a batch of two."""
    from torch.fx._pytree import tree_flatten_spec

    flat = tree_flatten_spec((tuple(args), dict(kwargs or {})), gm._in_spec)
    with torch.no_grad():
        _ShapeRecorder(gm).run(*flat)


def is_float_tensor(node) -> bool:
    val = node_value(node)
    return isinstance(val, torch.Tensor) and val.dtype == torch.float32


def module_of(gm: fx.GraphModule, node, cls):
    """The module a call_module node of gm calls, where it is an instance of cls; else None."""
    if isinstance(node, fx.Node) and node.op == "call_module":
        m = gm.get_submodule(node.target)
        if isinstance(m, cls):
            return m
    return None


def module_path(node: fx.Node) -> str:
    """The path of the innermost module the node was traced in ("" for the root)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return path if isinstance(path, str) else ""


@contextlib.contextmanager
def quiet_treespec_deprecation():
    """Silence torch 2.13's FutureWarning about `isinstance(treespec, LeafSpec)`: torch's own
    export and GraphModule copying raise it on every capture / convert, and users can do nothing
    about it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
        yield


def positional_inputs(gm: fx.GraphModule) -> tuple[list[str], int] | None:
    """(the model's names of its forward's parameters, the number of positional inputs the graph
    takes) of a graph torch.export captured, or None for a graph without that record."""
    info = getattr(gm.graph._codegen, "pytree_info", None)
    if info is None:
        return None
    return list(info.orig_args), info.in_spec.child(0).num_children
