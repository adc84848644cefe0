"""Benchmarking: latency, throughput, start-up time and memory of models run through ferry.

``run_bench(model, BenchSpec(...))`` measures locally and returns the results document
(``ferry.bench.runner``); ``ferry.bench.remote.run_remote`` runs the same on a device where
``ferry agent`` (``ferry.bench.agent``) listens; ``ferry.bench.report`` and ``ferry.bench.plot``
turn results into tables, CSV, an artifact's report and a PNG.
"""

from __future__ import annotations

from ferry.bench.latency import LatencyStats, measure
from ferry.bench.runner import SCHEMA, BenchSpec, run_bench

__all__ = ["SCHEMA", "BenchSpec", "LatencyStats", "measure", "run_bench"]
