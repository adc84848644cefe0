"""Latency of repeated runs: warm up, time each call, summarize with percentiles."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["DEFAULT_BLOCK", "Contender", "LatencyStats", "interleave", "measure", "summarize_ms"]


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
        figures = summarize_ms(samples_ns, batch)
        ms = figures["latency_ms"]
        return cls(
            iterations=figures["iterations"],
            batch=batch,
            **{f"{key}_ms": ms[key] for key in ("mean", "std", "min", "p50", "p90", "p99", "max")},
            throughput=figures["throughput"] or float("inf"),
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
    _check_limits(iterations, duration_s)
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


def _check_limits(iterations: int | None, duration_s: float | None) -> None:
    if iterations is None and duration_s is None:
        raise ValueError("give iterations, duration_s or both")
    if (iterations is not None and iterations < 1) or (duration_s is not None and duration_s <= 0):
        raise ValueError("iterations and duration_s must be positive")


#: Calls per block when configurations alternate (DESIGN.md, Measuring).
DEFAULT_BLOCK = 10


@dataclasses.dataclass(eq=False)
class Contender:
    """One configuration taking part in :func:`interleave`: what to call, and what it measured.

    Attributes:
        fn: one inference call.
        timing: told ``True`` just before the timed calls of a block and ``False`` after, so a
            per-partition clock counts exactly the calls whose latency is recorded.
        samples_ns: per-call latency of every timed call.
        timed_ns: their sum.
        error: what the call raised, after which the contender left the rotation.
    """

    fn: Callable[[], object]
    timing: Callable[[bool], None] | None = None
    samples_ns: list[int] = dataclasses.field(default_factory=list)
    timed_ns: int = 0
    error: Exception | None = None

    def fraction(self, iterations: int | None, duration_s: float | None) -> float:
        """How far along it is, 0..1: whichever of the two limits comes first."""
        if self.error is not None:
            return 1.0
        done = 0.0
        if iterations is not None:
            done = max(done, len(self.samples_ns) / iterations)
        if duration_s is not None:
            done = max(done, self.timed_ns / 1e9 / duration_s)
        return min(done, 1.0)


def interleave(
    contenders: list[Contender],
    *,
    warmup: int = 10,
    iterations: int | None = 100,
    duration_s: float | None = None,
    block: int = DEFAULT_BLOCK,
    on_progress: Callable[[float], None] | None = None,
) -> None:
    """Time several configurations against each other in alternating blocks of calls.

    Each contender is warmed up (``warmup`` calls), then the contenders take turns, a block of up
    to ``block`` timed calls each, the order reversing every round, until each has ``iterations``
    samples or ``duration_s`` seconds of timed calls (whichever comes first when both are given).
    Every block starts with one untimed call: the previous engine's worker threads spin for a
    while after its last call and steal the cores from the next engine's first call, a cost no
    deployment that runs one engine pays. Separate back-to-back runs would instead let the
    machine's load drift between configurations (DESIGN.md, Measuring).

    A contender whose call raises is taken out of the rotation with ``error`` set; the others go on.
    ``on_progress`` gets the summed fractions done (0..len(contenders)) after every block.
    """
    _check_limits(iterations, duration_s)
    block = max(1, block)
    for c in contenders:
        try:
            for _ in range(warmup):
                c.fn()
        except Exception as e:  # reported per configuration, never fatal to the others
            c.error = e
    clock = time.perf_counter_ns
    rounds = 0
    while True:
        active = [c for c in contenders if c.fraction(iterations, duration_s) < 1.0]
        if not active:
            break
        for c in active if rounds % 2 == 0 else reversed(active):
            try:
                c.fn()  # untimed: absorbs the previous engine's spinning threads
                if c.timing is not None:
                    c.timing(True)
                try:
                    for _ in range(block):
                        if c.fraction(iterations, duration_s) >= 1.0:
                            break
                        start = clock()
                        c.fn()
                        elapsed = clock() - start
                        c.samples_ns.append(elapsed)
                        c.timed_ns += elapsed
                finally:
                    if c.timing is not None:
                        c.timing(False)
            except Exception as e:
                c.error = e
            if on_progress is not None:
                on_progress(sum(x.fraction(iterations, duration_s) for x in contenders))
        rounds += 1


def summarize_ms(samples_ns: list[int] | np.ndarray, batch: int) -> dict[str, Any]:
    """Latency figures in milliseconds for the results document.

    Returns ``latency_ms`` (p50, p90, p99, mean, std, min, max), ``latency_percentiles_ms``
    (p0..p100, 101 values: enough to redraw the distribution), ``iterations`` and
    ``throughput`` (samples per second: batch / mean latency).
    """
    ms = np.asarray(samples_ns, dtype=np.float64) / 1e6
    if ms.size == 0:
        raise ValueError("no samples")
    percentiles = np.percentile(ms, np.arange(101))
    mean = float(ms.mean())
    return {
        "iterations": int(ms.size),
        "latency_ms": {
            "p50": float(percentiles[50]),
            "p90": float(percentiles[90]),
            "p99": float(percentiles[99]),
            "mean": mean,
            "std": float(ms.std()),
            "min": float(ms.min()),
            "max": float(ms.max()),
        },
        "latency_percentiles_ms": [float(v) for v in percentiles],
        "throughput": batch * 1000.0 / mean if mean > 0 else None,
    }
