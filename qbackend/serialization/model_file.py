"""Saving and loading converted models: `qbackend.save(qmodel, path)` / `qbackend.load(path)`.

The file (format 2) is a safetensors file (tensor_file.py): the tensors (int8 weights, scales,
zero points, biases, buffers) in its data section, and in its header's metadata one JSON document
(`qbackend`) with its SHA-256 (`qbackend_sha256`). The document holds the format version, the
qbackend and torch versions, the CPU the model was saved on, a summary of the layers (what
`qbackend.explain` shows), each tensor's dtype, shape and SHA-256, the classes outside qbackend and
torch.nn the model needs, and the model itself as data (object_codec.py: the int8 graph's nodes,
every module's state, the layer and activation records).

Loading never runs code from the file. It checks, before building anything: the container's layout
(sizes, offsets), the document's checksum, the format version, every tensor's dtype, shape and
checksum, and that every class the model needs is one loading may rebuild (allowlist.py). Any
violation is a `ModelFileError` naming what is wrong. Then it rebuilds the modules from their
state (every weight is repacked) and rebinds the model to this machine (rebind.py: 7-bit
activations only where no provider multiplies 8-bit ones exactly here, every layer routed again).

Format 1 files (qbackend before format 2: a torch.save archive with a pickled model) load only
with `allow_pickle=True`, which warns: unpickling can run code. `qbackend upgrade OLD NEW` (or
`upgrade_file`) rewrites one as format 2.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings

import torch

from ..core.version import VERSION as QBACKEND_VERSION
from ..dispatch import cpu_features
from ..nn.model import QuantizedModel
from ..report import explain
from . import tensor_file
from .allowlist import NotAllowedError, resolve_class
from .graph_codec import GraphCodecError
from .legacy_file import LEGACY_VERSION, is_legacy, read_legacy, read_legacy_header
from .object_codec import CodecError, Decoder, Encoder
from .rebind import rebind

FORMAT = "qbackend-model"
VERSION = 2
_DOC, _DOC_SHA = "qbackend", "qbackend_sha256"


class ModelFileError(ValueError):
    """The file is not a (readable, intact, compatible) qbackend model file."""


class PickleFileWarning(UserWarning):
    """A format-1 model file was unpickled (allow_pickle=True): unpickling can run code from the file."""


def _sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b"").hexdigest()


def _summary(qmodel: QuantizedModel) -> list[dict]:
    """The layers as `qbackend.explain` lists them, as plain JSON values."""
    try:
        rows = [dict(r) for r in explain(qmodel)]
    except Exception:  # noqa: BLE001  (a summary is informative only)
        return []
    return json.loads(json.dumps(rows, default=str))


def model_parts(qmodel: QuantizedModel) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) storing `qmodel` as data: what `save` writes into its safetensors file (the
    metadata's "format" key aside), and what another safetensors writer (qbackend.hf) may embed."""
    if not isinstance(qmodel, QuantizedModel):
        raise TypeError(f"qbackend.save takes the model qbackend.convert / quantize returned, got "
                        f"{type(qmodel).__name__}")
    encoder = Encoder()
    try:
        model = encoder.encode(qmodel)
    except (CodecError, GraphCodecError) as exc:
        raise ValueError(f"qbackend.save: this model cannot be stored as data: {exc}") from None
    tensors = encoder.tensors
    info = {name: dict(encoder.tensor_info[name], sha256=_sha256(t)) for name, t in tensors.items()}
    f = cpu_features()
    doc = {"format": FORMAT, "version": VERSION, "qbackend_version": QBACKEND_VERSION,
           "torch_version": str(torch.__version__),
           "saved_on": {"isa_class": f.isa_class, "vendor": f.vendor, "model": f.model_name},
           "classes": sorted(encoder.classes), "layers": _summary(qmodel), "tensors": info, "model": model}
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
    return tensors, {_DOC: text, _DOC_SHA: hashlib.sha256(text.encode()).hexdigest()}


def save(qmodel: QuantizedModel, path: str | os.PathLike) -> None:
    tensors, meta = model_parts(qmodel)
    tensor_file.write(path, tensors, {"format": FORMAT, **meta})


def _read(path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _document(path, data: bytes) -> tuple[dict, dict[str, torch.Tensor]]:
    """The checked document and tensors of a format-2 file's bytes."""
    try:
        tensors, meta = tensor_file.read(data, str(path))
    except tensor_file.ContainerError as exc:
        raise ModelFileError(f"not a readable qbackend model file: {exc}") from None
    if meta.get("format") != FORMAT or _DOC not in meta or _DOC_SHA not in meta:
        raise ModelFileError(f"{path}: a safetensors file, but not a qbackend model file (no {FORMAT!r} metadata)")
    return _checked_document(path, meta, tensors), tensors


def _parsed_document(path, meta: dict[str, str]) -> dict:
    """The JSON document in `meta` (model_parts' keys), checked against its checksum."""
    text = meta.get(_DOC)
    if not isinstance(text, str) or hashlib.sha256(text.encode()).hexdigest() != meta.get(_DOC_SHA):
        raise ModelFileError(f"{path}: the model description does not match its checksum (the file was edited or "
                             "damaged)")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ModelFileError(f"{path}: the model description is not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ModelFileError(f"{path}: the model description is not a JSON object")
    return doc


def _checked_document(path, meta: dict[str, str], tensors: dict[str, torch.Tensor]) -> dict:
    """The document in `meta` (model_parts' keys), checked against its checksum and against `tensors`."""
    doc = _parsed_document(path, meta)
    version = doc.get("version")
    if type(version) is not int:
        raise ModelFileError(f"{path}: the format version must be an integer, the file has {version!r} "
                             f"({type(version).__name__})")
    if version != VERSION:
        raise ModelFileError(f"{path}: written in qbackend model format version {version} (qbackend "
                             f"{doc.get('qbackend_version')}); this qbackend ({QBACKEND_VERSION}) reads version "
                             f"{VERSION}" + (" (and format 1 with allow_pickle=True)" if version == LEGACY_VERSION else ""))
    info = doc.get("tensors")
    if not isinstance(info, dict) or set(info) != set(tensors):
        raise ModelFileError(f"{path}: the tensor table does not match the model description")
    for name, t in tensors.items():
        entry = info[name]
        if not isinstance(entry, dict) or entry.get("dtype") != str(t.dtype).removeprefix("torch.") \
                or entry.get("shape") != list(t.shape):
            raise ModelFileError(f"{path}: tensor {name!r} is {t.dtype}{list(t.shape)} in the data, the description "
                                 f"says {entry!r:.120}")
        if _sha256(t) != entry.get("sha256"):
            raise ModelFileError(f"{path}: tensor {name!r} does not match its checksum (the file was edited or damaged)")
    return doc


def tensor_table(meta: dict[str, str], path) -> dict[str, tuple[torch.dtype, list[int]]]:
    """{tensor name: (dtype, shape)} that the document in `meta` (model_parts' keys) describes, read
    before any tensor is (a loader's placeholders take these), the document checked against its
    checksum; ModelFileError where it is malformed."""
    info = _parsed_document(path, meta).get("tensors")
    table = {}
    for name, entry in (info.items() if isinstance(info, dict) else ()):
        dtype = getattr(torch, str(entry.get("dtype")), None) if isinstance(entry, dict) else None
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not isinstance(dtype, torch.dtype) or not isinstance(shape, list) or \
                not all(type(d) is int and d >= 0 for d in shape) or not str(name).isidentifier():
            raise ModelFileError(f"{path}: the tensor table's entry {name!r} is malformed")
        table[name] = (dtype, shape)
    if not table:
        raise ModelFileError(f"{path}: the model description lists no tensors")
    return table


def _restore(tensors: dict[str, torch.Tensor], info: dict, path) -> dict[str, torch.Tensor]:
    """Each tensor with the strides and requires_grad it was saved with."""
    out = {}
    for name, t in tensors.items():
        entry = info[name]
        stride = entry.get("stride")
        if stride is not None:
            if not isinstance(stride, list) or len(stride) != t.dim() or not all(type(s) is int and s >= 0 for s in stride):
                raise ModelFileError(f"{path}: tensor {name!r} has stride {stride!r}")
            strided = torch.empty_strided(t.shape, stride, dtype=t.dtype)
            if strided.untyped_storage().nbytes() != t.numel() * t.element_size():
                raise ModelFileError(f"{path}: tensor {name!r}: stride {stride} does not tile its shape")
            t = strided.copy_(t)
        if entry.get("requires_grad") is True:
            t.requires_grad_(True)
        out[name] = t
    return out


def _trusted(classes) -> tuple:
    if classes is None:
        return ()
    if isinstance(classes, (type, type(os))):
        return (classes,)
    classes = tuple(classes)
    for c in classes:
        if not isinstance(c, (type, type(os))):
            raise TypeError(f"classes must hold classes or modules, got {type(c).__name__}")
    return classes


def inspect_file(path: str | os.PathLike) -> dict:
    """A model file's description without building the model: format, versions, saved-on CPU, the
    layers as explain lists them, tensor count and bytes, the classes it needs. Checks the file as
    `load` does (a damaged file raises ModelFileError)."""
    data = _read(path)
    if is_legacy(data):
        header = read_legacy_header(path, data, ModelFileError)
        return {"format": FORMAT, "version": header.get("version"), "qbackend_version": header.get("qbackend_version"),
                "torch_version": header.get("torch_version"), "saved_on": header.get("saved_on"),
                "pickled": True, "layers": None, "tensors": None, "tensor_bytes": None, "classes": None}
    doc, tensors = _document(path, data)
    return {k: doc.get(k) for k in ("format", "version", "qbackend_version", "torch_version", "saved_on", "classes",
                                    "layers")} | {
        "pickled": False, "tensors": len(tensors), "tensor_bytes": sum(t.numel() * t.element_size() for t in tensors.values())}


def read_model(path: str | os.PathLike, *, classes=None, allow_pickle: bool = False) -> QuantizedModel:
    """The model stored in `path` as it was saved (not rebound to this CPU)."""
    trusted = _trusted(classes)
    data = _read(path)
    if is_legacy(data):
        if not allow_pickle:
            raise ModelFileError(
                f"{path}: a qbackend model file of format {LEGACY_VERSION}, which stores a pickled model: loading it "
                "can run code from the file. If you trust the file, load it with qbackend.load(path, "
                "allow_pickle=True), or convert it once with `qbackend upgrade OLD NEW` (in a trusted environment); "
                "format-2 files load without running code")
        warnings.warn(f"qbackend.load: unpickling {path} (model format {LEGACY_VERSION}, allow_pickle=True): this can "
                      "run code from the file; convert it with `qbackend upgrade` to load it safely",
                      PickleFileWarning, stacklevel=3)
        return read_legacy(path, data, ModelFileError)
    doc, tensors = _document(path, data)
    return _decoded(path, doc, tensors, trusted)


def _decoded(path, doc: dict, tensors: dict[str, torch.Tensor], trusted: tuple) -> QuantizedModel:
    needed = doc.get("classes") or []
    if not isinstance(needed, list) or not all(isinstance(n, str) for n in needed):
        raise ModelFileError(f"{path}: the list of needed classes is malformed")
    missing = []
    for name in needed:
        try:
            resolve_class(name, trusted)
        except NotAllowedError:
            missing.append(name)
    if missing:
        raise ModelFileError(f"{path}: the model is made of classes outside qbackend and torch.nn ({', '.join(missing)}); "
                             "loading rebuilds only classes you trust: pass them (or their modules), e.g. "
                             "qbackend.load(path, classes=[MyModel]) or classes=[transformers]")
    decoder = Decoder(_restore(tensors, doc["tensors"], path), trusted)
    try:
        qmodel = decoder.decode(doc.get("model"))
    except (CodecError, GraphCodecError) as exc:
        raise ModelFileError(f"{path}: the model cannot be rebuilt: {exc}") from None
    except Exception as exc:  # noqa: BLE001  (a module's own __setstate__ rejecting its stored state)
        raise ModelFileError(f"{path}: the model cannot be rebuilt by this qbackend ({type(exc).__name__}: {exc})") \
            from None
    if not isinstance(qmodel, QuantizedModel):
        raise ModelFileError(f"{path}: the file holds a {type(qmodel).__name__}, not a QuantizedModel")
    qmodel.qbackend_saved_on = doc.get("saved_on")
    return qmodel


def model_from_parts(tensors: dict[str, torch.Tensor], meta: dict[str, str], source: str, *,
                     classes=None) -> QuantizedModel:
    """The model `model_parts` stored as (tensors, metadata), checked as `load` checks a file
    (`source` names it in errors) and rebound to this machine."""
    doc = _checked_document(source, meta, tensors)
    qmodel = _decoded(source, doc, tensors, _trusted(classes))
    qmodel.qbackend_rebind = rebind(qmodel)
    return qmodel


def load(path: str | os.PathLike, *, classes=None, allow_pickle: bool = False) -> QuantizedModel:
    """The model saved in `path`, rebound to this machine.

    classes: classes (or modules, all of whose classes count) outside qbackend and torch.nn that the
    model is made of and that you trust, e.g. the user model a module-swapped model keeps
    (`qbackend.inspect_file(path)["classes"]` lists them). allow_pickle: also load format-1 files,
    which unpickle (can run code from the file)."""
    qmodel = read_model(path, classes=classes, allow_pickle=allow_pickle)
    qmodel.qbackend_rebind = rebind(qmodel)
    return qmodel


def upgrade_file(old: str | os.PathLike, new: str | os.PathLike, *, classes=None) -> None:
    """Rewrite a format-1 (pickled) model file as format 2, unchanged (not rebound to this CPU).
    Unpickles `old`: run it only on files you trust."""
    save(read_model(old, classes=classes, allow_pickle=True), new)
