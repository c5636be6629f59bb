"""qbackend: a unified x86 INT8 quantization backend for PyTorch: plain uint8/int8 tensors, ops in
the torch.ops.qbackend namespace, each op instance routed to the fastest correct kernel (qbackend's
own VNNI/AMX GEMMs, FBGEMM or oneDNN).

    prepared = qbackend.prepare(model, example_inputs)      # backend="x86", config=QuantConfig()
    for batch in calibration_data:
        prepared(*batch)
    qmodel = qbackend.convert(prepared)

or `qbackend.quantize(model, example_inputs, calibration_data)` in one call, and
`qbackend.quantize_dynamic(model)`; decoder LLMs: `qbackend.quantize_llm(model)` (in place); Hugging
Face models: `from_pretrained(..., quantization_config=qbackend.hf.QBackendConfig(...))`. The ops
themselves are torch.ops.qbackend.*; qbackend.ops wraps them.

Layers, bottom first. A module imports only from its own layer and the layers below it, at module
level (tests/test_layers.py checks both):

  1 core           _C, core               the compiled extension (core.extension loads it); ISA levels,
                                          routes, batches, version
  2 ops            ops                     op fake impls, providers and their registry, packed weights
  3 dispatch       dispatch                CPU probe, rule table, the routing call, tune mode
  4 observers      observers               calibration statistics -> qparams
  5 config         config                  QuantConfig and its parts
  6 nn             nn                      quantized modules, QuantizedModel
  7 algorithms     algorithms, distributed  calibration-time methods on tensors: GPTQ, SmoothQuant;
                                          calibration statistics reduced across processes
  8 lowering       lowering, llm           capture, graph passes, convert, module swap; LLM Linears
  9 report         report                  explain, accuracy against FP32, the budgeted fallback
  10 serialization serialization           save / load, rebinding a loaded model to this CPU
  11 api           api                     prepare, calibrate, convert, quantize
  12 top           __init__, __main__, cli, models, hf, transformers_hook   public names, the command line,
                                          the model zoo, the Hugging Face quantization method
"""
from .core.extension import _C  # noqa: F401  (loads the extension, applies QBACKEND_ISA)
from .api import PreparedModel, calibrate, convert, prepare, quantize, quantize_dynamic, reduce_calibration
from .distributed import DistributedCalibrationError, RankWithoutDataWarning, ReductionReport
from .core.version import VERSION
from .config import EmbeddingConfig, ObserverSpec, QuantConfig, SmoothQuantConfig
from .observers.outliers import CalibrationOutlierWarning
from .dispatch import cpu_features
from .report import explain
from .nn.model import QuantizedModel
from .report import compare
from .serialization import load, save
from .llm import LLMConfig, quantize_llm
from . import transformers_hook

transformers_hook.install()  # qbackend.hf registers with transformers once transformers loads


__version__ = VERSION
__all__ = ["prepare", "convert", "calibrate", "quantize", "quantize_dynamic", "reduce_calibration",
           "DistributedCalibrationError", "RankWithoutDataWarning", "ReductionReport", "PreparedModel", "QuantizedModel",
           "QuantConfig", "ObserverSpec", "EmbeddingConfig", "SmoothQuantConfig", "save", "load", "explain", "compare",
           "cpu_features", "CalibrationOutlierWarning", "LLMConfig", "quantize_llm", "__version__"]
