"""One drawing interface for the fuzzers' case generators, backed by a seeded random.Random (the
tools' long runs: a case is a pure function of (seed, index)) or by hypothesis (the tests:
derandomized, shrinkable)."""
from __future__ import annotations

import math
import random

from hypothesis import strategies as st


class RandomDraw:
    """Draws from random.Random(seed)."""

    def __init__(self, seed):
        self.rng = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def choice(self, seq):
        return seq[self.rng.randrange(len(seq))]

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def log_uniform(self, lo: float, hi: float) -> float:
        return 10 ** self.rng.uniform(math.log10(lo), math.log10(hi))


class HypothesisDraw:
    """Draws through hypothesis' `data.draw` (st.data())."""

    def __init__(self, data):
        self.data = data

    def integer(self, lo: int, hi: int) -> int:
        return self.data.draw(st.integers(lo, hi))

    def choice(self, seq):
        return seq[self.data.draw(st.integers(0, len(seq) - 1))]

    def chance(self, p: float) -> bool:
        return self.data.draw(st.integers(0, 999)) < int(p * 1000)

    def log_uniform(self, lo: float, hi: float) -> float:
        return 10 ** self.data.draw(st.floats(math.log10(lo), math.log10(hi)))
