"""The adapter conformance kit: every check, run on one installed adapter, gathered in an
:class:`~ferry.conformance.AdapterReport`.

The checks, in order (``--checks`` names): ``node`` (ONNX's node test cases for every op the
rules claim, :func:`~ferry.conformance.run_conformance`), ``cache`` (compile once, reload),
``dynamic`` (symbolic sizes where claimed), ``bad-inputs``, ``threads`` and ``kit`` (a sample of
the real-model kit judged at the task). Each runs on its own: one that raises is that check's
``error``, never the run's end. With ``workers >= 1`` (the command line's default) every check
runs in a crash-isolated worker process (``_pool``), the node cases in their own pool: an adapter
that crashes its process (a segfault on a bad input) or hangs fails that check, named, and the
run goes on.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ferry.conformance._checks import CHECKS, AdapterReport, CheckResult
from ferry.conformance._runner import DEFAULT_TIMEOUT, engine_version, one_line

if TYPE_CHECKING:
    from ferry.backends import Backend
    from ferry.conformance._report import ConformanceReport

__all__ = ["CHECK_TIMEOUT", "run_adapter_kit"]

logger = logging.getLogger(__name__)

#: Seconds a check other than the node cases may take in its worker before it is killed (the kit
#: check compiles four CNNs: an ahead-of-time compiler plugin took about two minutes with a cold
#: engine cache).
CHECK_TIMEOUT = 900.0
#: The checks that run the adapter through ``ferry.load`` (by its registered name).
_SESSION_CHECKS = frozenset({"bad-inputs", "kit"})
#: The checks that run the probe model (``_probe``) on the adapter.
_PROBE_CHECKS = frozenset({"cache", "dynamic", "bad-inputs", "threads"})


@dataclasses.dataclass(frozen=True)
class _KitOptions:
    """What the kit check is given (pickled to a worker)."""

    models: tuple[str, ...] | None = None
    tools: str | None = None
    files: tuple[tuple[str, str], ...] = ()


def run_adapter_kit(
    backend: Backend,
    checks: Iterable[str] = CHECKS,
    *,
    per_op: int | None = None,
    ops: Iterable[tuple[str, str]] | None = None,
    workers: int = 1,
    timeout: float = DEFAULT_TIMEOUT,
    kit_models: Sequence[str] | None = None,
    kit_tools: str | None = None,
    kit_files: Mapping[str, str] | None = None,
) -> AdapterReport:
    """Run the kit's ``checks`` on ``backend``.

    Args:
        backend: the adapter (a ``BackendBase``; the session-level checks need it registered).
        checks: names from :data:`~ferry.conformance.CHECKS`, run in that order.
        per_op: run at most this many node cases per op (a sample); None runs them all.
        ops: only these ``(domain, op_type)`` node cases.
        workers: worker processes for the node cases; with 1 or more, every other check runs in
            a worker process of its own too; 0 runs everything in this process (no isolation:
            an adapter registered only in this process, a test's, needs it).
        timeout: seconds a node case may take in a worker.
        kit_models: the kit models to judge (default ``KIT_SAMPLE``).
        kit_tools: the folder of the kit's ``kit.json`` and ``inputs.py``.
        kit_files: converted ONNX files for kit models held in another format (``check_kit``).

    Raises:
        InvalidInputError: an unknown check name.
    """
    from ferry._version import __version__
    from ferry.conformance._check_cache import registered
    from ferry.conformance._probe import probe_refusal
    from ferry.errors import InvalidInputError

    wanted = list(dict.fromkeys(checks))
    unknown = [c for c in wanted if c not in CHECKS]
    if unknown:
        raise InvalidInputError(
            f"unknown check {', '.join(map(repr, unknown))}; choose from {', '.join(CHECKS)}"
        )
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    report = AdapterReport(
        backend=backend.name,
        device=backend.device,
        engine_version=engine_version(backend),
        ferry_version=__version__,
        date=date,
        checks=[],
        sampled=None
        if per_op is None
        else f"at most {per_op} node case{'s' if per_op != 1 else ''} per op",
    )
    reachable = registered(backend)
    refusal = probe_refusal(backend) if _PROBE_CHECKS & set(wanted) else None
    options = _KitOptions(
        tuple(kit_models) if kit_models else None,
        kit_tools,
        tuple(sorted((kit_files or {}).items())),
    )
    ordered = [c for c in CHECKS if c in wanted]
    results: dict[str, CheckResult] = {}
    isolated: list[str] = []
    for name in ordered:
        if name in _PROBE_CHECKS and refusal is not None:
            results[name] = CheckResult(name, "skip", refusal)
        elif name in _SESSION_CHECKS and not reachable:
            results[name] = CheckResult(
                name,
                "skip",
                f"ferry.load cannot reach {backend.name!r} by name: register it (the "
                "'ferry.backends' entry point) to run this check",
            )
        elif name == "node":
            start = time.perf_counter()
            try:
                results[name] = _node(backend, report, per_op, ops, workers, timeout)
            except Exception as e:
                results[name] = CheckResult(
                    name, "error", f"the check could not finish: {one_line(e)}"
                )
            results[name].seconds = time.perf_counter() - start
        elif workers <= 0:
            results[name] = run_check((backend, {}), (name, options))
        else:
            isolated.append(name)
    if isolated:
        results.update(_in_worker(backend, isolated, options))
    for name in ordered:
        result = results[name]
        logger.info(
            "%s: %s %s (%.1f s): %s",
            backend.name,
            name,
            result.status,
            result.seconds,
            result.summary,
        )
        report.checks.append(result)
    return report


def _node(
    backend: Backend,
    report: AdapterReport,
    per_op: int | None,
    ops: Iterable[tuple[str, str]] | None,
    workers: int,
    timeout: float,
) -> CheckResult:
    from ferry.conformance._cases import collect_cases, sample_cases
    from ferry.conformance._runner import run_conformance

    wanted = None if ops is None else set(ops)
    cases = collect_cases(wanted)
    if per_op is not None:
        cases = sample_cases(cases, per_op)
    nodes = run_conformance(backend, wanted, cases=cases, workers=workers, timeout=timeout)
    report.nodes = nodes
    return node_verdict(nodes)


def _in_worker(
    backend: Backend, names: Sequence[str], options: _KitOptions
) -> dict[str, CheckResult]:
    """Run ``names`` one after another in a crash-isolated worker process."""
    from ferry.conformance._pool import Lost, WorkerPool
    from ferry.conformance._runner import backend_handle, worker_setup

    pool: WorkerPool[tuple[str, _KitOptions], CheckResult] = WorkerPool(
        run_check,
        worker_setup,
        (backend_handle(backend), {}),
        size=1,
        timeout=CHECK_TIMEOUT,
        label=f"conformance worker for {backend.name}",
    )
    found: dict[str, CheckResult] = {}
    for index, outcome in pool.run([(name, options) for name in names]):
        name = names[index]
        if isinstance(outcome, Lost):
            why = (
                f"the check ran past {CHECK_TIMEOUT:g} s and was stopped (a hang?)"
                if outcome.kind == "timeout"
                else f"the adapter crashed the process (exit code {outcome.exit_code})"
            )
            outcome = CheckResult(name, "fail", why, seconds=outcome.seconds)
        found[name] = outcome
    return found


def run_check(state: tuple[Backend, Any], task: tuple[str, _KitOptions]) -> CheckResult:
    """Run one check (not ``node``) on the backend in ``state``; every exception is the check's
    ``error``. A worker's task function, and the in-process path's."""
    from ferry.conformance._check_cache import check_cache
    from ferry.conformance._check_dynamic import check_dynamic
    from ferry.conformance._check_inputs import check_bad_inputs
    from ferry.conformance._check_kit import KIT_SAMPLE, check_kit
    from ferry.conformance._check_threads import check_threads

    backend, _ = state
    name, options = task
    simple: dict[str, Callable[[Backend], CheckResult]] = {
        "cache": check_cache,
        "dynamic": check_dynamic,
        "bad-inputs": check_bad_inputs,
        "threads": check_threads,
    }
    start = time.perf_counter()
    try:
        if name == "kit":
            result = check_kit(
                backend,
                models=options.models or KIT_SAMPLE,
                tools=options.tools,
                files=dict(options.files),
            )
        else:
            result = simple[name](backend)
    except Exception as e:
        result = CheckResult(name, "error", f"the check could not finish: {one_line(e)}")
    result.seconds = time.perf_counter() - start
    return result


def node_verdict(nodes: ConformanceReport) -> CheckResult:
    """The node check's result from its conformance report: it fails when a claimed op fails a
    case (the rules claim what the engine gets wrong), unless the case is one of the engine's
    known failures (``ferry.conformance.KNOWN_FAILURES``), which are named instead."""
    from ferry.conformance._known import known_failure

    if not nodes.has_rules:
        return CheckResult(
            "node", "skip", "the backend publishes no rules(): it claims no op to check"
        )
    counts = nodes.counts()
    ran = (
        f"{counts['pass']} passed, {counts['fail'] + counts['error']} failed, "
        f"{counts['skip']} skipped of {len(nodes.cases)} cases"
    )
    details = [ran]
    bad: dict[str, int] = {}
    known: dict[str, int] = {}
    for op, cases in nodes.claimed_failures().items():
        for case in cases:
            reason = known_failure(nodes.backend, case.case_name)
            if reason is None:
                bad[op] = bad.get(op, 0) + 1
            else:
                known[f"{op}: {reason}"] = known.get(f"{op}: {reason}", 0) + 1
    details += [f"known engine failure ({n} cases): {why}" for why, n in known.items()]
    if bad:
        ops = ", ".join(f"{op} ({n})" for op, n in bad.items())
        return CheckResult(
            "node", "fail", f"claimed ops failing ONNX node cases: {ops}", details=details
        )
    extra = f"; {sum(known.values())} known engine failures named below" if known else ""
    return CheckResult(
        "node",
        "pass",
        f"every case of the {len(nodes.claimed_ops)} claimed ops that ran passed ({ran}){extra}",
        details=details,
    )
