"""The Session: runs a model's Plan, one compiled partition per backend, behind one ``run`` call.

``load`` prepares the model (``ferry.graph.prepare``), makes its plan (:func:`make_plan`: ONNX
Runtime alone, placement across the listed engines, or ``auto``'s measured choice) and builds the
Session. A plan that puts the whole graph on one backend runs the model itself (the fast path: one
engine call per ``run``). A split plan is checked against the model, each partition is lowered to a
standalone model (``ferry.plan.cut_partition``) and compiled on its backend, through the engine
cache when the backend has something to store (``_cache``). ``run`` then executes only the
partitions the requested outputs need, hands each exactly the values it reads, asks it only for the
values that are read later or were requested, and drops every value after its last reader.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np
import onnx
import onnx_ir as ir

from ferry.backends import (
    AUTO,
    DEFAULT_MIN_PARTITION_SIZE,
    FALLBACK,
    CompiledPartition,
    CompileSpec,
    PlacementReport,
    check_options,
    explain,
    get_backend,
    parse_backends,
)
from ferry.errors import InvalidInputError
from ferry.graph import graph_inputs, load_model, model_source_path, prepare
from ferry.plan import Partition, Plan, check_plan, cut_partition
from ferry.runtime._cache import EngineCache, compile_partition, resolve_cache
from ferry.runtime._specs import InputChecker, TensorSpec, spec_of

if TYPE_CHECKING:
    from ferry.parity import Budget
    from ferry.runtime._auto import AutoChoice

__all__ = [
    "AUTO_BUDGET_S",
    "PlanChoice",
    "Session",
    "load",
    "lower_plan",
    "make_plan",
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

    Returns:
        A Session; ``session.run({"input": array})`` gives ``{"output": array}``.
    """
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise InvalidInputError(f"threads must be a positive integer, got {threads!r}")
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
        from ferry.runtime._auto import artifact_shapes

        shapes = artifact_shapes(source_path)
    placed_here = plan is None
    if plan is None:
        plan = make_plan(
            work,
            names,
            threads=threads,
            precision=precision,
            feeds=example_inputs,
            shapes=shapes,
            accuracy=accuracy,
        ).plan
    elif precision is not None:
        plan = with_precision(plan, precision)
    if options:
        plan = plan.with_options(options)
    offered = placed_here and FALLBACK in names and len(names) > 1
    if check_pays and offered and set(plan.backends) != {FALLBACK}:
        plan = _faster_plan(work, plan, threads, source_path, cache_dir, example_inputs, shapes)
    session = Session(work, plan, threads=threads, source_path=source_path, cache_dir=cache_dir)
    session.quantization = quantization_report(source_path)
    return session


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
) -> Plan:
    """``plan`` (other engines than ONNX Runtime in it), or ONNX Runtime alone when that runs
    faster (see ``_pays``)."""
    from ferry.runtime._auto import timing_feeds
    from ferry.runtime._pays import cached_verdict, plan_pays

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
        return plan
    verdict = cached_verdict(work, plan, feeds, threads)
    if verdict is None:
        split = Session(work, plan, threads=threads, source_path=source_path, cache_dir=cache_dir)
        verdict = plan_pays(work, split, feeds, threads=threads)
    if verdict.pays:
        logger.info("the plan (%s) pays: %s", where, verdict.describe())
        return plan
    logger.warning(
        "running ONNX Runtime alone: %s, on %s. Pass check_pays=False (ferry.load) to run "
        "the plan anyway, or name the engine without ONNX Runtime.",
        verdict.describe(),
        where,
    )
    return Plan.whole_graph(work, FALLBACK)


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
    names = parse_backends(backends)
    if names == [AUTO]:
        from ferry.runtime._auto import auto_plan

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


def lower_plan(model: ir.Model, plan: Plan) -> list[ir.Model]:
    """Check ``plan`` against ``model``, then cut every partition out as a standalone model.

    Raises:
        PlanError: the plan does not fit the model (see :func:`ferry.plan.check_plan`).
    """
    check_plan(model, plan)
    return [
        cut_partition(model, p, where=f"partition {i} ({p.backend})")
        for i, p in enumerate(plan.partitions)
    ]


class Session:
    """A model ready to run. Thread-safe: ``run`` may be called from several threads at once.

    Made by :func:`load`, which hands it the prepared model (``ferry.graph.prepare``) and its plan.
    """

    def __init__(
        self,
        model: ir.Model,
        plan: Plan,
        *,
        threads: int | None = None,
        source_path: Path | None = None,
        cache_dir: str | os.PathLike[str] | Literal[False] | None = None,
    ) -> None:
        self.model = model
        self.plan = plan
        self.threads = threads
        #: What ``ferry quantize`` saved about this model (precision, target, metric and latency
        #: before/after, nodes kept float), when it made it; else None.
        self.quantization: dict[str, Any] | None = None
        required = [spec_of(v) for v in graph_inputs(model)]
        # From IR 4 on, an initializer that is also a graph input is a default the caller may
        # override; before IR 4 every initializer had to be listed as an input and is a constant.
        optional = [
            spec_of(v)
            for v in model.graph.inputs
            if v.name in model.graph.initializers and model.ir_version >= 4
        ]
        #: Specs of the inputs ``run`` needs: name, shape (symbolic dims as str), numpy dtype.
        self.inputs: list[TensorSpec] = required
        #: Inputs ``run`` may be given but has defaults for (initializers the model also lists as
        #: inputs), e.g. a streaming model's state.
        self.optional_inputs: list[TensorSpec] = optional
        #: Specs of the outputs ``run`` gives.
        self.outputs: list[TensorSpec] = [spec_of(v) for v in model.graph.outputs]
        self._checker = InputChecker(required, optional)
        self._output_names = [s.name for s in self.outputs]
        self._output_set = frozenset(self._output_names)
        options: dict[str, Any] = {"threads": threads} if threads else {}
        self._cache: EngineCache | None = resolve_cache(cache_dir)
        #: How each partition's engine was obtained: "loaded" (engine cache), "compiled" (and
        #: stored), "uncached" (the backend stores nothing, or no cache), "skipped" (a partition
        #: with no outputs: dead code, never compiled).
        self.engine_origins: list[str] = []
        self._single: CompiledPartition | None = None
        #: Called after each partition of a split plan runs, with its index in
        #: ``plan.partitions`` and the seconds it took (``ferry bench`` times partitions so).
        #: None, the default, costs nothing; a whole-graph plan never calls it.
        self.partition_timer: Callable[[int, float], None] | None = None
        if len(plan.partitions) == 1 and self._is_whole(plan.partitions[0]):
            # The fast path: the model itself (and its file, when given one) on one backend.
            self._compiled = [self._compile(plan.partitions[0], model, source_path, options)]
            self._single = self._compiled[0]
            self._steps: list[_Stage] = []
        else:
            lowered = lower_plan(model, plan)
            self._compiled = []
            self._steps = []
            for index, (partition, sub) in enumerate(zip(plan.partitions, lowered)):
                if not partition.outputs:
                    # Dead code (nothing it computes is read or returned): it would never run,
                    # and engines refuse a model without outputs.
                    logger.debug("skipping a partition without outputs on %s", partition.backend)
                    self.engine_origins.append("skipped")
                    continue
                compiled = self._compile(partition, sub, None, options)
                self._compiled.append(compiled)
                self._steps.append(_partition_io(index, partition, sub, compiled))
            # Graph outputs that no partition computes: graph inputs passed through, or weights.
            self._constant_outputs = {
                v.name or "": v.const_value.numpy()
                for v in model.graph.outputs
                if v.is_initializer() and v.const_value is not None
            }
            self._schedules: dict[tuple[str, ...], list[_Step]] = {}

    def _is_whole(self, partition: Partition) -> bool:
        return (
            len(partition.nodes) == len(self.model.graph)
            and set(partition.nodes) == {n.name for n in self.model.graph}
            and set(partition.outputs) == self._output_set
        )

    def _compile(
        self,
        partition: Partition,
        model: ir.Model,
        source_path: Path | None,
        options: dict[str, Any],
    ) -> CompiledPartition:
        backend = get_backend(partition.backend)
        check_options(backend, partition.options)
        spec = CompileSpec(
            partition=partition,
            model=model,
            source_path=source_path,
            options={**options, **partition.options},
        )
        logger.debug("compiling %d nodes on %s", len(partition.nodes), backend.name)
        compiled, origin = compile_partition(backend, spec, self._cache)
        self.engine_origins.append(origin)
        return compiled

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return list(self._output_names)

    def run(
        self, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run the model.

        Args:
            inputs: numpy arrays by input name; each must match its spec's dtype and fixed dims.
            outputs: names of the outputs wanted; None means all of them.

        Returns:
            The outputs by name, in the order asked for.

        Raises:
            InvalidInputError: an unknown or missing input, a wrong rank, dim or dtype, or an
                unknown output name.
            ExecutionError: the engine failed on these inputs.
        """
        feeds = self._checker.check(inputs)
        wanted = self._output_names if outputs is None else self._check_outputs(outputs)
        if self._single is not None:
            return self._single.run(feeds, wanted)
        return self._run_plan(feeds, wanted)

    def _check_outputs(self, outputs: Sequence[str]) -> list[str]:
        if isinstance(outputs, str):
            outputs = [outputs]
        unknown = [o for o in outputs if o not in self._output_set]
        if unknown:
            raise InvalidInputError(
                f"unknown output {', '.join(map(repr, unknown))}; the model gives "
                f"{', '.join(map(repr, self._output_names))}"
            )
        return list(outputs)

    def _run_plan(self, feeds: dict[str, np.ndarray], wanted: list[str]) -> dict[str, np.ndarray]:
        key = tuple(wanted)
        steps = self._schedules.get(key)
        if steps is None:
            steps = self._schedule(wanted)
            if len(self._schedules) < _MAX_SCHEDULES:
                self._schedules[key] = steps
        values: dict[str, np.ndarray] = (
            {**self._constant_outputs, **feeds} if self._constant_outputs else dict(feeds)
        )
        timer = self.partition_timer
        for step in steps:
            inputs = {name: values[name] for name in step.feeds}
            for name in step.optional:
                if name in values:
                    inputs[name] = values[name]
            if timer is None:
                values.update(step.compiled.run(inputs, step.outputs))
            else:
                start = time.perf_counter()
                values.update(step.compiled.run(inputs, step.outputs))
                timer(step.plan_index, time.perf_counter() - start)
            del inputs
            # Drop what no later partition reads, so peak memory stays near one partition's.
            for name in step.drop:
                values.pop(name, None)
        return {name: values[name] for name in wanted}

    def _schedule(self, wanted: Sequence[str]) -> list[_Step]:
        """The steps that compute ``wanted``: partitions nobody needs are left out.

        Walks the partitions backwards from the wanted outputs: a partition runs when a later
        step or the caller needs one of its outputs, and is asked only for those.
        """
        needed = set(wanted)
        chosen: list[tuple[_Stage, list[str]]] = []
        for part in reversed(self._steps):
            outputs = [name for name in part.outputs if name in needed]
            if not outputs:
                continue
            chosen.append((part, outputs))
            needed.update(part.feeds)
            needed.update(part.optional)
        chosen.reverse()
        last_read: dict[str, int] = {}
        for index, (part, _) in enumerate(chosen):
            for name in (*part.feeds, *part.optional):
                last_read[name] = index
        keep = set(wanted)
        drops: list[list[str]] = [[] for _ in chosen]
        for name, index in last_read.items():
            if name not in keep:
                drops[index].append(name)
        return [
            _Step(part.plan_index, part.compiled, part.feeds, part.optional, outputs, tuple(drop))
            for (part, outputs), drop in zip(chosen, drops)
        ]

    def __repr__(self) -> str:
        ins = ", ".join(f"{s.name}: {s.describe()}" for s in self.inputs)
        outs = ", ".join(f"{s.name}: {s.describe()}" for s in self.outputs)
        quantized = ""
        if self.quantization:
            q = self.quantization
            quantized = f", quantized={q.get('precision')} for {q.get('target')}"
        return (
            f"Session(backends={self.plan.backends}, inputs=[{ins}], outputs=[{outs}]{quantized})"
        )


# Schedules are memoized per set of requested outputs; a caller cycling through many subsets of
# a many-output model should not grow the session without bound.
_MAX_SCHEDULES = 64


class _Stage(NamedTuple):
    """A compiled partition and the values it exchanges with the others."""

    plan_index: int  # its position in plan.partitions
    compiled: CompiledPartition
    feeds: tuple[str, ...]  # inputs it must be given
    optional: tuple[str, ...]  # weights the caller may override: passed on when given
    outputs: tuple[str, ...]


class _Step(NamedTuple):
    """One partition's turn in a run: what to give it, what to ask of it, what to drop after."""

    plan_index: int  # its position in plan.partitions
    compiled: CompiledPartition
    feeds: tuple[str, ...]
    optional: tuple[str, ...]
    outputs: list[str]
    drop: tuple[str, ...]


def _partition_io(
    index: int, partition: Partition, model: ir.Model, compiled: CompiledPartition
) -> _Stage:
    graph = model.graph
    feeds = tuple(v.name or "" for v in graph.inputs if not v.is_initializer())
    optional = tuple(v.name or "" for v in graph.inputs if v.is_initializer())
    return _Stage(index, compiled, feeds, optional, tuple(partition.outputs))
