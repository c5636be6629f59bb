"""Weight quantization shared by the quantized modules: an observer over the float weight -> the
int8 weight and its per-output-channel scales (symmetric, zero point 0, as the kernels need)."""
from __future__ import annotations

import torch

from ..observers import Observer, PerChannelMinMaxObserver
from ..ops import weight_rows  # noqa: F401  (registers qbackend::quantize_weight_rows)


# The levels of a 7-bit weight (QuantConfig.seven_bit_for_speed): on them AVX2's pair products are
# exact for any uint8 input (the native provider's packing checks the same bound).
SEVEN_BIT_LEVELS = (-64, 64)


def is_seven_bit(q: torch.Tensor) -> bool:
    """Whether every level of the int8 weight q is in SEVEN_BIT_LEVELS."""
    lo, hi = SEVEN_BIT_LEVELS
    return q.numel() == 0 or (int(q.min()) >= lo and int(q.max()) <= hi)


def default_weight_observer(name: str | None = None) -> Observer:
    return PerChannelMinMaxObserver(dtype=torch.int8, symmetric=True, axis=0, name=name)


def quantize_weight(weight: torch.Tensor, observer: Observer | None = None,
                    name: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 weight, float32 per-output-channel scales) of a float weight [OC, ...]."""
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
        raise TypeError(f"{name or 'weight'}: expected a float weight tensor, got "
                        f"{weight.dtype if isinstance(weight, torch.Tensor) else type(weight).__name__}")
    if weight.device.type != "cpu":
        raise ValueError(f"{name or 'weight'}: weights must be on the CPU, got {weight.device}")
    w = weight.detach().float()
    lo, hi = torch.aminmax(w) if w.numel() else (w.new_zeros(()), w.new_zeros(()))  # NaN and inf propagate
    if not bool(torch.isfinite(lo) & torch.isfinite(hi)):
        raise ValueError(f"{name or 'weight'}: the weight has NaN or inf values")
    obs = observer if observer is not None else default_weight_observer(name)
    if obs.dtype != torch.int8 or not obs.symmetric:
        raise ValueError(f"{name or 'weight'}: the weight observer must be int8 and symmetric (the kernels take "
                         f"zero point 0), got {obs!r}")
    if getattr(obs, "_per_channel", False) and obs.axis not in (0, -w.dim()):
        raise ValueError(f"{name or 'weight'}: a per-channel weight observer must use axis 0 (output channels), "
                         f"got {obs.axis}")
    obs.reset()
    obs.update(w.reshape(w.shape[0], -1))
    qp = obs.compute_qparams()
    if bool((torch.as_tensor(qp.zero_point) != 0).any()):
        raise ValueError(f"{name or 'weight'}: the weight observer gave non-zero zero points; the kernels need "
                         "symmetric int8")
    scales = torch.as_tensor(qp.scale, dtype=torch.float32).reshape(-1)
    if scales.numel() == 1:
        scales = scales.expand(w.shape[0]).contiguous()
    # the levels, w / s rounded in fp64 (one pass in C++; reference.quantize_weight_rows)
    return torch.ops.qbackend.quantize_weight_rows(w, scales, int(qp.qmin), int(qp.qmax)), scales
