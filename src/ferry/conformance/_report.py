"""The outcome of a conformance run: one :class:`CaseResult` per case, gathered in a
:class:`ConformanceReport` that counts them, names the claimed ops that fail (the bugs DESIGN.md
means: a rule table that claims an op its conformance run fails) and makes one
:class:`OpSummary` row per op for the tables.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["STATUSES", "CaseResult", "ConformanceReport", "OpSummary"]

#: A case's status: ran and matched, ran and differed, raised (or crashed, or timed out), not run.
STATUSES = ("pass", "fail", "error", "skip")


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

    @property
    def label(self) -> str:
        """The op it tests as the table's rows name it: ``Relu`` or ``Relu (function body)``."""
        return f"{self.op} (function body)" if self.expanded else self.op

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data."""
        d = dataclasses.asdict(self)
        d["ops"] = list(self.ops)
        d["seconds"] = round(self.seconds, 4)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CaseResult:
        """A result from :meth:`to_dict`'s data (unknown keys ignored)."""
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
        """The row's name: ``Relu`` or ``Relu (function body)``."""
        return f"{self.op} (function body)" if self.expanded else self.op

    def to_dict(self) -> dict[str, Any]:
        """The row as JSON-ready data."""
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
        return {status: found.get(status, 0) for status in STATUSES}

    def claimed_failures(self) -> dict[str, list[CaseResult]]:
        """The bugs: claimed cases that failed or erred, by op (function bodies as ``op (function body)``)."""
        bad: dict[str, list[CaseResult]] = {}
        for case in self.cases:
            if case.claimed is not False and case.status in ("fail", "error"):
                bad.setdefault(case.label, []).append(case)
        return dict(sorted(bad.items()))

    def vetoed(self) -> dict[str, list[CaseResult]]:
        """Claimed cases the backend's ``validate`` refused, by op: the rules over-claim them."""
        found: dict[str, list[CaseResult]] = {}
        for case in self.cases:
            if case.claimed and case.status == "skip" and (case.reason or "").startswith("vetoed"):
                found.setdefault(case.label, []).append(case)
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
        """The report as JSON-ready data: its fields, the counts, claimed failures, vetoes and
        rows, then every case."""
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
        """A report from :meth:`to_dict`'s data (the derived keys are recomputed, not read)."""
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
