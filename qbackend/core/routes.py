"""The typed result of a routing decision: `Route` (which provider runs an op instance, decided
how and why) and `BatchRoutes` (the providers of one layer by the size of each call).

Made by qbackend.dispatch.route, held by the packed weights (qbackend.ops.packed) and by the layer
records; a leaf module, so every layer above can name the types."""
from __future__ import annotations

from dataclasses import dataclass

# How a route was decided.
RULE, TUNED, FORCED = "rule", "tuned", "forced"
SOURCES = (RULE, TUNED, FORCED)


@dataclass(frozen=True)
class BatchRoutes:
    """Consecutive size ranges with their providers: ranges[i] = (last size, provider), sizes
    above the previous range's last; the last range's `last` is None (open-ended). `key` is the
    shape key the sizes are of ("n", the batch of a conv2d; "m", the rows of a linear)."""

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


@dataclass(frozen=True)
class Route:
    """Where one op instance runs.

    provider: the provider's name (a key of the registry, qbackend.ops.registry);
    source: RULE (the rule table), TUNED (timed on the layer) or FORCED (the config or
    QBACKEND_PROVIDER); rule: the rendered condition of the rule row that chose it (None unless
    source is RULE); why: one line saying why (the rule's evidence, the timings, or the force and
    what overrode the rules' choice); batch_routes: the providers by call size where they differ
    (None: one provider for every size)."""

    provider: str
    source: str
    why: str
    rule: str | None = None
    batch_routes: BatchRoutes | None = None

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"Route.source must be one of {', '.join(SOURCES)}, got {self.source!r}")

    @property
    def forced(self) -> bool:
        return self.source == FORCED

    def describe(self) -> str:
        """why, with the batch ranges when there are several providers."""
        return self.why if self.batch_routes is None else f"{self.why}; by batch size: {self.batch_routes.describe()}"
