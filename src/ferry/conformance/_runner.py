"""Running ONNX's node test cases on a backend, for the ops its rules claim.

The algorithm, per case (from :mod:`ferry.conformance._cases`):

1. Skip it when it uses what no engine in ferry takes: training ops, graph inputs and outputs
   that are not tensors (sequences, optionals, maps: partitions exchange tensors only), or random
   ops whose expected outputs are numpy's draws.
2. Ask the backend's rule table about every top-level node (after ``ferry.graph.prepare``, so
   that dtype and rank conditions see inferred types), as the partitioner does (Constant nodes
   feeding others excepted: the partitioner places them with their reader). A node the rules
   reject makes the case a skip with the rules' reason: the backend never claimed it, so it is no
   failure. So does a node the backend's ``validate`` vetoes: the engine would never be given it.
3. Otherwise compile the case through the adapter API (``Backend.compile`` on a whole-graph
   partition), run every data set and compare with ONNX's expected outputs the way ONNX's backend
   test runner does (``ferry.parity`` in strict mode with the case's tolerance).

Every exception is caught per case (status ``error``). With ``workers >= 1`` the cases run in the
room's crash-isolated pool, so that an engine that crashes or hangs on one case (a segfault, a
deadlock) costs that case only: it is recorded as an error and the worker is replaced.
"""

from __future__ import annotations

import datetime
import functools
import logging
import pickle
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import onnx_ir as ir

from ferry.backends import require_base, rule_table
from ferry.conformance._cases import ConformanceCase, collect_cases, normal_domain, op_name
from ferry.conformance._compare import compare_output, error_of, mismatch_text
from ferry.conformance._pool import Lost, WorkerPool
from ferry.conformance._report import CaseResult, ConformanceReport
from ferry.errors import FerryError

if TYPE_CHECKING:
    from ferry.backends import Backend, RuleTable

__all__ = [
    "DEFAULT_TIMEOUT",
    "backend_handle",
    "engine_version",
    "one_line",
    "rule_table",
    "run_case",
    "run_conformance",
    "worker_setup",
]

logger = logging.getLogger(__name__)

#: Seconds one case may take in a worker process before it is killed and counted as an error.
DEFAULT_TIMEOUT = 120.0

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

#: A case ready to run: (the case, its prepared model serialized, whether the rules claim it).
_Task = tuple[ConformanceCase, bytes, bool | None]


# --------------------------------------------------------------------------------------------------
# Deciding whether a case runs


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
        if normal_domain(node.domain) != "":
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
        if len(nodes) > 1 and node.op_type == "Constant" and normal_domain(node.domain) == "":
            continue
        verdict = table.supports(node, opsets)
        if verdict is not True:
            return str(verdict) if len(nodes) == 1 else f"node {node.name}: {verdict}"
    return None


def _prepare_verdict(
    case: ConformanceCase, rules: RuleTable | None, include_unclaimed: bool
) -> CaseResult | tuple[ir.Model, bool | None]:
    """The case's model and whether the rules claim it, or the skip result when it is not run.

    The model is the case as the partitioner sees a model: ``ferry.graph.prepare``'s copy, every
    node and value named and types inferred where undeclared.
    """
    from ferry.graph import prepare

    feature = _feature_skip(case)
    if feature is not None:
        return CaseResult(case.op, case.name, "skip", feature, expanded=case.expanded, claimed=None)
    model = prepare(ir.from_proto(case.model))
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


# --------------------------------------------------------------------------------------------------
# Running one case


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
            f"preparing the case: {one_line(e)}",
            expanded=case.expanded,
        )
    if isinstance(prepared, CaseResult):
        return prepared
    model, claimed = prepared
    return _execute(backend, case, model, claimed, dict(options or {"threads": 1}))


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
        stage = "validate()"
        vetoed = backend.validate(model, list(partition.nodes))
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
            reason, err = _compare(case, expected, actual, partition.outputs)
            if err is not None:
                worst = err if worst is None else max(worst, err)
            if reason is not None:
                return result("fail", reason, worst, seconds=time.perf_counter() - start)
        return result("pass", None, worst, seconds=time.perf_counter() - start)
    except Exception as e:
        return result("error", f"{stage}: {one_line(e)}", seconds=time.perf_counter() - start)


def _compare(
    case: ConformanceCase, expected: Sequence[Any], actual: Sequence[Any], names: Sequence[str]
) -> tuple[str | None, float | None]:
    """Compare one data set's outputs, in order, up to the first that differs.

    Returns:
        ``(why the first differing output differs or None, the largest error up to it)``.
    """
    if len(actual) != len(expected):
        return f"{len(actual)} outputs, expected {len(expected)}", None
    worst: float | None = None
    for index, (want, got) in enumerate(zip(expected, actual)):
        label = f"output {index}" + (f" ({names[index]})" if index < len(names) else "")
        if got is None:
            return f"{label} missing", worst
        parity = compare_output(label, got, want, atol=case.atol, rtol=case.rtol)
        err = error_of(parity, want)
        if err is not None:
            worst = err if worst is None else max(worst, err)
        if not parity.passed:
            return f"{label}: {mismatch_text(parity)}", worst
    return None, worst


def one_line(e: BaseException, limit: int = 400) -> str:
    """An exception as one line: its type (unless it is ferry's own error) and its message, both
    ends kept when it is longer than ``limit``."""
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
        backend: the engine adapter (a ``BackendBase``). Its ``rules()`` decide which cases
            count; a backend without rules runs every case.
        ops: ``(domain, op_type)`` pairs to test; None tests every op.
        cases: the cases to run instead of ``collect_cases(ops)`` (a sample, say).
        include_unclaimed: run cases the rules reject too (see ``run_case``).
        workers: worker processes; 0 runs in this process (no timeout, and an engine crash takes
            the caller down with it).
        timeout: seconds a case may take in a worker before it is killed and recorded as an error.
        options: ``CompileSpec.options`` (default ``{"threads": 1}``).

    Returns:
        The report, cases in ONNX's order.

    Raises:
        InvalidInputError: ``backend`` does not derive from ``BackendBase``.
    """
    from ferry._version import __version__

    require_base(backend, "run_conformance")
    start = time.perf_counter()
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    table = rule_table(backend)
    ops = None if ops is None else {(normal_domain(d), t) for d, t in ops}
    selected = list(cases) if cases is not None else collect_cases(ops)
    opts = dict(options or {"threads": 1})

    results: list[CaseResult | None] = [None] * len(selected)
    runnable: list[int] = []
    tasks: list[_Task] = []
    for index, case in enumerate(selected):
        try:
            prepared = _prepare_verdict(case, table, include_unclaimed)
        except Exception as e:
            prepared = CaseResult(
                case.op, case.name, "error", f"preparing: {one_line(e)}", expanded=case.expanded
            )
        if isinstance(prepared, CaseResult):
            results[index] = prepared
        else:
            model, claimed = prepared
            runnable.append(index)
            tasks.append((case, ir.to_proto(model).SerializeToString(), claimed))
    logger.info(
        "%s: %d of %d cases to run (%d skipped)",
        backend.name,
        len(runnable),
        len(selected),
        len(selected) - len(runnable),
    )
    pool = WorkerPool(
        _run_task,
        worker_setup,
        (backend if workers <= 0 else backend_handle(backend), opts),
        size=max(workers, 0),
        timeout=timeout,
        label=f"conformance worker for {backend.name}",
    )
    for done, (position, outcome) in enumerate(pool.run(tasks), 1):
        if isinstance(outcome, Lost):
            outcome = _lost(tasks[position][0], outcome, timeout)
        results[runnable[position]] = outcome
        if done % 200 == 0:
            logger.info("%s: %d of %d cases run", backend.name, done, len(tasks))

    claimed_ops: list[str] = []
    untested_ops: list[str] = []
    if table is not None:
        keys = [(d, t) for d, t in table.ops() if ops is None or (d, t) in ops]
        with_cases = {case.key for case in collect_cases()}
        claimed_ops = sorted(op_name(d, t) for d, t in keys)
        untested_ops = sorted(op_name(d, t) for d, t in keys if (d, t) not in with_cases)

    return ConformanceReport(
        backend=backend.name,
        device=backend.device,
        engine_version=engine_version(backend),
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


def engine_version(backend: Backend) -> str:
    """``backend.version``, or ``unknown (why)`` when looking it up fails."""
    try:
        return str(backend.version)
    except Exception as e:  # a report without a version beats no report
        return f"unknown ({one_line(e, 80)})"


def _lost(case: ConformanceCase, lost: Lost, timeout: float) -> CaseResult:
    """The error result of a case whose worker crashed or overran."""
    if lost.kind == "timeout":
        reason = f"timed out after {timeout:g} s"
    else:
        reason = f"the engine crashed the worker process (exit code {lost.exit_code})"
    return CaseResult(
        case.op, case.name, "error", reason, expanded=case.expanded, seconds=lost.seconds
    )


# --------------------------------------------------------------------------------------------------
# In a worker


def backend_handle(backend: Backend) -> Backend | str:
    """The backend itself when it pickles, else its registry name (a worker looks it up)."""
    try:
        pickle.dumps(backend)
    except Exception:
        return backend.name
    return backend


def worker_setup(arg: tuple[Backend | str, dict[str, Any]]) -> tuple[Backend, dict[str, Any]]:
    """A worker's state: the backend (looked up by name when it came as one) and the options."""
    handle, options = arg
    if isinstance(handle, str):
        from ferry.backends import get_backend

        return get_backend(handle), options
    return handle, options


def _run_task(state: tuple[Backend, dict[str, Any]], task: _Task) -> CaseResult:
    """Run one prepared case; every exception is the case's error."""
    backend, options = state
    case, blob, claimed = task
    try:
        model = ir.from_proto(onnx.load_from_string(blob))
        return _execute(backend, case, model, claimed, options)
    except Exception as e:
        return CaseResult(case.op, case.name, "error", one_line(e), expanded=case.expanded)
