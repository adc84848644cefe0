"""The Session: runs a model's Plan, one compiled partition per backend, behind one ``run`` call."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx_ir.passes.common import NameFixPass

from ferry.backends import get_backend
from ferry.backends.api import CompiledPartition, CompileSpec
from ferry.errors import FerryError, InvalidInputError
from ferry.graph import graph_inputs, infer_value_types, load_model, model_source_path
from ferry.runtime.plan import Partition, Plan
from ferry.runtime.specs import InputChecker, TensorSpec, spec_of

__all__ = ["Session", "backend_names", "load"]

logger = logging.getLogger(__name__)

DEFAULT_BACKENDS = ("onnxruntime",)


def load(
    source: str | os.PathLike[str] | ir.Model | onnx.ModelProto,
    *,
    backends: str | Sequence[str] | None = None,
    threads: int | None = None,
    plan: Plan | None = None,
) -> Session:
    """Load a model and make it ready to run.

    Args:
        source: an ``.onnx`` file, a ferry artifact folder, an ``onnx_ir.Model`` or an
            ``onnx.ModelProto``. The source is never modified.
        backends: backend names in priority order (``"onnxruntime"`` or ``["onnxruntime"]``);
            None means ONNX Runtime on the CPU.
        threads: intra-op threads per engine; None lets each engine choose (all cores).
        plan: run this plan instead of placing the whole graph on the first backend.

    Returns:
        A Session; ``session.run({"input": array})`` gives ``{"output": array}``.
    """
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise InvalidInputError(f"threads must be a positive integer, got {threads!r}")
    names = backend_names(backends)
    for name in names:
        get_backend(name)  # fail early, naming the missing engine
    model = load_model(source)
    # Engines may read the file itself only when it is what we were given: an in-memory model
    # loaded from a file may have been changed since.
    source_path = model_source_path(model) if isinstance(source, (str, os.PathLike)) else None
    # Work on a copy (weights are shared, not copied) so that naming nodes never touches the caller's model.
    work = model.clone()
    NameFixPass()(work)
    if plan is None:
        plan = Plan.whole_graph(work, names[0])
    return Session(work, plan, threads=threads, source_path=source_path)


def backend_names(backends: str | Sequence[str] | None) -> list[str]:
    if backends is None:
        return list(DEFAULT_BACKENDS)
    if isinstance(backends, str):
        names = [b.strip() for b in backends.split(",") if b.strip()]
    else:
        names = [str(b) for b in backends]
    if not names:
        raise InvalidInputError("backends is empty; name at least one, e.g. 'onnxruntime'")
    return names


class Session:
    """A model ready to run. Thread-safe: ``run`` may be called from several threads at once."""

    def __init__(
        self,
        model: ir.Model,
        plan: Plan,
        *,
        threads: int | None = None,
        source_path: Path | None = None,
    ) -> None:
        self.model = model
        self.plan = plan
        self.threads = threads
        inferred = infer_value_types(model)
        required = [spec_of(v, inferred.get(v.name or "")) for v in graph_inputs(model)]
        # From IR 4 on, an initializer that is also a graph input is a default the caller may
        # override; before IR 4 every initializer had to be listed as an input and is a constant.
        optional = [
            spec_of(v, inferred.get(v.name or ""))
            for v in model.graph.inputs
            if v.name in model.graph.initializers and model.ir_version >= 4
        ]
        #: Specs of the inputs ``run`` needs: name, shape (symbolic dims as str), numpy dtype.
        self.inputs: list[TensorSpec] = required
        #: Specs of the outputs ``run`` gives.
        self.outputs: list[TensorSpec] = [
            spec_of(v, inferred.get(v.name or "")) for v in model.graph.outputs
        ]
        self._checker = InputChecker(required, optional)
        self._output_names = [s.name for s in self.outputs]
        self._output_set = frozenset(self._output_names)
        options: dict[str, Any] = {"threads": threads} if threads else {}
        self._compiled: list[CompiledPartition] = [
            self._compile(p, source_path, options) for p in plan.partitions
        ]
        self._single = self._compiled[0] if len(self._compiled) == 1 else None
        self._last_use = _last_uses(plan)

    def _compile(
        self, partition: Partition, source_path: Path | None, options: dict[str, Any]
    ) -> CompiledPartition:
        backend = get_backend(partition.backend)
        graph = self.model.graph
        whole = len(partition.nodes) == len(graph) and set(partition.outputs) == self._output_set
        if not whole:
            raise FerryError(
                "this plan splits the graph into partitions, which needs ferry's partitioner to "
                "lower them; run the whole model on one backend instead"
            )
        spec = CompileSpec(
            partition=partition,
            model=self.model,
            source_path=source_path,
            options={**options, **partition.options},
        )
        logger.debug("compiling %d nodes on %s", len(partition.nodes), backend.name)
        return backend.compile(spec)

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
        values: dict[str, np.ndarray] = dict(feeds)
        keep = set(wanted)
        for index, (partition, compiled) in enumerate(zip(self.plan.partitions, self._compiled)):
            part_inputs = {name: values[name] for name in partition.inputs}
            values.update(compiled.run(part_inputs, list(partition.outputs)))
            # Drop what no later partition reads, so peak memory stays near one partition's.
            for name in self._last_use[index]:
                if name not in keep:
                    values.pop(name, None)
        return {name: values[name] for name in wanted}

    def __repr__(self) -> str:
        ins = ", ".join(f"{s.name}: {s.describe()}" for s in self.inputs)
        outs = ", ".join(f"{s.name}: {s.describe()}" for s in self.outputs)
        return f"Session(backends={self.plan.backends}, inputs=[{ins}], outputs=[{outs}])"


def _last_uses(plan: Plan) -> list[list[str]]:
    """For each partition, the values read for the last time there."""
    last: dict[str, int] = {}
    for index, partition in enumerate(plan.partitions):
        for name in partition.inputs:
            last[name] = index
    per_partition: list[list[str]] = [[] for _ in plan.partitions]
    for name, index in last.items():
        per_partition[index].append(name)
    return per_partition
