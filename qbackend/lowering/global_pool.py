"""The global-pool pass of convert: Quantize(adaptive_avg_pool2d(Dequantize(q), [1, 1])), the
classifier head of a CNN whose last layer writes int8 (lowering/plan.py makes it so), becomes one
GlobalAvgPoolQuantize call on q (qbackend::global_avg_pool2d: exact integer sums, one requantize)
instead of a dequantize, a float pool over channels-last memory and a quantize.
"""
from __future__ import annotations

from torch import fx

from ..nn.pool import GlobalAvgPoolQuantize
from ..nn.quant import Dequantize, Quantize
from .graph_utils import module_of
from .plan import is_global_avg_pool


def fuse_global_pools(gm: fx.GraphModule) -> int:
    """Rewrite the eligible dequantize + pool + quantize chains of gm in place; returns how many."""
    count = 0
    for qnode in list(gm.graph.nodes):
        qmod = module_of(gm, qnode, Quantize)
        if qmod is None or qmod.channel_divisor is not None or not is_global_avg_pool(qnode.args[0]):
            continue
        pool = qnode.args[0]
        dmod = module_of(gm, pool.args[0], Dequantize)
        if dmod is None:
            continue
        module = GlobalAvgPoolQuantize(dmod.scale, dmod.zero_point, dmod.dtype, qmod.scale, qmod.zero_point,
                                       qmod.dtype, qmod.qmax, value=qmod.value, x_value=dmod.value)
        name = f"qbackend_global_avg_pool_{count}"
        gm.add_submodule(name, module)
        with gm.graph.inserting_after(qnode):
            call = gm.graph.call_module(name, (pool.args[0].args[0],))
        call.meta = {k: v for k, v in qnode.meta.items() if k != "val"}
        qnode.replace_all_uses_with(call)
        gm.graph.erase_node(qnode)
        if not pool.users:
            gm.graph.erase_node(pool)
        count += 1
    return count
