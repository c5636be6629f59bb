"""Routes by batch size: which provider a layer runs on at each batch size it may be called with.

The rule table ranks providers by shape, and a layer's shape grows with the batch: a conv that is
fastest on the native kernel at batch 1 may be oneDNN's at batch 32. `batch_routes` evaluates the
rules (through `route`, so exactness and refusals apply) over the sizes a layer may see, keyed by
the dimension the rules read (conv2d: `n`, the batch; linear: `m`, the rows = batch x tokens), and
returns the sizes as consecutive ranges, each with its provider. The packed weight holds one
packed form per provider in it and picks the range of each call's size (ops/packed.py).

Sizes are evaluated from 1 up to `upto`: by default 8x the example's size and at least 64 (a
layer converted from batch-8 examples is routed for batches up to 64; beyond, the provider of the
largest evaluated size, so a weight is not packed twice for sizes far from any it was prepared
for). Every size up to DENSE_UPTO is evaluated (every threshold of the rule table lies there),
then 1.5x steps; a range ends at the last evaluated size with its provider, and the last range is
open-ended.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

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


@dataclass(frozen=True)
class BatchRoutes:
    """Consecutive size ranges with their providers: ranges[i] = (last size, provider), sizes
    above the previous range's last; the last range's `last` is None (open-ended). `key` is the
    shape key the sizes are of ("n" or "m")."""

    key: str
    ranges: tuple[tuple[int | None, str], ...]

    def __post_init__(self):
        if not self.ranges or self.ranges[-1][0] is not None:
            raise ValueError("BatchRoutes needs ranges ending in an open-ended one")
        lasts = [last for last, _ in self.ranges[:-1]]
        if any(not isinstance(v, int) or v < 1 for v in lasts) or lasts != sorted(set(lasts)):
            raise ValueError(f"BatchRoutes range ends must be increasing positive sizes, got {lasts}")

    @property
    def providers(self) -> tuple[str, ...]:
        """The distinct providers, in range order."""
        seen: list[str] = []
        for _, p in self.ranges:
            if p not in seen:
                seen.append(p)
        return tuple(seen)

    def provider_for(self, size: int) -> str:
        for last, provider in self.ranges:
            if last is None or size <= last:
                return provider
        raise AssertionError("unreachable: the last range is open-ended")

    def describe(self) -> str:
        """e.g. "n <= 4: native; n >= 5: onednn"."""
        parts, first = [], 1
        for last, provider in self.ranges:
            if last is None:
                parts.append(f"{self.key} >= {first}: {provider}")
            elif last == first:
                parts.append(f"{self.key} = {first}: {provider}")
            else:
                parts.append(f"{self.key} {'<= ' + str(last) if first == 1 else f'{first}-{last}'}: {provider}")
            first = (last or 0) + 1
        return "; ".join(parts)

    def to_list(self) -> list[list]:
        return [[last, p] for last, p in self.ranges]

    @classmethod
    def from_list(cls, key: str, ranges) -> "BatchRoutes":
        return cls(key, tuple((None if last is None else int(last), str(p)) for last, p in ranges))


def batch_routes(op: str, shape: Mapping, eight_bit_input: bool = True, upto: int | None = None) -> BatchRoutes:
    """The rule table's provider for `op` at every size of the shape's size key up to `upto`
    (default: max(64, 8 x the shape's own size); see the module docstring), as ranges. Forced
    providers (config, QBACKEND_PROVIDER) are not this function's business: callers route those
    as one."""
    from .router import route

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
        provider = route(op, {**shape, key: size}, eight_bit_input=eight_bit_input, force=None).provider
        if prev is not None and provider != prev:
            ranges.append((prev_size, prev))
        prev_size, prev = size, provider
    ranges.append((None, prev))
    return BatchRoutes(key, tuple(ranges))
