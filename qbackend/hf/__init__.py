"""qbackend as a Hugging Face transformers quantization method ("qbackend"): QBackendConfig
(config.py), its HfQuantizer (quantizer.py) and the static int8 blocks of encoders (static_blocks.py),
registered with transformers when this package is imported. `import qbackend` imports it as soon as transformers.modeling_utils loads (transformers_hook.py),
so `from_pretrained` of a folder saved with it finds the method without importing it by hand.

    from qbackend.hf import QBackendConfig
    model = AutoModelForCausalLM.from_pretrained(path, quantization_config=QBackendConfig(weights="int4"))
    model.save_pretrained(out)                 # safetensors + config.json, no pickle
    model = AutoModelForCausalLM.from_pretrained(out)   # quantized again, no recalibration
    encoder = AutoModel.from_pretrained(path, quantization_config=QBackendConfig(mode="static",
                                                                                 calibration=batches))
"""
from transformers.quantizers.auto import (AUTO_QUANTIZATION_CONFIG_MAPPING, AUTO_QUANTIZER_MAPPING,
                                          register_quantization_config, register_quantizer)

from .config import FORMAT_VERSION, QUANT_METHOD, QBackendConfig
from .quantizer import QBackendHfQuantizer

__all__ = ["QBackendConfig", "QBackendHfQuantizer", "QUANT_METHOD", "FORMAT_VERSION"]

# Registered once per process (transformers' register_* refuse a second registration of a name).
if QUANT_METHOD not in AUTO_QUANTIZATION_CONFIG_MAPPING:
    register_quantization_config(QUANT_METHOD)(QBackendConfig)
if QUANT_METHOD not in AUTO_QUANTIZER_MAPPING:
    register_quantizer(QUANT_METHOD)(QBackendHfQuantizer)
