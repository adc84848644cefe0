"""``backends="auto"``: measure candidate plans at the sizes the model will run, keep the fastest
one within an accuracy budget.

Candidates: plain ONNX Runtime fp32 (the baseline and the reference), each available engine at
each precision it offers (what it refuses falls back to ONNX Runtime, so an engine that takes part
of the model is a split plan), and the placement of all engines together (listed by
:mod:`ferry.runtime._auto_candidates`). Simulated adapters (``simulated = True``) are left out
unless named. On a source already in int8 (QDQ, dynamic int8, QOperator) each candidate is
labelled by what its compiled engine says it computed: ``openvino int8 (QDQ)`` (precision
``int8``, ``+ bf16`` when its float layers were asked lower) where it runs the source's layers in
int8, ``openvino fp32 (widens dynamic int8)`` where it runs them in float.

Where it measures: at the inputs given (``feeds``), else at random inputs of the shapes given,
else of the model's static shapes. A symbolic first dim (the batch, as a rule) may default to 1;
any other symbolic dim without a size is an error asking for it: a 640x640 detector timed at a
few pixels says nothing about the detector.

How it judges: each candidate runs once on the inputs and is judged against the baseline's
outputs with :func:`ferry.parity.within_budget`. With no budget given: a float source by
:data:`ferry.parity.DEFAULT_BUDGET` (cosine >= 0.999 and argmax agreement >= 99%: engines
computing the same float function should agree in the numbers); a source already reduced in
precision (QDQ, dynamic or weight-only int8) at its task (:func:`ferry.parity.infer_judge`: a
classifier's top-1, a recognizer's sequence...), since two engines' int8 kernels round
differently (OpenVINO's int8 of a QDQ ResNet-50 is cosine 0.995 from ONNX Runtime's, with the same
top-1, and 3.9x faster). Then all run in alternating blocks of calls, each block
after the others' worker threads have gone quiet (:func:`ferry.runtime._measure.block_stats`),
until the ranking is stable or the budget is spent, each candidate's noise measured. A split plan
(several partitions) competes only if it beats each of its engines alone. The fastest within
budget wins; among those tied with it (their difference within the two candidates' measured noise,
:func:`ferry.runtime._measure.tie_tolerance`, never under 1%), the baseline, then one that asks
for no precision below the source's (fp32, or the source's own int8), then the fewest partitions
(equal speed is not worth a lower precision or a boundary). The choice and the table are
cached per model, input sizes, budget, precision and machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx_ir as ir

from ferry.backends import FALLBACK, get_backend, known_backends
from ferry.errors import FerryError
from ferry.graph import graph_inputs, reduced_precision
from ferry.parity import DEFAULT_BUDGET, Budget, default_budget, within_budget
from ferry.plan import Plan
from ferry.runtime._auto_candidates import (
    Candidate,
    candidates,
    computes_int8,
    name_computed,
)
from ferry.runtime._measure import (
    alone_session,
    machine_fingerprint,
    save_verdict,
    tie_tolerance,
    time_in_blocks,
    timing_feeds,
    verdicts_dir,
)
from ferry.runtime._session import Session, check_threads
from ferry.runtime._specs import spec_of

__all__ = ["AutoChoice", "Candidate", "auto_engines", "auto_plan", "choose"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class AutoChoice:
    """The plan chosen and the table measured.

    Attributes:
        plan: the plan chosen.
        label: its candidate's label.
        candidates: the candidates measured (empty when the choice came from the cache).
        table: one row per candidate (``Candidate.to_dict``), also when read from the cache.
        inputs: the input shapes it measured at.
        random_inputs: it measured and judged on random data (no inputs were given), which says
            little about a reduced precision's accuracy on real data.
        from_cache: the choice was read from the cache, not measured now.
        cache_path: where the choice and table are saved (None: not cached).
        session: the chosen candidate's Session, built and timed here: ``load`` returns it
            rather than compiling the plan again (None when the choice came from the cache).
        judge: how the candidates were judged, in words (``judge: top1 on 'prob' (...)``).
    """

    plan: Plan
    label: str
    candidates: list[Candidate]
    table: list[dict[str, Any]]
    inputs: dict[str, list[int]]
    random_inputs: bool = False
    from_cache: bool = False
    cache_path: Path | None = None
    session: Session | None = dataclasses.field(default=None, repr=False, compare=False)
    judge: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "chosen": self.label,
            "from_cache": self.from_cache,
            "inputs": self.inputs,
            "random_inputs": self.random_inputs,
            "judge": self.judge,
            "plan": self.plan.to_dict(),
            "candidates": self.table,
        }


def auto_plan(
    model: ir.Model,
    *,
    backends: Sequence[str] | None = None,
    accuracy: Budget | None = None,
    exact: bool = False,
    precision: str | None = None,
    budget_s: float = 20.0,
    feeds: Mapping[str, np.ndarray] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    threads: int | None = None,
    cache: bool = True,
    remeasure: bool = False,
    source_path: Path | None = None,
    cache_dir: str | os.PathLike[str] | Literal[False] | None = None,
) -> AutoChoice:
    """Measure candidate plans for ``model`` (prepared: nodes and values named) and return the
    fastest within the accuracy budget.

    Args:
        model: the model.
        backends: engines to consider; None: every known backend available here that is not
            simulated.
        accuracy: the budget against ONNX Runtime fp32 (judge specs or a function, see
            :func:`ferry.parity.within_budget`); None: :data:`ferry.parity.DEFAULT_BUDGET` for a
            float source, the task's judge (:func:`ferry.parity.infer_judge`) for a source
            already reduced in precision.
        exact: consider fp32 only.
        precision: consider only this precision (ONNX Runtime fp32 stays as the baseline);
            ``int8`` on a source already in int8 takes each engine that computes the source's
            int8 (OpenVINO's int8 of a QDQ model), whatever options it offers.
        budget_s: rough bound on the time spent timing calls (compiling comes on top).
        feeds: the inputs to measure and judge with (the best: real data at real sizes).
        shapes: input sizes to measure at with random data, when ``feeds`` is None.
        threads: intra-op threads for every engine.
        cache: reuse and store the choice for this model, input sizes and machine.
        remeasure: measure again even when a cached choice exists (and replace it).
        source_path: the file ``model`` was read from, which an engine taking the whole model
            may read itself (as ``load`` lets it).
        cache_dir: the engine cache the candidates compile through, as ``load``'s: None for the
            default, a folder, or False for none. The choice itself is kept apart, under the
            default cache root (:func:`ferry.runtime.default_cache_dir`), when ``cache``.

    Raises:
        InvalidInputError: the sizes to measure at are unknown (symbolic dims past the batch and
            neither feeds nor shapes), or a named engine is not known.
        FerryError: ONNX Runtime itself cannot run the model on these inputs.
    """
    check_threads(threads)
    names = auto_engines(backends)
    specs = [spec_of(v) for v in graph_inputs(model)]
    # Sizes not given are found (ids within their tables, masks of ones), never guessed.
    inputs = dict(feeds) if feeds is not None else timing_feeds(specs, shapes, model=model)
    reduced = reduced_precision(model) if accuracy is None else None
    judged: Any = accuracy if not reduced else _TASK_JUDGE
    key = _cache_key(model, names, inputs, feeds is None, judged, exact, precision, threads)
    path = verdicts_dir() / f"{key}.json" if cache else None
    if path is not None and not remeasure:
        cached = _read_cache(path)
        if cached is not None:
            return cached
    # Built only now: a choice read from the cache needs no session here (``load`` builds it).
    baseline = alone_session(model, threads=threads, source_path=source_path, cache_dir=cache_dir)
    expected = baseline.run(dict(inputs))
    budget, judge = _budget(model, expected, accuracy)
    held = reduced_precision(model)
    tried = candidates(model, names, exact=exact, precision=precision, held=held)
    if held:  # labelled by what its engine computed of the source's int8, not by the option
        name_computed(tried[0], _compiled(baseline), held)
    # Each candidate is built once: timed here, and the chosen one is the session returned.
    sessions: list[tuple[Candidate, Session]] = [(tried[0], baseline)]
    tried[0].accuracy = within_budget(expected, expected, budget)
    for candidate in tried[1:]:
        start = time.perf_counter()
        try:
            session = Session(
                model, candidate.plan, threads=threads, source_path=source_path, cache_dir=cache_dir
            )
            got = session.run(dict(inputs))
        except FerryError as e:
            candidate.error = str(e)
            continue
        candidate.load_s = time.perf_counter() - start
        if held:
            name_computed(candidate, _compiled(session), held)
            if precision == "int8" and candidate.option != "int8":
                candidate.error = computes_int8(candidate)
                if candidate.error is not None:
                    continue
        candidate.accuracy = within_budget(got, expected, budget)
        sessions.append((candidate, session))
    sessions = _timed_or_dropped(sessions, inputs, budget_s)
    best = choose(tried)
    baseline_ms = tried[0].latency_ms
    choice = AutoChoice(
        best.plan,
        best.label,
        tried,
        [c.to_dict(baseline_ms) for c in tried],
        {name: list(np.shape(a)) for name, a in inputs.items()},
        random_inputs=feeds is None,
        cache_path=path,
        session=next(s for c, s in sessions if c is best),
        judge=judge,
    )
    if path is not None:
        _write_cache(path, choice)
    return choice


def _compiled(session: Session) -> list[Any]:
    """The session's compiled partitions, to ask their engines what they computed (the Session
    keeps them to itself; only auto asks)."""
    return list(getattr(session, "_compiled", ()))


class _Failing:
    """A session whose failure on a call is remembered (which of the timed ones failed)."""

    def __init__(self, candidate: Candidate, session: Session, failed: list[Candidate]) -> None:
        self._candidate, self._session, self._failed = candidate, session, failed

    def run(self, feeds: Mapping[str, np.ndarray]) -> Any:
        try:
            return self._session.run(feeds)
        except FerryError as e:
            self._candidate.error = str(e)
            self._failed.append(self._candidate)
            raise


def _timed_or_dropped(
    sessions: list[tuple[Candidate, Session]], inputs: Mapping[str, np.ndarray], budget_s: float
) -> list[tuple[Candidate, Session]]:
    """Time the sessions in blocks; a candidate that fails on a later call (an engine that ran
    the first call but not a repeat: a model with random ops draws other sizes each call) is
    marked with its error and left out, and the rest are timed again. The baseline's own
    failure is the model's and propagates."""
    while True:
        failed: list[Candidate] = []
        wrapped = [(c, _Failing(c, s, failed)) for c, s in sessions]
        try:
            time_in_blocks(wrapped, inputs, budget_s)
            return sessions
        except FerryError:
            if not failed or failed[0] is sessions[0][0]:
                raise
            sessions = [(c, s) for c, s in sessions if c not in failed]


#: The cache key's budget for a reduced-precision source judged at its task (the judge itself is
#: a function of the model, which the key already holds).
_TASK_JUDGE = ({"judge": "the task's, inferred (a reduced-precision source)"},)


def _budget(
    model: ir.Model, expected: Mapping[str, np.ndarray], accuracy: Budget | None
) -> tuple[Budget, str]:
    """The budget the candidates are judged by, and the judge in words for the table."""
    if accuracy is not None:
        return accuracy, "judge: the accuracy budget given"
    budget, words = default_budget(model, expected)
    return budget, words + ("; --accuracy overrides" if "at the task" in words else "")


def choose(candidates: Sequence[Candidate]) -> Candidate:
    """The fastest candidate within budget; among those tied with it (the difference within
    :func:`ferry.runtime._measure.tie_tolerance` of their noises), the baseline (the first
    candidate), then one asking no precision below the source's (``Candidate.lowered``), then
    the fewest partitions, then the first listed. A split plan
    (several partitions) takes part only if it is faster than each of its engines alone (every
    one-partition candidate within budget on one of its engines): a cut costs copies and calls
    that an engine running alone does not pay."""
    passing = [c for c in candidates if c.passed]
    if not passing:
        raise FerryError(
            "no candidate ran within the accuracy budget, not even ONNX Runtime fp32: "
            + "; ".join(f"{c.label}: {c.error or 'outside budget'}" for c in candidates)
        )
    passing = [c for c in passing if _beats_its_engines(c, passing)]
    fastest = min(passing, key=lambda c: c.latency_ms)
    close = [
        c
        for c in passing
        if c.latency_ms <= fastest.latency_ms * (1 + tie_tolerance(c.noise, fastest.noise))
    ]
    order = {id(c): i for i, c in enumerate(candidates)}
    return min(
        close,
        key=lambda c: (
            c is not candidates[0],
            c.lowered,
            len(c.plan.partitions),
            order[id(c)],
        ),
    )


def _beats_its_engines(candidate: Candidate, passing: Sequence[Candidate]) -> bool:
    """``candidate`` is whole on one engine, or faster than each candidate in ``passing``
    running one of its engines alone."""
    if len(candidate.plan.partitions) <= 1:
        return True
    engines = set(candidate.plan.backends)
    alone = [
        c
        for c in passing
        if len(c.plan.partitions) == 1 and c.plan.backends[0] in engines and c is not candidate
    ]
    return all(candidate.latency_ms < c.latency_ms for c in alone)


def auto_engines(backends: Sequence[str] | None) -> list[str]:
    """The engines auto considers: those named (an unknown one is an error), else every
    available one but simulated adapters; ONNX Runtime always among them (last unless named)."""
    names = list(backends) if backends is not None else known_backends()
    found = []
    for name in names:
        try:
            backend = get_backend(name)
        except FerryError as e:
            if backends is not None:
                raise
            logger.info("auto: skipping %s: %s", name, e)
            continue
        if backends is None and backend.simulated:
            logger.info("auto: skipping %s: a simulated adapter (name it to measure it)", name)
            continue
        found.append(name)
    if FALLBACK not in found:
        found.append(FALLBACK)
    return found


def _budget_key(accuracy: Budget | None) -> Any:
    """The budget as JSON for the cache key; functions by their qualified name (their address
    would change every run)."""

    def stable(value: Any) -> Any:
        if callable(value):
            return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', '?')}"
        return value

    if accuracy is None:
        return list(DEFAULT_BUDGET)
    if callable(accuracy):
        return stable(accuracy)
    specs = [accuracy] if isinstance(accuracy, Mapping) else list(accuracy)
    return [{key: stable(value) for key, value in spec.items()} for spec in specs]


def _cache_key(
    model: ir.Model,
    names: list[str],
    feeds: Mapping[str, np.ndarray],
    random_inputs: bool,
    accuracy: Budget | None,
    exact: bool,
    precision: str | None,
    threads: int | None,
) -> str:
    digest = hashlib.sha256()
    digest.update(ir.to_proto(model).SerializeToString(deterministic=True))
    sizes = {name: [list(np.shape(a)), str(np.asarray(a).dtype)] for name, a in feeds.items()}
    settings = [names, sizes, random_inputs, _budget_key(accuracy), exact, precision, threads]
    digest.update(json.dumps([settings, machine_fingerprint()], default=str).encode())
    return digest.hexdigest()[:32]


def _read_cache(path: Path) -> AutoChoice | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        plan = Plan.from_dict(data["plan"])
        label = str(data["chosen"])
        table = list(data["candidates"])
        inputs = dict(data["inputs"])
        random_inputs = bool(data.get("random_inputs", False))
        judge = str(data.get("judge", ""))
    except (OSError, ValueError, KeyError, TypeError, FerryError):
        return None
    logger.info("auto: using the cached choice %s (%s)", label, path)
    return AutoChoice(plan, label, [], table, inputs, random_inputs, True, path, judge=judge)


def _write_cache(path: Path, choice: AutoChoice) -> None:
    if not save_verdict(path, choice.to_dict(), "auto's choice"):
        choice.cache_path = None
