"""Benchmarking: latency statistics of models run through ferry."""

from __future__ import annotations

from ferry.bench.latency import LatencyStats, measure

__all__ = ["LatencyStats", "measure"]
