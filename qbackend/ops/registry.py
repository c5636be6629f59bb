"""The provider registry: every provider qbackend can run an op instance on, by family, and the one
place every provider name is read from (the router, the rule table's checks, the config checks,
QBACKEND_PROVIDER, the tune cache, the CLI).

Each family's table lives beside its implementations; adding a provider is adding one record there:

  kernel     linear and conv2d (static and dynamic): ops/providers.py PROVIDERS
             (native, fbgemm, onednn, reference)
  embedding  rowwise-quantized embedding lookups: ops/embedding.py EMBEDDING_PROVIDERS
             (builtin, fbgemm, fbgemm_gpu)
  attention  attention cores: ops/attention.py ATTENTION_PROVIDERS (native, sdpa)

Every record has `name`, `routed` (a candidate of the rule table's fallbacks and of tune mode),
`refuses(op, shape) -> str | None` (why it cannot run that op instance on this CPU) and
`exact_8bit(op=None, shape=None)` (whether it multiplies full-range 8-bit activations exactly here:
for that op instance, or for all it runs).
"""
from __future__ import annotations

from typing import Mapping

from .attention import ATTENTION_PROVIDERS
from .embedding import EMBEDDING_PROVIDERS
from .providers import PROVIDERS

FAMILIES: Mapping[str, Mapping] = {"kernel": PROVIDERS, "embedding": EMBEDDING_PROVIDERS,
                                   "attention": ATTENTION_PROVIDERS}
# The op kinds the router routes, and the family of providers that runs each.
OP_FAMILY: Mapping[str, str] = {"linear": "kernel", "conv2d": "kernel", "embedding_bag": "embedding",
                                "attention": "attention"}


def family_of(op: str) -> str:
    if op not in OP_FAMILY:
        raise ValueError(f"no provider runs op {op!r}; routed ops: {', '.join(OP_FAMILY)}")
    return OP_FAMILY[op]


def provider_names(family: str) -> tuple[str, ...]:
    """The names of a family's providers, in registry order."""
    if family not in FAMILIES:
        raise ValueError(f"unknown provider family {family!r}; families: {', '.join(FAMILIES)}")
    return tuple(FAMILIES[family])


def routed_names(family: str) -> tuple[str, ...]:
    """The family's providers that the rule table's fallbacks and tune mode consider, in order."""
    return tuple(name for name, p in FAMILIES[family].items() if p.routed)


def all_names() -> frozenset[str]:
    """Every provider name of every family."""
    return frozenset(name for table in FAMILIES.values() for name in table)


def check_name(name, family: str, what: str, optional: bool = False) -> str:
    """`name` if it names a provider of `family`, else a ValueError naming `what` and the choices
    (optional: None is a choice too, said so in the message; the caller lets None through)."""
    names = provider_names(family)
    if name not in names:
        raise ValueError(f"{what} must be one of {', '.join(names)}{' or None' if optional else ''}, got {name!r}")
    return name


def get(family: str, name: str):
    """The provider record `name` of `family` (ValueError listing the family's names)."""
    table = FAMILIES.get(family)
    if table is None:
        raise ValueError(f"unknown provider family {family!r}; families: {', '.join(FAMILIES)}")
    if name not in table:
        raise ValueError(f"unknown {family} provider {name!r}; choose one of {', '.join(table)}")
    return table[name]


def provider_for(op: str, name: str):
    """The record of provider `name` in the family that runs `op`."""
    return get(family_of(op), name)
