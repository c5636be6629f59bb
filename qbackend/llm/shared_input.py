"""Linears that read the same input, computed by one call: a decoder layer's q, k and v projections
(and its MLP's gate and up) all multiply the same hidden state, so quantize_llm concatenates their
quantized weights and runs one weight-only product (one fixed cost, one quantization of the input
for W4A8, the threads' work in one parallel loop) whose column slices are the members' outputs.

The groups are found by running the model once on a probe: quantized Linears called in a row with the
same input tensor object, each called once, of one weight format. The model's own code is untouched:
each member stays a module at its place (`self_attn.k_proj`, ...), a SharedInputLinear; the first one
called computes the fused product and leaves the other slices for the others, which take theirs when
called with that same, unmodified tensor (its identity and version counter; inference-mode tensors
have no version counter, so there identity alone), on the same thread. A member called otherwise
computes the product itself, so any call order gives the members' own outputs. After fusing, the
probe runs again and must give the same logits, or the fusion is undone.
"""
from __future__ import annotations

import threading

import torch
from torch import nn

from ..nn.int4_linear import Int4WeightOnlyLinear
from ..nn.linear import WeightOnlyLinear

__all__ = ["SharedInputLinear", "fuse_shared_inputs"]


def _version(x: torch.Tensor):
    try:
        return x._version
    except RuntimeError:  # an inference-mode tensor has no version counter
        return None


def _format(m: nn.Module):
    """What must agree for two quantized Linears' weights to be concatenated (None: not fusable)."""
    if type(m) is WeightOnlyLinear:
        return ("int8", m.in_features, m.activations)
    if type(m) is Int4WeightOnlyLinear:
        return ("int4", m.in_features, m.group_size, m.symmetric, m.activations)
    return None


def _concat_bias(members: list[nn.Module]) -> torch.Tensor | None:
    if all(m.bias is None for m in members):
        return None
    return torch.cat([m.bias if m.bias is not None else torch.zeros(m.out_features) for m in members])


def _fused(members: list[nn.Module]) -> nn.Module:
    first, bias = members[0], _concat_bias(members)
    if type(first) is WeightOnlyLinear:
        return WeightOnlyLinear(torch.cat([m.weight_int8 for m in members]), torch.cat([m.w_scales for m in members]),
                                bias, first.activations)
    return Int4WeightOnlyLinear(torch.cat([m.weight_packed for m in members]), torch.cat([m.scales for m in members]),
                                torch.cat([m.offsets for m in members]), bias, first.group_size, first.in_features,
                                first.symmetric, first.activations)


class _Group:
    """The fused product of a group and, per thread, the slices not yet taken."""

    def __init__(self, fused: nn.Module, sizes: list[int]):
        self.fused, self.sizes, self.local = fused, sizes, threading.local()

    def __getstate__(self):  # copies and pickles (copy.deepcopy, torch.save) leave the pending slices behind
        return {"fused": self.fused, "sizes": self.sizes}

    def __setstate__(self, state):
        self.__init__(state["fused"], state["sizes"])

    def output(self, index: int, x: torch.Tensor) -> torch.Tensor:
        pending = getattr(self.local, "pending", None)
        if pending is not None and pending[0] is x and pending[1] == _version(x) and pending[2][index] is not None:
            y, pending[2][index] = pending[2][index], None
            if all(p is None for p in pending[2]):
                self.local.pending = None
            return y
        parts = list(self.fused(x).split(self.sizes, dim=-1))
        mine, parts[index] = parts[index], None
        self.local.pending = (x, _version(x), parts)
        return mine


class SharedInputLinear(nn.Module):
    """One member of a group of Linears that read the same input (see the module docstring); the
    first member holds the fused weights (`fused`), the others reach them through the group."""

    def __init__(self, group: _Group, index: int, in_features: int, out_features: int):
        super().__init__()
        if index == 0:
            self.fused = group.fused
        object.__setattr__(self, "_group", group)
        self.index, self.in_features, self.out_features = index, in_features, out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._group.output(self.index, x)

    def fused_rows(self) -> tuple[nn.Module, int, int]:
        """(the group's fused module, the first of this member's output rows in it, one past its last)."""
        start = sum(self._group.sizes[:self.index])
        return self._group.fused, start, start + self._group.sizes[self.index]

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, member {self.index} of "
                f"{len(self._group.sizes)} sharing one {type(self._group.fused).__name__}")


def _groups_seen(model: nn.Module, run) -> tuple[list[list[str]], torch.Tensor]:
    """Runs `run()` with every fusable Linear recording its input: the runs of consecutive calls with
    one input object (each member called once, one weight format), and the run's output."""
    calls, handles = [], []
    for name, m in model.named_modules():
        if _format(m) is not None:
            handles.append(m.register_forward_pre_hook(lambda mod, args, name=name: calls.append((name, args[0]))))
    try:
        with torch.no_grad():
            out = run()
    finally:
        for h in handles:
            h.remove()
    counts: dict[str, int] = {}
    for name, _ in calls:
        counts[name] = counts.get(name, 0) + 1
    groups, current = [], []
    for name, x in calls:
        if current and current[-1][1] is x and _format(model.get_submodule(name)) == \
                _format(model.get_submodule(current[0][0])):
            current.append((name, x))
            continue
        if len(current) > 1:
            groups.append([n for n, _ in current])
        current = [(name, x)]
    if len(current) > 1:
        groups.append([n for n, _ in current])
    return [g for g in groups if all(counts[n] == 1 for n in g)], out


def fuse_shared_inputs(model: nn.Module, run) -> list[list[str]]:
    """Fuse `model`'s groups of same-input Linears in place, found and checked by `run()` (a forward on
    a probe returning a tensor); returns the groups fused (none if the model does not run on the probe
    or the check failed)."""
    try:
        groups, before = _groups_seen(model, run)
    except Exception:  # noqa: BLE001  (a model the probe does not fit: nothing fused)
        return []
    if not groups:
        return []
    originals = {}
    for names in groups:
        members = [model.get_submodule(n) for n in names]
        group = _Group(_fused(members), [m.out_features for m in members])
        for i, (name, m) in enumerate(zip(names, members)):
            originals[name] = m
            model.set_submodule(name, SharedInputLinear(group, i, _format(m)[1], m.out_features))
    try:
        with torch.no_grad():
            after = run()
        same = after.shape == before.shape and bool(torch.allclose(after, before, rtol=1e-4, atol=1e-5))
    except Exception:  # noqa: BLE001  (a model whose code does not take the slices: undone below)
        same = False
    if not same:
        for name, m in originals.items():
            model.set_submodule(name, m)
        return []
    return groups
