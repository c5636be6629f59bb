"""A process-wide counter that changes whenever a converted model may have changed.

Recorded forward plans (nn/forward_plan.py) bake each op's arguments into the plan: qparams, the
packed weight objects, the module tree. A plan is valid only while the counter is what it was when
the plan was recorded. It moves on every attribute assignment on qbackend's modules and packed
weights (`Tracked`), and on every module, parameter or buffer registration anywhere (torch's global
registration hooks, installed by `install_module_hooks`): so replacing a layer, requantizing one
(set_qparams), repacking a weight for another provider or rebinding a loaded model all invalidate
the plans, at the cost of re-recording after unrelated module construction.
"""
from __future__ import annotations

import itertools

_counter = itertools.count(1)
CURRENT = [0]  # CURRENT[0] is the generation now: read it where a call to current() costs too much


def current() -> int:
    """The generation now."""
    return CURRENT[0]


def bump() -> None:
    """Invalidate every recorded plan."""
    CURRENT[0] = next(_counter)


class Tracked:
    """Mixin for qbackend's modules and packed weights: an attribute assignment bumps the generation."""

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        bump()

    def __delattr__(self, name):
        super().__delattr__(name)
        bump()


_installed = []


def install_module_hooks() -> None:
    """Bump on every nn.Module child, parameter or buffer registration (once per process)."""
    if _installed:
        return
    from torch.nn.modules import module as torch_module

    def hook(*_args):
        bump()

    _installed.extend([torch_module.register_module_module_registration_hook(hook),
                       torch_module.register_module_buffer_registration_hook(hook),
                       torch_module.register_module_parameter_registration_hook(hook)])
