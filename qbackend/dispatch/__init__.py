"""Dispatch: the CPU probe and the rules that route each op instance to a kernel provider."""
from .cpu import CpuFeatures, Feature, cpu_features, fbgemm_isa
from .batch_routes import BatchRoutes, batch_routes
from .router import Route, route

__all__ = ["BatchRoutes", "CpuFeatures", "Feature", "batch_routes", "cpu_features", "fbgemm_isa", "Route", "route"]
