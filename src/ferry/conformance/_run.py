"""Backend conformance: ONNX's own node test cases, run on a backend for the ops its rules claim.

The algorithm, per test case of ``onnx.backend.test.case.node``:

1. Map the case to the op it tests: its single node's op, or for an ``*_expanded`` case (the op's
   function body, inlined by ONNX) the op whose body it is.
2. Skip it when it uses what no engine in ferry takes: training ops, graph inputs and outputs
   that are not tensors (sequences, optionals, maps: partitions exchange tensors only), or random
   ops whose expected outputs are numpy's draws.
3. Ask the backend's rule table about every top-level node (after ONNX shape inference, so that
   dtype and rank conditions see types), as the partitioner does (Constant nodes feeding others
   excepted: the partitioner places them with their reader). A node the rules reject makes the
   case a skip with the rules' reason: the backend never claimed it, so it is no failure. So does
   a node the backend's ``validate`` vetoes: the engine would never be given it.
4. Otherwise compile the case through the adapter API (``Backend.compile`` on a whole-graph
   partition), run every data set and compare with ONNX's expected outputs the way ONNX's backend
   test runner does (``|actual - expected| <= atol + rtol * |expected|``, NaN equal to NaN, shapes
   and dtypes exact, strings equal).

Every exception is caught per case (status ``error``). With ``workers >= 1`` the cases run in
worker processes, so that an engine that crashes or hangs on one case (a segfault, a deadlock)
costs that case only: it is recorded as an error and the worker is replaced.

DESIGN.md: a rule table that claims an op its conformance run fails is a bug.
``ConformanceReport.claimed_failures`` lists exactly those; ``tests/conformance`` fails on them.

Run ``python -m ferry.conformance --backend onnxruntime --out docs/conformance/`` to
write the Markdown table and JSON report for a backend.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import datetime
import functools
import importlib
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import re
import sys
import time
import traceback
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import onnx_ir as ir

from ferry.errors import FerryError

if TYPE_CHECKING:
    from ferry.backends import Backend, RuleTable

__all__ = [
    "CaseResult",
    "ConformanceCase",
    "ConformanceReport",
    "OpSummary",
    "collect_cases",
    "compare_outputs",
    "main",
    "op_name",
    "rule_table",
    "run_case",
    "run_conformance",
    "sample_cases",
    "write_table",
]

logger = logging.getLogger(__name__)

#: ONNX's backend test runner uses these when a case sets none.
DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-7
#: Seconds one case may take in a worker process before it is killed and counted as an error.
DEFAULT_TIMEOUT = 120.0
#: Seconds a worker process may take to import the engine and report ready.
_STARTUP_TIMEOUT = 300.0

_TRAINING_DOMAINS = frozenset({"ai.onnx.preview.training"})
_RANDOM_OPS = frozenset(
    {
        "Bernoulli",
        "Multinomial",
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
    }
)
_EXPANDED = re.compile(r"^(?P<base>.+)_expanded(?:_ver\d+)?$")
_STATUSES = ("pass", "fail", "error", "skip")


def _normal_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def op_name(domain: str, op_type: str) -> str:
    """How reports name an op: ``Conv`` in the ONNX domain, ``ai.onnx.ml::LabelEncoder`` elsewhere."""
    domain = _normal_domain(domain)
    return op_type if not domain else f"{domain}::{op_type}"


# --------------------------------------------------------------------------------------------------
# Cases


@dataclasses.dataclass(frozen=True)
class ConformanceCase:
    """One ONNX node test case, tied to the op it tests.

    Attributes:
        name: ONNX's name for it (``test_relu``, ``test_layer_normalization_2d_axis0_expanded``).
        domain / op_type: the op it tests.
        expanded: whether the model is the op's function body rather than the op itself.
        model: the test model, exactly as ONNX builds it.
        data_sets: ``(inputs, expected outputs)`` pairs in graph input and output order; tensors are
            numpy arrays, sequences lists, absent optionals None.
        rtol / atol: the tolerance ONNX gives the case.
    """

    name: str
    domain: str
    op_type: str
    expanded: bool
    model: onnx.ModelProto
    data_sets: tuple[tuple[tuple[Any, ...], tuple[Any, ...]], ...]
    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL

    @property
    def op(self) -> str:
        return op_name(self.domain, self.op_type)

    @property
    def key(self) -> tuple[str, str]:
        return (_normal_domain(self.domain), self.op_type)


def _normalize(value: Any) -> Any:
    """A data set entry as a backend receives and returns it: numpy arrays (scalars included)."""
    if value is None:
        return None
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, (list, tuple)):
        return [_normalize(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _normalize(v) for k, v in value.items()}
    return np.asarray(value)


@functools.lru_cache(maxsize=1)
def _onnx_test_cases() -> tuple[Any, ...]:
    """Every node test case ONNX defines (``onnx.backend.test.case.TestCase``), collected once.

    ``collect_testcases`` fills a module-level list as a side effect of importing the case modules,
    filtered by the ``op_type`` of the *first* call in the process: a later call returns whatever
    that first call kept. When another caller got there first, the case modules are reloaded so
    that the list is complete.
    """
    import onnx.backend.test.case.node as node_cases
    from onnx.backend.test.case.utils import import_recursive

    prefix = node_cases.__name__ + "."
    with warnings.catch_warnings():
        # The generators overflow and divide by zero on purpose (inf and NaN cases).
        warnings.simplefilter("ignore")
        stale = sorted(name for name in sys.modules if name.startswith(prefix))
        if not stale:
            return tuple(node_cases.collect_testcases())
        node_cases._NodeTestCases.clear()
        node_cases._existing_names.clear()
        node_cases._TargetOpType = None
        for name in stale:
            importlib.reload(sys.modules[name])
        import_recursive(node_cases)
        return tuple(node_cases._NodeTestCases)


@functools.lru_cache(maxsize=1)
def _all_cases() -> tuple[ConformanceCase, ...]:
    raw = _onnx_test_cases()
    tested: dict[str, tuple[str, str]] = {}
    for case in raw:
        if not _EXPANDED.match(case.name) and len(case.model.graph.node) == 1:
            node = case.model.graph.node[0]
            tested[case.name] = (_normal_domain(node.domain), node.op_type)
    cases = []
    for case in raw:
        match = _EXPANDED.match(case.name)
        expanded = match is not None and match["base"] in tested
        if expanded:
            assert match is not None
            domain, op_type = tested[match["base"]]
        elif case.name in tested:
            domain, op_type = tested[case.name]
        else:
            # Not seen in onnx 1.23: a multi-node case that is no function expansion. Name it
            # after its first node rather than drop it.
            node = case.model.graph.node[0]
            domain, op_type = _normal_domain(node.domain), node.op_type
        data_sets = tuple(
            (tuple(_normalize(x) for x in inputs), tuple(_normalize(y) for y in outputs))
            for inputs, outputs in case.data_sets or ()
        )
        cases.append(
            ConformanceCase(
                name=case.name,
                domain=domain,
                op_type=op_type,
                expanded=expanded,
                model=case.model,
                data_sets=data_sets,
                rtol=case.rtol if case.rtol is not None else DEFAULT_RTOL,
                atol=case.atol if case.atol is not None else DEFAULT_ATOL,
            )
        )
    return tuple(cases)


def collect_cases(ops: Iterable[tuple[str, str]] | None = None) -> list[ConformanceCase]:
    """ONNX's node test cases, each tied to the op it tests.

    Args:
        ops: ``(domain, op_type)`` pairs to keep (``""`` or ``"ai.onnx"`` for ONNX's own ops);
            None keeps every case. Function-body (``_expanded``) cases count as their op's.

    Returns:
        The cases in ONNX's order (about 1,900 with onnx 1.23, a quarter of them expanded).
    """
    cases = _all_cases()
    if ops is None:
        return list(cases)
    wanted = {(_normal_domain(d), t) for d, t in ops}
    return [case for case in cases if case.key in wanted]


def sample_cases(cases: Sequence[ConformanceCase], per_op: int) -> list[ConformanceCase]:
    """A representative subset: at most ``per_op`` cases of each op (and of its function body),
    spread evenly over ONNX's cases for it, first and last included; ONNX's order is kept.

    Every op keeps at least one case, so a sample still touches every op a backend claims.
    """
    groups: dict[tuple[str, str, bool], list[int]] = {}
    for index, case in enumerate(cases):
        groups.setdefault((*case.key, case.expanded), []).append(index)
    keep: set[int] = set()
    for indices in groups.values():
        n = len(indices)
        if n <= per_op:
            keep.update(indices)
        elif per_op <= 1:
            keep.add(indices[0])
        else:
            keep.update(indices[round(i * (n - 1) / (per_op - 1))] for i in range(per_op))
    return [case for index, case in enumerate(cases) if index in keep]


# --------------------------------------------------------------------------------------------------
# Results


@dataclasses.dataclass(frozen=True)
class CaseResult:
    """How one case went.

    Attributes:
        op: the op it tests (``op_name`` spelling).
        case_name: ONNX's name for the case.
        status: ``pass``, ``fail`` (ran, outputs differ), ``error`` (compile or run raised, crashed
            or timed out) or ``skip`` (not claimed by the rules, or not runnable in ferry).
        reason: why it failed, erred or was skipped; None on a pass.
        max_abs_err: the largest absolute difference over all outputs, when there were numbers to
            compare.
        expanded: whether the case is the op's function body.
        claimed: whether the backend's rules accept every node of the case (None: the backend has
            no rules, every case was run).
        seconds: compile and run time.
        ops: the distinct ops in the case's graph.
    """

    op: str
    case_name: str
    status: str
    reason: str | None = None
    max_abs_err: float | None = None
    expanded: bool = False
    claimed: bool | None = None
    seconds: float = 0.0
    ops: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["ops"] = list(self.ops)
        d["seconds"] = round(self.seconds, 4)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CaseResult:
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in fields}
        kwargs["ops"] = tuple(kwargs.get("ops", ()))
        return cls(**kwargs)


@dataclasses.dataclass(frozen=True)
class OpSummary:
    """One row of the coverage table: an op (or its function body), and how its cases went."""

    op: str
    expanded: bool
    claimed: str
    passed: int
    failed: int
    errors: int
    skipped: int
    notes: str

    @property
    def label(self) -> str:
        return f"{self.op} (function body)" if self.expanded else self.op

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class ConformanceReport:
    """The outcome of a conformance run of one backend.

    Attributes:
        backend / device / engine_version: which engine ran the cases.
        onnx_version / ferry_version: where the cases and the harness came from.
        date: when the run started (UTC, ISO 8601).
        seconds: wall time of the run.
        workers: worker processes used (0: in-process).
        has_rules: whether the backend publishes rules; when not, every case was run.
        claimed_ops: every op the rules claim (within the ops asked for), ``op_name`` spelling.
        untested_ops: the claimed ops ONNX has no node test case for.
        cases: every case's result, in ONNX's order.
    """

    backend: str
    device: str
    engine_version: str
    onnx_version: str
    ferry_version: str
    date: str
    seconds: float
    workers: int
    has_rules: bool
    claimed_ops: list[str]
    untested_ops: list[str]
    cases: list[CaseResult]

    def counts(self) -> dict[str, int]:
        """Cases per status."""
        found = collections.Counter(c.status for c in self.cases)
        return {status: found.get(status, 0) for status in _STATUSES}

    def claimed_failures(self) -> dict[str, list[CaseResult]]:
        """The bugs: claimed cases that failed or erred, by op (function bodies as ``op (function body)``)."""
        bad: dict[str, list[CaseResult]] = {}
        for case in self.cases:
            if case.claimed is not False and case.status in ("fail", "error"):
                label = f"{case.op} (function body)" if case.expanded else case.op
                bad.setdefault(label, []).append(case)
        return dict(sorted(bad.items()))

    def vetoed(self) -> dict[str, list[CaseResult]]:
        """Claimed cases the backend's ``validate`` refused, by op: the rules over-claim them."""
        found: dict[str, list[CaseResult]] = {}
        for case in self.cases:
            if case.claimed and case.status == "skip" and (case.reason or "").startswith("vetoed"):
                label = f"{case.op} (function body)" if case.expanded else case.op
                found.setdefault(label, []).append(case)
        return dict(sorted(found.items()))

    def ops(self) -> list[OpSummary]:
        """One row per op tested (and its function body, when ONNX has a case for it), plus one per
        claimed op that ONNX has no test case for; sorted by op."""
        groups: dict[tuple[str, bool], list[CaseResult]] = {}
        for case in self.cases:
            groups.setdefault((case.op, case.expanded), []).append(case)
        for op in self.untested_ops:
            groups.setdefault((op, False), [])
        claimed = set(self.claimed_ops)
        rows = [
            _summarize(op, expanded, cases, claimed, self.has_rules)
            for (op, expanded), cases in groups.items()
        ]
        return sorted(rows, key=lambda r: (("::" in r.op), r.op.lower(), r.expanded))

    def to_dict(self) -> dict[str, Any]:
        meta = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "cases"
        }
        return {
            **meta,
            "counts": self.counts(),
            "claimed_failures": {
                op: [c.case_name for c in cases] for op, cases in self.claimed_failures().items()
            },
            "vetoed": {op: [c.case_name for c in cases] for op, cases in self.vetoed().items()},
            "ops": [row.to_dict() for row in self.ops()],
            "cases": [c.to_dict() for c in self.cases],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ConformanceReport:
        fields = {f.name for f in dataclasses.fields(cls)} - {"cases"}
        meta = {k: v for k, v in d.items() if k in fields}
        meta.setdefault("untested_ops", [])
        return cls(
            **meta,
            cases=[CaseResult.from_dict(c) for c in d.get("cases", [])],
        )

    def summary(self) -> str:
        """One line: engine, date, counts."""
        counts = self.counts()
        failing = len(self.claimed_failures())
        rules = (
            f"{len(self.claimed_ops)} ops claimed by its rules, {failing} of them failing"
            if self.has_rules
            else "the backend has no rules, so every case was run"
        )
        return (
            f"{self.backend} {self.engine_version} ({self.device}), {self.date[:10]}: "
            f"{counts['pass']} passed, {counts['fail']} failed, {counts['error']} errors, "
            f"{counts['skip']} skipped of {len(self.cases)} ONNX {self.onnx_version} node test "
            f"cases in {self.seconds:.0f} s; {rules}"
        )


def _summarize(
    op: str, expanded: bool, cases: Sequence[CaseResult], claimed: set[str], has_rules: bool
) -> OpSummary:
    counts = collections.Counter(c.status for c in cases)
    notes: list[str] = []
    if not has_rules:
        claim = "n/a"
    elif not expanded:
        claim = "yes" if op in claimed else "no"
    else:
        # A function body is claimed case by case: when the rules take every node in it.
        verdicts = [c.claimed for c in cases if c.claimed is not None]
        claim = (
            "n/a"
            if not verdicts
            else "yes"
            if all(verdicts)
            else "partly"
            if any(verdicts)
            else "no"
        )
    if not cases:
        notes.append("ONNX has no node test case for it")
    bad = [c for c in cases if c.status in ("fail", "error")]
    for case in bad[:3]:
        notes.append(f"{case.case_name}: {case.reason}")
    if len(bad) > 3:
        notes.append(f"{len(bad) - 3} more failing")
    skips = collections.Counter(
        _skip_kind(c.reason) for c in cases if c.status == "skip" and c.reason
    )
    for reason, n in skips.most_common(2):
        notes.append(f"skipped ({n}): {reason}")
    if len(skips) > 2:
        notes.append("other skips: see the JSON report")
    return OpSummary(
        op=op,
        expanded=expanded,
        claimed=claim,
        passed=counts.get("pass", 0),
        failed=counts.get("fail", 0),
        errors=counts.get("error", 0),
        skipped=counts.get("skip", 0),
        notes="; ".join(notes),
    )


def _skip_kind(reason: str) -> str:
    # Rule reasons name the input index and dtype of one case; keep one line per kind of reason.
    return reason if len(reason) <= 120 else reason[:117] + "..."


# --------------------------------------------------------------------------------------------------
# Running one case


def rule_table(backend: Backend) -> RuleTable | None:
    """The backend's rules as a table, or None when it publishes none (``rules()`` missing or not
    implemented)."""
    from ferry.backends import RuleTable

    rules = getattr(backend, "rules", None)
    if rules is None:
        return None
    try:
        return RuleTable(rules())
    except NotImplementedError:
        return None


def _feature_skip(case: ConformanceCase) -> str | None:
    """Why no ferry backend could run this case, or None."""
    graph = case.model.graph
    training = sorted({n.op_type for n in graph.node if n.domain in _TRAINING_DOMAINS})
    if training:
        return f"training op ({', '.join(training)}): inference engines do not run it"
    for kind, values in (("input", graph.input), ("output", graph.output)):
        for value in values:
            which = value.type.WhichOneof("value")
            if which != "tensor_type":
                what = (which or "untyped").replace("_type", "")
                article = "an" if what[:1] in "aeiou" else "a"
                return (
                    f"graph {kind} {value.name!r} is {article} {what}: ferry partitions exchange "
                    "tensors only"
                )
    for inputs, outputs in case.data_sets:
        if any(x is None for x in (*inputs, *outputs)):
            return "an absent optional input or output: ferry partitions exchange tensors only"
    return _random_reason(case)


def _random_reason(case: ConformanceCase) -> str | None:
    """Why the case's expected outputs are random draws no engine can reproduce, or None.

    ONNX computed them with numpy's generator: a random op (``Bernoulli``, ``RandomUniformLike``...)
    or ``Dropout`` in training mode with a non-zero ratio.
    """
    graph = case.model.graph
    known = dict(zip((v.name for v in graph.input), case.data_sets[0][0])) if case.data_sets else {}
    for node in graph.node:
        if _normal_domain(node.domain) != "":
            continue
        if node.op_type in _RANDOM_OPS:
            return (
                f"{node.op_type} draws random numbers: no engine reproduces the numpy draws "
                "ONNX's expected outputs came from"
            )
        if node.op_type == "Dropout" and len(node.input) > 2 and node.input[2]:
            training = known.get(node.input[2])
            ratio = known.get(node.input[1]) if node.input[1] else 0.5
            if training is None or (
                bool(np.asarray(training)) and (ratio is None or float(np.asarray(ratio)) != 0.0)
            ):
                return (
                    "Dropout in training mode drops random elements: no engine reproduces the "
                    "numpy draws ONNX's expected outputs came from"
                )
    return None


def _prepare(case: ConformanceCase) -> ir.Model:
    """The case as the partitioner sees a model: shapes inferred, every node and value named."""
    from onnx_ir.passes.common import NameFixPass

    proto = case.model
    try:
        proto = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    except Exception as e:  # inference failing only means fewer types for the rules to check
        logger.debug("shape inference failed on %s: %s", case.name, e)
    model = ir.from_proto(proto)
    NameFixPass()(model)
    return model


def _graph_ops(model: ir.Model) -> tuple[str, ...]:
    return tuple(sorted({op_name(n.domain, n.op_type) for n in model.graph}))


def _rules_verdict(model: ir.Model, table: RuleTable) -> str | None:
    """None when the rules accept every top-level node, else the first rejection.

    Only the main graph's nodes are asked about, as the partitioner does: a control-flow node's
    rule answers for its bodies. Constant nodes that feed other nodes are not asked about either:
    the partitioner places them with their first reader whatever the rules say.
    """
    opsets = dict(model.opset_imports)
    nodes = list(model.graph)
    for node in nodes:
        if len(nodes) > 1 and node.op_type == "Constant" and _normal_domain(node.domain) == "":
            continue
        verdict = table.supports(node, opsets)
        if verdict is not True:
            return str(verdict) if len(nodes) == 1 else f"node {node.name}: {verdict}"
    return None


def run_case(
    backend: Backend,
    case: ConformanceCase,
    *,
    rules: RuleTable | None = None,
    include_unclaimed: bool = False,
    options: Mapping[str, Any] | None = None,
) -> CaseResult:
    """Run one case on ``backend`` in this process and compare with ONNX's expected outputs.

    Args:
        backend: the engine adapter.
        case: from ``collect_cases``.
        rules: the rule table to check the case against; None runs the case unchecked (``claimed``
            is then None). Pass ``rule_table(backend)`` for the backend's own rules.
        include_unclaimed: run cases the rules reject too (recorded with ``claimed=False``), to see
            what the engine could take beyond its rules.
        options: ``CompileSpec.options`` (default ``{"threads": 1}``).

    Returns:
        The result; never raises for a problem of the case or the engine.
    """
    try:
        prepared = _prepare_verdict(case, rules, include_unclaimed)
    except Exception as e:
        return CaseResult(
            case.op,
            case.name,
            "error",
            f"preparing the case: {_one_line(e)}",
            expanded=case.expanded,
        )
    if isinstance(prepared, CaseResult):
        return prepared
    model, claimed = prepared
    return _execute(backend, case, model, claimed, dict(options or {"threads": 1}))


def _prepare_verdict(
    case: ConformanceCase, rules: RuleTable | None, include_unclaimed: bool
) -> CaseResult | tuple[ir.Model, bool | None]:
    """The case's model and whether the rules claim it, or the skip result when it is not run."""
    feature = _feature_skip(case)
    if feature is not None:
        return CaseResult(
            case.op,
            case.name,
            "skip",
            feature,
            expanded=case.expanded,
            claimed=None,
        )
    model = _prepare(case)
    if rules is None:
        return model, None
    verdict = _rules_verdict(model, rules)
    if verdict is not None and not include_unclaimed:
        return CaseResult(
            case.op,
            case.name,
            "skip",
            f"not claimed: {verdict}",
            expanded=case.expanded,
            claimed=False,
            ops=_graph_ops(model),
        )
    return model, verdict is None


def _execute(
    backend: Backend,
    case: ConformanceCase,
    model: ir.Model,
    claimed: bool | None,
    options: dict[str, Any],
) -> CaseResult:
    """Validate, compile and run ``model`` on ``backend`` and compare; every exception is a result."""
    from ferry.backends import CompileSpec
    from ferry.plan import Plan

    ops = _graph_ops(model)
    result = functools.partial(
        CaseResult, case.op, case.name, expanded=case.expanded, claimed=claimed, ops=ops
    )
    start = time.perf_counter()
    stage = "planning"
    try:
        partition = Plan.whole_graph(model, backend.name, options).partitions[0]
        validate = getattr(backend, "validate", None)
        if validate is not None:
            stage = "validate()"
            vetoed = validate(model, list(partition.nodes))
            if vetoed:
                node, why = next(iter(sorted(vetoed.items())))
                return result(
                    "skip",
                    f"vetoed by {backend.name}.validate(): {node}: {why}",
                    seconds=time.perf_counter() - start,
                )
        stage = "compile"
        compiled = backend.compile(CompileSpec(partition=partition, model=model, options=options))
        worst: float | None = None
        for index, (inputs, expected) in enumerate(case.data_sets):
            stage = "run" if len(case.data_sets) == 1 else f"run (data set {index})"
            feeds = dict(zip(partition.inputs, inputs))
            got = compiled.run(feeds)
            actual = [got.get(name) for name in partition.outputs]
            ok, reason, err = compare_outputs(
                expected, actual, case.rtol, case.atol, names=partition.outputs
            )
            if err is not None:
                worst = err if worst is None else max(worst, err)
            if not ok:
                return result("fail", reason, worst, seconds=time.perf_counter() - start)
        return result("pass", None, worst, seconds=time.perf_counter() - start)
    except Exception as e:
        return result("error", f"{stage}: {_one_line(e)}", seconds=time.perf_counter() - start)


def _one_line(e: BaseException, limit: int = 400) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    if not isinstance(e, FerryError):
        text = f"{type(e).__name__}: {text}"
    if len(text) <= limit:
        return text
    # Engines put the source location and C++ signature first and the reason last
    # ("...conv_integer.cc:52 virtual Status ConvInteger::Compute(...) ... is not supported now."):
    # keep both ends.
    head = limit // 3
    return text[:head] + " ... " + text[-(limit - head - 5) :]


def compare_outputs(
    expected: Sequence[Any],
    actual: Sequence[Any],
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    names: Sequence[str] | None = None,
) -> tuple[bool, str | None, float | None]:
    """Compare outputs the way ONNX's backend test runner does (``assert_similar_outputs``).

    Shapes and dtypes must match exactly, strings be equal, and numbers satisfy
    ``|actual - expected| <= atol + rtol * |expected|`` (NaN equal to NaN, infinities equal to
    themselves); bfloat16 gets at least two ULPs of relative tolerance, as ONNX allows.

    Returns:
        ``(passed, reason or None, max_abs_err or None)``.
    """
    if len(actual) != len(expected):
        return False, f"{len(actual)} outputs, expected {len(expected)}", None
    worst: float | None = None
    for index, (exp, act) in enumerate(zip(expected, actual)):
        label = f"output {index}" + (f" ({names[index]})" if names and index < len(names) else "")
        if act is None:
            return False, f"{label} missing", worst
        if isinstance(exp, list):
            if not isinstance(act, (list, tuple)) or len(act) != len(exp):
                return False, f"{label}: expected a sequence of {len(exp)} tensors", worst
            ok, reason, err = compare_outputs(exp, list(act), rtol, atol)
            if err is not None:
                worst = err if worst is None else max(worst, err)
            if not ok:
                return False, f"{label}: {reason}", worst
            continue
        ok, reason, err = _compare_tensor(np.asarray(exp), np.asarray(act), rtol, atol)
        if err is not None:
            worst = err if worst is None else max(worst, err)
        if not ok:
            return False, f"{label}: {reason}", worst
    return True, None, worst


def _compare_tensor(
    exp: np.ndarray, act: np.ndarray, rtol: float, atol: float
) -> tuple[bool, str | None, float | None]:
    if act.shape != exp.shape:
        return False, f"shape {act.shape}, expected {exp.shape}", None
    if exp.dtype == object or act.dtype == object or exp.dtype.kind in "US":
        equal = np.array_equal(act.astype(object), exp.astype(object))
        return equal, None if equal else "strings differ", None
    if act.dtype != exp.dtype:
        return False, f"dtype {act.dtype}, expected {exp.dtype}", None
    if exp.dtype.name == "bfloat16":
        rtol = max(rtol, 2.0**-6)
    if exp.dtype.kind not in "biufc":
        # ml_dtypes' float8/int4/... types: compare their values as float32, as numpy cannot mix
        # them with Python floats.
        exp, act = exp.astype(np.float32), act.astype(np.float32)
    if exp.size == 0:
        return True, None, None
    if exp.dtype.kind == "b":
        exp, act = exp.astype(np.int8), act.astype(np.int8)
    close = np.isclose(act, exp, rtol=rtol, atol=atol, equal_nan=True)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(act.astype(np.float64) - exp.astype(np.float64))
    finite = diff[np.isfinite(diff)]
    err = float(finite.max()) if finite.size else None
    if close.all():
        return True, None, err
    bad = int((~close).sum())
    # A mismatch against an infinity or a NaN (-FLT_MAX for -inf, say) has no finite error.
    mismatched = diff[~close]
    worst_bad: float | str | None = err
    if np.isnan(mismatched).any():
        worst_bad = "nan"
    elif np.isinf(mismatched).any():
        worst_bad = "inf"
    where = np.unravel_index(int(np.argmin(close)), exp.shape) if exp.ndim else ()
    first = f"at {tuple(int(i) for i in where)}: {act[where]!r} vs {exp[where]!r}"
    return (
        False,
        f"{bad} of {exp.size} elements differ (max abs err {worst_bad}, rtol {rtol}, "
        f"atol {atol}); first {first}",
        err,
    )


# --------------------------------------------------------------------------------------------------
# Running many cases


def run_conformance(
    backend: Backend,
    ops: Iterable[tuple[str, str]] | None = None,
    *,
    cases: Sequence[ConformanceCase] | None = None,
    include_unclaimed: bool = False,
    workers: int = 0,
    timeout: float = DEFAULT_TIMEOUT,
    options: Mapping[str, Any] | None = None,
) -> ConformanceReport:
    """Run ONNX's node test cases on ``backend`` and collect the results.

    Args:
        backend: the engine adapter. Its ``rules()`` decide which cases count; a backend without
            rules runs every case.
        ops: ``(domain, op_type)`` pairs to test; None tests every op.
        cases: the cases to run instead of ``collect_cases(ops)`` (a sample, say).
        include_unclaimed: run cases the rules reject too (see ``run_case``).
        workers: worker processes; 0 runs in this process (no timeout, and an engine crash takes
            the caller down with it).
        timeout: seconds a case may take in a worker before it is killed and recorded as an error.
        options: ``CompileSpec.options`` (default ``{"threads": 1}``).

    Returns:
        The report, cases in ONNX's order.
    """
    from ferry._version import __version__

    start = time.perf_counter()
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    table = rule_table(backend)
    ops = None if ops is None else {(_normal_domain(d), t) for d, t in ops}
    selected = list(cases) if cases is not None else collect_cases(ops)
    opts = dict(options or {"threads": 1})

    results: list[CaseResult | None] = [None] * len(selected)
    runnable: list[tuple[int, ConformanceCase, ir.Model, bool | None]] = []
    for index, case in enumerate(selected):
        try:
            prepared = _prepare_verdict(case, table, include_unclaimed)
        except Exception as e:
            prepared = CaseResult(
                case.op, case.name, "error", f"preparing: {_one_line(e)}", expanded=case.expanded
            )
        if isinstance(prepared, CaseResult):
            results[index] = prepared
        else:
            runnable.append((index, case, *prepared))
    logger.info(
        "%s: %d of %d cases to run (%d skipped)",
        backend.name,
        len(runnable),
        len(selected),
        len(selected) - len(runnable),
    )
    if workers <= 0:
        for done, (index, case, model, claimed) in enumerate(runnable, 1):
            results[index] = _execute(backend, case, model, claimed, opts)
            if done % 200 == 0:
                logger.info("%s: %d of %d cases run", backend.name, done, len(runnable))
    else:
        pool = _WorkerPool(backend, workers, timeout, opts)
        for index, result in pool.run(runnable):
            results[index] = result

    claimed_ops: list[str] = []
    untested_ops: list[str] = []
    if table is not None:
        keys = [(d, t) for d, t in table.ops() if ops is None or (d, t) in ops]
        with_cases = {case.key for case in _all_cases()}
        claimed_ops = sorted(op_name(d, t) for d, t in keys)
        untested_ops = sorted(op_name(d, t) for d, t in keys if (d, t) not in with_cases)

    return ConformanceReport(
        backend=backend.name,
        device=getattr(backend, "device", "?"),
        engine_version=_engine_version(backend),
        onnx_version=onnx.__version__,
        ferry_version=__version__,
        date=date,
        seconds=round(time.perf_counter() - start, 2),
        workers=max(workers, 0),
        has_rules=table is not None,
        claimed_ops=claimed_ops,
        untested_ops=untested_ops,
        cases=[r for r in results if r is not None],
    )


def _engine_version(backend: Backend) -> str:
    try:
        return str(backend.version)
    except Exception as e:  # a report without a version beats no report
        return f"unknown ({_one_line(e, 80)})"


@dataclasses.dataclass
class _Worker:
    process: Any
    conn: multiprocessing.connection.Connection
    ready: bool = False
    task: tuple[int, ConformanceCase] | None = None
    since: float = 0.0


class _WorkerPool:
    """Worker processes that run cases one at a time; a worker that crashes or overruns its
    timeout is killed, its case recorded as an error, and a fresh one started.

    Workers are spawned (not forked): an engine's thread pools in this process (ONNX Runtime,
    OpenVINO's TBB) would not survive a fork. The backend goes to them pickled, or by registry
    name when it does not pickle.
    """

    def __init__(
        self, backend: Backend, size: int, timeout: float, options: dict[str, Any]
    ) -> None:
        self.size = size
        self.timeout = timeout
        self.options = options
        self.context = multiprocessing.get_context("spawn")
        try:
            self.backend_blob = pickle.dumps(("object", backend))
        except Exception:
            self.backend_blob = pickle.dumps(("registry", backend.name))
        self.workers: list[_Worker] = []

    def _start(self) -> _Worker:
        parent, child = self.context.Pipe()
        process = self.context.Process(
            target=_worker_main,
            args=(child, self.backend_blob, self.options),
            daemon=True,
            name="ferry-conformance",
        )
        process.start()
        child.close()
        worker = _Worker(process, parent, since=time.monotonic())
        self.workers.append(worker)
        return worker

    def _retire(self, worker: _Worker) -> None:
        self.workers.remove(worker)
        try:
            worker.conn.close()
        finally:
            if worker.process.is_alive():
                worker.process.kill()
            worker.process.join(5)

    def run(
        self, tasks: Sequence[tuple[int, ConformanceCase, ir.Model, bool | None]]
    ) -> Iterable[tuple[int, CaseResult]]:
        queue = collections.deque(
            (index, case, ir.to_proto(model).SerializeToString(), claimed)
            for index, case, model, claimed in tasks
        )
        outstanding = len(queue)
        try:
            while outstanding:
                while len(self.workers) < min(self.size, outstanding):
                    self._start()
                for worker in self.workers:
                    if worker.ready and worker.task is None and queue:
                        index, case, blob, claimed = queue.popleft()
                        worker.conn.send((case, blob, claimed))
                        worker.task, worker.since = (index, case), time.monotonic()
                for index, result in self._collect():
                    outstanding -= 1
                    yield index, result
        finally:
            for worker in list(self.workers):
                with contextlib.suppress(OSError):
                    worker.conn.send(None)
                self._retire(worker)

    def _collect(self) -> list[tuple[int, CaseResult]]:
        """Wait for the next message or timeout; return the cases finished."""
        now = time.monotonic()
        deadlines = [
            w.since + (self.timeout if w.ready else _STARTUP_TIMEOUT) for w in self.workers
        ]
        wait = max(0.0, min(deadlines) - now) if deadlines else 0.0
        ready = multiprocessing.connection.wait([w.conn for w in self.workers], timeout=wait)
        finished: list[tuple[int, CaseResult]] = []
        for worker in [w for w in self.workers if w.conn in ready]:
            try:
                kind, payload = worker.conn.recv()
            except (EOFError, OSError):
                worker.process.join(5)
                code = worker.process.exitcode
                if worker.task is None:
                    self._retire(worker)
                    raise FerryError(
                        f"a conformance worker for {self._name()} exited (code {code}) before "
                        "it took a case; run with workers=0 to see the error in this process"
                    ) from None
                index, case = worker.task
                finished.append(
                    (
                        index,
                        CaseResult(
                            case.op,
                            case.name,
                            "error",
                            f"the engine crashed the worker process (exit code {code})",
                            expanded=case.expanded,
                        ),
                    )
                )
                self._retire(worker)
                continue
            if kind == "ready":
                worker.ready, worker.since = True, time.monotonic()
            elif kind == "setup-error":
                self._retire(worker)
                raise FerryError(f"a conformance worker could not set up {self._name()}: {payload}")
            elif kind == "result" and worker.task is not None:
                finished.append((worker.task[0], payload))
                worker.task = None
        now = time.monotonic()
        for worker in list(self.workers):
            if worker.conn in ready:
                continue
            if worker.task is not None and now - worker.since > self.timeout:
                index, case = worker.task
                finished.append(
                    (
                        index,
                        CaseResult(
                            case.op,
                            case.name,
                            "error",
                            f"timed out after {self.timeout:g} s",
                            expanded=case.expanded,
                            seconds=now - worker.since,
                        ),
                    )
                )
                self._retire(worker)
            elif not worker.ready and now - worker.since > _STARTUP_TIMEOUT:
                self._retire(worker)
                raise FerryError(
                    f"a conformance worker for {self._name()} did not start in "
                    f"{_STARTUP_TIMEOUT:g} s"
                )
        return finished

    def _name(self) -> str:
        kind, payload = pickle.loads(self.backend_blob)
        return str(payload if kind == "registry" else getattr(payload, "name", "?"))


def _worker_main(
    conn: multiprocessing.connection.Connection, backend_blob: bytes, options: dict[str, Any]
) -> None:
    """A worker process: set up the backend, then run cases until told to stop."""
    try:
        warnings.simplefilter("ignore")
        kind, payload = pickle.loads(backend_blob)
        if kind == "registry":
            from ferry.backends import get_backend

            payload = get_backend(payload)
        backend: Backend = payload
        conn.send(("ready", None))
    except Exception:
        conn.send(("setup-error", traceback.format_exc(limit=5)))
        return
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        case, blob, claimed = task
        try:
            model = ir.from_proto(onnx.load_from_string(blob))
            result = _execute(backend, case, model, claimed, options)
        except Exception as e:
            result = CaseResult(case.op, case.name, "error", _one_line(e), expanded=case.expanded)
        conn.send(("result", result))


# --------------------------------------------------------------------------------------------------
# Reports


def _cell(text: str, limit: int = 400) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def write_table(report: ConformanceReport, path: str | os.PathLike[str]) -> Path:
    """Write the Markdown coverage table to ``path`` and the full JSON report beside it.

    Args:
        report: from ``run_conformance``.
        path: the ``.md`` file, or a folder to write ``<backend>.md`` and ``<backend>.json`` into.

    Returns:
        The Markdown file written.
    """
    target = Path(path)
    if target.suffix != ".md":
        target = target / f"{report.backend}.md"
    target.parent.mkdir(parents=True, exist_ok=True)
    rows = report.ops()
    claimed_bad = report.claimed_failures()
    lines = [
        f"# ONNX node conformance: {report.backend}",
        "",
        "<!-- Generated by `python -m ferry.conformance"
        f" --backend {report.backend} --out {target.parent.as_posix()}/`; do not edit. -->",
        "",
        report.summary() + ".",
        "",
    ]
    if report.has_rules:
        if claimed_bad:
            lines.append(
                "**Ops the rules claim but fail:** "
                + ", ".join(f"`{op}` ({len(cases)})" for op, cases in claimed_bad.items())
                + "."
            )
        else:
            lines.append("Every case of every claimed op that ran passed.")
        lines.append("")
        vetoed = report.vetoed()
        if vetoed:
            lines.append(
                "Claimed by the rules but vetoed by the engine's `validate()` (over-claims the "
                "partitioner has to undo): "
                + ", ".join(f"`{op}` ({len(cases)})" for op, cases in vetoed.items())
                + "."
            )
            lines.append("")
    lines += [
        "Failed counts cases whose outputs differ and cases the engine raised on; "
        "see the JSON report beside this file for every case and reason.",
        "",
        "| op | claimed by rules? | passed | failed | skipped | notes |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for row in rows:
        lines.append(
            f"| {_cell(row.label)} | {row.claimed} | {row.passed} | {row.failed + row.errors} | "
            f"{row.skipped} | {_cell(row.notes)} |"
        )
    _write(target, "\n".join(lines) + "\n")
    _write(target.with_suffix(".json"), _report_json(report))
    return target


def _write(path: Path, text: str) -> None:
    from ferry.graph import atomic_path

    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
        # mkstemp creates 0600 files; these are documents for everyone to read.
        tmp.chmod(0o644)


def _report_json(report: ConformanceReport) -> str:
    """The report as JSON, one case per line: compact, and diffs between runs stay readable."""
    data = report.to_dict()
    cases = data.pop("cases")
    head = json.dumps(data, indent=1)
    lines = ",\n".join("  " + json.dumps(case) for case in cases)
    return head[:-2] + ',\n "cases": [\n' + lines + "\n ]\n}\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ferry.conformance``: run a backend's conformance and write its table."""
    parser = argparse.ArgumentParser(
        prog="python -m ferry.conformance",
        description="Run ONNX's node test cases on a ferry backend for the ops its rules claim.",
    )
    parser.add_argument(
        "--backend",
        action="append",
        required=True,
        help="registered backend name, or module:Class for one not registered (repeatable)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("docs/conformance"),
        help="folder for <backend>.md and <backend>.json",
    )
    parser.add_argument(
        "--op",
        action="append",
        default=None,
        help="only this op (repeatable; 'domain::Op' outside the ONNX domain)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes; 0 runs in-process, without timeouts or crash "
        "isolation (default: 1)",
    )
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per case")
    parser.add_argument(
        "--per-op",
        type=int,
        default=None,
        help="run at most this many cases per op (a sample; default: all)",
    )
    parser.add_argument(
        "--include-unclaimed", action="store_true", help="also run the cases the rules do not claim"
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when a claimed op fails a case"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    ops = None
    if args.op:
        ops = {tuple(o.split("::", 1)) if "::" in o else ("", o) for o in args.op}
    status = 0
    for name in args.backend:
        try:
            backend = _backend_from_cli(name)
        except FerryError as e:
            logger.error("%s", e)
            status = 2
            continue
        cases = collect_cases(ops)
        if args.per_op is not None:
            cases = sample_cases(cases, args.per_op)
        report = run_conformance(
            backend,
            ops,
            cases=cases,
            workers=args.workers,
            timeout=args.timeout,
            include_unclaimed=args.include_unclaimed,
        )
        path = write_table(report, args.out)
        logger.info("%s\nwrote %s and %s", report.summary(), path, path.with_suffix(".json"))
        bad = report.claimed_failures()
        for op, failed in bad.items():
            logger.info("claimed but failing: %s: %s", op, ", ".join(c.case_name for c in failed))
        if args.check and bad:
            status = max(status, 1)
    return status


def _backend_from_cli(spec: str) -> Backend:
    """A registered backend by name, or ``module:Class`` instantiated directly."""
    from ferry.backends import get_backend
    from ferry.errors import BackendUnavailableError

    if ":" not in spec:
        return get_backend(spec)
    module_name, _, attr = spec.partition(":")
    try:
        backend: Backend = getattr(importlib.import_module(module_name), attr)()
    except (ImportError, AttributeError) as e:
        raise BackendUnavailableError(f"cannot import backend {spec!r}: {e}") from e
    if not backend.available():
        raise BackendUnavailableError(f"backend {spec!r} is not available on this machine")
    return backend
