"""Native RMSNorms for quantize_llm: every module that computes Llama's RMSNorm is replaced by
qbackend.nn.RMSNorm (one qbackend::rms_norm call instead of six torch ops per norm and token).

Found by what a module computes, not by its class: a leaf module with a 1-D float `weight`, no bias,
and an epsilon attribute (`variance_epsilon`, `eps` or `epsilon`), whose own output on a probe input
equals RMSNorm's within float32 rounding. A norm of another form (Gemma's `1 + weight`, a LayerNorm
that subtracts the mean) fails the probe and stays as it is.
"""
from __future__ import annotations

import torch
from torch import nn

from ..nn.rms_norm import RMSNorm

_EPS_NAMES = ("variance_epsilon", "eps", "epsilon")
# The probe's agreement: a few float32 roundings of the output's scale (bfloat16/float16: their own).
_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _as_rms_norm(module: nn.Module) -> RMSNorm | None:
    weight = getattr(module, "weight", None)
    if (not isinstance(weight, torch.Tensor) or weight.dim() != 1 or weight.dtype not in _TOLERANCE
            or getattr(module, "bias", None) is not None or next(module.children(), None) is not None
            or isinstance(module, (nn.Linear, nn.Embedding, RMSNorm))):
        return None
    eps = next((getattr(module, n) for n in _EPS_NAMES if isinstance(getattr(module, n, None), (float, int))), None)
    if eps is None or not eps >= 0:
        return None
    candidate = RMSNorm(weight.detach(), float(eps))
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 3, weight.shape[0], generator=gen) * 3).to(weight.dtype)
    try:
        with torch.no_grad():
            ref, out = module(x), candidate(x)
    except Exception:  # noqa: BLE001  (a module that is not a one-input norm: not ours to replace)
        return None
    if not isinstance(ref, torch.Tensor) or ref.shape != out.shape or ref.dtype != out.dtype:
        return None
    scale = float(ref.float().abs().max()) or 1.0
    ok = float((ref.float() - out.float()).abs().max()) <= _TOLERANCE[weight.dtype] * scale
    return candidate if ok else None


def swap_rms_norms(model: nn.Module, skip=lambda name: False) -> list[str]:
    """Replace `model`'s RMSNorm modules in place (see the module docstring); the names replaced."""
    swapped = []
    for name, module in list(model.named_modules()):
        if not name or skip(name):
            continue
        native = _as_rms_norm(module)
        if native is not None:
            model.set_submodule(name, native)
            swapped.append(name)
    return swapped
