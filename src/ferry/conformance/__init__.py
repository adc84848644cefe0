"""Conformance: the adapter kit any installed backend can run, ONNX's own node test cases for the
ops its rules claim among its checks.

DESIGN.md: a rule table that claims an op its conformance run fails is a bug.
``run_conformance(backend)`` gives a :class:`ConformanceReport` (its ``claimed_failures`` are
exactly those bugs; ``tests/conformance`` fails on them); ``write_table`` writes the tables in
``docs/conformance/``. The room also holds the generators of the measured rule tables of ONNX
Runtime and OpenVINO. From the command line::

    python -m ferry.conformance --backend NAME --out docs/conformance/   # the kit, its report
    python -m ferry.conformance --backend NAME --checks node,cache --sample 2
    python -m ferry.conformance rules onnxruntime                         # regenerate its rules
    python -m ferry.conformance rules openvino

The modules, one job each: ``_cases`` (ONNX's node test cases, collected once), ``_pool`` (the
crash-isolated worker pool), ``_compare`` (outputs against expected ones, through
``ferry.parity``), ``_runner`` (a backend's conformance run), ``_report`` (its results),
``_tables`` (the files written), ``_known`` (engines' known failing cases); the adapter kit's
checks (``run_adapter_kit`` in ``_kit``, results in ``_checks``, the report in ``_kit_tables``):
``_probe`` (the small model they run), ``_check_cache``, ``_check_dynamic``, ``_check_inputs``,
``_check_threads``, ``_check_kit``; ``_gen_onnxruntime`` (ONNX Runtime's rule table),
``_openvino_forms`` / ``_openvino_derive`` / ``_gen_openvino`` (OpenVINO's), ``_cli``.
"""

from __future__ import annotations

from ferry.conformance._cases import ConformanceCase, collect_cases, op_name, sample_cases
from ferry.conformance._check_cache import check_cache
from ferry.conformance._check_dynamic import check_dynamic
from ferry.conformance._check_inputs import check_bad_inputs
from ferry.conformance._check_kit import KIT_SAMPLE, check_kit
from ferry.conformance._check_threads import check_threads
from ferry.conformance._checks import CHECKS, AdapterReport, CheckResult
from ferry.conformance._cli import main
from ferry.conformance._kit import node_verdict, run_adapter_kit
from ferry.conformance._kit_tables import read_adapter_report, write_adapter_report
from ferry.conformance._known import KNOWN_FAILURES, known_failure, known_failures
from ferry.conformance._pool import Lost, WorkerPool
from ferry.conformance._report import CaseResult, ConformanceReport, OpSummary
from ferry.conformance._runner import rule_table, run_case, run_conformance
from ferry.conformance._tables import write_table

__all__ = [
    "CHECKS",
    "KIT_SAMPLE",
    "KNOWN_FAILURES",
    "AdapterReport",
    "CaseResult",
    "CheckResult",
    "ConformanceCase",
    "ConformanceReport",
    "Lost",
    "OpSummary",
    "WorkerPool",
    "check_bad_inputs",
    "check_cache",
    "check_dynamic",
    "check_kit",
    "check_threads",
    "collect_cases",
    "known_failure",
    "known_failures",
    "main",
    "node_verdict",
    "op_name",
    "read_adapter_report",
    "rule_table",
    "run_adapter_kit",
    "run_case",
    "run_conformance",
    "sample_cases",
    "write_adapter_report",
    "write_table",
]
