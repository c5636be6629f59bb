"""Observers: calibration statistics -> quantization parameters.

Every observer has update(x) (returns x), compute_qparams() -> QParams, state_dict() /
load_state_dict() / from_state_dict(), merge(other) and reset(); the shared policies (NaN/inf,
empty tensors, no data, merge compatibility) are documented in qbackend.observers.base, the
qparams rule (0 in range, symmetric zero points, degenerate ranges, reduce_range) in
qbackend.observers.qparams.

  MinMaxObserver, MovingAverageMinMaxObserver, PerChannelMinMaxObserver   (minmax.py)
  HistogramObserver  L2-minimising range search, as torch.ao's            (histogram.py)
  PercentileObserver                                                      (percentile.py)
  MSEObserver        round-trip MSE over shrunk candidate ranges          (mse.py)
  BestRangeObserver  the lower-L2 of the two searches above               (best_range.py)

The hot loops (one-pass finite min/max, histogram accumulation, range search, error model) are
C++ ops in torch.ops.qbackend (csrc/ops/observer_ops.cpp).
"""
from .base import NONFINITE_POLICIES, OBSERVER_CLASSES, NonFiniteWarning, Observer, ObserverError
from .histogram import HistogramObserver
from .minmax import MinMaxObserver, MovingAverageMinMaxObserver, PerChannelMinMaxObserver
from .mse import MSEObserver
from .best_range import BestRangeObserver
from .percentile import PercentileObserver
from .qparams import QParams, choose_qparams, default_reduce_range, qrange

__all__ = ["Observer", "ObserverError", "NonFiniteWarning", "NONFINITE_POLICIES", "QParams", "choose_qparams",
           "default_reduce_range", "qrange", "MinMaxObserver", "MovingAverageMinMaxObserver",
           "PerChannelMinMaxObserver", "HistogramObserver", "PercentileObserver", "MSEObserver", "BestRangeObserver",
           "OBSERVER_CLASSES"]
