"""The Session: runs a model's Plan, one compiled partition per backend, behind one ``run`` call.

``load`` (:mod:`ferry.runtime._load`) prepares the model and makes its plan; the Session compiles
it. A plan that puts the whole graph on one backend runs the model itself (the fast path: one
engine call per ``run``). A split plan is checked against the model, each partition is lowered to a
standalone model (``ferry.plan.cut_partition``) and compiled on its backend, through the engine
cache when the backend has something to store (``_cache``). ``run`` then executes only the
partitions the requested outputs need, hands each exactly the values it reads, asks it only for the
values that are read later or were requested, and drops every value after its last reader.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import onnx_ir as ir

from ferry.backends import (
    CompiledPartition,
    CompileSpec,
    CopyingKVRunner,
    KVLayout,
    KVPool,
    KVRunner,
    PerRowKVPool,
    check_options,
    get_backend,
)
from ferry.errors import InvalidInputError
from ferry.graph import graph_inputs
from ferry.plan import Partition, Plan, check_plan, cut_partition
from ferry.runtime._cache import EngineCache, compile_partition, resolve_cache
from ferry.runtime._specs import InputChecker, TensorSpec, spec_of

__all__ = ["Session", "check_threads", "lower_plan"]

logger = logging.getLogger(__name__)


def check_threads(threads: int | None) -> None:
    """Refuse a thread count that is not a positive integer (None: each engine chooses).

    Raises:
        InvalidInputError: ``threads`` is not None nor a positive integer.
    """
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise InvalidInputError(f"threads must be a positive integer, got {threads!r}")


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

    def kv_runner(self, layout: KVLayout) -> KVRunner:
        """A runner for one sequence of a decoder with the cache ``layout`` describes: the
        engine's own (ONNX Runtime's I/O binding) when the model runs whole on one engine that
        keeps caches, else presents fed back as pasts through :meth:`run`."""
        if self._single is not None:
            engine = get_backend(self.plan.partitions[0].backend)
            runner = engine.kv_runner(self._single, layout)
            if runner is not None:
                return runner
        return CopyingKVRunner(self.run, layout)

    def kv_pool(self, layout: KVLayout, rows: int) -> KVPool:
        """Caches for up to ``rows`` sequences of ``layout.capacity`` slots each, decoded as one
        batch by the engine where it can (ONNX Runtime on a graph sharing past and present),
        else one :meth:`kv_runner` per sequence stepped in turn."""
        if self._single is not None:
            engine = get_backend(self.plan.partitions[0].backend)
            pool = engine.kv_pool(self._single, layout, rows)
            if pool is not None:
                return pool
        return PerRowKVPool(self.kv_runner, layout, rows)

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
