"""Routes by batch size: the sizes at which a layer's provider is evaluated, and the ranges of
sizes that share a provider.

The rule table ranks providers by shape, and a layer's shape grows with the batch: a conv that is
fastest on the native kernel at batch 1 may be oneDNN's at batch 32. `size_ranges` evaluates a
provider function (routing.py passes the rule table's choice, exactness and refusals included) over
the sizes a layer may see, keyed by the dimension the rules read (conv2d: `n`, the batch; linear:
`m`, the rows = batch x tokens), and returns the sizes as consecutive ranges, each with its
provider. The packed weight holds one packed form per provider in them and picks the range of
each call's size (ops/packed.py).

Sizes are evaluated from 1 up to `upto`: by default 8x the example's size and at least 64 (a
layer converted from batch-8 examples is routed for batches up to 64; beyond, the provider of the
largest evaluated size, so a weight is not packed twice for sizes far from any it was prepared
for). Every size up to DENSE_UPTO is evaluated (every threshold of the rule table lies there),
then 1.5x steps; a range ends at the last evaluated size with its provider, and the last range is
open-ended.
"""
from __future__ import annotations

from typing import Callable, Mapping

from ..core.routes import BatchRoutes

DENSE_UPTO = 256
SIZE_KEYS = {"conv2d": "n", "linear": "m"}
MIN_UPTO, UPTO_FACTOR = 64, 8


def sizes(upto: int) -> tuple[int, ...]:
    """The sizes evaluated up to `upto` (see the module docstring)."""
    out = list(range(1, min(upto, DENSE_UPTO) + 1))
    s = DENSE_UPTO
    while s < upto:
        s = min(upto, int(s * 1.5))
        out.append(s)
    return tuple(out)


def size_ranges(op: str, shape: Mapping, provider_at: Callable[[Mapping], str], upto: int | None = None) -> BatchRoutes:
    """`provider_at(shape at size s)` at every size s of the shape's size key up to `upto`
    (default: max(64, 8 x the shape's own size)), as ranges."""
    if op not in SIZE_KEYS:
        raise ValueError(f"batch routes are defined for {', '.join(SIZE_KEYS)}, not {op!r}")
    key = SIZE_KEYS[op]
    if upto is None:
        upto = max(MIN_UPTO, UPTO_FACTOR * int(shape[key]))
    if upto < 1:
        raise ValueError(f"upto must be a positive size, got {upto}")
    ranges: list[tuple[int | None, str]] = []
    prev_size, prev = None, None
    for size in sizes(upto):
        provider = provider_at({**shape, key: size})
        if prev is not None and provider != prev:
            ranges.append((prev_size, prev))
        prev_size, prev = size, provider
    ranges.append((None, prev))
    return BatchRoutes(key, tuple(ranges))
