"""Checking a Plan partition by partition, and finding the first node where a backend goes wrong.

Each partition runs on its backend with the exact inputs ONNX Runtime computed for it on the whole
model; its outputs are compared with ONNX Runtime's. When a partition disagrees, a binary search
over prefixes of its node list finds the first node whose output diverges (a prefix that holds a
diverging node diverges too, so the search is sound).

Two measures: the element tolerance (the default; the contract for an fp32 plan that must compute
what ONNX Runtime computes), or an accuracy budget (``budget=``: the task-level judges of
:func:`ferry.parity.within_budget`, for reduced precision, quantized kernels and recurrent state
where engines legitimately round differently).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx_ir as ir

from ferry.backends import CompileSpec, check_options, get_backend
from ferry.errors import FerryError
from ferry.graph import infer_value_types
from ferry.parity import Budget, BudgetVerdict, OutputParity, compare_outputs, within_budget
from ferry.plan import Partition, Plan, boundary, cut_partition
from ferry.runtime._load import load

__all__ = ["PartitionCheck", "all_values", "verify_plan"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PartitionCheck:
    """How one partition compares with ONNX Runtime on the same inputs."""

    index: int
    backend: str
    nodes: int
    outputs: tuple[OutputParity, ...]
    #: The first node whose output diverges, when the partition failed and bisection found it.
    first_bad_node: str | None = None
    first_bad_op: str | None = None
    error: str | None = None
    #: The budget's verdict, when the check was made against an accuracy budget.
    accuracy: BudgetVerdict | None = None

    @property
    def passed(self) -> bool:
        if self.error is not None:
            return False
        if self.accuracy is not None:
            return self.accuracy.passed
        return all(o.passed for o in self.outputs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "backend": self.backend,
            "nodes": self.nodes,
            "passed": self.passed,
            "outputs": [o.to_dict() for o in self.outputs],
            "first_bad_node": self.first_bad_node,
            "first_bad_op": self.first_bad_op,
            "error": self.error,
            "accuracy": None if self.accuracy is None else self.accuracy.to_dict(),
        }


def all_values(model: ir.Model, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every value of the top-level graph, computed by ONNX Runtime on the whole model."""
    probe = model.clone()
    # Outputs need a type; take shape inference's where the model declares none.
    inferred = infer_value_types(probe)
    known = {v.name for v in probe.graph.outputs}
    for node in probe.graph:
        for value in node.outputs:
            if not value.name or value.name in known:
                continue
            dtype, _ = inferred.get(value.name, (None, None))
            if value.dtype is None and dtype is not None:
                value.dtype = ir.DataType.from_numpy(np.dtype(dtype))
            if value.dtype is not None:
                probe.graph.outputs.append(value)
                known.add(value.name)
    session = load(probe)
    values = dict(feeds)
    values.update(session.run(dict(feeds)))
    return values


def verify_plan(
    model: ir.Model,
    plan: Plan,
    feeds: Mapping[str, np.ndarray],
    *,
    tolerance: tuple[float, float] | None = None,
    budget: Budget | None = None,
    options: Mapping[str, Any] | None = None,
    bisect: bool = True,
) -> list[PartitionCheck]:
    """Run each partition of ``plan`` on its backend against ONNX Runtime's values.

    Args:
        model: the model the plan was made for (nodes and values named).
        plan: the plan to check.
        feeds: inputs of the whole model.
        tolerance: (atol, rtol); None picks one per dtype.
        budget: judge each partition against this accuracy budget instead of the tolerance
            (:data:`ferry.parity.DEFAULT_BUDGET` and friends; see :func:`~ferry.parity.within_budget`).
        options: options for every backend (threads, ...), merged under each partition's own.
        bisect: look for the first diverging node of a failing partition.
    """
    reference = all_values(model, feeds)
    measure = _Measure(tolerance, budget)
    checks = []
    for index, partition in enumerate(plan.partitions):
        check = _check_partition(model, index, partition, reference, measure, dict(options or {}))
        if not check.passed and bisect and check.error is None and len(partition.nodes) > 1:
            bad = _bisect(model, partition, reference, measure, dict(options or {}))
            if bad is not None:
                node = next(n for n in model.graph if n.name == bad)
                check = dataclasses.replace(check, first_bad_node=bad, first_bad_op=node.op_type)
        checks.append(check)
    return checks


@dataclasses.dataclass(frozen=True)
class _Measure:
    """Tolerance or budget: how a partition's outputs are judged against ONNX Runtime's."""

    tolerance: tuple[float, float] | None
    budget: Budget | None

    def judge(
        self, got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]
    ) -> tuple[tuple[OutputParity, ...], BudgetVerdict | None]:
        report = compare_outputs(got, want, tolerance=self.tolerance)
        if self.budget is None:
            return report.outputs, None
        return report.outputs, within_budget(got, want, self.budget)

    def passes(self, got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> bool:
        outputs, verdict = self.judge(got, want)
        return verdict.passed if verdict is not None else all(o.passed for o in outputs)


def _run_partition(
    model: ir.Model,
    partition: Partition,
    reference: Mapping[str, np.ndarray],
    options: dict[str, Any],
) -> dict[str, np.ndarray]:
    backend = get_backend(partition.backend)
    check_options(backend, partition.options)  # a plan file's options, as Session checks them
    sub = cut_partition(model, partition)
    spec = CompileSpec(partition=partition, model=sub, options={**options, **partition.options})
    compiled = backend.compile(spec)
    return compiled.run(
        {name: reference[name] for name in partition.inputs}, list(partition.outputs)
    )


def _check_partition(
    model: ir.Model,
    index: int,
    partition: Partition,
    reference: Mapping[str, np.ndarray],
    measure: _Measure,
    options: dict[str, Any],
) -> PartitionCheck:
    try:
        got = _run_partition(model, partition, reference, options)
    except FerryError as e:
        return PartitionCheck(index, partition.backend, len(partition.nodes), (), error=str(e))
    want = {name: reference[name] for name in partition.outputs}
    outputs, verdict = measure.judge(got, want)
    return PartitionCheck(index, partition.backend, len(partition.nodes), outputs, accuracy=verdict)


def _prefix(
    model: ir.Model, partition: Partition, count: int, reference: Mapping[str, np.ndarray]
) -> Partition:
    """The partition cut to its first ``count`` nodes, giving every tensor those nodes produce
    (those ONNX Runtime computed in ``reference``: types need not be declared in the model)."""
    names = partition.nodes[:count]
    inputs, _ = boundary(model, names)
    wanted = set(names)
    outputs = [
        v.name or ""
        for n in model.graph
        if n.name in wanted
        for v in n.outputs
        if v.name in reference
    ]
    return Partition(partition.backend, names, inputs, tuple(outputs), dict(partition.options))


def _bisect(
    model: ir.Model,
    partition: Partition,
    reference: Mapping[str, np.ndarray],
    measure: _Measure,
    options: dict[str, Any],
) -> str | None:
    def diverges(count: int) -> bool:
        cut = _prefix(model, partition, count, reference)
        try:
            got = _run_partition(model, cut, reference, options)
        except FerryError:
            return True
        want = {name: reference[name] for name in cut.outputs if name in reference}
        got = {name: got[name] for name in want}
        return not measure.passes(got, want)

    low, high = 1, len(partition.nodes)  # the whole partition diverges
    if not diverges(high):
        return None  # only visible with the partition's own output set: report no node
    while low < high:
        middle = (low + high) // 2
        if diverges(middle):
            high = middle
        else:
            low = middle + 1
    return partition.nodes[low - 1]
