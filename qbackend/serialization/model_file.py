"""Saving and loading converted models: `qbackend.save(qmodel, path)` / `qbackend.load(path)`.

The file is a torch.save archive holding a header (format name and version, the qbackend and
torch versions, the CPU it was saved on) and the pickled QuantizedModel, whose packed weights
pickle as their int8 weights plus metadata (never a provider's packed bytes). Loading checks the
header first, unpickles the model (every weight is repacked), then rebinds it to this machine
(rebind.py: 7-bit activations where the CPU has no VNNI, every layer routed again),
so a model saved on an AMX machine runs on an AVX2-only one.

Security: like torch.load(weights_only=False), loading unpickles Python objects; load only files
you trust.
"""
from __future__ import annotations

import io
import os

import torch

from ..core.version import VERSION as QBACKEND_VERSION
from ..dispatch import cpu_features
from ..nn.model import QuantizedModel
from .rebind import rebind

FORMAT = "qbackend-model"
VERSION = 1


class ModelFileError(ValueError):
    """The file is not a (readable, compatible) qbackend model file."""


def save(qmodel: QuantizedModel, path: str | os.PathLike) -> None:
    if not isinstance(qmodel, QuantizedModel):
        raise TypeError(f"qbackend.save takes the model qbackend.convert / quantize returned, got "
                        f"{type(qmodel).__name__}")
    payload = io.BytesIO()
    torch.save(qmodel, payload)
    f = cpu_features()
    header = {"format": FORMAT, "version": VERSION, "qbackend_version": QBACKEND_VERSION,
              "torch_version": str(torch.__version__), "saved_on": {"isa_class": f.isa_class, "vendor": f.vendor,
                                                               "model": f.model_name}}
    torch.save({"header": header, "model": payload.getvalue()}, path)


def load(path: str | os.PathLike) -> QuantizedModel:
    try:
        obj = torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as exc:  # noqa: BLE001  (truncated zip, garbage, a pickle that is not plain data)
        raise ModelFileError(f"{path}: not a readable qbackend model file (truncated or corrupt?): "
                             f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
    header = obj.get("header") if isinstance(obj, dict) else None
    if not isinstance(header, dict) or header.get("format") != FORMAT or not isinstance(obj.get("model"), bytes):
        raise ModelFileError(f"{path}: not a qbackend model file (no {FORMAT!r} header)")
    if header.get("version") != VERSION:
        raise ModelFileError(f"{path}: written in qbackend model format version {header.get('version')!r} "
                             f"(qbackend {header.get('qbackend_version')}); this qbackend reads version {VERSION}")
    try:
        qmodel = torch.load(io.BytesIO(obj["model"]), weights_only=False)
    except Exception as exc:  # noqa: BLE001
        raise ModelFileError(f"{path}: the model in this file cannot be rebuilt by this qbackend "
                             f"({type(exc).__name__}: {exc})") from exc
    if not isinstance(qmodel, QuantizedModel):
        raise ModelFileError(f"{path}: the file holds a {type(qmodel).__name__}, not a QuantizedModel")
    qmodel.qbackend_saved_on = header.get("saved_on")
    qmodel.qbackend_rebind = rebind(qmodel)
    return qmodel
