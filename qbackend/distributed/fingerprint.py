"""Digests that tell whether two ranks prepared the same thing: the model's structure (its graph
code or module tree and every parameter's name, shape and dtype), its weights (their bytes), the
configuration and the calibration statistics' names and settings. SHA-256, so equal digests mean
equal inputs; the weights' bytes are hashed as they lie in memory (BERT-base's 440 MB: about 0.3 s
with the CPU's SHA instructions)."""
from __future__ import annotations

import hashlib
import json
import re

import torch
from torch import nn

__all__ = ["text_digest", "structure_digest", "weights_digest", "config_digest", "model_identity"]

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def text_digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def _tensors(module: nn.Module):
    seen = set()
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            yield name, t


def structure_digest(module: nn.Module, code: str) -> bytes:
    """`code` (the graph's code, or the module tree's repr) and every parameter's and buffer's
    name, shape and dtype."""
    shapes = [(name, list(t.shape), str(t.dtype)) for name, t in _tensors(module)]
    return text_digest(_ADDRESS.sub("", code) + json.dumps(shapes))


def weights_digest(module: nn.Module) -> bytes:
    """The bytes of every parameter and buffer, in order."""
    h = hashlib.sha256()
    for _, t in _tensors(module):
        t = t.detach()
        if t.numel() == 0:
            continue
        t = t.contiguous().reshape(-1)
        h.update(memoryview(t.view(torch.uint8).numpy()) if t.dtype != torch.bool else t.numpy().tobytes())
    return h.digest()


def config_digest(config) -> bytes:
    """The configuration's repr (object addresses left out)."""
    return text_digest(_ADDRESS.sub("", repr(config)))


def model_identity(module: nn.Module, code: str, config) -> dict[str, bytes]:
    """The digests the ranks compare before a reduction: the structure of `module` (with `code`,
    its graph's code or its repr), its weights and `config`."""
    return {"structure": structure_digest(module, code), "weights": weights_digest(module),
            "config": config_digest(config)}
