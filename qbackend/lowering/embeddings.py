"""Embedding tables in the captured graph: each aten.embedding / aten.embedding_bag call whose
table is a parameter (nn.Embedding, nn.EmbeddingBag, or F.embedding(_bag) on a parameter) is
matched at prepare time (weight-only: nothing to calibrate) and, at convert, replaced by a
QuantizedEmbedding / QuantizedEmbeddingBag module (rowwise 8 or 4 bits, per the module's
EmbeddingConfig) on the provider the dispatcher picks. Tables under the config's min_weights,
and modules the config keeps in FP32, are left alone silently; max bags, max_norm, bags whose
offset2bag / bag_size outputs are used and (unless EmbeddingConfig.transformer_tables) lookups
that feed a LayerNorm through adds (a transformer's token embeddings) stay FP32 with the reason
(FP32FallbackWarning)."""
from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch import fx

from ..config import EmbeddingConfig, QuantConfig
from ..dispatch import route
from ..nn.embedding import QuantizedEmbedding, QuantizedEmbeddingBag
from ..ops.embedding import PackedEmbeddingTable, quantize_rowwise
from .fold import get_attr_value
from .graph_utils import module_path
from .records import table_record

aten = torch.ops.aten
_BAG_MODES = {0: "sum", 1: "mean", 2: "max"}
# argument positions: (indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx)
_BAG_TARGETS = {aten.embedding_bag.padding_idx, aten.embedding_bag.default, aten._embedding_bag.default,
                aten._embedding_bag_forward_only.default}


@dataclass
class EmbeddingOp:
    """One embedding lookup of the captured graph that becomes a rowwise-quantized table."""

    kind: str                    # "embedding" | "embedding_bag"
    name: str
    node: fx.Node                # the aten call
    weight: fx.Node              # get_attr of the table
    config: EmbeddingConfig
    mode: str = "sum"
    padding_idx: int | None = None
    include_last_offset: bool = False

    def args(self) -> tuple:
        a = self.node.args
        if self.kind == "embedding":
            return (a[1],)
        psw = a[6] if len(a) > 6 else self.node.kwargs.get("per_sample_weights")
        return (a[1], a[2], psw)


def _arg(node: fx.Node, i: int, name: str, default):
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def feeds_layer_norm(node: fx.Node, depth: int = 4) -> bool:
    """Whether node's value reaches an aten.layer_norm through at most `depth` elementwise adds
    (token + position + type embeddings, then LayerNorm: a transformer's input)."""
    frontier = [node]
    for _ in range(depth + 1):
        nxt = []
        for n in frontier:
            for u in n.users:
                if u.op == "call_function" and u.target is aten.layer_norm.default and u.args[0] is n:
                    return True
                if u.op == "call_function" and u.target in (aten.add.Tensor, aten.add_.Tensor):
                    nxt.append(u)
        frontier = nxt
    return False


def match_embeddings(gm: fx.GraphModule, model: torch.nn.Module, config: QuantConfig):
    """(embedding ops to quantize, [(name, reason) of tables the config asked for but that stay FP32])."""
    ops, skipped, calls = [], [], {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is aten.embedding.default:
            kind = "embedding"
        elif node.target in _BAG_TARGETS:
            kind = "embedding_bag"
        else:
            continue
        path = module_path(node)
        k = calls.get(path, 0)
        calls[path] = k + 1
        name = (path if k == 0 else f"{path}@{k}") or kind
        try:
            module = model.get_submodule(path) if path else model
        except AttributeError:
            module = torch.nn.Module()
        cfg = config.for_module(name, module)
        ecfg = cfg.embedding if cfg is not None else None
        weight = node.args[0]
        if ecfg is None or not (isinstance(weight, fx.Node) and weight.op == "get_attr"):
            continue
        table = get_attr_value(gm, weight)
        if table.dim() != 2 or table.numel() < ecfg.min_weights:
            continue
        op = EmbeddingOp(kind, name, node, weight, ecfg)
        why = None
        if getattr(module, "max_norm", None) is not None:
            why = "max_norm renormalises the table at lookup"
        elif table.dtype != torch.float32:
            why = f"its table is {table.dtype}, not float32"
        elif ecfg.bits == 4 and table.shape[1] % 2:
            why = "4-bit tables need an even embedding dim"
        elif kind == "embedding" and not ecfg.transformer_tables and feeds_layer_norm(node):
            why = ("a transformer's embedding (its lookups feed a LayerNorm): kept in float, its error would ride "
                   "the residual stream (EmbeddingConfig(transformer_tables=True) quantizes it)")
        elif kind == "embedding":
            pad = _arg(node, 2, "padding_idx", -1)
            op.padding_idx = None if pad is None or pad < 0 else int(pad)
        else:
            mode = _BAG_MODES.get(int(_arg(node, 4, "mode", 0)), "?")
            pad = _arg(node, 8, "padding_idx", None)
            op.mode, op.include_last_offset = mode, bool(_arg(node, 7, "include_last_offset", False))
            op.padding_idx = None if pad is None or pad < 0 else int(pad)
            if mode not in ("sum", "mean"):
                why = f"{mode} bags are not quantized (sum and mean are)"
            elif any(u.target is not operator.getitem or u.args[1] != 0 for u in node.users):
                why = "the graph reads its offset2bag / bag_size outputs"
        if why:
            skipped.append((name, why))
            continue
        ops.append(op)
    return ops, skipped


def rewrite_embeddings(gm: fx.GraphModule, ops: list[EmbeddingOp]) -> dict[str, dict]:
    """Replace each op by its quantized module; returns the layer records (like convert's)."""
    layers = {}
    for op in ops:
        ecfg = op.config
        table = get_attr_value(gm, op.weight)
        rows, dim = table.shape
        shape = {"rows": int(rows), "dim": int(dim), "bits": ecfg.bits,
                 "fp16_qparams": int(ecfg.qparams_dtype == torch.float16),
                 "padding_idx": int(op.kind == "embedding_bag" and op.padding_idx is not None)}
        r = route("embedding_bag", shape, eight_bit_input=False, forced=ecfg.provider)
        packed = PackedEmbeddingTable(quantize_rowwise(table, ecfg.bits, ecfg.qparams_dtype), dim, ecfg.bits,
                                      r.provider)
        if op.kind == "embedding":
            module = QuantizedEmbedding(packed, op.padding_idx)
        else:
            module = QuantizedEmbeddingBag(packed, op.mode, op.padding_idx, op.include_last_offset)
        target = "qembedding_" + op.name.replace(".", "_").replace("@", "_call")
        gm.add_submodule(target, module)
        with gm.graph.inserting_after(op.node):
            call = gm.graph.call_module(target, op.args())
        call.meta["qbackend_layer"] = op.name
        if op.kind == "embedding":
            op.node.replace_all_uses_with(call)
        else:
            for user in list(op.node.users):
                user.replace_all_uses_with(call)
                gm.graph.erase_node(user)
        gm.graph.erase_node(op.node)
        layers[op.name] = table_record(op.kind, target, shape, ecfg, r,
                                       op.mode if op.kind == "embedding_bag" else None)
    return layers
