"""Forward plans: a converted model's eager forward replayed as one native call per input signature.

The int8 graph runs as Python: a GraphModule calling qbackend's modules, each calling its op, so a
small layer pays several microseconds of Python per call, more than its arithmetic at batch 1. A
plan is that forward recorded once: the graph runs under a dispatch mode that sees every op call
(qbackend's kernels and the aten ops between them) with its arguments, and the calls become steps
of a `qbackend._C.ForwardPlan` (csrc/runtime/forward_plan.cpp), which replays them through the
dispatcher with no Python between them, the GIL released. The same ops with the same arguments:
the outputs are the graph's bit for bit.

A plan is recorded per input signature (each tensor input's dtype, sizes and strides; every other
input's value; whether grad mode is on), on the signature's second call: sizes the graph computes
from its inputs' shapes are constants of that signature. It is not recorded (the graph runs, every
call) where a replay could differ from the graph: an op reading a tensor's data into Python
(`.item()`), a random op, an op writing into an input or a weight, an input passed twice, anything
requiring grad with grad mode on, autocast, another dispatch mode or tensor subclass, a call from
torch.compile / torch.export tracing, and any forward hook (global, or on the graph module or a
module inside it: a replay calls no module, so it would skip them; `qbackend.compare` measures
layers with hooks). A replay whose step returns other sizes than recorded (an op whose output
shape depends on the data) stops and the graph runs that call. Plans are dropped when the model may have changed
(core/generation.py) and are never saved: a loaded model records its own.

The common case, a call with the same inputs' signature as the last one, takes a shorter path
(`ForwardPlans.fast`, which QuantizedModel.__call__ tries before nn.Module.__call__): the plan's
native entry (a plain CPython callable) checks the inputs, the modes, the hook tables, the
generation and the graph's forward itself and replays. That path runs right after the previous
forward's kernels with the caches cold, where each Python frame and lookup costs up to
microseconds, so it holds as little Python as it can: about 1 us per layer at batch 1 on ResNet-18
(benchmarks/results/xeon_amx/forward_overhead.md). Each step also knows the module that ran it
(`Plan.step_modules`), which qbackend.report.plan_profile uses to time a plan layer by layer.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
from torch.nn.modules import module as _torch_module
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from ..core import generation
from ..core.extension import _C

aten = torch.ops.aten

# The fast path's bindings: a lookup in torch's module dict costs a microsecond or more with the
# caches cold. torch.compiler.is_compiling() returns `_compiler._is_compiling_flag` outside
# TorchScript; a plan's entry expects `_GENERATION[0]` to be the object it was at recording.
_compiler = torch.compiler
_GENERATION = generation.CURRENT

MAX_PLANS = 8  # signatures kept per model (least recently used dropped)

# Ops that return only metadata of a tensor: for one input signature their results are constants.
_METADATA = {aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default, aten.sym_storage_offset.default,
             aten.size.int, aten.stride.int, aten.dim.default, aten.is_contiguous.default,
             aten.is_contiguous.memory_format}


def _remember(table: OrderedDict, key, value, limit: int = MAX_PLANS) -> None:
    """table[key] = value, dropping the least recently added entries beyond `limit`."""
    table[key] = value
    while len(table) > limit:
        table.popitem(last=False)


def tensor_args(args) -> list[torch.Tensor]:
    """The tensor inputs of a call, in order: a plan's inputs (its other inputs are in its signature)."""
    return [a for a in args if isinstance(a, torch.Tensor)]


class _Refused(Exception):
    """The forward cannot be recorded; the message says why."""


def signature(args) -> tuple | None:
    """The key of a call's plan, or None where no plan applies (see the module docstring)."""
    grad = torch.is_grad_enabled()
    key = [grad]
    for a in args:
        if isinstance(a, torch.Tensor):
            if type(a) is not torch.Tensor or a.device.type != "cpu" or (grad and a.requires_grad):
                return None
            key.append((a.dtype, a.shape, a.stride()))
        else:
            try:
                hash(a)
            except TypeError:
                return None
            key.append((type(a), a))
    return tuple(key)


def plans_apply() -> bool:
    """Whether this call may use or record a plan (not while tracing, under autocast or a mode)."""
    return not (torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.is_autocast_enabled("cpu")
                or _get_current_dispatch_mode_stack())


class _Recorder(TorchDispatchMode):
    """Runs the forward, turning each op call into a plan step (refusing what a replay could not
    reproduce)."""

    def __init__(self, inputs: list[torch.Tensor]):
        super().__init__()
        self.num_inputs = len(inputs)
        self.slots: dict[int, int] = {}
        self.keep: list = list(inputs)  # every tensor seen stays alive, so ids stay unique
        self.steps: list[tuple] = []    # (func, arguments, refs, outputs)
        self.step_modules: list[str | None] = []  # per step: the innermost module running it (None: the graph)
        self.module_stack: list[str] = []
        self.refused: str | None = None
        self.grad = torch.is_grad_enabled()
        for i, t in enumerate(inputs):
            if id(t) in self.slots:
                self.refused = "an input tensor is passed twice"
            self.slots[id(t)] = i

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.refused is None:
            try:
                self._record(func, args, kwargs, out)
            except _Refused as e:
                self.refused = str(e)
        return out

    def _constant(self, t: torch.Tensor, func) -> None:
        if self.grad and t.requires_grad:
            raise _Refused(f"{func} reads a tensor that requires grad")
        if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
            raise _Refused(f"{func} reads a {type(t).__name__}")
        self.keep.append(t)

    def _record(self, func, args, kwargs, out) -> None:
        if func in _METADATA:
            return
        schema = func._schema
        named = {a.name: v for a, v in zip(schema.arguments, args)}
        named.update(kwargs)
        if torch.Tag.nondeterministic_seeded in func.tags:
            defaults = {a.name: a.default_value for a in schema.arguments if a.name == "dropout_p"}
            if named.get("dropout_p", defaults.get("dropout_p")) != 0.0:  # attention without dropout draws nothing
                raise _Refused(f"{func} is random")
        writes = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
        refs, arguments = [], {}
        for name, v in named.items():
            if isinstance(v, torch.Tensor):
                slot = self.slots.get(id(v))
                if slot is None:
                    self._constant(v, func)
                    arguments[name] = v
                    if name in writes:
                        raise _Refused(f"{func} writes into a weight or constant ({name})")
                else:
                    if name in writes and slot < self.num_inputs:
                        raise _Refused(f"{func} writes into an input ({name})")
                    refs.append((name, -1, slot))
            elif isinstance(v, (list, tuple)) and any(isinstance(e, torch.Tensor) for e in v):
                elems = list(v)
                for i, e in enumerate(elems):
                    if not isinstance(e, torch.Tensor):
                        continue
                    slot = self.slots.get(id(e))
                    if slot is None:
                        self._constant(e, func)
                    else:
                        refs.append((name, i, slot))
                        elems[i] = torch.empty(0, dtype=e.dtype)
                    if name in writes:
                        raise _Refused(f"{func} writes into a list of tensors ({name})")
                arguments[name] = elems
            else:
                arguments[name] = v
        returns = [out] if len(schema.returns) == 1 else list(out) if isinstance(out, (tuple, list)) else [out]
        outputs = []
        for r, v in enumerate(returns):
            values = [(-1, v)] if not isinstance(v, (list, tuple)) else list(enumerate(v))
            for elem, t in values:
                if not isinstance(t, torch.Tensor):
                    if t is not None:
                        raise _Refused(f"{func} returns a {type(t).__name__} computed from the data")
                    continue
                if self.grad and t.requires_grad:
                    raise _Refused(f"{func} returns a tensor that requires grad")
                slot = self.slots.get(id(t))
                if slot is None:
                    slot = len(self.slots)
                    self.slots[id(t)] = slot
                    self.keep.append(t)
                outputs.append((r, elem, slot, list(t.shape)))
        self.steps.append((func, arguments, refs, outputs))
        self.step_modules.append(self.module_stack[-1] if self.module_stack else None)

    def track_modules(self, gm: torch.nn.Module):
        """A context in which calls of gm's submodules push their qualified names on module_stack
        (global module hooks, removed on exit), so each step knows the module that ran it."""
        names = {id(m): n for n, m in gm.named_modules() if n}
        stack = self.module_stack

        def pre(module, args):
            name = names.get(id(module))
            if name is not None:
                stack.append(name)

        def post(module, args, out):
            if names.get(id(module)) is not None and stack:
                stack.pop()

        class _Hooks:
            def __enter__(self_inner):
                self_inner.handles = (_torch_module.register_module_forward_pre_hook(pre),
                                      _torch_module.register_module_forward_hook(post, always_call=True))

            def __exit__(self_inner, *exc):
                for h in self_inner.handles:
                    h.remove()

        return _Hooks()

    def build(self, graph_outputs) -> "Plan":
        """The plan of the recorded steps, whose flat outputs are `graph_outputs`."""
        outs, template = [], []
        for v in graph_outputs:
            slot = self.slots.get(id(v)) if isinstance(v, torch.Tensor) else None
            if slot is None:
                template.append((False, v))  # a constant: a weight, an int, None
            else:
                template.append((True, len(outs)))
                outs.append(slot)
        last_read = {}
        for i, (_, _, refs, outputs) in enumerate(self.steps):
            for _, _, slot in refs:
                last_read[slot] = i
            for _, _, slot, _ in outputs:
                last_read.setdefault(slot, i)
        keep = set(outs)
        frees = [[] for _ in self.steps]
        for slot, i in last_read.items():
            if slot not in keep and slot >= self.num_inputs:
                frees[i].append(slot)
        native = _C.ForwardPlan(self.num_inputs)
        names = []
        for (func, arguments, refs, outputs), free in zip(self.steps, frees):
            name, overload = func._schema.name, func._schema.overload_name
            native.add_step(name, overload, arguments, refs, outputs, free)
            names.append(str(func))
        native.set_outputs(outs)
        return Plan(native, template, names, list(self.step_modules))


@dataclass
class Plan:
    """One recorded forward: the native plan and how its outputs make the graph's flat outputs."""

    native: object
    template: list          # per flat output: (True, index into the plan's outputs) or (False, constant)
    step_names: list[str]   # the op of each step, in order
    step_modules: list      # per step: the qualified name of the innermost submodule that ran it, or None
    fast: bool = False      # recorded from tensors only: its entry checks a call's inputs
    entry: object = None    # where fast: native.entry(), the checks and the replay as one call, entry(*tensors)

    def __post_init__(self):
        # the graph's flat outputs are the plan's outputs as they are (no constants, no reordering)
        self.outputs_in_order = self.template == [(True, i) for i in range(len(self.template))]

    def outputs(self, got: list | None) -> list | None:
        """The graph's flat outputs from the native plan's (None where the replay stopped)."""
        if got is None or self.outputs_in_order:
            return got
        return [got[v] if from_plan else v for from_plan, v in self.template]

    def run(self, tensors: list[torch.Tensor]) -> list | None:
        return self.outputs(self.native.run(tensors))

    def run_timed(self, tensors: list[torch.Tensor]) -> tuple[list | None, list[int]]:
        """run(), with each step's wall time in ns and the whole replay's as the last element."""
        got, ns = self.native.run_timed(tensors)
        return self.outputs(got), ns

    def step_layers(self, layer_of: dict) -> list:
        """Per step, the layer (layer_of: module path -> layer name) of the innermost module running
        it that is one, or None."""
        layers = []
        for module in self.step_modules:
            layer = None
            while module is not None and layer is None:
                layer = layer_of.get(module)
                module = module.rpartition(".")[0] or None
            layers.append(layer)
        return layers


@dataclass
class ForwardPlans:
    """The plans of one model, by input signature (see the module docstring). A signature's plan is
    recorded on its second call, so shapes seen once (varying sequence lengths) cost no recording."""

    plans: OrderedDict = field(default_factory=OrderedDict)
    refused: OrderedDict = field(default_factory=OrderedDict)  # signature -> why no plan
    seen: OrderedDict = field(default_factory=OrderedDict)     # signatures called once
    generation: int = -1
    forward: object = None                          # the graph's forward the plans were recorded from
    hook_tables: tuple = ()                         # the forward-hook dicts of gm and every module in it
    lock: threading.Lock = field(default_factory=threading.Lock)
    last: Plan | None = None                        # the plan the last call ran, where it is `fast`
    owner_tables: tuple = ()                        # the hook dicts of the module whose forward calls gm

    def clear(self) -> None:
        with self.lock:
            self.last = None
            self.plans.clear()
            self.refused.clear()
            self.seen.clear()

    def fast(self, args) -> list | None:
        """The graph's flat outputs through the last call's plan where `args` (its flat inputs, all
        tensors) have that plan's signature and nothing else stands in the way; None otherwise: the
        caller takes the full path. The plan's native entry checks it all (the inputs, the modes, the
        hook tables, the generation and the graph's forward, which `_record` told it to expect) but
        the compile flag, read here so that torch.compile tracing a call sees it and goes on with
        the graph instead of calling the entry. It runs right after the previous forward's kernels
        with the caches cold, where each Python lookup costs: so the checks are in C++."""
        plan = self.last
        if plan is None or _compiler._is_compiling_flag:
            return None
        got = plan.entry(*args)
        return got if got is None or plan.outputs_in_order else plan.outputs(got)

    def _watched_tables(self) -> list:
        """The hook tables a fast replay expects empty: every module's in the graph, the global ones (a
        replay calls no module, so it would skip their hooks) and the owner's (whose __call__ the fast
        path skips)."""
        return [*self.hook_tables, *self.owner_tables, _torch_module._global_forward_hooks,
                _torch_module._global_forward_pre_hooks, _torch_module._global_backward_hooks,
                _torch_module._global_backward_pre_hooks]

    def __call__(self, gm: torch.nn.Module, args: list):
        """gm's flat outputs for `args` through a plan, or None where none applies: the caller runs gm.
        gm returns a tuple or list (a GraphModule's flat outputs)."""
        key = signature(args)
        if key is None or not plans_apply():
            return None
        if self.generation != generation.current() or self.forward is not type(gm).forward:
            self.clear()
            self.generation, self.forward = generation.current(), type(gm).forward
            self.hook_tables = tuple(d for m in gm.modules() for d in (m._forward_pre_hooks, m._forward_hooks))
        if any(self.hook_tables) or _torch_module._global_forward_hooks or _torch_module._global_forward_pre_hooks:
            return None
        plan = self.plans.get(key)
        if plan is None:
            if key in self.refused:
                return None
            if key not in self.seen:
                _remember(self.seen, key, True)
                return None
            return self._record(gm, args, key)
        out = plan.run(tensor_args(args))
        if out is None:  # a step's sizes differ from the recording: this call (and later ones) run the graph
            with self.lock:
                self.last = None
                self.plans.pop(key, None)
                _remember(self.refused, key, "an op's output sizes depend on the data")
        elif plan.fast:
            self.last = plan
        return out

    def _record(self, gm, args, key):
        start = generation.current()
        recorder = _Recorder(tensor_args(args))
        with recorder.track_modules(gm), recorder:
            out = gm(*args)
        plan, why = None, recorder.refused
        if why is None:
            try:
                plan = recorder.build(list(out))
                if all(isinstance(a, torch.Tensor) for a in args):
                    plan.native.expect_inputs(list(args), key[0])
                    plan.native.expect_empty(self._watched_tables())
                    plan.native.expect_same(_GENERATION, 0, _GENERATION[0])  # this very int: a bump replaces it
                    plan.native.expect_same(type(gm), "forward", self.forward)
                    plan.entry = plan.native.entry()
                    plan.fast = True
            except (RuntimeError, ValueError, TypeError) as e:  # an argument the native plan cannot hold
                why = f"not recordable: {e}"
        if generation.current() != start:  # the forward itself changed a module: nothing to replay
            plan, why = None, "the forward changes the model"
            self.generation = generation.current()  # keep this refusal
        with self.lock:
            self.seen.pop(key, None)
            if plan is not None:
                _remember(self.plans, key, plan)
                if plan.fast:
                    self.last = plan
            else:
                _remember(self.refused, key, why)
        return out

    def recorded(self, args) -> Plan | None:
        """The plan recorded for the signature of `args`, or None."""
        key = signature(args)
        return None if key is None else self.plans.get(key)

    def describe(self, layer_of: dict | None = None) -> list[str]:
        """One line per recorded signature: its input sizes and steps; then the refused ones.
        layer_of: module path -> layer name; where given, a line also says which layers its plan runs
        and what ops run between them."""
        def inputs(key) -> str:
            sizes = ", ".join(f"{tuple(k[1])}" for k in key[1:] if isinstance(k[0], torch.dtype))
            return f"inputs {sizes}" + (" (grad mode on)" if key[0] else "")

        def contents(plan) -> str:
            if layer_of is None:
                return ""
            layers, others = [], {}
            for group, op in zip(plan.step_layers(layer_of), plan.step_names):
                if group is not None:
                    for layer in group.split("+"):  # a step that runs several layers: "a+b+c"
                        if layer not in layers:
                            layers.append(layer)
                else:
                    name = op.split(".")[1] if op.count(".") >= 2 else op
                    others[name] = others.get(name, 0) + 1
            every = [v for v in layer_of.values() if "+" not in v]
            missing = [v for v in every if v not in layers]
            text = f": {len(layers)} of {len(every)} layers"
            if len(layers) <= 8:
                text += f" ({', '.join(layers)})"
            if missing:
                text += f"; not in the plan: {', '.join(missing[:8])}" + (" ..." if len(missing) > 8 else "")
            if others:
                text += "; between them " + ", ".join(f"{k} x{v}" if v > 1 else k for k, v in others.items())
            return text

        lines = [f"{inputs(key)}: {len(plan.step_names)} ops in one native call{contents(plan)}"
                 for key, plan in list(self.plans.items())]
        lines += [f"{inputs(key)}: runs the graph ({why})" for key, why in list(self.refused.items())]
        return lines
