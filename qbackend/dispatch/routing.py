"""The routing decision, in one call: `route(op, shape, ...)` returns the typed `Route` of one op
instance (which provider runs it, decided how, why, and by batch size where that changes it).

Every caller routes through it: building a layer (lowering), re-routing a loaded model
(serialization's rebind), the LSTM's products, embedding tables, attention cores and
`qbackend info`. In order:

1. Forced: the config's provider (`forced`) or, for linear and conv2d without one,
   QBACKEND_PROVIDER. It is used when it can run the op instance; a kernel provider that cannot
   falls back to the rules (the reason says so), an embedding or attention provider raises.
   Forced 8-bit activations on a provider that would saturate them raise.
2. Rules: the first row of the rule table (rules.py) for the op on this CPU's class whose
   condition holds and whose provider can run the op instance (`refuses`) and is not excluded.
   Correctness then applies: full-range 8-bit activations (`eight_bit_input`) need a provider that
   multiplies them exactly on this CPU; if the rule's cannot, the first routed provider of the
   registry that can is used. Without a matching row, the first routed provider that can run it.
3. Tune (`tune`, a TuneRequest): the routed providers that can run it exactly are timed on the
   layer (tuner.tune_route) and the fastest wins, unless forced.
4. By batch (`by_batch`, linear and conv2d, not forced or tuned): the rules at every size the
   layer may be called with (batch_routes.py); ranges are kept where the provider changes.

`fusion_route(chain)` is the route of every layer of a fused chain (the fusion table, rules.FUSIONS):
one provider for all of them, at every size, or None where the table lists the chain for no row of
this CPU's class (or QBACKEND_PROVIDER forces a provider): the layers are then routed one by one.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Mapping

from ..core.routes import FORCED, RULE, TUNED, Route
from ..ops import registry
from .batch_routes import SIZE_KEYS, size_ranges
from .cpu import CpuFeatures, cpu_features
from .rules import Rule, SevenBitRow, choose, fusion, seven_bit_pays, seven_bit_weights_pay
from .tuner import TuneRequest, tune_route

ENV_PROVIDER = "QBACKEND_PROVIDER"


def env_forced() -> str | None:
    """The kernel provider QBACKEND_PROVIDER forces, or None (ValueError on an unknown name)."""
    value = os.environ.get(ENV_PROVIDER, "").strip()
    if not value:
        return None
    return registry.check_name(value, "kernel", ENV_PROVIDER)


def _cpu_facts(op: str, shape: Mapping, cpu: CpuFeatures) -> Mapping:
    """The shape, plus the CPU's measured facts for ops whose rows depend on them."""
    if op == "attention":
        return {**shape, "bf16_products_pay": int(cpu.bf16_products_pay)}
    return shape


def _runs(family: str, name: str, op: str, shape: Mapping, exclude: frozenset) -> bool:
    """Whether provider `name` may run the op instance: not excluded, and it does not refuse it."""
    return name not in exclude and registry.get(family, name).refuses(op, shape) is None


def _rule_choice(op: str, shape: Mapping, eight_bit_input: bool, exclude: frozenset,
                 cpu: CpuFeatures) -> tuple[Rule | None, str | None]:
    """Step 2 of the module docstring without its messages: (the rule row that applies, or None;
    the provider that runs the op instance, or None when none can)."""
    family = registry.family_of(op)

    def runs(name: str) -> bool:
        return _runs(family, name, op, shape, exclude)

    def exact(name: str) -> bool:
        return not eight_bit_input or registry.get(family, name).exact_8bit(op, shape)

    rule: Rule | None = choose(op, cpu.isa_class, _cpu_facts(op, shape, cpu), usable=runs, missing_ok=True)
    if rule is not None and exact(rule.provider):
        return rule, rule.provider
    return rule, next((other for other in registry.routed_names(family) if runs(other) and exact(other)), None)


def _rule_provider(op: str, shape: Mapping, eight_bit_input: bool, exclude: frozenset, cpu: CpuFeatures) -> str:
    """The provider step 2 routes the op instance to (the error _rule_route raises if none)."""
    provider = _rule_choice(op, shape, eight_bit_input, exclude, cpu)[1]
    return provider if provider is not None else _rule_route(op, shape, eight_bit_input, exclude, cpu).provider


def _rule_route(op: str, shape: Mapping, eight_bit_input: bool, exclude: frozenset, cpu: CpuFeatures,
                prefix: str = "") -> Route:
    """Step 2 of the module docstring: the rule table, then correctness."""
    family = registry.family_of(op)
    rule, provider = _rule_choice(op, shape, eight_bit_input, exclude, cpu)
    if provider is not None:
        if rule is not None and provider == rule.provider:
            return Route(rule.provider, RULE, f"{prefix}rule [{rule.condition}]: {rule.reason}", rule=rule.condition)
        if rule is None:
            return Route(provider, RULE, f"{prefix}no rule row applies; {provider} runs it", rule=None)
        return Route(provider, RULE, f"{prefix}{rule.provider} (rule [{rule.condition}]) saturates 8-bit "
                                     f"activations on this CPU; {provider} is exact", rule=rule.condition)
    if eight_bit_input and (rule is not None or any(_runs(family, p, op, shape, exclude)
                                                    for p in registry.routed_names(family))):
        raise ValueError(f"no provider multiplies 8-bit activations exactly on this CPU ({cpu.isa_class}); "
                         f"for this {op} ({dict(shape)}); use 7-bit activations (reduce_range=True in the "
                         "activation observers)")
    reasons = "; ".join(f"{name}: {'excluded' if name in exclude else registry.get(family, name).refuses(op, shape)}"
                        for name in registry.routed_names(family))
    raise ValueError(f"no provider can run this {op} here ({dict(shape)}): {reasons}")


def exact_route_exists(op: str, shape: Mapping, forced: str | None = None) -> bool:
    """Whether some routed provider (the forced one, where it can run the instance) runs this op
    instance with full-range 8-bit activations exactly on this CPU (else its input needs 7 bits:
    prepare observes it so, serialization's rebind requantizes it). Without `forced`, the provider
    QBACKEND_PROVIDER forces, as route() would use it."""
    family = registry.family_of(op)
    if forced is None and family == "kernel":
        forced = env_forced()
    if forced is not None and forced in registry.routed_names(family) \
            and registry.get(family, forced).refuses(op, shape) is None:
        return bool(registry.get(family, forced).exact_8bit(op, shape))
    return any(registry.get(family, p).refuses(op, shape) is None and registry.get(family, p).exact_8bit(op, shape)
               for p in registry.routed_names(family))


def seven_bit_speedup(op: str, shape: Mapping, forced: str | None = None,
                      cpu: CpuFeatures | None = None) -> SevenBitRow | None:
    """The 7-bit table's row (rules.SEVEN_BIT) for a static layer on this CPU: its 7-bit route is
    measured more than X_7BIT times its exact 8-bit one; None where 8 bits cost no speed, or where
    the config (`forced`) or QBACKEND_PROVIDER forces a provider (which the table does not describe)."""
    if forced is not None or env_forced() is not None:
        return None
    return seven_bit_pays(op, (cpu if cpu is not None else cpu_features()).isa_class, shape)


def seven_bit_weights(op: str, shape: Mapping, r: Route, cpu: CpuFeatures | None = None) -> SevenBitRow | None:
    """The 7-bit weight table's row (rules.SEVEN_BIT_WEIGHTS) for a static layer routed `r` on this
    CPU: where the native provider runs it at every call size and its pair-product kernel pays;
    None where the layer keeps 8-bit weights (another provider, a forced or tuned route)."""
    if r.source != RULE or r.provider != "native":
        return None
    if r.batch_routes is not None and any(p != "native" for _, p in r.batch_routes.ranges):
        return None
    return seven_bit_weights_pay(op, (cpu if cpu is not None else cpu_features()).isa_class, shape)


def noting_seven_bit_weights(r: Route, row: SevenBitRow) -> Route:
    """`r` with its layer's 7-bit weights (the table's row `row`) said in its why."""
    return dataclasses.replace(r, why=f"{r.why}; 7-bit weights: {row.describe}")


def route(op: str, shape: Mapping, *, eight_bit_input: bool = True, forced: str | None = None,
          by_batch: bool = False, tune: TuneRequest | None = None, exclude=(), cpu: CpuFeatures | None = None) -> Route:
    """The route of one op instance (see the module docstring).

    op: "linear" (static or dynamic), "conv2d", "embedding_bag" or "attention"; shape: the keys
    the rule conditions read (rules.py); eight_bit_input: its activations use the full 8-bit
    range (not the 7-bit one); forced: a provider name from the config; by_batch: also route by
    call size; tune: time the candidates instead of trusting the rules; exclude: providers not to
    use (one that refused to pack the layer); cpu: whose rule-table column to read (default this
    machine's; whether a provider can run the op is always this process's)."""
    family = registry.family_of(op)
    cpu = cpu if cpu is not None else cpu_features()
    exclude = frozenset(exclude)
    source = "config"
    if forced is None and family == "kernel":
        forced, source = env_forced(), ENV_PROVIDER
    prefix = ""
    if forced is not None:
        provider = registry.get(family, forced)
        refusal = provider.refuses(op, shape)
        if refusal is None:
            if eight_bit_input and not provider.exact_8bit(op, shape):
                raise ValueError(f"provider {forced!r} (forced) saturates 8-bit activations on this CPU; calibrate "
                                 "with 7-bit activations (reduce_range=True) or force another provider")
            return Route(forced, FORCED, f"forced ({source})")
        if family != "kernel":
            what = "table" if family == "embedding" else op
            raise ValueError(f"{family} provider {forced!r} (forced) cannot run this {what}: {refusal}")
        prefix = f"{forced} (forced) cannot run it ({refusal}); "
    chosen = _rule_route(op, shape, eight_bit_input, exclude, cpu, prefix)
    if tune is not None:
        candidates = [p for p in registry.routed_names(family) if p not in exclude
                      and (not eight_bit_input or registry.get(family, p).exact_8bit(op, shape))
                      and registry.get(family, p).refuses(op, shape) is None]
        if len(candidates) < 2:  # nothing to choose between: the rule's route, saying so
            only = f"only {candidates[0]} runs" if candidates else "no provider runs"
            exactly = " with 8-bit activations exactly" if eight_bit_input else ""
            return dataclasses.replace(chosen, why=f"{chosen.why}; not tuned: {only} it{exactly} here")
        provider, why = tune_route(tune, candidates, rule_provider=chosen.provider)
        return Route(provider, TUNED, why)
    if by_batch and op in SIZE_KEYS:
        ranges = size_ranges(op, shape, lambda s: _rule_provider(op, s, eight_bit_input, exclude, cpu))
        if len(ranges.providers) > 1:
            return Route(chosen.provider, chosen.source, chosen.why, chosen.rule, ranges)
    return chosen


def fusion_route(chain: str, cpu: CpuFeatures | None = None) -> Route | None:
    """The route of each layer of a fused `chain` ("inverted_residual") on this CPU, or None (see
    the module docstring)."""
    if env_forced() is not None:
        return None
    row = fusion(chain, (cpu if cpu is not None else cpu_features()).isa_class)
    if row is None:
        return None
    return Route(row.provider, RULE, f"fused into one native call with its block: {row.describe}",
                 rule=f"fusion {chain}")
