"""Conformance: ONNX's own node test cases run on a backend for the ops its rules claim.

``run_conformance(backend)`` gives a :class:`ConformanceReport`; ``write_table`` writes the tables
in ``docs/conformance/``; ``python -m ferry.conformance --backend NAME --out DIR`` does both.
"""

from __future__ import annotations

from ferry.conformance._run import (
    CaseResult,
    ConformanceCase,
    ConformanceReport,
    OpSummary,
    collect_cases,
    compare_outputs,
    main,
    op_name,
    rule_table,
    run_case,
    run_conformance,
    sample_cases,
    write_table,
)

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
