"""ONNX Runtime static INT8 as a peer (benchmarks only; optional dependencies ``onnx``,
``onnxscript`` (torch's ONNX exporter) and ``onnxruntime``, see the ``bench`` extra in setup.py).

- ``export_onnx(model, example_inputs, path)``: ``torch.onnx.export(..., dynamo=True)`` (torch
  2.13's exporter, through torch.export) with a dynamic batch dimension; inputs named input0,
  input1, ...
- ``quantize_onnx(fp32_path, int8_path, calibration)``: ORT's recommended preprocessing
  (``quant_pre_process``: symbolic shape inference + graph optimisation), then ``quantize_static``
  in the QDQ format, per-channel int8 weights (QInt8), uint8 activations (QUInt8), MinMax
  calibration over the calibration batches, every op type ORT can quantize (its default).
- ``session(path, threads)``: an ``InferenceSession`` on the CPU execution provider with
  ``intra_op_num_threads = threads``, one inter-op thread, sequential execution, all graph
  optimisations (``spinning=False``: passive waiting between ops); ``runner(sess)`` returns a function of torch tensors -> the first output as a
  torch tensor (zero-copy both ways).
"""
from __future__ import annotations

import warnings
from typing import Callable

import torch
from torch import nn

REQUIRES = "onnxruntime, onnx, onnxscript"


def version() -> str:
    import onnx
    import onnxruntime
    import onnxscript

    return f"onnxruntime {onnxruntime.__version__}, onnx {onnx.__version__}, onnxscript {onnxscript.__version__}"


def input_names(example_inputs: tuple) -> list[str]:
    return [f"input{i}" for i in range(len(example_inputs))]


@torch.no_grad()
def export_onnx(model: nn.Module, example_inputs: tuple, path: str) -> None:
    """FP32 ONNX model of `model` at `path`, batch dimension dynamic."""
    batch = torch.export.Dim("batch", min=1, max=4096)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), tuple(example_inputs), path, input_names=input_names(example_inputs),
                          output_names=["output"], dynamic_shapes=tuple({0: batch} for _ in example_inputs),
                          dynamo=True, external_data=False, verbose=False)


def quantize_onnx(fp32_path: str, int8_path: str, calibration: list[tuple]) -> str:
    """Static QDQ INT8 model of the ONNX model at fp32_path, calibrated on `calibration` (tuples of
    torch tensors, in the model's input order), written to int8_path. Returns an info string."""
    import logging

    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    names = input_names(calibration[0])

    class Reader(CalibrationDataReader):
        def __init__(self):
            self._it = iter([{n: t.numpy() for n, t in zip(names, batch)} for batch in calibration])

        def get_next(self):
            return next(self._it, None)

    pre_path = int8_path + ".pre.onnx"
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # per-tensor fallbacks of 1-D weights (LayerNorm) are logged per op
    try:
        quant_pre_process(fp32_path, pre_path)
        quantize_static(pre_path, int8_path, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax)
    finally:
        root.setLevel(level)
    return (f"quantize_static QDQ, per-channel QInt8 weights, QUInt8 activations, MinMax, {len(calibration)} "
            "calibration batches, after quant_pre_process")


def session(path: str, threads: int, spinning: bool = True):
    """spinning=False: intra-op threads wait passively (session.intra_op.allow_spinning=0) instead of
    busy-waiting between ops (ONNX Runtime's default)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def runner(sess) -> Callable[..., torch.Tensor]:
    names = [i.name for i in sess.get_inputs()]
    out_name = sess.get_outputs()[0].name

    def run(*inputs: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(sess.run([out_name], {n: t.numpy() for n, t in zip(names, inputs)})[0])

    return run
