"""Small helpers over captured ATen graphs: concrete example shapes, float tensor values, the
module path a node came from."""
from __future__ import annotations

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


def example_shape(node) -> tuple[int, ...] | None:
    """The shape the node's value had with the example inputs, or None if not a tensor."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if not isinstance(val, torch.Tensor):
        return None
    return tuple(hint(s) for s in val.shape)


def is_float_tensor(node) -> bool:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return isinstance(val, torch.Tensor) and val.dtype == torch.float32


def module_path(node: fx.Node) -> str:
    """The path of the innermost module the node was traced in ("" for the root)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return path if isinstance(path, str) else ""
