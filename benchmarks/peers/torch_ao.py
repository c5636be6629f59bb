"""torch.ao.quantization as a peer (benchmarks and tests only; qbackend itself never uses torch.ao).

- ``torch_ao_static(model, example_inputs, calibration)``: FX graph mode post-training static
  quantization on the x86 engine: ``prepare_fx`` with ``get_default_qconfig_mapping("x86")``,
  one forward per calibration batch, ``convert_fx``. If FX symbolic tracing fails (HF BERT does:
  "Proxy object does not support item assignment"), falls back to ``torch_ao_dynamic`` and says so
  in the info string.
- ``torch_ao_dynamic(model)``: ``quantize_dynamic`` of nn.Linear and nn.LSTM to qint8 weights.

Both return ``(quantized_model, info)``; both may modify `model` (pass a deep copy to keep it).
``torch.backends.quantized.engine`` is set to "x86" (a process-wide setting).
"""
from __future__ import annotations

import warnings

import torch
from torch import nn

ENGINE = "x86"


def _first_line(e: BaseException, limit: int = 160) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = text if len(text) <= limit else text[:limit - 3] + "..."
    return f"{type(e).__name__}: {text}"


def torch_ao_dynamic(model: nn.Module) -> tuple[nn.Module, str]:
    """Dynamic quantization: nn.Linear and nn.LSTM with qint8 weights, activations quantized per
    call (torch.ao.quantization.quantize_dynamic), on the x86 engine."""
    from torch.ao.quantization import quantize_dynamic

    torch.backends.quantized.engine = ENGINE
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's deprecation notices
        qmodel = quantize_dynamic(model.eval(), {nn.Linear, nn.LSTM}, dtype=torch.qint8)
    return qmodel, f"quantize_dynamic (Linear, LSTM; qint8 weights), engine {ENGINE}"


@torch.no_grad()
def torch_ao_static(model: nn.Module, example_inputs: tuple, calibration: list[tuple]) -> tuple[nn.Module, str]:
    """FX post-training static quantization with the default x86 qconfig mapping (HistogramObserver
    activations, per-channel weights), calibrated on `calibration`; dynamic quantization if FX
    cannot trace the model."""
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    torch.backends.quantized.engine = ENGINE
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            prepared = prepare_fx(model.eval(), get_default_qconfig_mapping(ENGINE), example_inputs)
        except Exception as e:  # noqa: BLE001  (FX symbolic tracing fails on data-dependent Python)
            qmodel, info = torch_ao_dynamic(model)
            return qmodel, f"FX tracing failed ({_first_line(e)}); fell back to {info}"
        for batch in calibration:
            prepared(*batch)
        qmodel = convert_fx(prepared)
    return qmodel, (f"FX static (prepare_fx/convert_fx, get_default_qconfig_mapping('{ENGINE}'), "
                    f"{len(calibration)} calibration batches)")
