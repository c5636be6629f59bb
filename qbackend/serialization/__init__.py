"""Saving and loading converted models (model_file.py: `save`, `load`, the file's header and
checks) and rebinding a loaded model to the CPU it runs on (rebind.py: 7-bit activations where the
CPU lacks VNNI, every layer routed again)."""
from .model_file import FORMAT, VERSION, ModelFileError, load, save
from .rebind import RequantizedWarning, rebind

__all__ = ["FORMAT", "VERSION", "ModelFileError", "RequantizedWarning", "load", "rebind", "save"]
