"""The inverted-residual pass of convert: chains of int8 convs shaped like MobileNetV2's block,

    [1x1 expansion (+ activation) ->] depthwise conv (+ activation) -> 1x1 projection [+ residual],

each intermediate value int8 and read by the next conv only, become one QuantizedInvertedResidual
(nn/inverted_residual.py: one native call whose result equals the three layers', bit for bit)
where the fusion table (qbackend.dispatch.rules.FUSIONS) lists the chain for this CPU's class
(qbackend.dispatch.fusion_route; re-routing a loaded model asks it again).
Every layer of a fused chain is packed for the fusion's provider, and its record says so; a layer
whose provider the config or QBACKEND_PROVIDER forced, or that tune mode timed, keeps its route
and its chain is not fused. QuantConfig(fusions=False) turns the pass off.
"""
from __future__ import annotations

import torch
from torch import fx

from ..core.routes import RULE
from ..dispatch import fusion_route
from ..nn.conv import QuantizedConv2d
from ..nn.inverted_residual import QuantizedInvertedResidual
from ..ops import PackedConv2dWeight
from .graph_utils import module_of

CHAIN = QuantizedInvertedResidual.CHAIN


def _pointwise(m: QuantizedConv2d) -> bool:
    p = m.packed
    return (p.kernel_size == (1, 1) and p.groups == 1 and tuple(p.stride) == (1, 1) and tuple(p.padding) == (0, 0)
            and tuple(p.dilation) == (1, 1))


def _depthwise(m: QuantizedConv2d) -> bool:
    p = m.packed
    return p.groups > 1 and p.groups == p.in_channels == p.out_channels


def _feeds_only(node: fx.Node, reader: fx.Node) -> bool:
    return len(node.users) == 1 and reader in node.users and not node.kwargs


def _intermediate(m: QuantizedConv2d) -> bool:
    """An int8 output with no clamp beyond its range and no residual of its own."""
    return m.out_dtype != torch.float32 and m._clamp_max is None and not m.has_accum


def _chain(gm: fx.GraphModule, node: fx.Node):
    """(expand node or None, depthwise node, project node) ending at `node`, or None."""
    project = module_of(gm, node, QuantizedConv2d)
    if project is None or not _pointwise(project) or not node.args or node.kwargs:
        return None
    dnode = node.args[0]
    dw = module_of(gm, dnode, QuantizedConv2d)
    if dw is None or not _depthwise(dw) or not _intermediate(dw) or len(dnode.args) != 1 \
            or not _feeds_only(dnode, node) or (len(node.args) == 2 and node.args[1] is dnode):
        return None
    if (project.x_dtype, project.x_scale, project.x_zero_point) != (dw.out_dtype, dw.out_scale, dw.out_zero_point):
        return None
    enode = dnode.args[0]
    expand = module_of(gm, enode, QuantizedConv2d)
    if expand is None or not _pointwise(expand) or not _intermediate(expand) or len(enode.args) != 1 \
            or not _feeds_only(enode, dnode) or any(a is enode for a in node.args[1:]) \
            or (dw.x_dtype, dw.x_scale, dw.x_zero_point) != (expand.out_dtype, expand.out_scale, expand.out_zero_point):
        enode = None
    return enode, dnode, node


def _packed_for(m: QuantizedConv2d, provider: str) -> PackedConv2dWeight:
    """m's weight packed for `provider` alone (no routes by batch size)."""
    p = m.packed
    if p.provider.name == provider and p._forms is None:
        return p
    return PackedConv2dWeight(p.weight, p.w_scales, p.bias, p.stride, p.padding, p.dilation, p.groups,
                              provider=provider, x_shape=p.x_shape, x_qparams=p.x_qparams)


def fuse_inverted_residuals(gm: fx.GraphModule, layers: dict, enabled: bool = True) -> int:
    """Rewrite gm's eligible chains in place (see the module docstring); `layers`: the layer
    records by name, whose routes and module paths are updated. Returns how many chains."""
    chain_route = fusion_route(CHAIN) if enabled else None
    if chain_route is None:
        return 0
    by_module = {info.module: info for info in layers.values()}
    count = 0
    for node in list(gm.graph.nodes):
        chain = _chain(gm, node) if node.op == "call_module" else None
        if chain is None:
            continue
        nodes = [n for n in chain if n is not None]
        records = [by_module.get(n.target) for n in nodes]
        if any(r is None or r.route is None or r.route.source != RULE for r in records):
            continue
        modules = [gm.get_submodule(n.target) for n in nodes]
        try:
            packs = [_packed_for(m, chain_route.provider) for m in modules]
        except (ValueError, TypeError, RuntimeError):
            continue  # the provider cannot run one of them here: the layers keep their routes
        for m, packed in zip(modules, packs):
            m.packed = packed
        enode, dnode, pnode = chain
        fused = QuantizedInvertedResidual(*(gm.get_submodule(n.target) if n is not None else None for n in chain))
        owner, _, leaf = pnode.target.rpartition(".")
        path = f"{owner}.fused_{leaf}" if owner else f"fused_{leaf}"  # beside the projection
        gm.set_submodule(path, fused) if owner else gm.add_submodule(path, fused)
        for part, n in zip(("expand", "depthwise", "project"), chain):
            if n is None:
                continue
            info = by_module[n.target]
            owner_n, _, leaf_n = n.target.rpartition(".")
            (gm.get_submodule(owner_n) if owner_n else gm)._modules.pop(leaf_n, None)
            info.module = f"{path}.{part}"
            info.route = chain_route
        first = nodes[0]
        with gm.graph.inserting_before(pnode):
            call = gm.graph.call_module(path, (first.args[0],) + tuple(pnode.args[1:]))
        call.meta = {k: v for k, v in pnode.meta.items()}
        pnode.replace_all_uses_with(call)
        for n in reversed(nodes):
            gm.graph.erase_node(n)
        count += 1
    return count
