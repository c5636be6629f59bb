"""Peer quantization flows that qbackend is compared against (benchmarks and tests only)."""
