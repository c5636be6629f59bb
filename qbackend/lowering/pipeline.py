"""prepare and convert as pipelines of passes, listed in order here: each pass takes the state of
its flow (prepare.PrepareState, convert.ConvertState: the graph plus what the passes before it
found) and hands it on. A new pass is one entry in a list.

    prepare_graph(model, example_args, config)  -> PreparedGraph   (the model to calibrate)
    convert_graph(prepared)                     -> the int8 graph, its layer and activation records
"""
from __future__ import annotations

from typing import Callable

from torch import nn

from ..config import QuantConfig
from . import convert, prepare
from .graph_utils import quiet_treespec_deprecation

PREPARE: tuple[Callable, ...] = (
    prepare.capture_graph,          # torch.export -> GraphModule (a batch of one captured as two)
    prepare.example_shapes,         # the user's example shapes on the nodes, for routing
    prepare.fold_batchnorms,        # BatchNorm into the conv / linear before it
    prepare.equalize_layers,        # cross-layer equalization through ReLU (QuantConfig.equalization)
    prepare.match_layers,           # conv2d / linear -> int8 ops, with the add and activation they absorb
    prepare.match_tables,           # embedding lookups -> rowwise-quantized tables
    prepare.plan_values,            # which values are observed, which flow in int8
    prepare.smoothing_groups,       # SmoothQuant's candidates (before observers: folds read users)
    prepare.token_candidates,       # values their Linears may read per token (chosen at convert)
    prepare.insert_observers,       # an observer on every observed value
    prepare.insert_channel_stats,   # SmoothQuant's per-channel statistics
    prepare.insert_row_samples,     # a row sample of each per-token candidate
    prepare.insert_hessian_stats,   # X^T X and E[x] per static Linear / conv input (GPTQ, bias correction)
)

CONVERT: tuple[Callable, ...] = (
    convert.qparams_from_observers,  # each observed value's qparams and activation record
    convert.search_smoothing,        # SmoothQuant's factors per candidate value
    convert.choose_per_token,        # which Linears read their input per token; the plan made again
    convert.warn_calibration_outliers,  # one warning naming ranges a few outlying values dominate
    convert.copy_graph,              # rewrite a copy (parameters shared)
    convert.apply_smoothing,         # factors into LayerNorms, quantize ops and (later) weights
    convert.attach_hessians,         # GPTQ's H and E[x] per static Linear / conv
    convert.plan_nhwc_flattens,      # flattens of channels-last int8 read only by Linears: NHWC order
    convert.rewrite_layers,          # each matched op -> its qbackend.nn module, int8 between them
    convert.read_flattens_as_nhwc,   # those flattens read the NHWC memory (a view, no copy)
    convert.rewrite_tables,          # embedding lookups -> rowwise-quantized modules
    convert.shapes_from_int8,        # shape queries read int8 forms (float chains kept for shapes die)
    convert.drop_recorders,          # observers, statistics, export's guards; dead code
    convert.fuse_float_cores,        # attention cores, LayerNorms and global pools with the quantize behind them
    convert.channels_last_inputs,    # quantizes read only by convs write channels-last
    convert.views_as_reshapes,       # views of the FP32 graph run on channels-last int8 outputs
    convert.donate_dead_residuals,   # residual convs write into dead int8 residuals
    convert.drop_unused_attributes,  # the float weights replaced
    convert.name_layers_by_path,     # int8 layers at their original module paths
    convert.fuse_blocks,             # inverted-residual chains -> one native call (the fusion table)
    convert.check_and_warn,          # lint, recompile, one warning listing what stays FP32
)


def run(passes, state):
    for p in passes:
        state = p(state)
    return state


def prepare_graph(model: nn.Module, example_args: tuple, config: QuantConfig,
                  example_kwargs: dict | None = None) -> prepare.PreparedGraph:
    """The PREPARE passes on the model (CaptureError if torch.export cannot capture it)."""
    state = run(PREPARE, prepare.PrepareState(model, tuple(example_args), example_kwargs, config))
    return prepare.prepared_graph(state)


def convert_graph(prepared: prepare.PreparedGraph, warn: bool = True, tune=None):
    """((the int8 GraphModule over flat inputs, input spec, output spec), the layer records, the
    activation records): the CONVERT passes on a calibrated prepared graph."""
    with quiet_treespec_deprecation():
        state = run(CONVERT, convert.ConvertState(prepared, tune=tune, warn=warn))
        return convert.plain_graph(state.gm), state.layers, state.activations
