"""QuantizedModel: what `qbackend.convert` returns.

An nn.Module around the int8 graph (a plain torch.fx.GraphModule over flat inputs and outputs) or,
for the module-swap fallback, around the model with its layers swapped. It keeps the user-facing
calling convention (the model's own args, kwargs and output structure, via pytree specs), the
per-layer records (`qbackend_layers`: name -> core.records.LayerRecord: kind, mode, module path,
fusion, shapes, route) and the activation table (`qbackend_activations`: value name ->
ActivationRecord: each int8 value's float range and settings, from which its qparams can be
recomputed for another CPU). It pickles (torch.save / qbackend.save), the records as versioned
plain dicts.
"""
from __future__ import annotations

from torch import nn
from torch.fx._pytree import tree_flatten_spec
from torch.utils import _pytree as pytree

from ..core import generation
from ..core.batches import bind_by_name
from ..core.records import ActivationRecord, LayerRecord
from .forward_plan import ForwardPlans, tensor_args
from .inputs import check_inputs
from .inverted_residual import QuantizedInvertedResidual


class _DumpedSpec:
    """A pytree spec in its serialized (JSON) form, inside a saved QuantizedModel, with the classes
    its nodes name beyond the builtin containers (a Hugging Face ModelOutput, say): a loader
    resolves those first, and importing a class's module is what registers it with pytree."""

    def __init__(self, text: str, classes: tuple = ()):
        self.text = text
        self.classes = classes


def _node_classes(spec: pytree.TreeSpec) -> tuple:
    """The non-builtin classes of a pytree spec's nodes, each once, in first-seen order."""
    seen, stack = [], [spec]
    while stack:
        node = stack.pop()
        if isinstance(node.type, type) and node.type.__module__ not in ("builtins", "collections") \
                and node.type not in seen:
            seen.append(node.type)
        stack.extend(reversed(node.children()))
    return tuple(seen)


def _positional_count(in_spec) -> int:
    """n where the graph's inputs are exactly n positional arguments (the spec of `(args, {})` with
    n leaves), so a call with n positional arguments and no keywords passes them through as they
    are (what tree_flatten_spec would return, without its cost: benchmarks/results/
    design_measurements.md, "Pytree flatten in QuantizedModel calls"); -1 otherwise."""
    if in_spec is None or in_spec.num_children != 2:
        return -1
    args_spec, kwargs_spec = in_spec.children()
    if kwargs_spec.type is not dict or kwargs_spec.num_children or args_spec.type not in (tuple, list) \
            or not all(c.is_leaf() for c in args_spec.children()):
        return -1
    return args_spec.num_children


_CALL_STATE = frozenset({"forward", "forward_plans", "_compiled_call_impl"})  # what _plain_call reads


class QuantizedModel(nn.Module):
    """What qbackend.convert returns: the int8 model, with its layer and activation records."""

    def __init__(self, inner: nn.Module, layers: dict[str, LayerRecord], activations: dict[str, ActivationRecord],
                 in_spec=None, out_spec=None, arg_names=None, input_signature=None, forward_plans: bool = True):
        """arg_names: the model's names of the graph's positional inputs (its forward's parameters),
        by which a call may also pass them as keywords. input_signature: each flat graph input's
        [name, rank, floating] (nn/inputs.py), checked on every call; None: not checked.
        forward_plans: whether eager calls replay recorded forward plans (nn/forward_plan.py; the
        `forward_plans` attribute switches them later)."""
        super().__init__()
        self.inner = inner
        self.qbackend_layers = layers
        self.qbackend_activations = activations
        self._in_spec, self._out_spec = in_spec, out_spec
        self._single_output = out_spec is not None and out_spec.is_leaf()
        self._arg_names = list(arg_names) if arg_names else []
        self._positional = _positional_count(in_spec)
        self._input_signature = input_signature
        self.forward_plans = bool(forward_plans)
        self._plans = self._new_plans()
        generation.install_module_hooks()

    def _new_plans(self) -> ForwardPlans:
        return ForwardPlans(owner_tables=(self._forward_hooks, self._forward_pre_hooks, self._backward_hooks,
                                          self._backward_pre_hooks))

    @property
    def graph_module(self):
        """The int8 torch.fx.GraphModule (None for the module-swap fallback)."""
        return self.inner if self._in_spec is not None else None

    def layer(self, name: str) -> nn.Module:
        """The quantized module of the layer `name` (a key of qbackend_layers, e.g. "layer1.0.conv1")."""
        if name not in self.qbackend_layers:
            raise KeyError(f"no quantized layer {name!r}; layers: {', '.join(self.qbackend_layers)}")
        return self.inner.get_submodule(self.qbackend_layers[name].module)

    def __call__(self, *args, **kwargs):
        """nn.Module.__call__, with the last call's forward plan tried first (ForwardPlans.fast) where
        __call__ would only call forward (`_plain_call`: plans on, not compiled, forward not replaced;
        and, checked in C++, no hook on this model or globally) and the inputs are positional as
        captured. A call runs right after the previous forward's kernels, with the caches cold, where
        each Python frame and lookup costs up to microseconds: this skips the frames of
        nn.Module.__call__ and forward (benchmarks/results/xeon_amx/forward_overhead.md)."""
        if self._plain_call and not kwargs and len(args) == self._positional:
            out = self._plans.fast(args)
            if out is not None:
                return out[0] if self._single_output else pytree.tree_unflatten(out, self._out_spec)
        return super().__call__(*args, **kwargs)

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name in _CALL_STATE:
            self._update_plain_call()

    def __delattr__(self, name):
        super().__delattr__(name)
        if name in _CALL_STATE:
            self._update_plain_call()

    def _update_plain_call(self) -> None:
        """`_plain_call`: whether nn.Module.__call__ would only call QuantizedModel.forward, hooks
        aside (plans on, not compiled, no forward set on the instance, not a subclass); kept current
        by every assignment of the attributes it reads (`_CALL_STATE`)."""
        state = self.__dict__
        state["_plain_call"] = bool(state.get("forward_plans")) and self._compiled_call_impl is None \
            and "forward" not in state and type(self) is QuantizedModel

    def forward(self, *args, **kwargs):
        if self._in_spec is None:
            return self.inner(*args, **kwargs)
        if not kwargs and len(args) == self._positional and self.forward_plans:
            out = self._plans.fast(args)  # the last call's plan's inputs: checked in C++
            if out is not None:
                return out[0] if self._single_output else pytree.tree_unflatten(out, self._out_spec)
        if kwargs or len(args) != self._positional:
            args = self._flatten(args, kwargs)
        if self._input_signature is not None:
            check_inputs(self._input_signature, args)
        out = self._plans(self.inner, args) if self.forward_plans else None
        if out is None:
            out = self.inner(*args)
        return pytree.tree_unflatten(list(out), self._out_spec)

    def recorded_plan(self, *args, **kwargs):
        """(the forward plan recorded for these inputs' signature, their flat tensors), or (None, None)
        where none is recorded yet or plans do not apply (nn/forward_plan.py)."""
        if self._in_spec is None or not self.forward_plans:
            return None, None
        if kwargs or len(args) != self._positional:
            args = self._flatten(args, kwargs)
        plan = self._plans.recorded(args)
        return (plan, tensor_args(args)) if plan is not None else (None, None)

    def layer_by_module(self) -> dict[str, str]:
        """Each quantized layer's module path -> its layer name; a module that runs several layers in
        one call (a fused inverted-residual block) -> their names joined by "+"."""
        out = {rec.module: name for name, rec in self.qbackend_layers.items() if rec.module}
        groups: dict[str, list[str]] = {}
        for path, name in out.items():
            parent = path.rpartition(".")[0]
            if parent and isinstance(self.inner.get_submodule(parent), QuantizedInvertedResidual):
                groups.setdefault(parent, []).append(name)
        out.update({parent: "+".join(names) for parent, names in groups.items()})
        return out

    def forward_plan_summary(self) -> list[str]:
        """What eager calls run: one line per input signature seen (a recorded plan, or why the graph
        runs it), or that plans are off."""
        if self._in_spec is None:
            return ["module-swap model: its layers run as modules (no forward plans)"]
        if not self.forward_plans:
            return ["forward plans are off: every call runs the graph"]
        return self._plans.describe(self.layer_by_module()) or [
            "no call yet: a plan is recorded on the second call of each input signature"]

    def _apply(self, fn, *args, **kwargs):
        generation.bump()  # .to() / .float() replace buffers without registration hooks
        return super()._apply(fn, *args, **kwargs)

    def _flatten(self, args: tuple, kwargs: dict) -> list:
        """The graph's flat inputs of a call: positional inputs given by keyword are moved to their
        place first (as the FP32 model binds them); a call of another structure gets a TypeError
        that names what the model was captured with."""
        n_args = self._in_spec.child(0).num_children
        args, kwargs = bind_by_name(self._arg_names, n_args, args, kwargs)
        expected_kwargs = set(self._in_spec.child(1).context or ())
        if len(args) != n_args or set(kwargs) != expected_kwargs:
            names = ", ".join(self._arg_names[:n_args]) or f"{n_args} inputs"
            raise TypeError(f"the quantized model was captured with the positional inputs ({names})"
                            + (f" and the keywords {sorted(expected_kwargs)}" if expected_kwargs else "")
                            + f"; got {len(args)} positional and keywords {sorted(kwargs)}")
        return tree_flatten_spec((list(args), kwargs), self._in_spec)

    # The pytree specs pickle (and deep-copy) as their JSON form where torch can write one: pickling
    # TreeSpec objects goes through a deprecated LeafSpec check that warns on every save and load.
    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_plans", None)  # derived: a loaded model records its own
        state.pop("_plain_call", None)  # derived
        state["qbackend_layers"] = {k: r.to_dict() for k, r in self.qbackend_layers.items()}
        state["qbackend_activations"] = {k: r.to_dict() for k, r in self.qbackend_activations.items()}
        for key in ("_in_spec", "_out_spec"):
            spec = state.get(key)
            if spec is not None:
                try:
                    state[key] = _DumpedSpec(pytree.treespec_dumps(spec), _node_classes(spec))
                except Exception:  # noqa: BLE001  (a custom node without a serialized name: pickle it as is)
                    pass
        return state

    def __setstate__(self, state):
        for key in ("_in_spec", "_out_spec"):
            if isinstance(state.get(key), _DumpedSpec):
                state[key] = pytree.treespec_loads(state[key].text)
        state["qbackend_layers"] = {k: r if isinstance(r, LayerRecord) else LayerRecord.from_dict(r)
                                    for k, r in state.get("qbackend_layers", {}).items()}
        state["qbackend_activations"] = {k: r if isinstance(r, ActivationRecord) else ActivationRecord.from_dict(r)
                                         for k, r in state.get("qbackend_activations", {}).items()}
        super().__setstate__(state)
        self.__dict__.setdefault("_arg_names", [])  # models saved before it existed
        self.__dict__.setdefault("_input_signature", None)  # saved without one: not checked
        self.__dict__.setdefault("forward_plans", True)
        self._plans = self._new_plans()
        generation.install_module_hooks()
        self._positional = _positional_count(self._in_spec)
        self._single_output = self._out_spec is not None and self._out_spec.is_leaf()
        self._update_plain_call()

    def extra_repr(self) -> str:
        kinds = {}
        for info in self.qbackend_layers.values():
            key = f"{info.kind}:{info.mode}"
            kinds[key] = kinds.get(key, 0) + 1
        return "quantized layers: " + ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items()))
