"""Latency of repeated runs: warm up, time each call, summarize with percentiles."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["LatencyStats", "measure"]


@dataclasses.dataclass(frozen=True)
class LatencyStats:
    """Per-call latency in milliseconds over ``iterations`` timed calls of batch ``batch``."""

    iterations: int
    batch: int
    mean_ms: float
    std_ms: float
    min_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    #: Samples per second: batch / mean latency.
    throughput: float

    @classmethod
    def from_samples(cls, samples_ns: np.ndarray, batch: int = 1) -> LatencyStats:
        ms = samples_ns.astype(np.float64) / 1e6
        p50, p90, p99 = np.percentile(ms, [50, 90, 99])
        mean = float(ms.mean())
        return cls(
            iterations=len(ms),
            batch=batch,
            mean_ms=mean,
            std_ms=float(ms.std()),
            min_ms=float(ms.min()),
            p50_ms=float(p50),
            p90_ms=float(p90),
            p99_ms=float(p99),
            max_ms=float(ms.max()),
            throughput=batch * 1000.0 / mean if mean > 0 else float("inf"),
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def measure(
    fn: Callable[[], object],
    *,
    warmup: int = 10,
    iterations: int | None = 100,
    duration_s: float | None = None,
    batch: int = 1,
    on_progress: Callable[[int], None] | None = None,
) -> LatencyStats:
    """Call ``fn`` ``warmup`` times untimed, then time each call.

    Stops after ``iterations`` calls, or after ``duration_s`` seconds when that is given (whichever
    comes first when both are).
    """
    if iterations is None and duration_s is None:
        raise ValueError("give iterations, duration_s or both")
    if (iterations is not None and iterations < 1) or (duration_s is not None and duration_s <= 0):
        raise ValueError("iterations and duration_s must be positive")
    for _ in range(warmup):
        fn()
    clock = time.perf_counter_ns
    deadline = clock() + int(duration_s * 1e9) if duration_s is not None else None
    limit = iterations if iterations is not None else 1 << 62
    samples: list[int] = []
    while len(samples) < limit:
        start = clock()
        fn()
        end = clock()
        samples.append(end - start)
        if on_progress is not None:
            on_progress(len(samples))
        if deadline is not None and end >= deadline:
            break
    return LatencyStats.from_samples(np.asarray(samples), batch)
