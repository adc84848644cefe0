"""``load``: a model made ready to run, and the plan it runs (``make_plan``).

``load`` reads and checks its arguments once (``backends`` parsed once, each engine named looked up
once), prepares the model (``ferry.graph.prepare``), makes its plan (ONNX Runtime alone, placement
across the listed engines, or ``auto``'s measured choice) and returns the Session that runs it.
Where ``auto`` or the pays check already built and timed the session of the plan kept, that
session is the one returned: nothing is compiled twice.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
import onnx_ir as ir

from ferry.backends import (
    AUTO,
    DEFAULT_MIN_PARTITION_SIZE,
    FALLBACK,
    PlacementReport,
    check_options,
    explain,
    get_backend,
    parse_backends,
)
from ferry.errors import FerryError, InvalidInputError
from ferry.graph import graph_inputs, load_model, model_source_path, prepare
from ferry.parity import Budget, default_budget, within_budget
from ferry.plan import Plan
from ferry.runtime._auto import AutoChoice, auto_plan
from ferry.runtime._live import LiveSession, check_placement, wants_live
from ferry.runtime._measure import alone_session, artifact_shapes, timing_feeds
from ferry.runtime._pays import cached_verdict, plan_pays, single_engine_plans, winning_plan
from ferry.runtime._session import Session, check_threads
from ferry.runtime._specs import spec_of

__all__ = [
    "AUTO_BUDGET_S",
    "PlanChoice",
    "load",
    "make_plan",
    "quantization_report",
    "with_precision",
]

logger = logging.getLogger(__name__)

#: Seconds ``backends="auto"`` spends timing candidates when ``ferry.load`` asks it (the choice is
#: then cached per model and machine; ``ferry plan --backends auto --budget S`` measures longer).
AUTO_BUDGET_S = 5.0


def load(
    source: str | os.PathLike[str] | ir.Model | onnx.ModelProto,
    *,
    backends: str | Sequence[str] | None = None,
    threads: int | None = None,
    precision: str | None = None,
    plan: Plan | None = None,
    cache_dir: str | os.PathLike[str] | Literal[False] | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    example_inputs: Mapping[str, np.ndarray] | None = None,
    accuracy: Budget | None = None,
    check_pays: bool = True,
    placement: str = "live",
) -> Session:
    """Load a model and make it ready to run.

    Args:
        source: an ``.onnx`` file, a ferry artifact folder, an ``onnx_ir.Model`` or an
            ``onnx.ModelProto``. The source is never modified.
        backends: backend names in priority order (``"openvino,onnxruntime"`` or
            ``["openvino", "onnxruntime"]``); None means ONNX Runtime on the CPU. With more than
            ONNX Runtime, the graph is partitioned: each engine takes the nodes it supports, in
            this order, and ONNX Runtime runs the rest. ``"auto"`` measures candidate plans on
            this machine and runs the fastest correct one (the choice is cached per model).
        threads: intra-op threads per engine; None lets each engine choose (all cores).
        precision: run in this precision (``"fp32"``, ``"bf16"``, ``"fp16"``, ``"int8"``) on
            every engine of the plan that offers it (ONNX Runtime runs the model's own types);
            with ``"auto"``, only candidates in this precision are measured. None: each
            engine's default (fp32).
        plan: run this plan (``ferry plan -o``) instead of partitioning.
        options: per-backend compile options, e.g. ``{"openvino": {"precision": "bf16"}}``,
            merged over the plan's own.
        cache_dir: where compiled engines are kept between runs: None for the default
            (``$FERRY_CACHE_DIR``, else ``~/.cache/ferry``), a folder, or False for no cache.
            Only backends that build a storable engine use it; ONNX Runtime does not.
        shapes: the input sizes the model will run at (``{"x": (1, 3, 640, 640)}``): auto's
            candidates, and a placed plan against ONNX Runtime alone, are timed there. None:
            ``example_inputs``' sizes, else those saved in the artifact (``ferry.json``:
            ``"shapes"`` or the last ``ferry bench``), else the model's fixed sizes (a symbolic
            batch dim counts as 1; any other symbolic dim has no size: auto asks for it, the
            split check is skipped with a warning).
        example_inputs: real inputs to time (and, with ``"auto"``, judge) on.
        accuracy: with ``"auto"``, the budget candidates are judged by against ONNX Runtime
            fp32 (judge specs or a function, :func:`ferry.parity.within_budget`); None: cosine
            >= 0.999 and argmax agreement >= 99%.
        check_pays: when you list ONNX Runtime with other engines (``"openvino,onnxruntime"``)
            and ferry places the model on them, time that plan against ONNX Runtime alone
            (about 2 s, once per model, sizes and machine) and run ONNX Runtime alone, with a
            warning, when the plan is slower: the engines you list are offered, and each runs
            only where it pays. False keeps the plan regardless; an engine named without ONNX
            Runtime (``"openvino"``) runs what it can, as asked.
        placement: ``"live"`` (the default): when several engines are offered (``"auto"``, or
            a list with ONNX Runtime) but the sizes are unknown (a symbolic dim past the batch,
            no ``shapes``/``example_inputs`` nor saved sizes), start on ONNX Runtime alone and
            move each bucket of input sizes to the plan that is checked to pay on its first
            real call (:class:`ferry.runtime.LiveSession`, ``session.placement_report()``).
            ``"fixed"``: keep the plan made at load.

    Returns:
        A Session; ``session.run({"input": array})`` gives ``{"output": array}``.
    """
    check_threads(threads)
    check_placement(placement)
    names = parse_backends(backends)
    for name in names:
        if name != AUTO:
            get_backend(name)  # fail early, naming the missing engine
    for name, given in (options or {}).items():
        check_options(get_backend(name), given)
    model = load_model(source)
    # Engines may read the file itself only when it is what we were given: an in-memory model
    # loaded from a file may have been changed since.
    source_path = model_source_path(model) if isinstance(source, (str, os.PathLike)) else None
    # Work on a prepared copy (weights shared, not copied): the caller's model is never touched.
    work = prepare(model)
    if names != [AUTO] and accuracy is not None:
        raise InvalidInputError(
            "accuracy= is for backends='auto' (the budget its candidates are judged by); "
            "ferry plan --verify --accuracy judges a plan's partitions"
        )
    if shapes is None and example_inputs is None:
        shapes = artifact_shapes(source_path)
    if plan is None and wants_live(
        placement, work, names, shapes=shapes, example_inputs=example_inputs, check_pays=check_pays
    ):
        live = _live_session(
            work, names, threads, precision, options, accuracy, source_path, cache_dir
        )
        if live is not None:
            return live
    placed_here = plan is None
    # A session auto or the pays check built (and timed) for the very plan kept.
    built: Session | None = None
    if plan is None:
        made = _plan_for(
            work,
            names,
            threads=threads,
            precision=precision,
            feeds=example_inputs,
            shapes=shapes,
            accuracy=accuracy,
            source_path=source_path,
            cache_dir=cache_dir,
        )
        plan = made.plan
        if made.auto is not None:
            built = made.auto.session
    elif precision is not None:
        plan = with_precision(plan, precision)
    if options:
        plan = plan.with_options(options)
    offered = placed_here and FALLBACK in names and len(names) > 1
    if check_pays and offered and set(plan.backends) != {FALLBACK}:
        plan, built = _faster_plan(
            work, plan, threads, source_path, cache_dir, example_inputs, shapes
        )
    if built is None or built.plan != plan:
        built = Session(work, plan, threads=threads, source_path=source_path, cache_dir=cache_dir)
    built.quantization = quantization_report(source_path)
    return built


def _live_session(
    work: ir.Model,
    names: list[str],
    threads: int | None,
    precision: str | None,
    options: Mapping[str, Mapping[str, Any]] | None,
    accuracy: Budget | None,
    source_path: Path | None,
    cache_dir: str | os.PathLike[str] | Literal[False] | None,
) -> LiveSession | None:
    """A session that learns its plan from the calls it serves (``placement="live"``); None when
    the engines listed take nothing from ONNX Runtime (nothing to learn)."""
    candidate = None
    if names != [AUTO]:
        candidate = _plan_for(
            work, names, threads=threads, precision=precision, options=options
        ).plan
        if set(candidate.backends) == {FALLBACK}:
            return None
    live = LiveSession(
        work,
        names,
        candidate,
        threads=threads,
        precision=precision,
        accuracy=accuracy,
        source_path=source_path,
        cache_dir=cache_dir,
    )
    live.quantization = quantization_report(source_path)
    return live


def quantization_report(model_file: Path | None) -> dict[str, Any] | None:
    """The report ``ferry quantize`` saved beside ``model_file`` (``<stem>.quantize.json``, or an
    artifact's ``ferry.json`` ``"quantization"``); None for a model it did not make."""
    if model_file is None:
        return None
    for path, key in (
        (model_file.with_suffix(".quantize.json"), None),
        (model_file.parent / "ferry.json", "quantization"),
    ):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        found = data.get(key) if key and isinstance(data, dict) else data
        if isinstance(found, dict) and "precision" in found and "target" in found:
            return found
    return None


def _faster_plan(
    work: ir.Model,
    plan: Plan,
    threads: int | None,
    source_path: Path | None,
    cache_dir: str | os.PathLike[str] | Literal[False] | None,
    example_inputs: Mapping[str, np.ndarray] | None,
    shapes: Mapping[str, Sequence[int]] | None,
) -> tuple[Plan, Session | None]:
    """``plan`` (other engines than ONNX Runtime in it), or the fastest engine alone when that
    beats it (ONNX Runtime, or an engine of a split plan that takes the whole model; see
    ``_pays``); with the session of the plan kept when it was built to be timed."""
    where = f"{len(plan.partitions)} partition(s) on {', '.join(plan.backends)}"
    specs = [spec_of(v) for v in graph_inputs(work)]
    try:
        feeds = dict(example_inputs) if example_inputs is not None else timing_feeds(specs, shapes)
    except InvalidInputError as e:
        # A split is the risky case (each cut costs a copy and a call): say so loudly.
        log = logger.warning if len(plan.partitions) > 1 else logger.info
        log(
            "not checked whether the plan (%s) is faster than ONNX Runtime alone: %s "
            "(give shapes= or example_inputs= to check it)",
            where,
            str(e).split(". Give", 1)[0],
        )
        return plan, None
    verdict = cached_verdict(work, plan, feeds, threads)
    built: dict[str, Session] = {}
    if verdict is None:

        def session(of: Plan) -> Session:
            return Session(work, of, threads=threads, source_path=source_path, cache_dir=cache_dir)

        built["plan"] = session(plan)
        built[FALLBACK] = alone_session(
            work, threads=threads, source_path=source_path, cache_dir=cache_dir
        )
        singles = {name: session(p) for name, p in single_engine_plans(work, plan).items()}
        # Faster is worth nothing when the answers are wrong (OpenVINO's NaN logits on a
        # decoder's empty past): each side is judged against ONNX Runtime before it is timed.
        expected = built[FALLBACK].run(dict(feeds))
        budget, words = default_budget(work, expected)
        wrong = _outside_budget(built["plan"], feeds, expected, budget)
        if wrong is not None:
            logger.warning(
                "running ONNX Runtime alone: the plan's answers (%s) are outside the accuracy "
                "budget (%s) on %s: %s",
                where,
                words,
                "the example inputs" if example_inputs is not None else "inputs found to run it",
                wrong,
            )
            return Plan.whole_graph(work, FALLBACK), built[FALLBACK]
        singles = {
            name: single
            for name, single in singles.items()
            if _outside_budget(single, feeds, expected, budget) is None
        }
        built.update(singles)
        verdict = plan_pays(
            work, built["plan"], feeds, threads=threads, alone=built[FALLBACK], singles=singles
        )
    if verdict.pays:
        logger.info("the plan (%s) pays: %s", where, verdict.describe())
        return plan, built.get("plan")
    engine = verdict.fastest_alone[0]
    logger.warning(
        "running %s alone: %s, on %s. Pass check_pays=False (ferry.load) to run the plan "
        "anyway, or name the engine without ONNX Runtime.",
        "ONNX Runtime" if engine == FALLBACK else engine,
        verdict.describe(),
        where,
    )
    return winning_plan(work, plan, verdict), built.get(engine)


def _outside_budget(
    session: Session, feeds: Mapping[str, np.ndarray], expected: Any, budget: Budget
) -> str | None:
    """Why ``session``'s answers on ``feeds`` are outside ``budget`` of ``expected`` (or it
    fails on them); None when they are within it."""
    try:
        judged = within_budget(session.run(dict(feeds)), expected, budget)
    except FerryError as e:
        return f"it failed: {str(e).splitlines()[0]}"
    return None if judged.passed else judged.summary()


@dataclasses.dataclass(frozen=True)
class PlanChoice:
    """A plan and how it was made.

    Attributes:
        plan: the plan.
        report: placement's verdict per node and boundary tensors, when engines were placed.
        auto: what ``auto`` measured, when it chose.
    """

    plan: Plan
    report: PlacementReport | None = None
    auto: AutoChoice | None = None


def make_plan(
    model: ir.Model,
    backends: str | Sequence[str] | None,
    *,
    threads: int | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    force_cpu: Iterable[str] = (),
    min_partition_size: int = DEFAULT_MIN_PARTITION_SIZE,
    feeds: Mapping[str, np.ndarray] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    accuracy: Budget | None = None,
    exact: bool = False,
    budget_s: float | None = None,
    remeasure: bool = False,
    explain_placement: bool = False,
    precision: str | None = None,
) -> PlanChoice:
    """The plan for running ``model`` (prepared: ``ferry.graph.prepare``) on ``backends``.

    ONNX Runtime alone runs the whole graph; ``"auto"`` is the measured choice (``feeds``,
    ``shapes``, ``accuracy``, ``exact``, ``remeasure`` and ``budget_s`` are auto's, see
    :func:`ferry.runtime.auto_plan`; the budget defaults to :data:`AUTO_BUDGET_S`; with
    ``precision``, only candidates in it are measured);
    any other list is placed in priority order with
    ONNX Runtime taking what no engine supports (``force_cpu`` and ``min_partition_size`` are
    placement's; ``explain_placement`` asks for placement's report even for ONNX Runtime alone).
    ``precision`` goes to every engine of the plan that offers it (:func:`with_precision`);
    ``options`` (per backend) are merged over the plan's own.
    """
    return _plan_for(
        model,
        parse_backends(backends),
        threads=threads,
        options=options,
        force_cpu=force_cpu,
        min_partition_size=min_partition_size,
        feeds=feeds,
        shapes=shapes,
        accuracy=accuracy,
        exact=exact,
        budget_s=budget_s,
        remeasure=remeasure,
        explain_placement=explain_placement,
        precision=precision,
    )


def _plan_for(
    model: ir.Model,
    names: list[str],
    *,
    threads: int | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    force_cpu: Iterable[str] = (),
    min_partition_size: int = DEFAULT_MIN_PARTITION_SIZE,
    feeds: Mapping[str, np.ndarray] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    accuracy: Budget | None = None,
    exact: bool = False,
    budget_s: float | None = None,
    remeasure: bool = False,
    explain_placement: bool = False,
    precision: str | None = None,
    source_path: Path | None = None,
    cache_dir: str | os.PathLike[str] | Literal[False] | None = None,
) -> PlanChoice:
    """:func:`make_plan` on backend ``names`` already parsed; ``source_path`` and ``cache_dir``
    (``load``'s) build auto's candidates as ``load`` would build the one it returns."""
    if names == [AUTO]:
        budget = AUTO_BUDGET_S if budget_s is None else budget_s
        choice = auto_plan(
            model,
            threads=threads,
            budget_s=budget,
            feeds=feeds,
            shapes=shapes,
            accuracy=accuracy,
            exact=exact,
            precision=precision,
            remeasure=remeasure,
            source_path=source_path,
            cache_dir=cache_dir,
        )
        made = PlanChoice(choice.plan, auto=choice)
    elif names == [FALLBACK] and not force_cpu and not explain_placement:
        made = PlanChoice(Plan.whole_graph(model, FALLBACK))
    else:
        report = explain(model, names, force_cpu=force_cpu, min_partition_size=min_partition_size)
        made = PlanChoice(report.plan, report=report)
    if precision is not None and names != [AUTO]:
        made = dataclasses.replace(made, plan=with_precision(made.plan, precision))
    if options:
        made = dataclasses.replace(made, plan=made.plan.with_options(options))
    return made


def with_precision(plan: Plan, precision: str) -> Plan:
    """``plan`` with ``precision`` set on every engine of it that offers that precision.

    Raises:
        InvalidInputError: no engine of the plan offers it (each one's offer is named).
    """
    offers = {name: tuple(get_backend(name).precisions) for name in plan.backends}
    taking = [name for name, offered in offers.items() if precision in offered]
    if not taking:
        listed = "; ".join(f"{name} offers {', '.join(p)}" for name, p in offers.items())
        raise InvalidInputError(
            f"precision {precision!r}: no engine of the plan runs it ({listed}); choose one "
            "they offer, or engines that offer it (backends=...)"
        )
    return plan.with_options({name: {"precision": precision} for name in taking})
