"""A converted model as JSON plus tensors, and back, without pickle.

`Encoder.encode(obj)` turns an object tree into JSON values: plain values as themselves, every
tensor as a reference into the file's tensor table, every other value as a tagged object
(`{"$tuple": [...]}`, `{"$dtype": "float32"}`, `{"$obj": "qbackend.nn.linear:QuantizedLinear",
"id": 3, "state": ...}`, ...). An object is stored by its class's name and the state pickling would
store (`__getstate__()`), never by a reduce function, so the file holds data only; torch.fx
GraphModules are stored as their graph's nodes (graph_codec.py).

`Decoder.decode(value)` rebuilds the tree: classes, functions and ops only through allowlist.py;
objects as `cls.__new__(cls)` plus the class's own `__setstate__` (or its `__dict__`), exactly as
unpickling would rebuild them. Shared objects and tensors stay shared. Any malformed value raises
`CodecError` naming where in the tree it was.
"""
from __future__ import annotations

import base64
import copyreg
import enum
import math
import types
from collections import OrderedDict

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from . import graph_codec
from .allowlist import (NotAllowedError, class_allowed, function_allowed, function_name, pytree_node_class,
                        qualified_name, resolve_class, resolve_function, resolve_node_class)


class CodecError(ValueError):
    """A value that cannot be stored as data (saving), or a malformed stored value (loading)."""


_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_MEMORY_FORMATS = {"contiguous_format": torch.contiguous_format, "channels_last": torch.channels_last,
                   "channels_last_3d": torch.channels_last_3d, "preserve_format": torch.preserve_format}
_LAYOUTS = {"strided": torch.strided, "sparse_coo": torch.sparse_coo}


_FUNCTION_TYPES = (types.FunctionType, types.BuiltinFunctionType, torch._ops.OpOverload, torch._ops.OpOverloadPacket)


def _is_namedtuple(obj) -> bool:
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields") and type(obj) is not tuple


def _plain_reduce(cls: type) -> bool:
    """Whether pickling `cls` goes through the default protocol (state = __getstate__())."""
    return getattr(cls, "__reduce_ex__", None) is object.__reduce_ex__ and \
        getattr(cls, "__reduce__", None) is object.__reduce__


class Encoder:
    """Encodes one object tree; `tensors` collects the tensors it references, by name."""

    def __init__(self):
        self.tensors: dict[str, torch.Tensor] = {}
        self.tensor_info: dict[str, dict] = {}
        self.classes: set[str] = set()  # names of classes that loading must be told to trust
        self._tensor_names: dict[int, str] = {}
        self._object_ids: dict[int, int] = {}
        self._keep: list = []  # objects encoded so far, alive so their ids stay unique

    def encode(self, obj, where: str = "model"):
        try:
            return self._value(obj, where)
        except RecursionError:
            raise CodecError(f"{where}: nested too deeply (a cycle through lists or dicts?)") from None

    def _tensor(self, t: torch.Tensor, where: str) -> str:
        name = self._tensor_names.get(id(t))
        if name is not None:
            return name
        if t.layout != torch.strided or t.is_quantized or t.device.type != "cpu" or type(t) not in (torch.Tensor, nn.Parameter):
            raise CodecError(f"{where}: a {type(t).__name__} ({t.layout}, {t.dtype}, {t.device}) cannot be stored")
        name = f"t{len(self.tensors)}"
        info = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
        if not t.is_contiguous() and t.numel() > 1:
            info["stride"] = list(t.stride())
            if t.is_contiguous(memory_format=torch.channels_last) and t.dim() == 4:
                info["memory_format"] = "channels_last"
        if t.requires_grad:
            info["requires_grad"] = True
        self.tensors[name] = t.detach().contiguous()
        self.tensor_info[name] = info
        self._tensor_names[id(t)] = name
        self._keep.append(t)
        return name

    def _pairs(self, items, where: str) -> list:
        return [[self._value(k, f"{where} key"), self._value(v, f"{where}[{k!r}]")] for k, v in items]

    def _value(self, obj, where: str):
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, float) and not isinstance(obj, bool):
            if math.isfinite(obj):
                return float(obj)
            return {"$float": "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")}
        if isinstance(obj, int) and not isinstance(obj, enum.Enum):
            return int(obj)
        if isinstance(obj, torch.Tensor):
            name = self._tensor(obj, where)
            if isinstance(obj, nn.Parameter):
                return {"$param": name, "requires_grad": bool(obj.requires_grad)}
            return {"$tensor": name}
        if isinstance(obj, torch.dtype):
            return {"$dtype": str(obj).removeprefix("torch.")}
        if isinstance(obj, torch.device):
            return {"$device": str(obj)}
        if isinstance(obj, torch.memory_format):
            return {"$memory_format": str(obj).removeprefix("torch.")}
        if isinstance(obj, torch.layout):
            return {"$layout": str(obj).removeprefix("torch.")}
        if isinstance(obj, torch.Size):
            return {"$size": [int(d) for d in obj]}
        if _is_namedtuple(obj):
            self._class_name(type(obj), where)
            return {"$namedtuple": qualified_name(type(obj)), "items": [self._value(v, where) for v in obj]}
        if type(obj) is tuple:
            return {"$tuple": [self._value(v, f"{where}[{i}]") for i, v in enumerate(obj)]}
        if type(obj) is list:
            return [self._value(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        if type(obj) is dict:
            if all(type(k) is str and not k.startswith("$") for k in obj):
                return {"$map": {k: self._value(v, f"{where}[{k!r}]") for k, v in obj.items()}}
            return {"$dict": self._pairs(obj.items(), where)}
        if type(obj) is OrderedDict:
            return {"$odict": self._pairs(obj.items(), where)}
        if type(obj) in (set, frozenset):
            items = sorted((self._value(v, where) for v in obj), key=repr)
            return {"$set" if type(obj) is set else "$frozenset": items}
        if type(obj) is slice:
            return {"$slice": [self._value(v, where) for v in (obj.start, obj.stop, obj.step)]}
        if obj is Ellipsis:
            return {"$ellipsis": True}
        if type(obj) is bytes:
            return {"$bytes": base64.b64encode(obj).decode()}
        if isinstance(obj, pytree.TreeSpec):
            return {"$treespec": pytree.treespec_dumps(obj)}
        if isinstance(obj, enum.Enum):
            return {"$enum": self._class_name(type(obj), where), "name": obj.name}
        if pytree_node_class(obj):
            return {"$node_class": qualified_name(obj)}
        if isinstance(obj, type):
            return {"$class": self._class_name(obj, where)}
        if isinstance(obj, _FUNCTION_TYPES):
            if not function_allowed(obj):
                raise CodecError(f"{where}: the function {getattr(obj, '__module__', '?')}."
                                 f"{getattr(obj, '__qualname__', obj)!s} cannot be stored in a model file "
                                 "(only torch's tensor functions, operator and math are)")
            return {"$function": function_name(obj)}
        return self._object(obj, where)

    def _class_name(self, cls: type, where: str) -> str:
        name = qualified_name(cls)
        if "<locals>" in name:
            raise CodecError(f"{where}: {name} is a local class; a model file can only name module-level classes")
        if not class_allowed(cls):
            self.classes.add(name)
        return name

    def _object(self, obj, where: str):
        known = self._object_ids.get(id(obj))
        if known is not None:
            return {"$ref": known}
        cls = type(obj)
        oid = len(self._object_ids)
        self._object_ids[id(obj)] = oid
        self._keep.append(obj)
        if isinstance(obj, fx.GraphModule):
            return {"$graph_module": graph_codec.encode(obj, self._value, where), "id": oid}
        if not _plain_reduce(cls) or hasattr(obj, "__getnewargs_ex__") or hasattr(obj, "__getnewargs__") \
                or cls.__module__ == "builtins":
            raise CodecError(f"{where}: a {qualified_name(cls)} cannot be stored in a model file (it pickles "
                             "through its own reduce function)")
        name = self._class_name(cls, where)
        state = obj.__getstate__()
        return {"$obj": name, "id": oid, "state": self._value(state, f"{where}.{cls.__name__}")}


class Decoder:
    """Decodes one object tree; `tensors` holds the tensors the file's table names."""

    def __init__(self, tensors: dict[str, torch.Tensor], trusted: tuple = ()):
        self.tensors = tensors
        self.trusted = trusted
        self._objects: dict[int, object] = {}

    def decode(self, value, where: str = "model"):
        try:
            return self._value(value, where)
        except RecursionError:
            raise CodecError(f"{where}: nested too deeply") from None
        except NotAllowedError as exc:
            raise CodecError(str(exc)) from None

    def _tensor(self, name, where: str) -> torch.Tensor:
        if not isinstance(name, str) or name not in self.tensors:
            raise CodecError(f"{where}: tensor {name!r} is not in the file's tensor table")
        return self.tensors[name]

    def _pairs(self, pairs, where: str) -> list:
        if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
            raise CodecError(f"{where}: expected a list of [key, value] pairs")
        return [(self._hashable(self._value(k, where), where), self._value(v, where)) for k, v in pairs]

    @staticmethod
    def _hashable(key, where: str):
        try:
            hash(key)
        except TypeError:
            raise CodecError(f"{where}: a dict key of type {type(key).__name__}") from None
        return key

    def _value(self, value, where: str):
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, list):
            return [self._value(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if not isinstance(value, dict) or not value:
            raise CodecError(f"{where}: unexpected value {value!r:.80}")
        tag = next(iter(value))
        body = value[tag]
        if tag == "$map":
            if not isinstance(body, dict):
                raise CodecError(f"{where}: $map is not an object")
            return {k: self._value(v, f"{where}[{k!r}]") for k, v in body.items()}
        if tag == "$tensor":
            return self._tensor(body, where)
        if tag == "$param":
            return nn.Parameter(self._tensor(body, where), requires_grad=bool(value.get("requires_grad", True)))
        if tag == "$float":
            if body not in _NONFINITE:
                raise CodecError(f"{where}: $float {body!r}")
            return _NONFINITE[body]
        if tag == "$tuple":
            return tuple(self._list(body, where))
        if tag == "$dict":
            return dict(self._pairs(body, where))
        if tag == "$odict":
            return OrderedDict(self._pairs(body, where))
        if tag in ("$set", "$frozenset"):
            items = [self._hashable(v, where) for v in self._list(body, where)]
            return set(items) if tag == "$set" else frozenset(items)
        if tag == "$slice":
            items = self._list(body, where)
            if len(items) != 3:
                raise CodecError(f"{where}: $slice needs 3 items")
            return slice(*items)
        if tag == "$ellipsis":
            return Ellipsis
        if tag == "$bytes":
            try:
                return base64.b64decode(body, validate=True)
            except (TypeError, ValueError):
                raise CodecError(f"{where}: $bytes is not base64") from None
        if tag == "$dtype":
            dtype = getattr(torch, body, None) if isinstance(body, str) else None
            if not isinstance(dtype, torch.dtype):
                raise CodecError(f"{where}: unknown dtype {body!r}")
            return dtype
        if tag == "$device":
            try:
                return torch.device(body)
            except (TypeError, RuntimeError):
                raise CodecError(f"{where}: unknown device {body!r}") from None
        if tag == "$memory_format":
            if body not in _MEMORY_FORMATS:
                raise CodecError(f"{where}: unknown memory format {body!r}")
            return _MEMORY_FORMATS[body]
        if tag == "$layout":
            if body not in _LAYOUTS:
                raise CodecError(f"{where}: unknown layout {body!r}")
            return _LAYOUTS[body]
        if tag == "$size":
            items = self._list(body, where)
            if not all(type(d) is int and d >= 0 for d in items):
                raise CodecError(f"{where}: $size {body!r}")
            return torch.Size(items)
        if tag == "$treespec":
            try:
                return pytree.treespec_loads(body)
            except Exception as exc:  # noqa: BLE001  (torch's parser raises several types)
                raise CodecError(f"{where}: unreadable pytree spec ({type(exc).__name__}: {exc})") from None
        if tag == "$namedtuple":
            cls = self._class(body, where)
            if not (issubclass(cls, tuple) and hasattr(cls, "_fields")):
                raise CodecError(f"{where}: {body} is not a namedtuple")
            return cls(*self._list(value.get("items"), where))
        if tag == "$enum":
            cls = self._class(body, where)
            if not issubclass(cls, enum.Enum) or value.get("name") not in cls.__members__:
                raise CodecError(f"{where}: {body} has no member {value.get('name')!r}")
            return cls[value["name"]]
        if tag == "$class":
            return self._class(body, where)
        if tag == "$node_class":
            if not isinstance(body, str):
                raise CodecError(f"{where}: class name {body!r}")
            return resolve_node_class(body, self.trusted)
        if tag == "$function":
            if not isinstance(body, str):
                raise CodecError(f"{where}: $function {body!r}")
            return resolve_function(body)
        if tag == "$ref":
            if body not in self._objects:
                raise CodecError(f"{where}: reference to object {body!r} before it was defined")
            return self._objects[body]
        if tag == "$graph_module":
            return self._remember(value, graph_codec.decode(body, self._value, where), where)
        if tag == "$obj":
            return self._object(value, where)
        raise CodecError(f"{where}: unknown tag {tag!r}")

    def _list(self, body, where: str) -> list:
        if not isinstance(body, list):
            raise CodecError(f"{where}: expected a list, got {type(body).__name__}")
        return [self._value(v, f"{where}[{i}]") for i, v in enumerate(body)]

    def _class(self, name, where: str) -> type:
        if not isinstance(name, str):
            raise CodecError(f"{where}: class name {name!r}")
        return resolve_class(name, self.trusted)

    def _remember(self, value: dict, obj, where: str):
        oid = value.get("id")
        if type(oid) is not int or oid in self._objects:
            raise CodecError(f"{where}: object id {oid!r} missing or repeated")
        self._objects[oid] = obj
        return obj

    def _object(self, value: dict, where: str):
        cls = self._class(value["$obj"], where)
        if not _plain_reduce(cls) or cls.__module__ == "builtins" or issubclass(cls, (torch.Tensor, fx.GraphModule)):
            raise CodecError(f"{where}: {value['$obj']} is not rebuilt from its state")
        obj = copyreg.__newobj__(cls)
        self._remember(value, obj, where)
        state = self._value(value.get("state"), f"{where}.{cls.__name__}")
        setstate = getattr(obj, "__setstate__", None)
        if setstate is not None:
            setstate(state)
        elif isinstance(state, dict):
            obj.__dict__.update(state)
        elif isinstance(state, tuple) and len(state) == 2 and all(s is None or isinstance(s, dict) for s in state):
            if state[0]:
                obj.__dict__.update(state[0])
            for k, v in (state[1] or {}).items():
                setattr(obj, k, v)
        elif state is not None:
            raise CodecError(f"{where}: state of {value['$obj']} is a {type(state).__name__}")
        return obj
