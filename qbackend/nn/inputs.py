"""The input signature of a graph-captured QuantizedModel: per flat graph input, its name, its rank,
whether it is floating, and the sizes the captured graph fixed (an int per fixed dim, None per free
one: which are free is the capture's `dynamic_dims` policy, and export fixes what the model pins,
e.g. channels), as the example inputs had them, checked at the model's forward entry so that a
wrong input is an error naming it instead of a failure deep inside a kernel or a wrong answer.

The signature is plain data (a list of [name, rank, floating, sizes] lists) so that it pickles and
is stored as is in model files; entries without sizes (older files) check rank and dtype class
only, and models saved without a signature are not checked.
"""
from __future__ import annotations

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import is_concrete_int


def input_signature(gm: fx.GraphModule, arg_names=None) -> list[list] | None:
    """[[name, rank, floating, sizes], ...] of the graph's placeholders (None for a non-tensor
    input) from their example values (sizes: the int of each dim the graph fixed, None where it is
    symbolic); None when some placeholder has no recorded example."""
    names = list(arg_names or [])
    signature = []
    for i, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        val = node.meta.get("val")
        name = names[i] if i < len(names) else node.name
        if isinstance(val, torch.Tensor):
            sizes = [int(s) if is_concrete_int(s) else None for s in val.shape]
            signature.append([name, int(val.dim()), bool(val.is_floating_point()), sizes])
        elif "val" in node.meta:
            signature.append(None)  # a constant or symbolic scalar: not checked
        else:
            return None
    return signature


def check_inputs(signature: list, args) -> None:
    """Raise ValueError (rank, a fixed size) or TypeError (dtype class) naming the first input of
    `args` (the graph's flat inputs) that does not match `signature`."""
    for spec, a in zip(signature, args):
        if spec is None or not isinstance(a, torch.Tensor):
            continue
        name, rank, floating = spec[:3]
        if a.dim() != rank:
            raise ValueError(f"input {name!r} must be {rank}-D (as the example input the model was converted with; "
                             f"only its sizes may vary), got a {a.dim()}-D tensor of shape {tuple(a.shape)}")
        if a.is_floating_point() != floating:
            want = "a floating" if floating else "a non-floating (integer or bool)"
            raise TypeError(f"input {name!r} must be {want} tensor, as the example input the model was converted "
                            f"with; got {a.dtype}")
        sizes = spec[3] if len(spec) > 3 else None
        if sizes:
            for dim, (want, got) in enumerate(zip(sizes, a.shape)):
                if want is not None and want != got:
                    raise ValueError(
                        f"input {name!r} must have size {want} in dim {dim}{_role(dim, rank, floating)} "
                        f"(shape {_pattern(sizes)}: the model "
                        f"was captured with these sizes fixed), got shape {tuple(a.shape)}"
                        + (_FREE_HINT if dim >= 2 and floating and rank >= 4 else ""))


_FREE_HINT = ("; quantizing with QuantConfig(dynamic_dims='all') captures the image sizes as free, where the "
              "model allows other ones")


def _role(dim: int, rank: int, floating: bool) -> str:
    """What a dim of an image-like input (floating, 4-D or more: N, C, spatial...) holds."""
    if not floating or rank < 4:
        return ""
    return " (its batch)" if dim == 0 else " (its channels)" if dim == 1 else " (a spatial size)"


def _pattern(sizes: list) -> str:
    return "(" + ", ".join("*" if s is None else str(s) for s in sizes) + ")"
