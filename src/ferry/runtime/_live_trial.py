"""Trials on real calls: a live session's candidate plans for one bucket of input sizes, each
run beside ONNX Runtime on the calls that bucket serves, timed in pairs and judged, until the
paired ratios say whether one pays.

Timing a candidate in a background thread while the session serves (a server's other instance,
the caller's next calls) measures the contention, not the plan: on two cores the learner saw
ONNX Runtime at 66 ms and OpenVINO at 92.6 ms where a quiet run gives 43 and 51.7, and kept the
wrong engine. A pair of runs of the same call, back to back in the caller's thread (their order
alternating, each after this process's engine threads went quiet), sees the same load on both
sides, so the ratio of the two holds where either time alone does not. The call's answer is always ONNX Runtime's; the candidate's answer is judged
against it on every trial call, so a trial never answers from an unchecked plan.

Before -> After::

    bucket input1=1x1x64x160: calls answered by ONNX Runtime alone
    -> trial: each call runs ONNX Runtime (the answer) and one candidate in turn (timed, judged)
    -> openvino: median 0.52x ONNX Runtime's time over 6 pairs (spread 3%) -> the bucket switches
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ferry.parity import Budget, within_budget
from ferry.plan import Plan
from ferry.runtime._measure import wait_quiet
from ferry.runtime._session import Session

__all__ = ["MAX_TRIAL_PAIRS", "MIN_TRIAL_PAIRS", "Contender", "Trial", "paired_verdict"]

#: Pairs a contender needs before its verdict (the median of fewer says little).
MIN_TRIAL_PAIRS = 5
#: Pairs after which a contender still within the noise is a tie (ONNX Runtime keeps the bucket).
MAX_TRIAL_PAIRS = 24
#: Calls cheaper than this (ms, ONNX Runtime's last time) are led by an untimed call on each side.
LEAD_BELOW_MS = 25.0
#: The least gain worth a switch: a plan must be faster than ONNX Runtime by more than this.
GAIN_FLOOR = 0.01


def paired_verdict(ratios: Sequence[float]) -> str | None:
    """``"pays"``, ``"slower"`` (not faster by more than :data:`GAIN_FLOOR`) or ``"tie"`` (still
    within the noise after :data:`MAX_TRIAL_PAIRS`) for the paired ratios ``plan_ms / alone_ms``;
    None while undecided. The median's standard error is estimated from the median absolute
    deviation (robust to the odd call a busy machine stretches); a verdict needs the median two
    standard errors clear of the floor."""
    n = len(ratios)
    if n < MIN_TRIAL_PAIRS:
        return None
    median = statistics.median(ratios)
    mad = statistics.median(abs(r - median) for r in ratios) * 1.4826
    error = 1.253 * mad / math.sqrt(n)
    bar = 1.0 / (1.0 + GAIN_FLOOR)
    if median + 2 * error < bar:
        return "pays"
    if median - 2 * error > bar:
        return "slower"
    return "tie" if n >= MAX_TRIAL_PAIRS else None


@dataclasses.dataclass
class Contender:
    """One candidate plan on trial: its session, the pairs timed, and why it left, if it did."""

    label: str
    plan: Plan
    session: Session
    ratios: list[float] = dataclasses.field(default_factory=list)
    plan_ms: list[float] = dataclasses.field(default_factory=list)
    alone_ms: list[float] = dataclasses.field(default_factory=list)
    error: str | None = None

    @property
    def verdict(self) -> str | None:
        """``"failed"`` (an error or a wrong answer), else :func:`paired_verdict`."""
        return "failed" if self.error is not None else paired_verdict(self.ratios)

    @property
    def speedup(self) -> float | None:
        """ONNX Runtime's time over the plan's, the median of the pairs."""
        return 1.0 / statistics.median(self.ratios) if self.ratios else None

    def medians(self) -> tuple[float | None, float | None]:
        """The plan's and ONNX Runtime's median ms over the pairs."""
        if not self.ratios:
            return None, None
        return statistics.median(self.plan_ms), statistics.median(self.alone_ms)

    def describe(self) -> str:
        if self.error is not None:
            return f"{self.label}: {self.error}"
        plan_ms, alone_ms = self.medians()
        if plan_ms is None or alone_ms is None:
            return f"{self.label}: not timed"
        return (
            f"{self.label}: {plan_ms:.3g} ms vs ONNX Runtime {alone_ms:.3g} ms over "
            f"{len(self.ratios)} calls ({self.speedup:.2f}x)"
        )


class Trial:
    """The contenders of one bucket, tried in turn on its calls (see the module's text).

    Args:
        contenders: the candidate plans, each already judged on the bucket's first call.
        budget: the accuracy budget their answers are judged by against ONNX Runtime's.
    """

    def __init__(self, contenders: Sequence[Contender], budget: Budget) -> None:
        self.contenders = list(contenders)
        self.budget = budget
        self.calls = 0
        self._lock = threading.Lock()

    def run(
        self,
        base: Session,
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | None,
    ) -> dict[str, np.ndarray]:
        """Answer the call on ``base`` (ONNX Runtime) and run the next undecided contender on it
        too, timed in a pair and judged; a contender that fails or answers outside the budget
        leaves the trial. The caller's errors (bad inputs) are raised by ``base`` as usual."""
        with self._lock:
            contender = self._next()
            self.calls += 1
            base_first = self.calls % 2 == 1
        if contender is None:
            return base.run(inputs, outputs)
        answer: dict[str, np.ndarray] | None = None
        alone_ms = 0.0
        # A cheap call is led by an untimed one (see _prepared); what counts is its last time.
        lead = bool(contender.alone_ms) and contender.alone_ms[-1] < LEAD_BELOW_MS
        if base_first:
            _prepared(base, inputs, outputs, lead)
            answer, alone_ms = _timed(base, inputs, outputs)
        try:
            _prepared(contender.session, inputs, outputs, lead)
            got, plan_ms = _timed(contender.session, inputs, outputs)
        except Exception as e:  # the contender's failure is its own, never the call's
            first = str(e).splitlines()[0] if str(e) else repr(e)
            with self._lock:
                contender.error = f"failed on a call: {first}"
            return answer if answer is not None else base.run(inputs, outputs)
        if answer is None:
            _prepared(base, inputs, outputs, lead)
            answer, alone_ms = _timed(base, inputs, outputs)
        judged = within_budget(got, answer, self.budget)
        with self._lock:
            if not judged.passed:
                contender.error = f"answered outside the accuracy budget ({judged.summary()})"
            else:
                contender.ratios.append(plan_ms / alone_ms if alone_ms > 0 else 1.0)
                contender.plan_ms.append(plan_ms)
                contender.alone_ms.append(alone_ms)
        return answer

    def decided(self) -> bool:
        """Every contender has its verdict."""
        with self._lock:
            return all(c.verdict is not None for c in self.contenders)

    def winner(self) -> Contender | None:
        """The contender that pays most (the fewest partitions among those within the noise of
        it); None when none pays."""
        paying = [c for c in self.contenders if c.verdict == "pays"]
        if not paying:
            return None
        best = min(paying, key=lambda c: statistics.median(c.ratios))
        fewest = min(paying, key=lambda c: (len(c.plan.partitions), statistics.median(c.ratios)))
        if fewest is not best and paired_verdict(_quotients(best, fewest)) != "pays":
            return fewest  # not clearly slower than the best: a boundary costs on other calls
        return best

    def _next(self) -> Contender | None:
        undecided = [c for c in self.contenders if c.verdict is None]
        if not undecided:
            return None
        return undecided[self.calls % len(undecided)]


def _prepared(
    session: Session, inputs: Mapping[str, Any], outputs: Sequence[str] | None, lead: bool
) -> None:
    """Ready ``session`` for its timed run: wait until this process's engine threads are quiet
    (ONNX Runtime's pool spins for ~40 ms after a call: the other half of a pair run inside that
    window measured the spin, OpenVINO at 0.6x where it runs 1.4x ONNX Runtime), then, for a
    cheap call, run it once untimed (an engine called after a pause first wakes its threads: a
    3 ms MiniLM on OpenVINO measured 0.94x ONNX Runtime cold, 1.1x warm)."""
    wait_quiet()
    if lead:
        session.run(inputs, outputs)


def _timed(
    session: Session, inputs: Mapping[str, Any], outputs: Sequence[str] | None
) -> tuple[dict[str, np.ndarray], float]:
    start = time.perf_counter()
    result = session.run(inputs, outputs)
    return result, (time.perf_counter() - start) * 1e3


def _quotients(best: Contender, other: Contender) -> list[float]:
    """``best``'s median ratio over each of ``other``'s: below 1 where best is the faster."""
    reference = statistics.median(best.ratios)
    return [reference / r for r in other.ratios if r > 0]
