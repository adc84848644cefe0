"""Does a plan pay? A plan on other engines against ONNX Runtime running the whole model.

Each cut costs a copy of the boundary tensors and an engine call; a plan cut into pieces can run
slower than either engine alone (a PP-OCR detector in 10 pieces ran at 0.61x of ONNX Runtime),
and an engine that takes a small model whole may still be slower than ONNX Runtime on it.
``plan_pays`` times the plan, ONNX Runtime alone and, for a split plan, each of its other engines
that takes the whole model alone (three engines offered: a vendor engine took a piece, OpenVINO
takes it all) in alternating blocks at the sizes the model will run, and says which is fastest.
``ferry.load`` asks it when it placed a model on the engines listed, ONNX Runtime among them, and
runs the fastest engine alone when that beats the plan. The verdict is cached per model, plan,
input sizes and machine.

Before -> After::

    [openvino: 20 nodes] -> [onnxruntime: DynamicQuantizeLinear] -> [openvino: ...] x 43
    (43 partitions, 9.1 ms)    vs   [onnxruntime: the whole model] (4.2 ms)
    -> onnxruntime alone, with a warning saying so
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from ferry.backends import FALLBACK, get_backend, place
from ferry.errors import FerryError
from ferry.plan import Plan
from ferry.runtime._measure import (
    alone_session,
    machine_fingerprint,
    save_verdict,
    tie_tolerance,
    time_in_blocks,
    verdicts_dir,
)
from ferry.runtime._session import Session

__all__ = [
    "PAYS_BUDGET_S",
    "PaysVerdict",
    "cached_verdict",
    "plan_pays",
    "single_engine_plans",
    "winning_plan",
]

logger = logging.getLogger(__name__)

#: Seconds spent timing the two (compiling comes on top); the verdict is then cached.
PAYS_BUDGET_S = 1.5


@dataclasses.dataclass(frozen=True)
class PaysVerdict:
    """The plan's and ONNX Runtime's median latency at ``inputs``, their measured noise (the
    relative spread of each figure within the run, :class:`ferry.runtime._measure.BlockStats`),
    and which is faster."""

    plan_ms: float
    alone_ms: float
    inputs: dict[str, list[int]]
    plan_noise: float = 0.0
    alone_noise: float = 0.0
    #: The split plan's other engines that take the whole model alone: (engine, ms, noise).
    others: tuple[tuple[str, float, float], ...] = ()

    @property
    def fastest_alone(self) -> tuple[str, float, float]:
        """The fastest single engine: (engine, ms, noise). ONNX Runtime unless another beats it
        by more than the noise (a tie keeps the engine that needs nothing compiled)."""
        best = (FALLBACK, self.alone_ms, self.alone_noise)
        for other in self.others:
            if other[1] * (1 + tie_tolerance(other[2], best[2])) < best[1]:
                best = other
        return best

    @property
    def pays(self) -> bool:
        """The plan is faster than every engine alone by more than the noise measured
        (:func:`ferry.runtime._measure.tie_tolerance`): a tie keeps the engine alone, which
        pays no boundary."""
        return all(
            self.plan_ms * (1 + tie_tolerance(self.plan_noise, noise)) < ms
            for _, ms, noise in ((FALLBACK, self.alone_ms, self.alone_noise), *self.others)
        )

    def describe(self) -> str:
        at = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in self.inputs.items())
        others = "".join(
            f", {_ENGINE_WORDS.get(name, name)} alone in {ms:.3g} ms (noise {noise:.1%})"
            for name, ms, noise in self.others
        )
        return (
            f"the plan runs in {self.plan_ms:.3g} ms (noise {self.plan_noise:.1%}), ONNX Runtime "
            f"alone in {self.alone_ms:.3g} ms (noise {self.alone_noise:.1%}){others} (at {at})"
        )


#: How an engine is named in a verdict's words.
_ENGINE_WORDS = {"openvino": "OpenVINO", "onnxruntime": "ONNX Runtime", "tensorrt": "TensorRT"}


def single_engine_plans(model: ir.Model, plan: Plan) -> dict[str, Plan]:
    """Each engine of a split ``plan`` (ONNX Runtime aside) that takes the whole model alone, as a
    one-partition plan carrying the options the plan gave that engine. Empty for a plan in one
    partition (it is its engine alone already)."""
    if len(plan.partitions) <= 1:
        return {}
    found = {}
    for name in plan.backends:
        if name == FALLBACK:
            continue
        try:
            placed = place(model, [get_backend(name), get_backend(FALLBACK)])
        except FerryError:
            continue
        if len(placed.partitions) == 1 and placed.backends == [name]:
            options = next(p.options for p in plan.partitions if p.backend == name)
            found[name] = placed.with_options({name: options}) if options else placed
    return found


def winning_plan(model: ir.Model, plan: Plan, verdict: PaysVerdict) -> Plan:
    """What runs when the verdict is in: ``plan`` when it pays, else the fastest engine alone."""
    if verdict.pays:
        return plan
    name = verdict.fastest_alone[0]
    if name == FALLBACK:
        return Plan.whole_graph(model, FALLBACK)
    return single_engine_plans(model, plan)[name]


def cached_verdict(
    model: ir.Model, plan: Plan, feeds: Mapping[str, np.ndarray], threads: int | None = None
) -> PaysVerdict | None:
    """The verdict :func:`plan_pays` stored for ``plan`` at these input sizes, if any."""
    inputs = {name: list(np.shape(a)) for name, a in feeds.items()}
    try:
        data = json.loads(_path(model, plan, inputs, threads).read_text(encoding="utf-8"))
        return PaysVerdict(
            float(data["plan_ms"]),
            float(data["alone_ms"]),
            inputs,
            float(data.get("plan_noise", 0.0)),
            float(data.get("alone_noise", 0.0)),
            tuple((str(n), float(ms), float(noise)) for n, ms, noise in data.get("others", [])),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclasses.dataclass
class _Contender:
    """One side of the race, as :func:`ferry.runtime._measure.time_in_blocks` times it."""

    label: str
    latency_ms: float = float("inf")
    noise: float = 0.0


def plan_pays(
    model: ir.Model,
    placed: Session,
    feeds: Mapping[str, np.ndarray],
    *,
    threads: int | None = None,
    cache: bool = True,
    alone: Session | None = None,
    singles: Mapping[str, Session] | None = None,
) -> PaysVerdict:
    """Time the Session ``placed`` (a plan on engines of ``model``, prepared) against ONNX
    Runtime alone and the plan's other engines alone (:func:`single_engine_plans`) on
    ``feeds``; with ``cache``, store the verdict (:func:`cached_verdict`).

    Args:
        model: the model both run.
        placed: the plan's session.
        feeds: the inputs to time on, at the sizes the model will run.
        threads: the intra-op threads both run with.
        cache: store the verdict.
        alone: ONNX Runtime's session on the whole model, when the caller built it (to keep the
            one that wins); None builds one.
        singles: the sessions of :func:`single_engine_plans`, when the caller built them; None
            builds them.

    Raises:
        FerryError: either fails to run on ``feeds``.
    """
    inputs = {name: list(np.shape(a)) for name, a in feeds.items()}
    path = _path(model, placed.plan, inputs, threads)
    if alone is None:
        alone = alone_session(model, threads=threads)
    if singles is None:
        singles = {
            name: Session(model, single, threads=threads)
            for name, single in single_engine_plans(model, placed.plan).items()
        }
    runs = [(_Contender("plan"), placed), (_Contender(FALLBACK), alone)]
    runs += [(_Contender(name), session) for name, session in singles.items()]
    for _, session in runs:
        session.run(dict(feeds))  # fails here, before timing, on inputs it cannot take
    time_in_blocks(runs, feeds, PAYS_BUDGET_S)
    (plan, _), (ort, _), *rest = runs
    others = tuple((c.label, c.latency_ms, c.noise) for c, _ in rest)
    verdict = PaysVerdict(plan.latency_ms, ort.latency_ms, inputs, plan.noise, ort.noise, others)
    if cache:
        save_verdict(path, dataclasses.asdict(verdict), "the plan's timing")
    return verdict


def _path(model: ir.Model, plan: Plan, inputs: Any, threads: Any) -> Path:
    digest = hashlib.sha256()
    digest.update(ir.to_proto(model).SerializeToString(deterministic=True))
    settings = [plan.to_dict(), inputs, threads, machine_fingerprint()]
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    return verdicts_dir() / f"pays-{digest.hexdigest()[:32]}.json"
