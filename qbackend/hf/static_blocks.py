"""Static int8 for a transformers encoder loaded through from_pretrained, keeping the model object:
each of its repeated blocks (the layers of the nn.ModuleList holding the most Linears: BERT's
`encoder.layer`) is captured and quantized by qbackend's graph flow on its own (qbackend.quantize:
SmoothQuant, GPTQ rounding, the fused attention, int8 between the block's layers) and replaced by a
StaticBlock running that graph; embeddings, the pooler and heads stay as they are. Each block is
calibrated on the inputs it sees when the float model runs the calibration batches (as the whole-model
flow's observers see float activations).

Saving: each block's graph as qbackend's model document (serialization.model_parts): its tensors in
the checkpoint as `<block>.t<i>`, its JSON and SHA-256 in the safetensors metadata under
`qbackend_block:<block>:<key>`. Loading: a BlockSlot with the document's tensor table as empty buffers at each
block, filled by transformers' loader, then decoded and rebound to this CPU as `qbackend.load` does.
"""
from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from ..api import quantize
from ..config import QuantConfig
from ..core.batches import batches
from ..lowering.convert import FP32FallbackWarning
from ..nn.model import QuantizedModel
from ..serialization import ModelFileError, model_from_parts, model_parts, tensor_table

try:  # transformers 5 records output_hidden_states by forward hooks on its layer classes, installed once per model
    from transformers.utils.output_capturing import maybe_install_capturing_hooks
except ImportError:  # pragma: no cover  (an older transformers: StaticBlock refuses output_hidden_states)
    maybe_install_capturing_hooks = None

__all__ = ["StaticBlock", "BlockSlot", "find_blocks", "quantize_blocks", "blocks_state", "place_block_slots",
           "blocks_from_slots", "META_PREFIX"]

META_PREFIX = "qbackend_block:"  # a block's metadata entries: f"{META_PREFIX}{path}:{model_parts' key}"


def find_blocks(model: nn.Module) -> list[str]:
    """Paths of the layers of the nn.ModuleList with the most nn.Linear descendants (BERT:
    encoder.layer.0 ... 11); [] where no ModuleList holds a Linear."""
    best, count = None, 0
    for name, m in model.named_modules():
        if isinstance(m, nn.ModuleList):
            n = sum(type(x) is nn.Linear for x in m.modules())
            if n > count:
                best, count = name, n
    if best is None:
        return []
    return [f"{best}.{i}" if best else str(i) for i in range(len(model.get_submodule(best)))]


def calibration_batches(calibration) -> list:
    """The calibration batches: a list (or other iterable) of batches, or one batch (a mapping such as a
    tokenizer's BatchEncoding, or an input_ids tensor); each mapping as a dict, as core.batches takes it."""
    if isinstance(calibration, (Mapping, torch.Tensor)):
        calibration = [calibration]
    elif isinstance(calibration, (str, bytes)) or not isinstance(calibration, Iterable):
        raise TypeError(f"calibration must be batches of the model's inputs (dicts, tuples or input_ids tensors), "
                        f"got {type(calibration).__name__}")
    return [dict(b) if isinstance(b, Mapping) else b for b in calibration]


def block_inputs(model: nn.Module, blocks: list[str], calibration) -> dict[str, list[tuple]]:
    """{block: [(hidden_states, attention_mask), ...]}: each block's inputs while the float model runs
    the `calibration` batches (core.batches' forms). A block called with anything else (cross-attention,
    a cache) is refused."""
    seen: dict[str, list[tuple]] = {b: [] for b in blocks}
    problems: list[str] = []

    def record(path):
        def hook(_mod, args, kwargs):
            extra = [k for k, v in kwargs.items() if v is not None and k not in ("hidden_states", "attention_mask")]
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
            extra += [f"argument {i}" for i, v in enumerate(args[2:], 2) if v is not None]
            if extra or not isinstance(hidden, torch.Tensor) or not (mask is None or isinstance(mask, torch.Tensor)):
                problems.append(f"{path} was called with {', '.join(extra) or 'no hidden-state tensor'}")
            seen[path].append((hidden.detach(), None if mask is None else mask.detach()))
        return hook

    handles = [model.get_submodule(b).register_forward_pre_hook(record(b), with_kwargs=True) for b in blocks]
    n = 0
    try:
        with torch.no_grad():
            for args, kwargs in batches(calibration, "calibration batches"):
                model(*args, **kwargs)
                n += 1
    finally:
        for h in handles:
            h.remove()
    if n == 0:
        raise ValueError("calibration gave no batches; static quantization needs at least one")
    if problems:
        raise ValueError("static blocks take (hidden_states, attention_mask) only: " + "; ".join(sorted(set(problems))))
    return seen


def mask_form(mask: torch.Tensor | None) -> dict | None:
    """The JSON form of a block's captured attention mask (dtype, rank, whether its query dim is 1),
    from which a call without a mask gets an all-visible one; None where it was captured without."""
    if mask is None:
        return None
    return {"dtype": str(mask.dtype).removeprefix("torch."), "rank": mask.dim(), "query_one": mask.shape[-2] == 1}


def check_mask_form(form, where: str) -> dict | None:
    if form is None:
        return None
    if not isinstance(form, dict) or form.get("dtype") not in ("bool", "float32", "bfloat16", "float16") or \
            form.get("rank") not in (2, 3, 4) or not isinstance(form.get("query_one"), bool):
        raise ValueError(f"{where}: a mask form must be null or {{dtype, rank, query_one}}, got {form!r}")
    return form


_HOOK_DICTS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
               "_forward_pre_hooks_with_kwargs")


def _install_output_hooks(model: nn.Module) -> None:
    """transformers' output-recording hooks on the model's layers, now (before a block replaces one)."""
    if maybe_install_capturing_hooks is not None and callable(getattr(model, "save_pretrained", None)):
        maybe_install_capturing_hooks(model)


def _replace(model: nn.Module, path: str, new: nn.Module) -> None:
    """Put `new` at `path` with the hooks of the module it replaces (transformers' output recorders, a
    user's), so output_hidden_states sees a static block as it saw the layer."""
    old = model.get_submodule(path)
    for attr in _HOOK_DICTS:
        getattr(new, attr).update(getattr(old, attr))
    model.set_submodule(path, new)


class StaticBlock(nn.Module):
    """A block of a transformers encoder as qbackend's int8 graph: called as the block was, with
    (hidden_states, attention_mask), returning its hidden states. `graph` is the QuantizedModel
    (qbackend.explain and compare work on it); a call without a mask where the block was captured
    with one gets the all-visible mask of the captured form (mask_form)."""

    def __init__(self, graph: QuantizedModel, mask: dict | None):
        super().__init__()
        self.graph, self.mask = graph, check_mask_form(mask, "mask")

    def forward(self, hidden_states, attention_mask=None, *args, **kwargs):
        extra = [f"argument {i + 2}" for i, a in enumerate(args) if a is not None]
        extra += [k for k, v in kwargs.items()
                  if v is not None and v is not False and k not in ("position_ids", "output_hidden_states")]
        if extra:
            raise ValueError(f"a static int8 block runs (hidden_states, attention_mask) only, got {', '.join(extra)}")
        if kwargs.get("output_hidden_states") and not self._forward_hooks:
            raise ValueError("output_hidden_states: this static int8 block has no output recorder (a transformers "
                             "version that does not record hidden states by forward hooks)")
        if self.mask is None:
            return self.graph(hidden_states)
        if attention_mask is None:
            b, s = hidden_states.shape[0], hidden_states.shape[1]
            shape = (b,) + (1,) * (self.mask["rank"] - 3) + (1 if self.mask["query_one"] else s, s)
            dtype = getattr(torch, self.mask["dtype"])
            attention_mask = torch.ones(shape, dtype=dtype) if dtype == torch.bool else torch.zeros(shape, dtype=dtype)
        return self.graph(hidden_states, attention_mask)

    def extra_repr(self) -> str:
        return f"static int8 graph of {len(self.graph.qbackend_layers)} int8 layers, mask {self.mask}"


def _skipped(block: str, skip) -> bool:
    """A block stays float where a name in `skip` is the block, contains it, or lies inside it."""
    return any(s == block or block.startswith(s + ".") or s.startswith(block + ".") for s in skip)


def quantize_blocks(model: nn.Module, calibration, config: QuantConfig, skip=()) -> dict[str, dict]:
    """Replace each block of `model` (find_blocks; but those `skip` names) by a StaticBlock quantized on
    its calibration inputs; {block: {"mask": its mask form}} (what a checkpoint records). ValueError
    where the model has no blocks to quantize or they are called otherwise than with (hidden_states,
    attention_mask)."""
    found = find_blocks(model)
    blocks = [b for b in found if not _skipped(b, skip)]
    if not blocks:
        raise ValueError("static quantization through from_pretrained quantizes an encoder's repeated blocks (an "
                         "nn.ModuleList of layers with nn.Linear modules); this model has "
                         + ("none" if not found else "none left after modules_to_not_convert"))
    _install_output_hooks(model)
    inputs = block_inputs(model, blocks, calibration_batches(calibration))
    forms, fallbacks = {}, {}
    for path in blocks:
        calls = inputs[path]
        masked = calls[0][1] is not None
        if any((m is not None) != masked for _, m in calls):
            raise ValueError(f"{path} was called with and without an attention mask across the calibration batches; "
                             "give every batch an attention_mask, or none")
        data = [(h, m) if masked else (h,) for h, m in calls]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            graph = quantize(model.get_submodule(path), data[0], data, config=config)
        for w in caught:
            if issubclass(w.category, FP32FallbackWarning):
                fallbacks.setdefault(str(w.message), []).append(path)
            else:
                warnings.warn(w.message, w.category, stacklevel=2)
        forms[path] = {"mask": mask_form(calls[0][1])}
        _replace(model, path, StaticBlock(graph, forms[path]["mask"]))
    for message, paths in fallbacks.items():  # one warning for what every block says alike
        warnings.warn(f"{message} (in {len(paths)} of the {len(blocks)} static blocks: {paths[0]} ...)",
                      FP32FallbackWarning, stacklevel=2)
    return forms


def blocks_state(model: nn.Module, paths) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) of the model's StaticBlocks at `paths`, as the module docstring says."""
    tensors, meta = {}, {}
    for path in paths:
        block = model.get_submodule(path)
        if not isinstance(block, StaticBlock):
            raise ValueError(f"{path} is not a static int8 block ({type(block).__name__})")
        parts, doc = model_parts(block.graph)
        tensors.update({f"{path}.{k}": v for k, v in parts.items()})
        meta.update({f"{META_PREFIX}{path}:{k}": v for k, v in doc.items()})
    return tensors, meta


def _block_meta(path: str, metadata: dict[str, str]) -> dict[str, str]:
    """The block's own metadata entries (model_parts' keys) out of the checkpoint's."""
    prefix = f"{META_PREFIX}{path}:"
    meta = {k[len(prefix):]: v for k, v in metadata.items() if k.startswith(prefix)}
    if not meta:
        raise ModelFileError(f"the checkpoint's metadata has no int8 graph for the static block {path}")
    return meta


class BlockSlot(nn.Module):
    """Where a StaticBlock goes while a checkpoint loads: its graph's tensors (the document's tensor
    table) as empty buffers on `device`, for the loader to fill."""

    def __init__(self, path: str, metadata: dict[str, str], device="meta"):
        super().__init__()
        self.path = path
        for name, (dtype, shape) in tensor_table(_block_meta(path, metadata), path).items():
            self.register_buffer(name, torch.empty(shape, dtype=dtype, device=device))

    def forward(self, *args, **kwargs):
        raise RuntimeError(f"{self.path}: the checkpoint's tensors were not loaded into this block")


def place_block_slots(model: nn.Module, blocks: dict[str, dict], metadata: dict[str, str]) -> None:
    """A BlockSlot at each block path (ValueError naming a path the model does not have)."""
    for path in blocks:
        try:
            model.get_submodule(path)
        except AttributeError:
            raise ValueError(f"the checkpoint has a static block at {path!r}, which the model does not have") from None
    _install_output_hooks(model)
    for path in blocks:
        _replace(model, path, BlockSlot(path, metadata))


def blocks_from_slots(model: nn.Module, blocks: dict[str, dict], metadata: dict[str, str]) -> None:
    """Each filled BlockSlot decoded (checked against its document's checksums, rebound to this CPU)
    into its StaticBlock."""
    for path, spec in blocks.items():
        slot = model.get_submodule(path)
        tensors = {k: v for k, v in slot._buffers.items()}
        if any(t.device.type == "meta" for t in tensors.values()):
            raise ModelFileError(f"{path}: the checkpoint did not hold all of this block's tensors")
        graph = model_from_parts(tensors, _block_meta(path, metadata), path)
        _replace(model, path, StaticBlock(graph, spec.get("mask")))
