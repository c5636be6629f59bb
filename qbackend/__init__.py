"""qbackend: a unified x86 INT8 quantization backend for PyTorch (FBGEMM + oneDNN, plain tensors).

    prepared = qbackend.prepare(model, example_inputs)      # backend="x86", config=QuantConfig()
    for batch in calibration_data:
        prepared(*batch)
    qmodel = qbackend.convert(prepared)

or `qbackend.quantize(model, example_inputs, calibration_data)` in one call, and
`qbackend.quantize_dynamic(model)`. The ops themselves are torch.ops.qbackend.*; qbackend.ops wraps them.
"""
from ._extension import _C  # noqa: F401  (loads the extension, applies QBACKEND_ISA)
from .api import PreparedModel, calibrate, convert, prepare, quantize, quantize_dynamic
from .config import EmbeddingConfig, ObserverSpec, QuantConfig, SmoothQuantConfig
from .dispatch import cpu_features
from .explain import explain
from .nn.model import QuantizedModel
from .report import compare
from .serialization import load, save

__version__ = "0.1.0"
__all__ = ["prepare", "convert", "calibrate", "quantize", "quantize_dynamic", "PreparedModel", "QuantizedModel",
           "QuantConfig", "ObserverSpec", "EmbeddingConfig", "SmoothQuantConfig", "save", "load", "explain", "compare",
           "cpu_features", "__version__"]
