"""The file form of a model quantize_llm quantized: each quantized module as a few plain tensors
under its own name, and a JSON-able spec per module, so a checkpoint (safetensors: tensors only, no
code) does not depend on the kernels' memory layout (the row tiles of weight_tiles.py may change; the
file does not), and a loader knows every tensor's shape and dtype before it reads one.

Tensors of the module `<name>` (N output features, K input features, G = ceil(K / group_size)):
  int8 Linear (WeightOnlyLinear)      <name>.weight_int8   int8 [N, K]
                                      <name>.weight_scale  float32 [N]     w = weight_scale * weight_int8
  int4 Linear (Int4WeightOnlyLinear)  <name>.weight_int4   uint8 [N, ceil(K / 2)]: weight k in the low
                                                           nibble of byte k / 2 for even k, the high for odd k
                                      <name>.weight_scale  float32 [N, G]
                                      <name>.weight_offset float32 [N, G]  w = weight_scale * u + weight_offset
                                                           (float16 values; a file's others are rounded to
                                                           float16 on load, as the module holds them)
  either, when it has a bias          <name>.bias          float32 [N]
  embedding (QuantizedEmbedding)      <name>.table         uint8 [rows, 4 + values' bytes]: each row's
                                                           float16 scale and bias, then its 8- or 4-bit
                                                           values (quantize_rowwise's fused table)
A member of a same-input group (llm/shared_input.py) is written as the Linear it was, its rows of the
group's weights. The spec says the kind, the shapes, the group form and the activations.

Loading: `place_slots` puts a CheckpointSlot (the tensors above as buffers, of the spec's shapes and
dtypes, on the model's device, e.g. meta) where each quantized module goes; a loader fills the
buffers; `modules_from_slots` checks each and builds the quantized module. quantize_llm's remaining
steps (finish_llm) then give the model the saved one was: the same tensors, the same steps.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..nn.embedding import QuantizedEmbedding
from ..nn.int4_linear import GROUP_SIZES, Int4WeightOnlyLinear
from ..nn.linear import ACTIVATIONS, WeightOnlyLinear
from ..ops.embedding import PackedEmbeddingTable, data_bytes
from .shared_input import SharedInputLinear

__all__ = ["checkpoint_state", "module_specs", "place_slots", "modules_from_slots", "file_tensors", "check_spec",
           "CheckpointSlot", "CheckpointError"]

KINDS = ("int8", "int4", "embedding")


class CheckpointError(ValueError):
    """A checkpoint's spec or tensors do not describe a quantized module the model can hold."""


def _linear_spec(module: nn.Module) -> dict:
    """A quantized Linear's spec, read off its attributes (no tensor is copied out of its tiles)."""
    base = module.fused_rows()[0] if isinstance(module, SharedInputLinear) else module
    spec = {"in_features": base.in_features, "out_features": module.out_features, "activations": base.activations,
            "bias": base.bias is not None}
    if type(base) is WeightOnlyLinear:
        spec["kind"] = "int8"
    elif type(base) is Int4WeightOnlyLinear:
        spec.update(kind="int4", group_size=base.group_size, symmetric=base.symmetric)
    else:
        raise TypeError(f"not a quantized Linear: {type(base).__name__}")
    return spec


def _row_major(module: nn.Module) -> dict[str, torch.Tensor]:
    """A quantized Linear's file tensors, all its rows."""
    if type(module) is WeightOnlyLinear:
        tensors = {"weight_int8": module.weight_int8, "weight_scale": module.w_scales.reshape(-1)}
    elif type(module) is Int4WeightOnlyLinear:
        # float32 in the file (the float16 values exactly): the format files already written have
        tensors = {"weight_int4": module.weight_packed, "weight_scale": module.scales.float(),
                   "weight_offset": module.offsets.float()}
    else:
        raise TypeError(f"not a quantized Linear: {type(module).__name__}")
    if module.bias is not None:
        tensors["bias"] = module.bias
    return tensors


def _module_spec(module: nn.Module) -> dict:
    if isinstance(module, QuantizedEmbedding):
        return {"kind": "embedding", "num_embeddings": module.num_embeddings, "embedding_dim": module.embedding_dim,
                "bits": module.bits, "padding_idx": module.padding_idx}
    return _linear_spec(module)


def _module_tensors(module: nn.Module, untiled: dict) -> dict[str, torch.Tensor]:
    """The module's file tensors; a same-input group's are its rows of the group's, which `untiled`
    (fused module id -> its row-major tensors) holds once for all the group's members."""
    if isinstance(module, QuantizedEmbedding):
        return {"table": module.packed.table().contiguous()}
    if not isinstance(module, SharedInputLinear):
        return {k: v.contiguous() for k, v in _row_major(module).items()}
    fused, start, stop = module.fused_rows()
    if id(fused) not in untiled:
        untiled[id(fused)] = _row_major(fused)
    return {k: v[start:stop].contiguous() for k, v in untiled[id(fused)].items()}


def _quantized_names(model: nn.Module) -> list[str]:
    record = getattr(model, "qbackend_llm", None)
    if not isinstance(record, dict):
        raise ValueError("the model was not quantized by qbackend.quantize_llm (it has no qbackend_llm record)")
    return list(record["quantized"]) + ([record["embedding"]] if record.get("embedding") else [])


def module_specs(model: nn.Module) -> dict[str, dict]:
    """{module name: spec} of every module quantize_llm quantized in `model` (JSON-able); a Linear
    whose 4-bit weights took GPTQ's rounding has "rounding": "gptq"."""
    gptq = set(model.qbackend_llm["gptq"]) if isinstance(getattr(model, "qbackend_llm", None), dict) else set()
    specs = {name: _module_spec(model.get_submodule(name)) for name in _quantized_names(model)}
    for name in gptq & set(specs):
        specs[name]["rounding"] = "gptq"
    return specs


def checkpoint_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict in the file form: its float tensors as they are, each quantized
    module's tensors as the module docstring says (nothing of the fused groups' own buffers)."""
    names = _quantized_names(model)
    prefixes = tuple(n + "." for n in names)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(prefixes)}
    untiled: dict = {}
    for name in names:
        state.update({f"{name}.{k}": v for k, v in _module_tensors(model.get_submodule(name), untiled).items()})
    return state


def file_tensors(spec: dict) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """{tensor suffix: (shape, dtype)} of the file tensors of a module with this (checked) spec."""
    if spec["kind"] == "embedding":
        bits, dim = spec["bits"], spec["embedding_dim"]
        return {"table": ((spec["num_embeddings"], data_bytes(dim, bits) + 4), torch.uint8)}  # + fp16 scale, bias
    n, k = spec["out_features"], spec["in_features"]
    if spec["kind"] == "int8":
        shapes = {"weight_int8": ((n, k), torch.int8), "weight_scale": ((n,), torch.float32)}
    else:
        g = math.ceil(k / spec["group_size"])
        shapes = {"weight_int4": ((n, (k + 1) // 2), torch.uint8), "weight_scale": ((n, g), torch.float32),
                  "weight_offset": ((n, g), torch.float32)}
    if spec["bias"]:
        shapes["bias"] = ((n,), torch.float32)
    return shapes


def _positive_int(spec: dict, key: str, name: str) -> int:
    v = spec.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise CheckpointError(f"{name}: the spec's {key} must be a positive integer, got {v!r}")
    return v


def check_spec(name: str, spec) -> dict:
    """`spec` if it describes a module this version can load, else CheckpointError naming the module."""
    if not isinstance(spec, dict) or spec.get("kind") not in KINDS:
        raise CheckpointError(f"{name}: the spec must be a dict whose kind is one of {', '.join(KINDS)}, got {spec!r}")
    if spec["kind"] == "embedding":
        _positive_int(spec, "num_embeddings", name)
        dim = _positive_int(spec, "embedding_dim", name)
        if spec.get("bits") not in (8, 4) or (spec["bits"] == 4 and dim % 2):
            raise CheckpointError(f"{name}: bits must be 8, or 4 with an even embedding_dim, got {spec.get('bits')!r}")
        pad = spec.get("padding_idx")
        if pad is not None and (not isinstance(pad, int) or isinstance(pad, bool)):
            raise CheckpointError(f"{name}: padding_idx must be an integer or null, got {pad!r}")
        return spec
    _positive_int(spec, "in_features", name)
    _positive_int(spec, "out_features", name)
    if spec.get("activations") not in ACTIVATIONS:
        raise CheckpointError(f"{name}: activations must be one of {', '.join(ACTIVATIONS)}, got "
                              f"{spec.get('activations')!r}")
    if spec.get("rounding", "nearest") not in ("nearest", "gptq"):
        raise CheckpointError(f"{name}: rounding must be 'nearest' or 'gptq', got {spec.get('rounding')!r}")
    if not isinstance(spec.get("bias"), bool):
        raise CheckpointError(f"{name}: bias must be true or false, got {spec.get('bias')!r}")
    if spec["kind"] == "int4":
        if spec.get("group_size") not in GROUP_SIZES:
            raise CheckpointError(f"{name}: group_size must be one of {', '.join(map(str, GROUP_SIZES))}, got "
                                  f"{spec.get('group_size')!r}")
        if not isinstance(spec.get("symmetric"), bool):
            raise CheckpointError(f"{name}: symmetric must be true or false, got {spec.get('symmetric')!r}")
    return spec


class CheckpointSlot(nn.Module):
    """Where a quantized module goes while a checkpoint loads: its file tensors as empty buffers of
    the spec's shapes and dtypes (on `device`) for the loader to fill; `module_from_slot` builds the
    module from them."""

    def __init__(self, name: str, spec: dict, device: torch.device | str = "cpu"):
        super().__init__()
        self.name, self.spec = name, check_spec(name, spec)
        for key, (shape, dtype) in file_tensors(spec).items():
            self.register_buffer(key, torch.empty(shape, dtype=dtype, device=device))

    def forward(self, *args, **kwargs):
        raise RuntimeError(f"{self.name}: the checkpoint's tensors were not loaded into this module")

    def extra_repr(self) -> str:
        return f"{self.name}: {self.spec['kind']}, waiting for its tensors"


def _check_loaded(slot: CheckpointSlot) -> dict[str, torch.Tensor]:
    tensors = {}
    for key, (shape, dtype) in file_tensors(slot.spec).items():
        t = slot._buffers.get(key)
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            raise CheckpointError(f"{slot.name}: the checkpoint has no tensor {slot.name}.{key}")
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise CheckpointError(f"{slot.name}.{key} must be {dtype} {list(shape)} as its spec says, got {t.dtype} "
                                  f"{list(t.shape)}")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{slot.name}.{key} has NaN or infinite values")
        tensors[key] = t.to("cpu")
    return tensors


def module_from_slot(slot: CheckpointSlot) -> nn.Module:
    """The quantized module of a filled slot (CheckpointError when a tensor is missing, of another
    shape or dtype than the spec says, or not finite)."""
    spec, t = slot.spec, _check_loaded(slot)
    if spec["kind"] == "embedding":
        table = PackedEmbeddingTable(t["table"], spec["embedding_dim"], spec["bits"])
        return QuantizedEmbedding(table, spec["padding_idx"])
    bias = t.get("bias")
    if spec["kind"] == "int8":
        return WeightOnlyLinear(t["weight_int8"], t["weight_scale"], bias, spec["activations"])
    return Int4WeightOnlyLinear(t["weight_int4"], t["weight_scale"], t["weight_offset"], bias, spec["group_size"],
                                spec["in_features"], spec["symmetric"], spec["activations"])


def _check_target(model: nn.Module, name: str, spec: dict) -> nn.Module:
    try:
        target = model.get_submodule(name)
    except AttributeError:
        raise CheckpointError(f"the checkpoint quantizes {name!r}, which the model does not have") from None
    if spec["kind"] == "embedding":
        ok = isinstance(target, nn.Embedding) and (target.num_embeddings, target.embedding_dim) == \
            (spec["num_embeddings"], spec["embedding_dim"])
        want = f"an nn.Embedding({spec['num_embeddings']}, {spec['embedding_dim']})"
    else:
        ok = isinstance(target, nn.Linear) and (target.in_features, target.out_features) == \
            (spec["in_features"], spec["out_features"]) and (target.bias is not None) == spec["bias"]
        want = f"an nn.Linear({spec['in_features']}, {spec['out_features']}, bias={spec['bias']})"
    if not ok:
        raise CheckpointError(f"the checkpoint's {name!r} is {want}; the model has {target}")
    return target


def place_slots(model: nn.Module, specs: dict, device: torch.device | str = "meta") -> None:
    """Put a CheckpointSlot at each module `specs` names (CheckpointError, before anything changes,
    where the model has no such Linear or Embedding of the spec's shape)."""
    if not isinstance(specs, dict) or not specs:
        raise CheckpointError(f"the checkpoint names no quantized modules (its spec is {specs!r})")
    for name, spec in specs.items():
        _check_target(model, name, check_spec(name, spec))
    for name, spec in specs.items():
        model.set_submodule(name, CheckpointSlot(name, spec, device))


def modules_from_slots(model: nn.Module) -> list[str]:
    """Replace every filled CheckpointSlot of `model` by its quantized module; their names."""
    slots = [(n, m) for n, m in model.named_modules() if isinstance(m, CheckpointSlot)]
    built = {n: module_from_slot(m) for n, m in slots}
    for name, module in built.items():
        model.set_submodule(name, module)
    return list(built)
