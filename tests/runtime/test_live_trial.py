"""Trials on real calls (``ferry.runtime._live_trial``): each call answered by ONNX Runtime and
run on one contender in turn, timed as a pair; the paired ratio decides.

Sessions here are stand-ins with a ``plan`` and a ``run``; the timer is replaced, so the times
each side takes are known.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import numpy as np
import pytest

from ferry.parity import DEFAULT_BUDGET
from ferry.runtime import _live_trial
from ferry.runtime._live_trial import (
    MAX_TRIAL_PAIRS,
    MIN_TRIAL_PAIRS,
    Contender,
    Trial,
    paired_verdict,
)


@dataclasses.dataclass
class _Plan:
    partitions: tuple[Any, ...]
    backends: list[str]


class _Stub:
    """A session answering ``x * scale`` (or raising), its cost in ms, its plan."""

    def __init__(self, ms: float, parts: int = 1, scale: float = 1.0, fails: bool = False):
        self.ms, self.scale, self.fails, self.calls = ms, scale, fails, 0
        self.plan = _Plan(tuple(range(parts)), ["onnxruntime" if ms < 0 else "engine"])

    def run(self, inputs: Any, outputs: Any = None) -> dict[str, np.ndarray]:
        self.calls += 1
        if self.fails:
            raise RuntimeError("engine fell over\ndetails")
        return {"y": inputs["x"] * self.scale}


def _timer(load: list[float]) -> Any:
    """Each call's cost times the machine's load at that call (the same for both of a pair)."""

    def fake(session: Any, inputs: Any, outputs: Any) -> tuple[Any, float]:
        return session.run(inputs, outputs), session.ms * load[0]

    return fake


X = {"x": np.linspace(1, 2, 64, dtype=np.float32).reshape(1, 64)}


def _contender(session: _Stub, label: str = "engine") -> Contender:
    return Contender(label, session.plan, session)  # type: ignore[arg-type]


def test_paired_verdicts() -> None:
    assert paired_verdict([0.5] * (MIN_TRIAL_PAIRS - 1)) is None
    assert paired_verdict([0.5] * MIN_TRIAL_PAIRS) == "pays"
    assert paired_verdict([1.0] * MIN_TRIAL_PAIRS) == "slower"
    assert paired_verdict([1.4] * MIN_TRIAL_PAIRS) == "slower"
    wobble = [0.97, 1.01, 0.95, 1.02, 0.99, 0.96, 1.03, 0.98]
    assert paired_verdict(wobble) is None  # within the noise: keep trying
    assert paired_verdict((wobble * 4)[:MAX_TRIAL_PAIRS]) == "tie"


def test_a_paired_trial_decides_right_on_a_machine_whose_load_swings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The load changes 3x from call to call (a server's other instance, a test run beside it):
    times taken apart rank by the load, the pairs still see the plan 0.6x ONNX Runtime."""
    load = [1.0]
    monkeypatch.setattr(_live_trial, "_timed", _timer(load))
    base, fast = _Stub(10.0), _Stub(6.0)
    trial = Trial([_contender(fast)], DEFAULT_BUDGET)
    swings = random.Random(0)
    while not trial.decided():
        load[0] = swings.uniform(1.0, 3.0)
        np.testing.assert_array_equal(trial.run(base, X, None)["y"], X["x"])  # its answer
    (c,) = trial.contenders
    assert c.verdict == "pays" and c.speedup == pytest.approx(10 / 6)
    assert len(c.ratios) == MIN_TRIAL_PAIRS and trial.winner() is c
    assert max(c.plan_ms) > min(c.alone_ms)  # apart, the times overlap


def test_a_contender_that_fails_or_answers_wrong_leaves_and_the_call_is_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_live_trial, "_timed", _timer([1.0]))
    base = _Stub(10.0)
    broken, wrong = _Stub(1.0, fails=True), _Stub(1.0, scale=-1.0)
    trial = Trial([_contender(broken, "broken"), _contender(wrong, "wrong")], DEFAULT_BUDGET)
    for _ in range(2):
        np.testing.assert_array_equal(trial.run(base, X, None)["y"], X["x"])
    assert trial.decided() and trial.winner() is None
    assert broken.calls == 1 and wrong.calls == 1  # each left on its first call
    words = [c.describe() for c in trial.contenders]
    assert words[0] == "broken: failed on a call: engine fell over"
    assert words[1].startswith("wrong: answered outside the accuracy budget")
    np.testing.assert_array_equal(trial.run(base, X, None)["y"], X["x"])  # decided: base only
    assert broken.calls == 1 and wrong.calls == 1


def test_the_fewest_partitions_win_a_tie_between_contenders(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    load = [1.0]
    monkeypatch.setattr(_live_trial, "_timed", _timer(load))
    base = _Stub(10.0)
    split, whole = _Stub(5.0, parts=5), _Stub(5.05, parts=1)
    trial = Trial([_contender(split, "split"), _contender(whole, "whole")], DEFAULT_BUDGET)
    jitter = random.Random(1)
    while not trial.decided():
        load[0] = jitter.uniform(0.98, 1.02)
        trial.run(base, X, None)
    assert trial.winner() is trial.contenders[1]
    clear = Trial([_contender(_Stub(3.0, parts=5)), _contender(_Stub(5.0))], DEFAULT_BUDGET)
    while not clear.decided():
        clear.run(base, X, None)
    assert clear.winner() is clear.contenders[0]  # clearly faster: the split is worth it
