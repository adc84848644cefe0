"""What every peer worker shares: the job file in, the results file out, peak RSS, and the
figures of one timed generation, computed as ``ferry bench --generate`` computes ferry's.

Each worker runs with its own peer's Python (``.venv-llamacpp/bin/python`` ...), which has no
ferry: this module imports nothing but the standard library.
"""

from __future__ import annotations

import json
import statistics
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

FIGURES = ("ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s")


def peak_rss_mb() -> float | None:
    """This process's resident-set high-water mark in MiB (``VmHWM``; ``ferry.bench``'s way)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


class Runs:
    """The timed generations of one configuration: each run's time to first token, prefill and
    decode tokens/s, summarized as median, min, max."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {k: [] for k in FIGURES}

    def add(self, start: float, stamps: list[float], prompt_tokens: int) -> None:
        """One run: ``start`` before the prompt went in, ``stamps`` as each new token came."""
        first = stamps[0] - start
        self.values["ttft_ms"].append(first * 1000)
        self.values["prefill_tokens_per_s"].append(prompt_tokens / first)
        self.values["decode_tokens_per_s"].append((len(stamps) - 1) / (stamps[-1] - stamps[0]))

    def summary(self) -> dict[str, Any]:
        return {
            k: {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": v}
            for k, v in self.values.items()
        }

    def result(
        self,
        *,
        load_s: float,
        before: float | None,
        prompt_tokens: int,
        new_tokens: int,
        version: str,
    ) -> dict[str, Any]:
        """The worker's answer for a speed job: the summary, load time, memory and counts."""
        return {
            **self.summary(),
            "load_s": load_s,
            "rss_before_load_mb": before,
            "peak_rss_mb": peak_rss_mb(),
            "prompt_tokens": prompt_tokens,
            "new_tokens": new_tokens,
            "version": version,
        }


def main(modes: dict[str, Callable[[dict[str, Any]], dict[str, Any]]]) -> int:
    """``worker.py JOB.json OUT.json``: the job's ``mode`` run on it, its result (or the error,
    one line, with the traceback on stderr) written to OUT.json."""
    job_file, out_file = Path(sys.argv[1]), Path(sys.argv[2])
    job = json.loads(job_file.read_text(encoding="utf-8"))
    try:
        out = modes[job["mode"]](job)
        out.setdefault("error", None)
    except Exception as e:  # reported as the configuration's failure, not a crash
        traceback.print_exc()
        out = {"error": f"{type(e).__name__}: {e}"}
    out_file.write_text(json.dumps(out), encoding="utf-8")
    return 0
