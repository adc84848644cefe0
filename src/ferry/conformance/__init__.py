"""Conformance: ONNX's own node test cases run on a backend for the ops its rules claim.

DESIGN.md: a rule table that claims an op its conformance run fails is a bug.
``run_conformance(backend)`` gives a :class:`ConformanceReport` (its ``claimed_failures`` are
exactly those bugs; ``tests/conformance`` fails on them); ``write_table`` writes the tables in
``docs/conformance/``. The room also holds the generators of the measured rule tables of ONNX
Runtime and OpenVINO. From the command line::

    python -m ferry.conformance --backend NAME --out docs/conformance/   # run, write the table
    python -m ferry.conformance rules onnxruntime                         # regenerate its rules
    python -m ferry.conformance rules openvino

The modules, one job each: ``_cases`` (ONNX's node test cases, collected once), ``_pool`` (the
crash-isolated worker pool), ``_compare`` (outputs against expected ones, through
``ferry.parity``), ``_runner`` (a backend's conformance run), ``_report`` (its results),
``_tables`` (the files written), ``_gen_onnxruntime`` (ONNX Runtime's rule table),
``_openvino_forms`` / ``_openvino_derive`` / ``_gen_openvino`` (OpenVINO's), ``_cli``.
"""

from __future__ import annotations

from ferry.conformance._cases import ConformanceCase, collect_cases, op_name, sample_cases
from ferry.conformance._cli import main
from ferry.conformance._pool import Lost, WorkerPool
from ferry.conformance._report import CaseResult, ConformanceReport, OpSummary
from ferry.conformance._runner import rule_table, run_case, run_conformance
from ferry.conformance._tables import write_table

__all__ = [
    "CaseResult",
    "ConformanceCase",
    "ConformanceReport",
    "Lost",
    "OpSummary",
    "WorkerPool",
    "collect_cases",
    "main",
    "op_name",
    "rule_table",
    "run_case",
    "run_conformance",
    "sample_cases",
    "write_table",
]
