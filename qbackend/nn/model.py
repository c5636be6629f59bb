"""QuantizedModel: what `qbackend.convert` returns.

An nn.Module around the int8 graph (a plain torch.fx.GraphModule over flat inputs and outputs) or,
for the module-swap fallback, around the model with its layers swapped. It keeps the user-facing
calling convention (the model's own args, kwargs and output structure, via pytree specs), the
per-layer records (`qbackend_layers`: kind, mode, module path, provider and why, shapes) and the
activation table (`qbackend_activations`: each int8 value's float range and settings, from which
its qparams can be recomputed for another CPU). It pickles (torch.save / qbackend.save).
"""
from __future__ import annotations

from torch import nn
from torch.fx._pytree import tree_flatten_spec
from torch.utils import _pytree as pytree


class _DumpedSpec:
    """A pytree spec in its serialized (JSON) form, inside a pickled QuantizedModel."""

    def __init__(self, text: str):
        self.text = text


class QuantizedModel(nn.Module):
    def __init__(self, inner: nn.Module, layers: dict, activations: dict, in_spec=None, out_spec=None):
        super().__init__()
        self.inner = inner
        self.qbackend_layers = layers
        self.qbackend_activations = activations
        self._in_spec, self._out_spec = in_spec, out_spec

    @property
    def graph_module(self):
        """The int8 torch.fx.GraphModule (None for the module-swap fallback)."""
        return self.inner if self._in_spec is not None else None

    def layer(self, name: str) -> nn.Module:
        """The quantized module of the layer `name` (a key of qbackend_layers, e.g. "layer1.0.conv1")."""
        if name not in self.qbackend_layers:
            raise KeyError(f"no quantized layer {name!r}; layers: {', '.join(self.qbackend_layers)}")
        return self.inner.get_submodule(self.qbackend_layers[name]["module"])

    def forward(self, *args, **kwargs):
        if self._in_spec is None:
            return self.inner(*args, **kwargs)
        flat = tree_flatten_spec((list(args), kwargs), self._in_spec)
        out = self.inner(*flat)
        return pytree.tree_unflatten(list(out), self._out_spec)

    # The pytree specs pickle (and deep-copy) as their JSON form where torch can write one: pickling
    # TreeSpec objects goes through a deprecated LeafSpec check that warns on every save and load.
    def __getstate__(self):
        state = self.__dict__.copy()
        for key in ("_in_spec", "_out_spec"):
            spec = state.get(key)
            if spec is not None:
                try:
                    state[key] = _DumpedSpec(pytree.treespec_dumps(spec))
                except Exception:  # noqa: BLE001  (a custom node without a serialized name: pickle it as is)
                    pass
        return state

    def __setstate__(self, state):
        for key in ("_in_spec", "_out_spec"):
            if isinstance(state.get(key), _DumpedSpec):
                state[key] = pytree.treespec_loads(state[key].text)
        super().__setstate__(state)

    def extra_repr(self) -> str:
        kinds = {}
        for info in self.qbackend_layers.values():
            key = f"{info['kind']}:{info['mode']}"
            kinds[key] = kinds.get(key, 0) + 1
        return "quantized layers: " + ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items()))
