"""The adapter conformance kit: every check, run on one installed adapter, gathered in an
:class:`~ferry.conformance.AdapterReport`.

The checks, in order (``--checks`` names): ``node`` (ONNX's node test cases for every op the
rules claim, :func:`~ferry.conformance.run_conformance`), ``cache`` (compile once, reload),
``dynamic`` (symbolic sizes where claimed), ``bad-inputs``, ``threads`` and ``kit`` (a sample of
the real-model kit judged at the task). Each runs on its own: one that raises is that check's
``error``, never the run's end.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from ferry.conformance._checks import CHECKS, AdapterReport, CheckResult
from ferry.conformance._runner import DEFAULT_TIMEOUT, one_line

if TYPE_CHECKING:
    from ferry.backends import Backend
    from ferry.conformance._report import ConformanceReport

__all__ = ["run_adapter_kit"]

logger = logging.getLogger(__name__)

#: The checks that run the adapter through ``ferry.load`` (by its registered name).
_SESSION_CHECKS = frozenset({"bad-inputs", "kit"})
#: The checks that run the probe model (``_probe``) on the adapter.
_PROBE_CHECKS = frozenset({"cache", "dynamic", "bad-inputs", "threads"})


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
        workers / timeout: the node cases' crash-isolated pool (see ``run_conformance``).
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
        engine_version=_version(backend),
        ferry_version=__version__,
        date=date,
        checks=[],
        sampled=None
        if per_op is None
        else f"at most {per_op} node case{'s' if per_op != 1 else ''} per op",
    )
    reachable = registered(backend)
    refusal = probe_refusal(backend) if _PROBE_CHECKS & set(wanted) else None
    runners = _runners(report, per_op, ops, workers, timeout, kit_models, kit_tools, kit_files)
    for name in [c for c in CHECKS if c in wanted]:
        start = time.perf_counter()
        if name in _PROBE_CHECKS and refusal is not None:
            result = CheckResult(name, "skip", refusal)
        elif name in _SESSION_CHECKS and not reachable:
            result = CheckResult(
                name,
                "skip",
                f"ferry.load cannot reach {backend.name!r} by name: register it (the "
                "'ferry.backends' entry point) to run this check",
            )
        else:
            try:
                result = runners[name](backend)
            except Exception as e:
                result = CheckResult(name, "error", f"the check could not finish: {one_line(e)}")
        result.seconds = time.perf_counter() - start
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


def _runners(
    report: AdapterReport,
    per_op: int | None,
    ops: Iterable[tuple[str, str]] | None,
    workers: int,
    timeout: float,
    kit_models: Sequence[str] | None,
    kit_tools: str | None,
    kit_files: Mapping[str, str] | None,
) -> dict[str, Callable[[Backend], CheckResult]]:
    from ferry.conformance._check_cache import check_cache
    from ferry.conformance._check_dynamic import check_dynamic
    from ferry.conformance._check_inputs import check_bad_inputs
    from ferry.conformance._check_kit import KIT_SAMPLE, check_kit
    from ferry.conformance._check_threads import check_threads

    def node(backend: Backend) -> CheckResult:
        from ferry.conformance._cases import collect_cases, sample_cases
        from ferry.conformance._runner import run_conformance

        wanted = None if ops is None else set(ops)
        cases = collect_cases(wanted)
        if per_op is not None:
            cases = sample_cases(cases, per_op)
        nodes = run_conformance(backend, wanted, cases=cases, workers=workers, timeout=timeout)
        report.nodes = nodes
        return node_verdict(nodes)

    def kit(backend: Backend) -> CheckResult:
        return check_kit(backend, models=kit_models or KIT_SAMPLE, tools=kit_tools, files=kit_files)

    return {
        "node": node,
        "cache": check_cache,
        "dynamic": check_dynamic,
        "bad-inputs": check_bad_inputs,
        "threads": check_threads,
        "kit": kit,
    }


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


def _version(backend: Backend) -> str:
    try:
        return backend.version
    except Exception as e:  # an engine whose version lookup fails still gets its report
        return f"unknown ({one_line(e, 80)})"
