from .quantize import dequantize, quantize  # noqa: F401  (also registers the ops' fake impls)
