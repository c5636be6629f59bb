"""Ops: the qbackend torch.library ops' Python side (fake impls, the observer ops' too), the
providers of each op family and their registry (registry.py), the packed weights, and the fp64
reference semantics."""
from .packed import PackedConv2dWeight, PackedLinearWeight
from .providers import PROVIDERS, Provider, get_provider
from .quantize import dequantize, quantize  # noqa: F401  (also registers the ops' fake impls)
from . import observer_ops  # noqa: F401,E402  (the observer ops' fake impls)
from . import pool  # noqa: F401,E402  (the int8 pooling op's fake impl)
from . import inverted_residual  # noqa: F401,E402  (the fused inverted-residual block's fake impl)
from .attention import attention  # noqa: E402  (also registers the fused attention op's fake impl)
from . import layer_norm  # noqa: F401,E402  (the fused LayerNorm + quantize op's fake impl)
from . import gptq_ops  # noqa: F401,E402  (GPTQ's column loop's and ordered Hessian's fake impls)
from . import conv_stats  # noqa: F401,E402  (the conv column sums' fake impl)
from . import woq  # noqa: F401,E402  (the weight-only Linears' fake impls)
from . import rms_norm  # noqa: F401,E402  (the LLMs' RMSNorm's fake impl)
from . import per_token  # noqa: F401,E402  (the per-token activation ops' fake impls)
from . import row_keys  # noqa: F401,E402  (the row sample keys' fake impl)
from . import weight_rows  # noqa: F401,E402  (the weight quantizer's fake impl)
from .embedding import EMBEDDING_PROVIDERS, PackedEmbeddingTable, quantize_rowwise  # noqa: E402
from . import registry  # noqa: E402

__all__ = ["PackedConv2dWeight", "PackedLinearWeight", "PROVIDERS", "Provider", "get_provider",
           "EMBEDDING_PROVIDERS", "PackedEmbeddingTable", "quantize_rowwise",
           "attention", "dequantize", "quantize", "registry"]
