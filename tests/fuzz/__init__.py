"""Differential fuzzers: op calls and small models drawn at random, checked against fp64 references
(ops) and FP32 / compiled / reloaded runs (models)."""
