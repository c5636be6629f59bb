"""qbackend: a unified x86 INT8 quantization backend for PyTorch (FBGEMM + oneDNN, plain tensors).

Public names. The ops themselves are torch.ops.qbackend.*; qbackend.ops wraps them.
"""
from ._extension import _C  # noqa: F401  (loads the extension, applies QBACKEND_ISA)
from .dispatch import cpu_features

__version__ = "0.1.0"
__all__ = ["cpu_features", "__version__"]
