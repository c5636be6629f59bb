"""What a qbackend model file may name, and how a name becomes an object on load.

A file names classes (the modules and records the model is made of), functions (the targets of
its graph's calls, a module's activation function) and torch ops. Loading resolves each name here
and refuses any other: it rebuilds instances of these classes only (`cls.__new__`, then the
class's own `__setstate__` with the decoded state; no constructor from the file runs) and
references only these functions:

* classes: qbackend's own (defined in a `qbackend.` module), torch's nn modules
  (`torch.nn.modules.`), and the classes the caller trusts (`qbackend.load(path, classes=[...])`:
  classes, or modules whose classes all count, e.g. `transformers` for a module-swapped Hugging Face
  model);
* pytree node classes (a Hugging Face ModelOutput, registered with torch's pytree by its library
  on import) as the node types of a model's input and output specs, without the caller's trust:
  naming one builds nothing from the file; its module must be loaded already (or be inside a
  trusted package, which imports it);
* functions: pure tensor functions of torch (`torch`, `torch.nn.functional`, `torch._C._nn`, ...),
  `operator`, `math`, and a few builtins, none of the names that read or write files, load code or
  compile;
* ops: `torch.ops.<ns>.<op>.<overload>` in the `qbackend`, `aten` and `prims` namespaces, except the
  few that read files.

Nothing is imported but qbackend's own modules and the modules of packages the caller passed (a
trusted module's submodules, e.g. `transformers.modeling_outputs` for `classes=[transformers]`): a
name in any other module that is not loaded yet is refused.
"""
from __future__ import annotations

import importlib
import inspect
import sys
import types

import torch
from torch import nn
from torch.utils import _pytree as pytree


class NotAllowedError(ValueError):
    """A model file names a class, function or op that loading may not use."""


FUNCTION_MODULES = ("torch", "torch.nn.functional", "torch._C._nn", "torch._C._VariableFunctions", "torch.functional",
                    "torch._C._special", "torch.special", "torch._C._linalg", "torch.linalg", "torch._C._fft",
                    "torch.fft", "torch._refs", "_operator", "operator", "math")
# Functions in those modules that touch files, load code, or change global state.
DENIED_FUNCTIONS = frozenset({"load", "save", "from_file", "compile", "set_default_dtype", "set_default_device",
                              "set_num_threads", "set_num_interop_threads", "manual_seed", "seed", "set_printoptions",
                              "use_deterministic_algorithms", "set_grad_enabled", "set_flush_denormal", "attrgetter",
                              "methodcaller"})
BUILTINS = {"getattr": getattr, "len": len, "slice": slice, "range": range, "int": int, "float": float, "bool": bool,
            "tuple": tuple, "list": list, "min": min, "max": max, "abs": abs}
OP_NAMESPACES = ("qbackend", "aten", "prims")
DENIED_OPS = frozenset({"from_file", "_nested_from_padded_and_nested_example"})


def qualified_name(obj) -> str:
    """'module:qualname' of a class or function."""
    return f"{obj.__module__}:{obj.__qualname__}"


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _import_owned(module: str, trusted: tuple = ()):
    """The module object: qbackend's own modules and those inside a trusted module's package are
    imported; any other must be loaded already."""
    if module.split(".")[-1] == "__main__":
        raise NotAllowedError(f"module {module!r} is a program, not a library")
    if _within(module, "qbackend") or any(isinstance(t, types.ModuleType) and _within(module, t.__name__)
                                           for t in trusted):
        return importlib.import_module(module)
    mod = sys.modules.get(module)
    if mod is None:
        raise NotAllowedError(f"module {module!r} is not loaded")
    return mod


def _lookup(module: str, qualname: str, trusted: tuple = ()):
    if "<" in qualname:
        raise NotAllowedError(f"{module}:{qualname} is a local name")
    obj = _import_owned(module, trusted)
    for part in qualname.split("."):
        if part.startswith("__") and part.endswith("__"):
            raise NotAllowedError(f"{module}:{qualname} names a dunder attribute")
        obj = getattr(obj, part)
    return obj


def _trusted(cls: type, trusted: tuple) -> bool:
    for t in trusted:
        if isinstance(t, type) and cls is t:
            return True
        if isinstance(t, types.ModuleType) and _within(cls.__module__, t.__name__):
            return True
    return False


def class_allowed(cls: type, trusted: tuple = ()) -> bool:
    """Whether files may rebuild instances of `cls`."""
    if not isinstance(cls, type):
        return False
    module = cls.__module__ or ""
    if module == "qbackend" or module.startswith("qbackend."):
        return True
    if module.startswith("torch.nn.modules.") and issubclass(cls, nn.Module):
        return True
    return _trusted(cls, trusted)


def resolve_class(name: str, trusted: tuple = ()) -> type:
    module, _, qualname = name.partition(":")
    try:
        cls = _lookup(module, qualname, trusted)
    except NotAllowedError:
        raise NotAllowedError(f"the file needs class {name}, which qbackend does not rebuild from data; if you trust "
                              f"it, pass it: qbackend.load(path, classes=[{qualname.split('.')[-1]}] or its module)") \
            from None
    except (ImportError, AttributeError) as exc:
        raise NotAllowedError(f"the file names class {name}, which does not exist here ({exc})") from None
    if not isinstance(cls, type) or qualified_name(cls) != name or not class_allowed(cls, trusted):
        raise NotAllowedError(f"the file needs class {name}, which qbackend does not rebuild from data; if you trust "
                              f"it, pass it: qbackend.load(path, classes=[...])")
    return cls


def function_allowed(fn) -> bool:
    """Whether a file may reference `fn` (as a graph call's target or an attribute's value)."""
    if isinstance(fn, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return op_name(fn) is not None
    if any(fn is b for b in BUILTINS.values()):
        return True
    module = getattr(fn, "__module__", None)
    name = getattr(fn, "__name__", None)
    if module not in FUNCTION_MODULES or not isinstance(name, str) or name in DENIED_FUNCTIONS or isinstance(fn, type):
        return False
    return callable(fn) and (inspect.isbuiltin(fn) or inspect.isfunction(fn) or isinstance(fn, types.BuiltinFunctionType))


def function_name(fn) -> str:
    """The name a file stores for an allowed function."""
    for name, b in BUILTINS.items():
        if fn is b:
            return f"builtins:{name}"
    op = op_name(fn) if isinstance(fn, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)) else None
    if op is not None:
        return op
    return f"{fn.__module__}:{fn.__qualname__}"


def pytree_node_class(cls) -> bool:
    """Whether `cls` is registered with torch's pytree as a container type."""
    return isinstance(cls, type) and cls in pytree.SUPPORTED_NODES


def resolve_node_class(name: str, trusted: tuple = ()) -> type:
    """The class a stored pytree spec names as a node type (see the module docstring)."""
    module, _, qualname = name.partition(":")
    try:
        cls = _lookup(module, qualname, trusted)
    except NotAllowedError:
        package = module.split(".")[0]
        raise NotAllowedError(f"the model's inputs or outputs are built as {name}, whose module is not loaded: "
                              f"import {module} before loading, or trust its package: qbackend.load(path, "
                              f"classes=[{package}])") from None
    except (ImportError, AttributeError) as exc:
        raise NotAllowedError(f"the file names class {name}, which does not exist here ({exc})") from None
    if not isinstance(cls, type) or qualified_name(cls) != name or not (pytree_node_class(cls)
                                                                         or class_allowed(cls, trusted)):
        raise NotAllowedError(f"the file names {name} as a pytree container, which it is not here")
    return cls


def resolve_function(name: str):
    if name.startswith("torch.ops."):
        return resolve_op(name)
    module, _, qualname = name.partition(":")
    if module == "builtins":
        if qualname not in BUILTINS:
            raise NotAllowedError(f"the file names builtin {qualname!r}, which loading may not use")
        return BUILTINS[qualname]
    if module not in FUNCTION_MODULES or "." in qualname:
        raise NotAllowedError(f"the file names function {name}, which loading may not use")
    try:
        fn = _lookup(module, qualname)
    except (NotAllowedError, AttributeError) as exc:
        raise NotAllowedError(f"the file names function {name}, which does not exist here ({exc})") from None
    if not function_allowed(fn):
        raise NotAllowedError(f"the file names function {name}, which loading may not use")
    return fn


def op_name(op) -> str | None:
    """'torch.ops.ns.name.overload' (or without overload for a packet) of an allowed op; None otherwise."""
    if isinstance(op, torch._ops.OpOverload):
        ns, name, overload = op.namespace, op._schema.name.split("::")[-1], op._overloadname
        text = f"torch.ops.{ns}.{name}.{overload}"
    elif isinstance(op, torch._ops.OpOverloadPacket):
        ns, name = op._qualified_op_name.split("::")
        text = f"torch.ops.{ns}.{name}"
    else:
        return None
    return text if ns in OP_NAMESPACES and name not in DENIED_OPS else None


def resolve_op(name: str):
    parts = name.split(".")
    if len(parts) not in (4, 5) or parts[:2] != ["torch", "ops"] or parts[2] not in OP_NAMESPACES \
            or parts[3] in DENIED_OPS:
        raise NotAllowedError(f"the file names op {name}, which loading may not use")
    try:
        op = getattr(getattr(torch.ops, parts[2]), parts[3])
        if len(parts) == 5:
            op = getattr(op, parts[4])
    except (AttributeError, RuntimeError, TypeError) as exc:
        raise NotAllowedError(f"the file names op {name}, which does not exist here ({exc})") from None
    if not isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)) or op_name(op) != name:
        raise NotAllowedError(f"the file names op {name}, which resolves to something else here")
    return op

