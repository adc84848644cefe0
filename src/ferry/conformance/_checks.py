"""What one adapter check gives (:class:`CheckResult`) and what the kit gives for one backend
(:class:`AdapterReport`): every check's result, and the node cases' own report.

A check passes, fails, errors (it could not run to a verdict: the check's own exception) or is
skipped with the reason said (nothing to check: the backend claims nothing there, or the kit is
not fetched). Only ``fail`` and ``error`` make the kit's exit status non-zero.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ferry.conformance._report import ConformanceReport

__all__ = ["CHECKS", "CHECK_TITLES", "AdapterReport", "CheckResult"]

#: Every check the kit runs, in order (``--checks`` names).
CHECKS = ("node", "cache", "dynamic", "bad-inputs", "threads", "kit")

#: Each check's section title in the Markdown report.
CHECK_TITLES = {
    "node": "Node cases",
    "cache": "Caching",
    "dynamic": "Dynamic sizes",
    "bad-inputs": "Bad inputs",
    "threads": "Thread safety",
    "kit": "Kit models judged at the task",
}


@dataclasses.dataclass
class CheckResult:
    """How one check went.

    Attributes:
        check: its name (one of :data:`CHECKS`).
        status: ``pass``, ``fail``, ``error`` (the check itself could not finish) or ``skip``.
        summary: one line: the verdict and why.
        seconds: how long it took.
        details: what it did, one line each (each step's verdict).
        rows: a table, when the check has one (the kit models: one row per model).
    """

    check: str
    status: str
    summary: str
    seconds: float = 0.0
    details: list[str] = dataclasses.field(default_factory=list)
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def failed(self) -> bool:
        """Whether it counts against the backend (``fail`` or ``error``)."""
        return self.status in ("fail", "error")

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data."""
        d = dataclasses.asdict(self)
        d["seconds"] = round(self.seconds, 2)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CheckResult:
        """A result from :meth:`to_dict`'s data."""
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in fields})


@dataclasses.dataclass
class AdapterReport:
    """The kit's outcome for one backend.

    Attributes:
        backend / device / engine_version: which engine ran.
        ferry_version: the harness.
        date: when the run started (UTC, ISO 8601).
        checks: each check run, in :data:`CHECKS` order.
        nodes: the node cases' report, when that check ran.
        sampled: what was sampled, in words (``"3 cases per op"``), or None when nothing was.
    """

    backend: str
    device: str
    engine_version: str
    ferry_version: str
    date: str
    checks: list[CheckResult]
    nodes: ConformanceReport | None = None
    sampled: str | None = None

    @property
    def passed(self) -> bool:
        """Whether no check failed or erred."""
        return not any(c.failed for c in self.checks)

    def check(self, name: str) -> CheckResult | None:
        """The result of check ``name``, when it ran."""
        return next((c for c in self.checks if c.check == name), None)

    def summary(self) -> str:
        """One line: the backend and each check's status."""
        each = ", ".join(f"{c.check} {c.status} ({c.seconds:.1f} s)" for c in self.checks)
        verdict = "PASS" if self.passed else "FAIL"
        return f"{self.backend} {self.engine_version} ({self.device}): {verdict}: {each}"

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (the node cases' report under ``nodes``)."""
        return {
            "backend": self.backend,
            "device": self.device,
            "engine_version": self.engine_version,
            "ferry_version": self.ferry_version,
            "date": self.date,
            "passed": self.passed,
            "sampled": self.sampled,
            "checks": [c.to_dict() for c in self.checks],
            "nodes": None if self.nodes is None else self.nodes.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AdapterReport:
        """A report from :meth:`to_dict`'s data."""
        nodes = d.get("nodes")
        return cls(
            backend=d["backend"],
            device=d["device"],
            engine_version=d["engine_version"],
            ferry_version=d["ferry_version"],
            date=d["date"],
            checks=[CheckResult.from_dict(c) for c in d.get("checks", [])],
            nodes=None if nodes is None else ConformanceReport.from_dict(nodes),
            sampled=d.get("sampled"),
        )
