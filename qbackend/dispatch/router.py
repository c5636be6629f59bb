"""The router: binds one op instance (kind + example shape) to a provider, from the rule table,
and checks that the provider can run it exactly on this CPU.

`route` returns a `Route` (provider, why). The rule table (rules.py) picks by speed; the router
then applies correctness: 8-bit uint8 activations need a provider that multiplies them without
16-bit saturation on this CPU (`Provider.exact_8bit`); if the rule's choice cannot, the other
provider that can is used (and the reason says so). Rules whose provider cannot run the op instance
at all (`Provider.refuses`: the native provider without AVX512-VNNI or AVX-VNNI, or on a 3x3 conv) are skipped.
`QBACKEND_PROVIDER=native|fbgemm|onednn|reference` forces one provider for every op it can run
(for debugging and comparisons); the others follow the rules, and their reason says so.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

import torch

from .cpu import cpu_features
from .rules import choose

KERNEL_PROVIDERS = ("native", "fbgemm", "onednn")
ENV_PROVIDER = "QBACKEND_PROVIDER"


@dataclass(frozen=True)
class Route:
    provider: str
    why: str
    forced: bool = False   # by the config or QBACKEND_PROVIDER: tune mode leaves it alone


def forced_provider() -> str | None:
    value = os.environ.get(ENV_PROVIDER, "").strip()
    if not value:
        return None
    from ..ops.providers import PROVIDERS

    if value not in PROVIDERS:
        raise ValueError(f"{ENV_PROVIDER}={value!r}: choose one of {', '.join(PROVIDERS)}")
    return value


def route_embedding(shape: Mapping, force: str | None = None) -> Route:
    """The embedding provider for a table (shape keys: rows, dim, bits, fp16_qparams, padding_idx):
    the first rule of op "embedding_bag" whose provider can run it here (installed, and taking
    the table's qparams dtype and padding_idx)."""
    from ..ops.embedding import get_embedding_provider

    def refuses(name: str) -> str | None:
        qp = torch.float16 if shape.get("fp16_qparams", 1) else torch.float32
        return get_embedding_provider(name).refuses(qp, shape["bits"], shape["dim"],
                                                    0 if shape.get("padding_idx", 0) else -1)

    if force is not None:
        why = refuses(force)
        if why is not None:
            raise ValueError(f"embedding provider {force!r} (forced) cannot run this table: {why}")
        return Route(force, "forced (config)", forced=True)
    isa = cpu_features().isa_class
    rule = choose("embedding_bag", isa, shape, usable=lambda p: refuses(p) is None)
    return Route(rule.provider, f"rule [{rule.condition}]: {rule.why}")


def route(op: str, shape: Mapping, eight_bit_input: bool = True, force: str | None = None) -> Route:
    """The provider for an op instance. eight_bit_input: its activations use the full uint8/int8
    range (not the 7-bit one), so the provider must be exact for them on this CPU."""
    from ..ops.providers import get_provider

    forced = force or forced_provider()
    prefix = ""
    if forced is not None:
        p = get_provider(forced)
        refusal = p.refuses(op, shape)
        if refusal is None:
            if eight_bit_input and not p.exact_8bit():
                raise ValueError(f"provider {forced!r} (forced) saturates 8-bit activations on this CPU; calibrate "
                                 "with 7-bit activations (reduce_range=True) or force another provider")
            return Route(forced, "forced (" + (f"{ENV_PROVIDER}" if force is None else "config") + ")", forced=True)
        prefix = f"{forced} (forced) cannot run it ({refusal}); "

    def runs(name: str) -> bool:
        return get_provider(name).refuses(op, shape) is None

    rule = choose(op, cpu_features().isa_class, shape, usable=runs)
    if not eight_bit_input or get_provider(rule.provider).exact_8bit():
        return Route(rule.provider, f"{prefix}rule [{rule.condition}]: {rule.why}")
    for other in KERNEL_PROVIDERS:
        if other != rule.provider and runs(other) and get_provider(other).exact_8bit():
            return Route(other, f"{prefix}{rule.provider} (rule [{rule.condition}]) saturates 8-bit activations on this "
                                f"CPU; {other} is exact")
    raise ValueError(f"no provider multiplies 8-bit activations exactly on this CPU ({cpu_features().isa_class}); "
                     "use 7-bit activations (the default observers do so on CPUs without VNNI)")
