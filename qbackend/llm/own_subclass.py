"""A module of the user's model given native behaviour in place: its class becomes a subclass of its own
class mixed with one of qbackend's (`<prefix><Class>`, made once per pair), so the object, its
attributes, children, hooks, state_dict keys and isinstance stay the model's. Copies and pickles name
the mixin and the model's class (the subclass is made again where it is loaded); transformers'
output-capturing registry, keyed by class name, sees the subclass as its base. Used by the native
decoder layers (llm/decoder_layers.py) and the decoding step (llm/decoding_step.py).
"""
from __future__ import annotations

from torch import nn

__all__ = ["OwnSubclass", "give_subclass", "restore_class", "subclass_of"]

_CLASSES: dict[tuple[type, type], type] = {}


class OwnSubclass(nn.Module):
    """The mixin's base: `_prefix` names the subclasses, `_transient` holds the attributes a copy or a
    pickle starts again from (their values there); `_qbackend_base` is the model's class."""

    _prefix = "Native"
    _transient: dict = {}
    _qbackend_base: type = nn.Module

    def __reduce_ex__(self, protocol):
        mixin = type(self).__mro__[1]
        return _rebuilt, (mixin, self._qbackend_base), {**self.__dict__, **self._transient}


def subclass_of(mixin: type, base: type) -> type:
    """The subclass of `base` mixed with `mixin` (an OwnSubclass; one per pair)."""
    cls = _CLASSES.get((mixin, base))
    if cls is None:
        cls = type(f"{mixin._prefix}{base.__name__}", (mixin, base),
                   {"__module__": mixin.__module__, "_qbackend_base": base, "__doc__": base.__doc__})
        _CLASSES[mixin, base] = cls
    _share_recorded_outputs(base, cls)
    return cls


def give_subclass(module: nn.Module, mixin: type, **attributes) -> None:
    """Makes `module`'s class subclass_of(mixin, its class) and sets `attributes` on it."""
    module.__class__ = subclass_of(mixin, type(module))
    module.__dict__.update(attributes)


def restore_class(module: nn.Module, *attributes: str) -> None:
    """Gives `module` its own class back and drops `attributes`."""
    module.__class__ = module._qbackend_base
    for key in attributes:
        module.__dict__.pop(key, None)


def _rebuilt(mixin: type, base: type) -> nn.Module:
    """An empty instance of subclass_of(mixin, base), for pickle and copy (their state is set on it after)."""
    return object.__new__(subclass_of(mixin, base))


def _share_recorded_outputs(base: type, cls: type) -> None:
    try:
        from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY
    except ImportError:  # a transformers without the registry: nothing to share
        return
    flags = dict.get(_CAN_RECORD_REGISTRY, str(base))
    if flags and not dict.get(_CAN_RECORD_REGISTRY, str(cls)):
        dict.__setitem__(_CAN_RECORD_REGISTRY, str(cls), flags)
