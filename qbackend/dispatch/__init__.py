"""Dispatch: the CPU probe and the rules that route each op instance to a kernel provider."""
from .cpu import CpuFeatures, Feature, cpu_features, fbgemm_isa
from .router import Route, route

__all__ = ["CpuFeatures", "Feature", "cpu_features", "fbgemm_isa", "Route", "route"]
