"""A torch.fx GraphModule as data: its graph's nodes (name, op, target, args, kwargs) and its
module state (submodules, parameters, buffers, plain attributes, plain-data `meta` entries), and
back.

Loading builds the graph node by node and lets torch.fx generate its Python code. Everything that
reaches that code is checked first, so a file cannot inject code through it: node names are Python
identifiers, method names public tensor methods, module and attribute targets are dotted identifiers (or child
indices), call
targets are allowlisted functions and ops (allowlist.py), arguments are decoded values (numbers,
strings, dtypes, slices, earlier nodes, ...). Node metadata (shapes, stack traces) is not stored.
"""
from __future__ import annotations

import keyword

import torch
from torch import fx, nn

OPS = ("placeholder", "get_attr", "call_function", "call_method", "call_module", "output")
# GraphModule attributes that torch.fx derives from the graph, and the nn.Module bookkeeping that is
# rebuilt fresh (a stored GraphModule has no hooks).
_DERIVED = frozenset({"_graph", "_code", "_lineno_map", "_prologue_start", "_tracer_cls", "_tracer_extras",
                      "shape_env", "_create_node_hooks", "_erase_node_hooks", "_replace_hooks", "_deepcopy_hooks"})
_HOOKS = ("_backward_hooks", "_backward_pre_hooks", "_forward_hooks", "_forward_hooks_always_called",
          "_forward_hooks_with_kwargs", "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_state_dict_hooks",
          "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")


class GraphCodecError(ValueError):
    """A GraphModule that cannot be stored, or a stored graph that is malformed."""


def _identifier(name, what: str, where: str) -> str:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise GraphCodecError(f"{where}: {what} {name!r} is not a Python identifier")
    return name


def _dotted(name, what: str, where: str) -> str:
    if not isinstance(name, str) or not name:
        raise GraphCodecError(f"{where}: {what} {name!r} is not a dotted name")
    for part in name.split("."):
        if not (part.isascii() and part.isdigit()):  # Sequential / ModuleList children are named 0, 1, ...
            _identifier(part, what, where)
    return name


def _args(value, encode, where: str):
    """Encode node arguments: Nodes become {"$node": name}; everything else goes to `encode`."""
    if isinstance(value, fx.Node):
        return {"$node": value.name}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        items = [_args(v, encode, where) for v in value]
        return items if isinstance(value, list) else {"$tuple": items}
    if isinstance(value, dict):
        return {"$map": {k: _args(v, encode, where) for k, v in value.items()}}
    if isinstance(value, slice):
        return {"$slice": [_args(v, encode, where) for v in (value.start, value.stop, value.step)]}
    return encode(value, where)


def encode(gm: fx.GraphModule, encode_value, where: str) -> dict:
    hooks = [h for h in _HOOKS if getattr(gm, h, None)]
    if hooks:
        raise GraphCodecError(f"{where}: a GraphModule with hooks ({', '.join(hooks)}) cannot be stored")
    nodes = []
    for n in gm.graph.nodes:
        if n.op == "call_function":
            target = encode_value(n.target, f"{where} node {n.name}")
        else:
            target = n.target
        nodes.append([n.name, n.op, target, _args(n.args, encode_value, f"{where} node {n.name}"),
                      _args(n.kwargs, encode_value, f"{where} node {n.name}")])
    state = {k: v for k, v in gm.__dict__.items() if k not in _DERIVED and k not in _HOOKS and k != "meta"}
    meta = {}
    for k, v in gm.meta.items():
        try:
            meta[k] = encode_value(v, f"{where}.meta[{k!r}]")
        except ValueError:
            continue  # meta keeps only plain-data entries
    return {"class_name": type(gm).__name__, "nodes": nodes, "meta": meta,
            "state": encode_value(state, f"{where}.state")}


def _decode_args(value, nodes: dict, decode_value, where: str):
    if isinstance(value, list):
        return [_decode_args(v, nodes, decode_value, where) for v in value]
    if isinstance(value, dict) and len(value) == 1:
        tag, body = next(iter(value.items()))
        if tag == "$node":
            if body not in nodes:
                raise GraphCodecError(f"{where}: argument {body!r} is not an earlier node")
            return nodes[body]
        if tag == "$tuple" and isinstance(body, list):
            return tuple(_decode_args(v, nodes, decode_value, where) for v in body)
        if tag == "$map" and isinstance(body, dict):
            return {_identifier(k, "keyword", where): _decode_args(v, nodes, decode_value, where)
                    for k, v in body.items()}
        if tag == "$slice" and isinstance(body, list) and len(body) == 3:
            return slice(*(_decode_args(v, nodes, decode_value, where) for v in body))
    return decode_value(value, where)


def decode(data, decode_value, where: str) -> fx.GraphModule:
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise GraphCodecError(f"{where}: a stored GraphModule needs a node list")
    class_name = _identifier(data.get("class_name", "GraphModule"), "class name", where)
    graph = fx.Graph()
    nodes: dict[str, fx.Node] = {}
    outputs = 0
    for entry in data["nodes"]:
        if not isinstance(entry, list) or len(entry) != 5:
            raise GraphCodecError(f"{where}: node entry {entry!r:.80} is not [name, op, target, args, kwargs]")
        name, op, target, args, kwargs = entry
        here = f"{where} node {name!r}"
        _identifier(name, "node name", where)
        if name in nodes:
            raise GraphCodecError(f"{here}: repeated node name")
        if op not in OPS:
            raise GraphCodecError(f"{here}: unknown op {op!r}")
        if op == "call_function":
            target = decode_value(target, here)
            if not callable(target):
                raise GraphCodecError(f"{here}: call target is not a function")
        elif op in ("get_attr", "call_module"):
            _dotted(target, "target", here)
        elif op == "placeholder":
            _identifier(target, "target", here)
        elif op == "call_method":
            if _identifier(target, "method", here).startswith("_") or not hasattr(torch.Tensor, target):
                raise GraphCodecError(f"{here}: method {target!r} is not a public tensor method")
        elif target != "output":
            raise GraphCodecError(f"{here}: output target {target!r}")
        a = _decode_args(args, nodes, decode_value, here)
        k = _decode_args(kwargs, nodes, decode_value, here)
        if not isinstance(a, tuple) or not isinstance(k, dict):
            raise GraphCodecError(f"{here}: args must be a tuple and kwargs a map")
        node = graph.create_node(op, target, a, k, name=name)
        if node.name != name:
            raise GraphCodecError(f"{here}: name collides with a reserved name ({node.name!r} given instead)")
        nodes[name] = node
        outputs += op == "output"
    if outputs != 1:
        raise GraphCodecError(f"{where}: a graph needs exactly one output node, this one has {outputs}")
    gm = fx.GraphModule(nn.Module(), fx.Graph(), class_name=class_name)
    state = decode_value(data.get("state"), f"{where}.state")
    if not isinstance(state, dict) or not isinstance(state.get("_modules"), dict):
        raise GraphCodecError(f"{where}: GraphModule state without its modules")
    for key in ("_modules", "_parameters", "_buffers"):
        if not isinstance(state.get(key, {}), dict):
            raise GraphCodecError(f"{where}: GraphModule {key} is not a dict")
    gm.__dict__.update(state)
    meta = data.get("meta", {})
    gm.meta = {k: decode_value(v, f"{where}.meta[{k!r}]") for k, v in meta.items()} if isinstance(meta, dict) else {}
    try:
        graph.lint()
        gm.graph = graph
    except Exception as exc:  # noqa: BLE001  (fx raises RuntimeError, AttributeError, ... on a bad graph)
        raise GraphCodecError(f"{where}: the stored graph is not valid ({type(exc).__name__}: {exc})") from None
    return gm
