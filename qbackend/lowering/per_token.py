"""The per-token pass of the lowering (the measurement itself: qbackend.algorithms.per_token):

* which values (`find_groups`, at prepare): the int8 output of a static Linear whose int8
  readers are all static Linears reading it as their input, writing float32 themselves (no
  int8 reader of their own) and taking no residual, none of them configured with
  per_token_inputs=False (a transformer FFN: the up projection's GELU output, read by the down
  projection). A uniform sample of the value's rows is recorded beside its observer (a
  ChannelStats, which merges exactly across processes);
* the choice (`choose`, at convert): the readers of a value read it per token where a reader's
  config says per_token_inputs=True, or, with "auto" (the default), where the static range's
  output error on the sampled rows is at least PER_TOKEN_GAIN times the per-token one. A chosen
  value is then not quantized: its producer writes float32 (its activation fused) and each reader
  becomes a TokenQuantizedLinear (convert makes the plan again with those readers reading float:
  plan.make_plan's `float_inputs`).

PER_TOKEN_GAIN is 10^0.1 (1 dB less output error on the layer). A per-token input costs the
producer's float32 write and its read, one pass over the value and one over the output at run
time: 2-5% of an encoder's forward (BERT-base, all-MiniLM-L6-v2). On calibration data the static
range's error is 1.2-2.5 dB above per-token on BERT-base's (random-init) FFNs and 6-27 dB on
all-MiniLM-L6-v2's (real weights); end to end that is +0.6 dB and +6.8 dB output SQNR
(benchmarks/results/epyc_zen4/accuracy.md, the rows "per-token inputs off").
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from torch import fx

from ..algorithms.per_token import output_errors
from ..algorithms.smoothquant import ChannelStats
from .fold import get_attr_value
from .graph_utils import example_shape
from .plan import Plan, static_readers

ROWS_PREFIX = "qbackend_row_sample_"
SAMPLE_ROWS = 512      # rows of each candidate value kept from calibration
PER_TOKEN_GAIN = 10 ** 0.1  # "auto": the static output error must be at least this multiple of the per-token one


@dataclass
class TokenGroup:
    """A value that its Linears may read per token, and those Linears (in the prepared graph)."""

    value: fx.Node
    ops: list            # the QuantizableOps (linear, static) reading it
    stats: str           # the ChannelStats submodule sampling its rows


def find_groups(plan: Plan, ops: list) -> dict[fx.Node, list]:
    """value -> the static Linears reading it, for every candidate value (module docstring)."""
    producers = {op.output: op for op in ops if op.config.mode == "static"}
    groups = {}
    for value, lst in static_readers(plan, ops).items():
        producer = producers.get(value)
        if producer is None or producer.kind != "linear" or value not in plan.int8_outputs \
                or value in plan.aliases or value in plan.int8_cats:
            continue
        shape = example_shape(value)
        if shape is None or len(shape) < 1:
            continue
        if all(op.kind == "linear" and what == "input" and op.accum is None and op.output not in plan.int8_outputs
               and op.config.per_token_inputs is not False and (example_shape(op.x) or (None,))[-1] == shape[-1]
               for op, what, _ in lst):
            groups[value] = [op for op, _, _ in lst]
    return groups


def qmax_for(op, gm: fx.GraphModule) -> int:
    """255 where a routed provider (the forced one, if any) multiplies full-range 8-bit activations
    exactly for this Linear on this CPU, else 127."""
    return 255 if op.exact_8bit_route(gm) else 127


def choose(groups: list[TokenGroup], gm: fx.GraphModule, qparams: dict) -> dict[str, dict]:
    """layer name -> {"qmax", "gain_db"} for every Linear that reads its input per token: the
    choice of the module docstring; gain_db is the static range's output error over the per-token
    one on the sampled rows (None where the config asked for per-token and nothing was sampled)."""
    chosen = {}
    for group in groups:
        stats: ChannelStats = gm.get_submodule(group.stats)
        qmax = min(qmax_for(op, gm) for op in group.ops)
        forced = any(op.config.per_token_inputs is True for op in group.ops)
        gain_db = None
        if stats.sample is not None and group.value in qparams:
            weights = [get_attr_value(gm, op.weight) for op in group.ops]
            static_err, token_err = output_errors(stats.sample, qparams[group.value], weights, qmax)
            if token_err > 0.0 and static_err > 0.0:
                gain_db = round(10.0 * math.log10(static_err / token_err), 2)
            use = forced or (static_err >= PER_TOKEN_GAIN * token_err and static_err > 0.0)
        else:
            use = forced
        if use:
            for op in group.ops:
                chosen[op.name] = {"qmax": qmax, "gain_db": gain_db}
    return chosen
