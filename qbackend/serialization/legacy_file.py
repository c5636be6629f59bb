"""Reading model format 1: a torch.save archive holding a header (read with weights_only=True) and
the model as a pickle. Unpickling can run code from the file, so model_file.py calls `read_legacy`
only when the caller passed allow_pickle=True; `read_legacy_header` reads the header alone, without
unpickling the model."""
from __future__ import annotations

import io

import torch

from ..nn.model import QuantizedModel

LEGACY_FORMAT = "qbackend-model"
LEGACY_VERSION = 1


def is_legacy(data: bytes) -> bool:
    """Whether the file's bytes are a zip archive (torch.save's format), as format-1 files are."""
    return data[:4] == b"PK\x03\x04"


def read_legacy_header(path, data: bytes, error: type[Exception]) -> dict:
    """The format-1 header of the file's bytes `data`, checked (`path` names it in errors); the
    archive's model bytes are not unpickled."""
    try:
        obj = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:  # noqa: BLE001  (truncated zip, garbage, a pickle that is not plain data)
        raise error(f"{path}: not a readable qbackend model file (truncated or corrupt?): "
                    f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    header = obj.get("header") if isinstance(obj, dict) else None
    if not isinstance(header, dict) or header.get("format") != LEGACY_FORMAT or not isinstance(obj.get("model"), bytes):
        raise error(f"{path}: not a qbackend model file (no {LEGACY_FORMAT!r} header)")
    version = header.get("version")
    if type(version) is not int:
        raise error(f"{path}: the format version must be an integer, the file has {version!r} ({type(version).__name__})")
    if version != LEGACY_VERSION:
        raise error(f"{path}: a torch.save archive of qbackend model format version {version}; this qbackend reads "
                    f"such archives only in version {LEGACY_VERSION}")
    return dict(header, _model=obj["model"])


def read_legacy(path, data: bytes, error: type[Exception]) -> QuantizedModel:
    """The pickled model of a format-1 file's bytes (runs the pickle: only for files the caller trusts)."""
    header = read_legacy_header(path, data, error)
    try:
        qmodel = torch.load(io.BytesIO(header["_model"]), weights_only=False)
    except Exception as exc:  # noqa: BLE001
        raise error(f"{path}: the model in this file cannot be rebuilt by this qbackend "
                    f"({type(exc).__name__}: {exc})") from None
    if not isinstance(qmodel, QuantizedModel):
        raise error(f"{path}: the file holds a {type(qmodel).__name__}, not a QuantizedModel")
    qmodel.qbackend_saved_on = header.get("saved_on")
    return qmodel
