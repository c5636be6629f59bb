"""The input-layout pass of convert: a Quantize read only by convs writes channels-last.

The conv kernels read channels-last int8 (every provider makes its input so). A model's input
image is channels-first float, so without this pass its Quantize writes channels-first int8 and
the first conv pays a layout copy of it (for a 3-channel image a strided byte copy slower than the
quantize itself). Where every reader of a Quantize is a QuantizedConv2d taking it as its input,
the Quantize writes channels-last directly (nn.quant.Quantize.channels_last): the same values.
"""
from __future__ import annotations

from torch import fx

from ..nn.conv import QuantizedConv2d
from ..nn.quant import Quantize
from .graph_utils import module_of


def _read_as_conv_input(gm: fx.GraphModule, reader: fx.Node, value: fx.Node) -> bool:
    return module_of(gm, reader, QuantizedConv2d) is not None and len(reader.args) >= 1 \
        and reader.args[0] is value and value not in reader.args[1:] and value not in reader.kwargs.values()


def quantize_channels_last(gm: fx.GraphModule) -> int:
    """Mark the Quantize modules of gm whose every reader is a conv's input; returns how many."""
    marked = 0
    for node in gm.graph.nodes:
        module = module_of(gm, node, Quantize)
        if module is None or module.channel_divisor is not None or not node.users:
            continue
        if all(_read_as_conv_input(gm, u, node) for u in node.users):
            module.channels_last = True
            marked += 1
    return marked
