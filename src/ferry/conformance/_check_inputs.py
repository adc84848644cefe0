"""The bad-inputs check: through ``ferry.load(model, backends=[NAME]).run``, inputs a caller gets
wrong give ferry's one-line error (``InvalidInputError`` or another ``FerryError``), never an
engine's own exception or a wrong answer, and the session still answers afterwards.

Two kinds of input: those ferry's input checker must refuse before the engine sees them (an
unknown or missing name, a wrong dtype, rank or fixed dim, not an array), and those that pass
the checker and reach the adapter (a non-contiguous array, an empty batch), which it must either
answer right or refuse with ferry's error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ferry.conformance._checks import CheckResult
from ferry.conformance._probe import (
    PROBE_INPUT,
    PROBE_WIDTH,
    differs,
    probe_feeds,
    probe_model,
    reference,
)
from ferry.conformance._runner import one_line

if TYPE_CHECKING:
    from ferry.backends import Backend

__all__ = ["check_bad_inputs"]

_BATCH = 2


def _refused_cases(x: np.ndarray) -> list[tuple[str, dict[str, Any]]]:
    """Inputs ferry must refuse, each with its name."""
    return [
        ("an unknown input name", {"not_an_input": x}),
        ("a missing input", {}),
        ("float64 for float32", {PROBE_INPUT: x.astype(np.float64)}),
        ("int32 for float32", {PROBE_INPUT: x.astype(np.int32)}),
        ("one dim too many", {PROBE_INPUT: x[None]}),
        ("one dim too few", {PROBE_INPUT: x[0]}),
        (
            f"{PROBE_WIDTH + 1} features for {PROBE_WIDTH}",
            {PROBE_INPUT: np.ones((_BATCH, PROBE_WIDTH + 1), np.float32)},
        ),
        ("a string for a tensor", {PROBE_INPUT: "not a tensor"}),
    ]


def _answered_cases(x: np.ndarray, dynamic: bool) -> list[tuple[str, dict[str, Any]]]:
    """Inputs that pass ferry's checker and reach the adapter: answered right or refused."""
    strided = np.ones((_BATCH, PROBE_WIDTH * 2), np.float32)
    strided[:, ::2] = x
    cases = [
        ("a column-major (Fortran-ordered) array", {PROBE_INPUT: np.asfortranarray(x)}),
        ("a strided view (every other column)", {PROBE_INPUT: strided[:, ::2]}),
    ]
    if dynamic:
        cases.append(("an empty batch (0 rows)", {PROBE_INPUT: x[:0]}))
    return cases


def check_bad_inputs(backend: Backend) -> CheckResult:
    """Run the bad-inputs check on ``backend`` (see the module's docstring); ``backend`` must be
    reachable by name through ferry's registry."""
    from ferry.runtime import load

    dynamic = backend.dynamic_shapes
    model = probe_model("batch" if dynamic else _BATCH)
    good = probe_feeds(_BATCH, seed=3)
    want = reference(model, good)
    session = load(model, backends=[backend.name], cache_dir=False)
    placed = sum(len(p.nodes) for p in session.plan.partitions if p.backend == backend.name)
    if not placed:
        return CheckResult("bad-inputs", "fail", "ferry.load placed no node on it")
    x = good[PROBE_INPUT]
    details: list[str] = []
    bad: list[str] = []
    for what, feeds in _refused_cases(x):
        bad += _verdict(what, session.run, feeds, None, details)
    for what, feeds in _answered_cases(x, dynamic):
        rows = np.asarray(feeds[PROBE_INPUT])
        expected = reference(model, {PROBE_INPUT: np.ascontiguousarray(rows)})
        bad += _verdict(what, session.run, feeds, expected, details)
    try:
        wrong = differs(session.run(dict(good)), want)
    except Exception as e:
        wrong = f"it raised {one_line(e)}"
    details.append(f"a good input afterwards: {'answered right' if wrong is None else wrong}")
    if wrong is not None:
        bad.append(f"the session no longer answers a good input: {wrong}")
    if bad:
        return CheckResult("bad-inputs", "fail", bad[0], details=details)
    cases = len(_refused_cases(x)) + len(_answered_cases(x, dynamic))
    return CheckResult(
        "bad-inputs",
        "pass",
        f"{cases} bad inputs each refused with ferry's one-line error or answered right; the "
        "session answers afterwards",
        details=details,
    )


def _verdict(
    what: str,
    run: Callable[[dict[str, Any]], dict[str, np.ndarray]],
    feeds: dict[str, Any],
    expected: dict[str, np.ndarray] | None,
    details: list[str],
) -> list[str]:
    """Run ``feeds`` (a bad input); add its line to ``details``; return what is wrong, if anything.

    ``expected`` None: it must be refused; else it may also be answered, rightly.
    """
    from ferry.errors import FerryError

    try:
        got = run(feeds)
    except FerryError as e:
        message = str(e)
        if "\n" in message.strip():
            details.append(f"{what}: refused, but over {message.count(chr(10)) + 1} lines")
            return [f"{what}: ferry's error spans several lines: {one_line(e, 160)}"]
        details.append(f"{what}: refused: {type(e).__name__}: {one_line(e, 160)}")
        return []
    except Exception as e:
        details.append(f"{what}: the engine's own error escaped: {one_line(e, 160)}")
        return [f"{what}: the engine's own error escaped (not ferry's): {one_line(e, 160)}"]
    if expected is None:
        details.append(f"{what}: accepted and answered")
        return [f"{what}: accepted; ferry should refuse it"]
    wrong = differs(got, expected)
    if wrong is not None:
        details.append(f"{what}: a wrong answer: {wrong}")
        return [f"{what}: a wrong answer: {wrong}"]
    details.append(f"{what}: answered right")
    return []
