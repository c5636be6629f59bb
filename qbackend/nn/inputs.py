"""The input signature of a graph-captured QuantizedModel: per flat graph input, its name, its rank
and whether it is floating, as the example inputs had them (what the captured graph fixes: batch
and other sizes may vary), checked at the model's forward entry so that a wrong input is an error
naming it instead of a failure deep inside a kernel.

The signature is plain data (a list of [name, rank, floating] lists) so that it pickles and is
stored as is in model files; models saved without one are not checked.
"""
from __future__ import annotations

import torch
from torch import fx


def input_signature(gm: fx.GraphModule, arg_names=None) -> list[list] | None:
    """[[name, rank, floating], ...] of the graph's placeholders (None for a non-tensor input)
    from their example values; None when some placeholder has no recorded example."""
    names = list(arg_names or [])
    signature = []
    for i, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        val = node.meta.get("val")
        name = names[i] if i < len(names) else node.name
        if isinstance(val, torch.Tensor):
            signature.append([name, int(val.dim()), bool(val.is_floating_point())])
        elif "val" in node.meta:
            signature.append(None)  # a constant or symbolic scalar: not checked
        else:
            return None
    return signature


def check_inputs(signature: list, args) -> None:
    """Raise ValueError (rank) or TypeError (dtype class) naming the first input of `args` (the
    graph's flat inputs) that does not match `signature`."""
    for spec, a in zip(signature, args):
        if spec is None or not isinstance(a, torch.Tensor):
            continue
        name, rank, floating = spec
        if a.dim() != rank:
            raise ValueError(f"input {name!r} must be {rank}-D (as the example input the model was converted with; "
                             f"only its sizes may vary), got a {a.dim()}-D tensor of shape {tuple(a.shape)}")
        if a.is_floating_point() != floating:
            want = "a floating" if floating else "a non-floating (integer or bool)"
            raise TypeError(f"input {name!r} must be {want} tensor, as the example input the model was converted "
                            f"with; got {a.dtype}")
