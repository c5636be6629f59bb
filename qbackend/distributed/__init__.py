"""Calibration across processes and machines: each rank calibrates its own shard of the data, and
`reduce_statistics` (reduce.py) leaves every rank holding the statistics one process would have
after calibrating on all the shards, so that converting on any rank gives the same model, bit for
bit. The public entry points are `qbackend.reduce_calibration` (a prepared model),
`qbackend.quantize(..., distributed=True)` and `qbackend.quantize_llm(..., distributed=True)` (a
decoder LLM's GPTQ statistics).

  collectives.py   the gloo collectives, bounded in time, failures naming the rank
  fingerprint.py   digests of model, weights and configuration, compared before anything moves
  statistics.py    per kind of statistic: what is sent, what is summed, how states merge
  wire.py          states as bytes (JSON and raw tensors; no pickle)
  reduce.py        the reduction's steps
"""
from .collectives import DistributedCalibrationError
from .fingerprint import model_identity
from .reduce import DEFAULT_TIMEOUT, PartialReductionError, RankWithoutDataWarning, ReductionReport, reduce_statistics

__all__ = ["DistributedCalibrationError", "PartialReductionError", "RankWithoutDataWarning", "ReductionReport",
           "reduce_statistics", "DEFAULT_TIMEOUT", "model_identity"]
