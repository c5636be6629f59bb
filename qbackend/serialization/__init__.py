"""Saving and loading converted models without pickle (model_file.py: `save`, `load`, the file's
checks, and model_parts / model_from_parts for a model embedded in another safetensors file;
tensor_file.py: the safetensors container; object_codec.py and graph_codec.py: the model as JSON; allowlist.py: what a file may name; legacy_file.py: format 1, behind allow_pickle) and
rebinding a loaded model to the CPU it runs on (rebind.py: 7-bit activations where the CPU lacks
VNNI, every layer routed again)."""
from .model_file import (FORMAT, VERSION, ModelFileError, PickleFileWarning, inspect_file, load, model_from_parts,
                         model_parts, read_model, save, tensor_table, upgrade_file)
from .rebind import RequantizedWarning, rebind

__all__ = ["FORMAT", "VERSION", "ModelFileError", "PickleFileWarning", "RequantizedWarning", "inspect_file", "load",
           "model_from_parts", "model_parts", "read_model", "rebind", "save", "tensor_table", "upgrade_file"]
