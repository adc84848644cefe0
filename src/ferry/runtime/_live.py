"""Live placement: a session whose input sizes were not given learns its plan from the calls it
serves.

When ``ferry.load`` is offered several engines (a list with ONNX Runtime among them, or
``"auto"``) but cannot know the sizes the model will run at (a symbolic dim past the batch, no
``shapes=``, ``example_inputs=`` nor saved sizes), timing a plan at made-up sizes says little about
the calls to come. A :class:`LiveSession` starts on the safest plan, ONNX Runtime alone, and
serves every call on it. Each call's sizes make its bucket: the exact shape of every input, batch
included (the verdict caches are keyed by exact sizes, an engine compiled for dynamic sizes may be
fast at one and slow at another, and the judge is run at those sizes: a rounded batch would time
and judge sizes no call had). The first call of a new bucket (at most :data:`MAX_BUCKETS` per
session) hands a copy of its inputs to one background daemon thread, which runs the placement for
that bucket on them: it builds the candidate plans and judges each against ONNX Runtime on the
sample (:func:`ferry.parity.default_budget`):

- an explicit engine list: the placed plan, and each of its engines that takes the whole model
  alone (:func:`ferry.runtime._pays.single_engine_plans`);
- ``"auto"``: :func:`ferry.runtime._auto.auto_plan` on the sample, its passing candidates
  (at most :data:`MAX_CONTENDERS`, fastest first as it measured them).

Which one pays is then measured on the bucket's own calls (:mod:`ferry.runtime._live_trial`):
each call is answered by ONNX Runtime and also run on one contender in turn, timed as a pair in
the caller's thread and judged, until the paired ratios decide (at most
:data:`~ferry.runtime._live_trial.MAX_TRIAL_PAIRS` pairs each). Timing in the background beside
calls being served measured the contention, not the plan, and kept the wrong engine.

A plan that passes the judge and pays becomes the bucket's plan: later calls of that bucket run on
it (the switch is one attribute store; a call in flight finishes on the plan it started on). A
call never gets an answer from a plan not yet checked: while a bucket is on trial its answers are
ONNX Runtime's, and every contender's answer is judged against them. What was learned is saved beside the other
verdicts (``live-<model key>-<bucket key>.json``), and in the artifact's ``ferry.json`` when the
model is one ferry made, so the next load, in this process or another, starts those buckets on
their learned plan at once.

Several sessions of one model (a server's instances) learn once: the others are made with
``learn=False`` and :meth:`LiveSession.adopt` each switch the learner reports to its
:meth:`LiveSession.on_switch` listeners.

Cost per call on a known bucket: the bucket key (a tuple of the inputs' shapes), one dict lookup,
one counter increment; a trial call runs the model twice (bounded: at most
``MAX_TRIAL_PAIRS`` such calls per contender).
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx_ir as ir

from ferry.backends import AUTO, FALLBACK
from ferry.errors import FerryError, InvalidInputError
from ferry.graph import graph_inputs
from ferry.parity import Budget, default_budget, within_budget
from ferry.plan import Plan
from ferry.runtime._auto import auto_plan
from ferry.runtime._live_store import (
    Learned,
    live_key,
    read_artifact_learned,
    read_learned,
    save_artifact_learned,
    save_learned,
)
from ferry.runtime._live_trial import Contender, Trial
from ferry.runtime._pays import single_engine_plans
from ferry.runtime._session import Session
from ferry.runtime._specs import spec_of

__all__ = ["MAX_BUCKETS", "PLACEMENTS", "LiveSession", "check_placement", "wants_live"]

logger = logging.getLogger(__name__)

#: The values ``ferry.load(placement=...)`` takes.
PLACEMENTS = ("live", "fixed")
#: Buckets (distinct input sizes) a session learns a plan for; later ones run on ONNX Runtime.
MAX_BUCKETS = 4
#: Buckets whose calls are counted in the report; calls of further sizes run on the base plan
#: without being recorded, so a caller cycling through sizes cannot grow the session.
_MAX_ROUTES = 256
#: Seconds ``auto`` spends timing candidates for one bucket (a first ranking: calls decide).
LIVE_AUTO_BUDGET_S = 3.0
#: Candidates put on trial per bucket.
MAX_CONTENDERS = 3

Bucket = tuple[tuple[int, ...], ...]


def check_placement(placement: str) -> None:
    """Refuse a ``placement`` that is not ``"live"`` nor ``"fixed"``.

    Raises:
        InvalidInputError: anything else.
    """
    if placement not in PLACEMENTS:
        raise InvalidInputError(
            f"placement must be 'live' (learn the plan from the calls served) or 'fixed' "
            f"(the plan made at load), got {placement!r}"
        )


def wants_live(
    placement: str,
    model: ir.Model,
    names: Sequence[str],
    *,
    shapes: Any,
    example_inputs: Any,
    check_pays: bool,
) -> bool:
    """Whether ``load`` should make a :class:`LiveSession`: placement ``"live"``, several engines
    offered (``"auto"``, or a list with ONNX Runtime among others), the pays check not turned off
    (False forces the plan), and no sizes known (none given nor saved, and a symbolic dim past
    the batch: a batch alone counts as 1 and is timed at load as before)."""
    if placement != "live" or not check_pays or shapes is not None or example_inputs is not None:
        return False
    offered = list(names) == [AUTO] or (FALLBACK in names and len(names) > 1)
    if not offered:
        return False
    specs = [spec_of(v) for v in graph_inputs(model)]
    # An unknown rank is an unknown size too.
    return any(
        s.shape is None or any(isinstance(d, str) or d is None for d in s.shape[1:]) for s in specs
    )


@dataclasses.dataclass
class _Route:
    """One bucket: the session its calls run on, and what was learned about it."""

    session: Session
    bucket: dict[str, list[int]]
    calls: int = 0
    state: str = "on onnxruntime (not learned)"
    label: str = FALLBACK
    speedup: float | None = None
    plan_ms: float | None = None
    alone_ms: float | None = None
    switched_at: float | None = None
    trial: Trial | None = None
    #: Each contender's outcome in words, once its trial is over.
    tried: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        trial = self.trial
        return {
            "bucket": self.bucket,
            "plan": self.label,
            "state": self.state,
            "speedup": self.speedup,
            "plan_ms": self.plan_ms,
            "alone_ms": self.alone_ms,
            "calls": self.calls,
            "switched_at": self.switched_at,
            "trial_calls": trial.calls if trial is not None else self.trial_calls,
            "tried": [c.describe() for c in trial.contenders] if trial else list(self.tried),
        }

    trial_calls: int = 0


class LiveSession(Session):
    """A Session on ONNX Runtime alone that moves each bucket of input sizes to the plan that
    pays for it, learned in the background from the calls it serves (see the module's text).

    ``run`` stays the API; :meth:`placement_report` says what was learned and
    :meth:`placement_settled` waits for the learning under way.
    """

    def __init__(
        self,
        model: ir.Model,
        names: Sequence[str],
        candidate: Plan | None,
        *,
        threads: int | None = None,
        precision: str | None = None,
        accuracy: Budget | None = None,
        source_path: Path | None = None,
        cache_dir: str | os.PathLike[str] | Literal[False] | None = None,
        learn: bool = True,
    ) -> None:
        super().__init__(
            model,
            Plan.whole_graph(model, FALLBACK),
            threads=threads,
            source_path=source_path,
            cache_dir=cache_dir,
        )
        self._names = list(names)
        self._candidate = candidate  # the placed plan (explicit list); None: auto
        self._precision = precision
        self._accuracy = accuracy
        self._source_path = source_path
        self._cache_dir = cache_dir
        self._run_base = super().run
        self._bucket_names = tuple(self.input_names)
        self._routes: dict[Bucket, _Route] = {}
        self._learning = 0  # buckets handed to the learner, this session
        self._jobs: collections.deque[tuple[Bucket, dict[str, np.ndarray]]] = collections.deque()
        self._pending = 0
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._worker: threading.Thread | None = None
        self._closing = False  # set at interpreter exit: learning stops at its next step
        self._built: dict[str, Session] = {}
        self._learns = learn  # False: a sibling instance, which only adopts what another learned
        self._leader: LiveSession | None = None  # the session a follower hands new sizes to
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        self._records: list[dict[str, Any]] = []  # the switches with their plans, for followers
        #: The switches made, in order: bucket, plan, speedup, when.
        self.switches: list[dict[str, Any]] = []
        self._key = live_key(model, self._names, candidate, precision, accuracy, threads)
        self._load_learned()

    # --- serving -----------------------------------------------------------------------------

    def run(
        self, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run the model on its bucket's plan (ONNX Runtime until a faster one is checked); see
        :meth:`Session.run`."""
        try:
            key = tuple([inputs[name].shape for name in self._bucket_names])
        except (KeyError, AttributeError, TypeError):
            return self._run_base(inputs, outputs)  # its checker names what is wrong
        route = self._routes.get(key)
        if route is None:
            route = self._first_call(key, inputs)
            if route is None:
                return self._run_base(inputs, outputs)
        route.calls += 1
        trial = route.trial
        if trial is None:
            return route.session.run(inputs, outputs)
        self._checker.check(inputs)  # a bad call is the caller's error, not a contender's
        answer = trial.run(route.session, inputs, outputs)
        if trial.decided():
            self._decide(route, trial)
        return answer

    def _first_call(self, key: Bucket, inputs: Mapping[str, Any]) -> _Route | None:
        self._checker.check(inputs)  # bad inputs fail here, before any learning
        leader = self._leader
        if leader is not None and key not in leader._routes:
            leader._first_call(key, inputs)  # sizes only a follower saw are learned too
        with self._lock:
            route = self._routes.get(key)
            if route is not None or len(self._routes) >= _MAX_ROUTES:
                return route
            bucket = {n: [int(d) for d in shape] for n, shape in zip(self._bucket_names, key)}
            route = _Route(self._plain(), bucket)
            if not self._learns:
                route.state = "on onnxruntime (waiting for the learning instance)"
            elif self._learning < MAX_BUCKETS and not self._closing:
                self._learning += 1
                route.state = "learning"
                sample = {n: np.array(inputs[n], copy=True) for n in self._bucket_names}
                self._jobs.append((key, sample))
                self._pending += 1
                if self._worker is None:
                    _LEARNING.add(self)
                    self._worker = threading.Thread(
                        target=self._work, name="ferry-live-placement", daemon=True
                    )
                    self._worker.start()
            else:
                route.state = f"on onnxruntime (learning is bounded to {MAX_BUCKETS} buckets)"
            self._routes[key] = route
        return route

    def _plain(self) -> Session:
        """This session's ONNX Runtime engine as a plain Session (shared, not compiled again)."""
        plain = Session.__new__(Session)
        plain.__dict__.update(self.__dict__)
        return plain

    # --- reporting ---------------------------------------------------------------------------

    def placement_report(self) -> dict[str, Any]:
        """What live placement did: ``{"placement": "live", "offered": [...], "switches": [...],
        "buckets": [...]}``, one bucket per input sizes seen (plan label, state, speedup over
        ONNX Runtime alone, calls served, when it switched)."""
        with self._lock:
            return {
                "placement": "live",
                "offered": list(self._names),
                "switches": list(self.switches),
                "buckets": [r.to_dict() for r in self._routes.values()],
            }

    def placement_settled(self, timeout: float | None = None) -> bool:
        """Wait until every bucket handed to the learner is decided; False if ``timeout``
        seconds passed first."""
        with self._settled:
            return self._settled.wait_for(lambda: self._pending == 0, timeout)

    def on_switch(self, listener: Callable[[dict[str, Any]], None]) -> None:
        """Call ``listener(switch)`` after every switch (the dict :attr:`switches` gains: bucket,
        plan label, speedup, both latencies, when, how, and ``"plan_dict"``, the plan itself),
        from the thread that switched; a listener that raises is logged and kept."""
        self._listeners.append(listener)

    def follow(self, leader: LiveSession) -> None:
        """Stop learning and take every switch ``leader`` (another session of the same model and
        offer: a server's first instance) made or will make; this session builds its own
        engines for each plan."""
        with self._lock:
            self._learns = False
            self._leader = leader
        leader.on_switch(self.adopt)
        for switch in leader.switch_records():
            self.adopt(switch)

    def switch_records(self) -> list[dict[str, Any]]:
        """The switches made so far, each as :meth:`on_switch` listeners receive it."""
        with self._lock:
            return [dict(s) for s in self._records]

    def adopt(self, switch: Mapping[str, Any]) -> None:
        """Move a bucket to the plan another session of the same model learned (a switch its
        :meth:`on_switch` listener received): this session builds its own engines for it.

        Raises:
            FerryError: the plan cannot be built here.
        """
        plan = Plan.from_dict(switch["plan_dict"])
        bucket = {str(n): [int(d) for d in s] for n, s in switch["bucket"].items()}
        key: Bucket = tuple(tuple(bucket[n]) for n in self._bucket_names)
        session = self._session_of(plan)
        with self._lock:
            route = self._routes.get(key)
            if route is None:
                if len(self._routes) >= _MAX_ROUTES:
                    return
                route = self._routes[key] = _Route(self._plain(), bucket)
        route.label = str(switch.get("plan") or "+".join(plan.backends))
        route.plan_ms, route.alone_ms = switch.get("plan_ms"), switch.get("alone_ms")
        route.speedup = switch.get("speedup")
        self._switch(route, session, "adopted", plan)

    # --- learning ----------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._jobs or self._closing:
                    self._worker = None
                    return
                key, sample = self._jobs.popleft()
            on_trial = False
            try:
                on_trial = self._learn(key, sample)
            except _Closing:
                self._routes[key].state = "on onnxruntime (learning stopped at exit)"
            except Exception as e:  # a failed trial must never break serving
                route = self._routes[key]
                route.state = f"on onnxruntime (learning failed: {e})"
                logger.warning("live placement at %s: kept ONNX Runtime: %s", route.bucket, e)
            finally:
                if not on_trial:  # a bucket on trial is decided by its calls (_decide)
                    self._settle_one()

    def _learn(self, key: Bucket, sample: dict[str, np.ndarray]) -> bool:
        """Build and judge the bucket's contenders on ``sample`` and put them on trial; True when
        the bucket is on trial (its calls decide), False when nothing is worth trying."""
        route = self._routes[key]
        self._check_open()
        expected = self._run_base(dict(sample))
        budget, words = default_budget(self.model, expected)
        if self._candidate is None:
            offered = self._auto_contenders(sample)
        else:
            offered = self._plan_contenders(self._candidate)
        contenders, refused = [], []
        for label, plan in offered:
            self._check_open()
            try:
                session = self._session_of(plan)
                judged = within_budget(session.run(dict(sample)), expected, budget)
            except FerryError as e:
                refused.append(f"{label}: failed ({str(e).splitlines()[0]})")
                continue
            if judged.passed:
                contenders.append(Contender(label, plan, session))
            else:
                refused.append(f"{label}: outside the accuracy budget ({words})")
        route.tried = refused
        if not contenders:
            if route.state == "learning":
                route.state = (
                    "on onnxruntime (auto's choice)"
                    if not offered
                    else "on onnxruntime (no plan passed the judge)"
                )
            if refused:
                logger.warning(
                    "live placement at %s: ONNX Runtime alone keeps this bucket: %s",
                    route.bucket,
                    "; ".join(refused),
                )
            self._save(None, route)
            return False
        route.trial = Trial(contenders, budget)
        route.state = "on trial (calls run ONNX Runtime and a candidate in turn)"
        return True

    def _decide(self, route: _Route, trial: Trial) -> None:
        """End ``route``'s trial once (the first call to see it decided does it)."""
        with self._lock:
            if route.trial is not trial:
                return
            route.trial = None
            route.trial_calls = trial.calls
            route.tried = [c.describe() for c in trial.contenders]
        try:
            winner = trial.winner()
            if winner is None:
                timed = [c for c in trial.contenders if c.ratios]
                if timed:  # the figures of the closest one, for the report
                    closest = max(timed, key=lambda c: c.speedup or 0.0)
                    route.plan_ms, route.alone_ms = closest.medians()
                    route.speedup = closest.speedup
                route.state = "on onnxruntime (no plan is faster on its calls)"
                logger.warning(
                    "live placement at %s: running ONNX Runtime alone, not the plan asked for: %s",
                    route.bucket,
                    "; ".join(route.tried),
                )
                self._save(None, route)
                return
            route.label = winner.label
            route.plan_ms, route.alone_ms = winner.medians()
            route.speedup = winner.speedup
            self._switch(route, winner.session, f"measured on {trial.calls} calls", winner.plan)
            self._save(winner.plan, route)
        finally:
            self._settle_one()

    def _settle_one(self) -> None:
        with self._settled:
            self._pending -= 1
            self._settled.notify_all()

    def _check_open(self) -> None:
        if self._closing:
            raise _Closing

    def _stop(self) -> None:
        """Drop the buckets not yet tried and wait for the step under way: an engine compiling
        in a daemon thread when the interpreter tears down aborts the process."""
        with self._lock:
            self._closing = True
            self._pending -= len(self._jobs)
            self._jobs.clear()
            worker = self._worker
            self._settled.notify_all()
        if worker is not None:
            worker.join(_STOP_WAIT_S)

    def _plan_contenders(self, plan: Plan) -> list[tuple[str, Plan]]:
        """The placed plan, and each of its engines that takes the whole model alone (an
        explicit plan slower than one of its engines is replaced by that engine)."""
        offered = [("+".join(plan.backends), plan)]
        offered += [
            (f"{name} alone", single)
            for name, single in single_engine_plans(self.model, plan).items()
        ]
        return offered

    def _auto_contenders(self, sample: dict[str, np.ndarray]) -> list[tuple[str, Plan]]:
        """Auto's passing candidates at ``sample``, fastest first as it measured them (a first
        ranking: the bucket's calls decide); empty when it keeps ONNX Runtime alone."""
        choice = auto_plan(
            self.model,
            accuracy=self._accuracy,
            precision=self._precision,
            budget_s=LIVE_AUTO_BUDGET_S,
            feeds=sample,
            threads=self.threads,
            source_path=self._source_path,
            cache_dir=self._cache_dir,
        )
        if choice.session is not None:
            self._built.setdefault(_signature(choice.plan), choice.session)
        if not choice.candidates:  # read from auto's cache: its choice alone
            alone = set(choice.plan.backends) == {FALLBACK} and len(choice.plan.partitions) == 1
            return [] if alone else [(choice.label, choice.plan)]
        passing = sorted(
            (c for c in choice.candidates[1:] if c.passed and c.error is None),
            key=lambda c: c.latency_ms,
        )
        offered = [(c.label, c.plan) for c in passing[:MAX_CONTENDERS]]
        return offered

    def _switch(self, route: _Route, session: Session, how: str, plan: Plan) -> None:
        route.session = session  # one store: calls in flight keep the session they hold
        route.switched_at = time.time()
        route.state = f"switched ({how})"
        switch = {
            "bucket": route.bucket,
            "plan": route.label,
            "speedup": route.speedup,
            "plan_ms": route.plan_ms,
            "alone_ms": route.alone_ms,
            "at": route.switched_at,
            "how": how,
        }
        self.switches.append(switch)
        self._records.append({**switch, "plan_dict": plan.to_dict()})
        for listener in list(self._listeners):
            try:
                listener({**switch, "plan_dict": plan.to_dict()})
            except Exception:  # a listener (metrics, a sibling) must never undo a switch
                logger.exception("live placement: a switch listener failed")
        logger.info(
            "live placement at %s: switched to %s (%s ms vs ONNX Runtime alone %s ms, %sx)",
            route.bucket,
            route.label,
            _fmt(route.plan_ms),
            _fmt(route.alone_ms),
            _fmt(route.speedup),
        )

    def _session_of(self, plan: Plan) -> Session:
        signature = _signature(plan)
        session = self._built.get(signature)
        if session is None:
            session = Session(
                self.model,
                plan,
                threads=self.threads,
                source_path=self._source_path,
                cache_dir=self._cache_dir,
            )
            self._built[signature] = session
        return session

    # --- what was learned, kept ----------------------------------------------------------------

    def _save(self, plan: Plan | None, route: _Route) -> None:
        label = route.label if plan is not None else FALLBACK
        learned = Learned(route.bucket, plan, label, route.plan_ms, route.alone_ms, route.state)
        save_learned(self._key, learned)
        save_artifact_learned(self._source_path, self._key, learned)

    def _load_learned(self) -> None:
        """Start the buckets learned before (this model, offer and machine) on their plan: the
        cache's records, then the artifact's for buckets the cache does not know."""
        cached = read_learned(self._key, MAX_BUCKETS)
        kept = read_artifact_learned(self._source_path, self._key, MAX_BUCKETS)
        for learned in [*cached, *kept]:
            try:
                key: Bucket = tuple(tuple(learned.bucket[n]) for n in self._bucket_names)
            except KeyError:
                continue
            if key in self._routes or self._learning >= MAX_BUCKETS:
                continue
            route = _Route(self._plain(), learned.bucket, state=learned.state)
            route.plan_ms, route.alone_ms = learned.plan_ms, learned.alone_ms
            if route.plan_ms and route.alone_ms:
                route.speedup = route.alone_ms / route.plan_ms
            self._routes[key] = route
            self._learning += 1  # a known bucket counts against the bound: it is learned
            if learned.plan is None:
                continue
            try:
                session = self._session_of(learned.plan)
            except FerryError as e:
                route.state = f"on onnxruntime (the learned plan failed to build: {e})"
                continue
            route.label = learned.label or "+".join(learned.plan.backends)
            self._switch(route, session, "learned before", learned.plan)


class _Closing(Exception):
    """The interpreter is exiting: learning stops."""


#: Sessions whose learner has run, stopped at exit (:meth:`LiveSession._stop`).
_LEARNING: weakref.WeakSet[LiveSession] = weakref.WeakSet()
#: The longest exit waits for a learning step under way (a compile, or the pays check's timing).
_STOP_WAIT_S = 60.0


@atexit.register
def _stop_learning() -> None:
    for session in list(_LEARNING):
        session._stop()


def _signature(plan: Plan) -> str:
    return json.dumps(plan.to_dict(), sort_keys=True)


def _fmt(value: float | None) -> str:
    return "?" if value is None else f"{value:.3g}"
