"""OpenVINO INT8 through NNCF post-training quantization as a peer (benchmarks only; optional
dependencies ``openvino`` and ``nncf``, see the ``bench`` extra in setup.py).

- ``convert(model, example_inputs)``: ``openvino.convert_model`` of the PyTorch model (inputs of
  dynamic shape).
- ``quantize(ov_model, calibration, transformer)``: ``nncf.quantize`` with its defaults (preset
  PERFORMANCE: symmetric int8 activations, per-channel weights; fast bias correction for CNNs),
  ``model_type=nncf.ModelType.TRANSFORMER`` for BERT (which adds SmoothQuant and keeps the ops
  NNCF recommends for transformers in float), ``subset_size`` = all calibration batches.
- ``compile_for(ov_model, shapes, threads)``: a copy reshaped to these static input shapes,
  compiled for the CPU device with ``INFERENCE_NUM_THREADS = threads``, ``PERFORMANCE_HINT =
  LATENCY``, one stream. The precision of the non-quantized ops is OpenVINO's default for the
  CPU (``INFERENCE_PRECISION_HINT``: bf16 where the CPU has AVX512-BF16 or AMX, f32 otherwise);
  ``precision(compiled)`` reports it.
- ``runner(compiled)``: a function of torch tensors -> the first output as a torch tensor.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

REQUIRES = "openvino, nncf"


def version() -> str:
    import nncf
    import openvino

    return f"openvino {openvino.__version__.split('-')[0]}, nncf {nncf.__version__}"


def convert(model: nn.Module, example_inputs: tuple):
    import openvino as ov

    with torch.no_grad():
        return ov.convert_model(model.eval(), example_input=tuple(example_inputs))


def quantize(ov_model, calibration: list[tuple], transformer: bool = False):
    """(quantized ov.Model, info)."""
    import logging

    import nncf

    nncf.set_log_level(logging.ERROR)
    dataset = nncf.Dataset(calibration, lambda batch: tuple(t.numpy() for t in batch))
    kwargs = {"model_type": nncf.ModelType.TRANSFORMER} if transformer else {}
    q = nncf.quantize(ov_model, dataset, subset_size=len(calibration), **kwargs)
    return q, (f"nncf.quantize defaults{' (model_type TRANSFORMER)' if transformer else ''}, "
               f"{len(calibration)} calibration batches")


def compile_for(ov_model, shapes: list[tuple[int, ...]], threads: int):
    import openvino as ov

    m = ov_model.clone()
    m.reshape({m.inputs[i]: ov.PartialShape(list(s)) for i, s in enumerate(shapes)})
    core = ov.Core()
    return core.compile_model(m, "CPU", {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
                                         "NUM_STREAMS": 1})


def precision(compiled) -> str:
    return str(compiled.get_property("INFERENCE_PRECISION_HINT")).replace("<Type: '", "").replace("'>", "")


def runner(compiled) -> Callable[..., torch.Tensor]:
    request = compiled.create_infer_request()

    def run(*inputs: torch.Tensor) -> torch.Tensor:
        request.infer([t.numpy() for t in inputs], share_inputs=True)
        return torch.from_numpy(request.get_output_tensor(0).data.copy())

    return run
