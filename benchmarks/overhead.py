"""ferry's per-call overhead: ``Session.run`` against raw ``onnxruntime.InferenceSession.run``.

Both run the same file with the same thread settings in one process. Calls are timed in blocks
(A x block, B x block, B x block, A x block, ...): ORT's worker threads spin after a call and would
steal the cores from the other engine's next call in a call-by-call interleave. Each round gives
one ratio (ferry's mean call time over raw's in that round); the median ratio is the figure.

    python benchmarks/overhead.py [--rounds 200] [--block 20] [--threads N] [--models a,b]

Goal: a median ratio of at most 1.05 on every zoo model at batch 1.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import onnxruntime as ort

import ferry
from ferry import zoo
from ferry.backends._onnxruntime import session_options

GOAL = 1.05


def block_time(fn: Callable[[], object], block: int) -> float:
    """Mean seconds per call over one block of calls."""
    start = time.perf_counter()
    for _ in range(block):
        fn()
    return (time.perf_counter() - start) / block


def compare(
    path: Path, name: str, rounds: int, block: int, threads: int | None
) -> dict[str, float]:
    options = {"threads": threads} if threads else {}
    raw = ort.InferenceSession(
        str(path), session_options(options), providers=["CPUExecutionProvider"]
    )
    session = ferry.load(path, threads=threads)
    feeds = zoo.example_inputs(name, batch=1)

    def run_raw() -> object:
        return raw.run(None, feeds)

    def run_ferry() -> object:
        return session.run(feeds)

    for fn in (run_raw, run_ferry):  # warm up both: first runs allocate arenas
        block_time(fn, block * 5)
    ratios, raw_times, ferry_times = [], [], []
    for i in range(rounds):
        # ABBA order cancels a steady drift (thermal, another process) within the round.
        if i % 2 == 0:
            a = block_time(run_raw, block)
            b = block_time(run_ferry, block)
        else:
            b = block_time(run_ferry, block)
            a = block_time(run_raw, block)
        raw_times.append(a)
        ferry_times.append(b)
        ratios.append(b / a)
    return {
        "raw_us": statistics.median(raw_times) * 1e6,
        "ferry_us": statistics.median(ferry_times) * 1e6,
        "ratio": statistics.median(ratios),
        "ratio_p10": statistics.quantiles(ratios, n=10)[0],
        "ratio_p90": statistics.quantiles(ratios, n=10)[-1],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument(
        "--threads", type=int, default=None, help="intra-op threads (default: ORT's)"
    )
    parser.add_argument("--models", default=",".join(zoo.names()))
    args = parser.parse_args(argv)

    names = [n.strip() for n in args.models.split(",") if n.strip()]
    print(
        f"onnxruntime {ort.__version__}, ferry {ferry.__version__}, threads={args.threads or 'default'}, "
        f"{args.rounds} rounds x {args.block} calls per engine, batch 1, fp32"
    )
    print(
        f"{'model':<20}{'raw ORT us':>12}{'ferry us':>12}{'ratio':>8}{'p10..p90':>14}  goal <= {GOAL}"
    )
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            path = zoo.save(name, tmp, dynamic_batch=True)
            r = compare(path, name, args.rounds, args.block, args.threads)
            worst = max(worst, r["ratio"])
            spread = f"{r['ratio_p10']:.3f}..{r['ratio_p90']:.3f}"
            print(
                f"{name:<20}{r['raw_us']:>12.1f}{r['ferry_us']:>12.1f}{r['ratio']:>8.3f}{spread:>14}"
            )
    verdict = "met" if worst <= GOAL else "NOT met"
    print(f"worst median ratio {worst:.3f}: goal {verdict}")
    return 0 if worst <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
