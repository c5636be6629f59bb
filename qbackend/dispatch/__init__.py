"""Dispatch: which provider runs each op instance, decided in one call.

  cpu.py           what this CPU can do (the probe, QBACKEND_ISA), and its class in the rule table
  rules.py         the rule table: rows of (op, CPU classes, condition, provider, evidence), as data
  routing.py       route(op, shape, ...) -> Route: forced providers, the rules, exactness, tune
                   mode and batch ranges; every caller routes through it
  batch_routes.py  the sizes a layer is routed at, and their ranges
  tuner.py         tune mode: timing candidates on the layer (tune_cache.py: the on-disk cache)
"""
from ..core.routes import BatchRoutes, Route
from .cpu import ISA_CLASSES, CpuFeatures, Feature, cpu_features, fbgemm_isa
from .routing import ENV_PROVIDER, env_forced, exact_route_exists, fusion_route, noting_seven_bit_weights, route, \
    seven_bit_speedup, seven_bit_weights
from .tuner import TuneOptions, TuneRequest

__all__ = ["BatchRoutes", "CpuFeatures", "ENV_PROVIDER", "exact_route_exists", "Feature", "fusion_route", "ISA_CLASSES",
           "Route", "TuneOptions", "TuneRequest", "cpu_features", "env_forced", "fbgemm_isa", "route",
           "noting_seven_bit_weights", "seven_bit_speedup", "seven_bit_weights"]
