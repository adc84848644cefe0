"""Conformance tier: each available backend runs ONNX's node test cases for the ops its rules claim.

DESIGN.md: a rule table that claims an op its conformance run fails is a bug. The per-backend test
fails listing every claimed op with a failing case, unless the case is in ``ALLOWED_FAILURES`` below
(a known engine bug or an ONNX tolerance the engine cannot meet, each with its reason).

The harness itself (``ferry.conformance``) is tested against fake backends built on ONNX
Runtime with rule tables of their own: one that conforms, one that computes a wrong answer, one
whose compile raises, one that crashes its process, one that hangs, one whose ``validate`` vetoes.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
import pytest

import ferry.backends
from ferry import conformance
from ferry.backends import CompileSpec, OpRule, RuleTable, get_backend, known_backends
from ferry.backends._onnxruntime import OnnxRuntimeBackend, OnnxRuntimePartition
from ferry.conformance import (
    KNOWN_FAILURES,
    CaseResult,
    ConformanceReport,
    collect_cases,
    known_failures,
    rule_table,
    run_case,
    run_conformance,
    sample_cases,
    write_table,
)
from ferry.errors import BackendUnavailableError, ExecutionError

#: Failing cases a backend's rules may claim for now: ``{backend: {case-name regex: reason}}``
#: (ferry.conformance's known failures, which the kit's node check also accepts). An entry that
#: matches no failing claimed case any more fails the full run: remove it.
ALLOWED_FAILURES: dict[str, dict[str, str]] = {
    name: known_failures(name) for name in [*KNOWN_FAILURES, *known_backends()]
}

#: Backends whose full run is fast enough for the default tier (measured on 2 busy cores:
#: onnxruntime runs its ~1,740 claimed cases in 5-8 s in one worker). Others run ``SAMPLE_PER_OP``
#: cases per op (and per function body) by default, and every case under ``-m slow``: OpenVINO
#: (160 ops claimed) runs its 801 claimed cases in 37-60 s, one per op (150) in 5-15 s, two per op
#: (264) in 15-27 s.
FULL_IN_DEFAULT_RUN = frozenset({"onnxruntime"})
SAMPLE_PER_OP = 1
#: Seconds one case may take before it counts as an error (an engine compile, not a benchmark).
CASE_TIMEOUT = 120.0


# --------------------------------------------------------------------------------------------------
# The conformance check itself


def _allowed(backend: str, case: CaseResult) -> str | None:
    for pattern, reason in ALLOWED_FAILURES.get(backend, {}).items():
        if re.fullmatch(pattern, case.case_name):
            return reason
    return None


def check_backend(name: str, *, full: bool, workers: int = 1) -> ConformanceReport:
    """Run ``name``'s conformance and fail listing every claimed op with a failing case."""
    try:
        backend = get_backend(name)
    except BackendUnavailableError as e:
        pytest.skip(str(e))
    if rule_table(backend) is None:
        pytest.skip(f"backend {name!r} publishes no rules() yet: nothing is claimed to check")
    cases = collect_cases()
    if not full:
        cases = sample_cases(cases, SAMPLE_PER_OP)
    start = time.perf_counter()
    report = run_conformance(backend, cases=cases, workers=workers, timeout=CASE_TIMEOUT)
    print(f"\n{report.summary()} (wall {time.perf_counter() - start:.1f} s)")

    failing = report.claimed_failures()
    unexplained = {
        op: [c for c in cases if _allowed(name, c) is None] for op, cases in failing.items()
    }
    unexplained = {op: cases for op, cases in unexplained.items() if cases}
    lines = [
        f"  {op}: "
        + "; ".join(f"{c.case_name} ({c.status}: {c.reason})" for c in cases[:3])
        + (f"; and {len(cases) - 3} more" if len(cases) > 3 else "")
        for op, cases in unexplained.items()
    ]
    assert not unexplained, (
        f"{name}'s rules claim {len(unexplained)} op(s) that fail ONNX node test cases; narrow "
        "the rules (opset range, dtypes, a check) or fix the adapter:\n" + "\n".join(lines)
    )
    if full:
        failed_names = [c.case_name for cases in failing.values() for c in cases]
        stale = [
            pattern
            for pattern in ALLOWED_FAILURES.get(name, {})
            if not any(re.fullmatch(pattern, n) for n in failed_names)
        ]
        assert not stale, (
            f"ALLOWED_FAILURES[{name!r}] entries match no failing claimed case any more; "
            f"remove them: {stale}"
        )
    return report


#: ferry's own engines; an installed plugin's conformance is its own tests' (the IREE plugin's
#: full run is a compile per case: 15 minutes), and removing it leaves this suite as it was.
BUILT_IN = sorted(ferry.backends._registry._BUILTIN)


@pytest.mark.parametrize("name", BUILT_IN)
def test_claimed_ops_pass_onnx_node_tests(name: str) -> None:
    check_backend(name, full=name in FULL_IN_DEFAULT_RUN)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(BUILT_IN) - FULL_IN_DEFAULT_RUN))
def test_claimed_ops_pass_all_onnx_node_tests(name: str) -> None:
    check_backend(name, full=True)


# --------------------------------------------------------------------------------------------------
# Fake backends: ONNX Runtime underneath, rule tables and faults of their own. Module level, so
# that worker processes can unpickle them.


class FakeOrt(OnnxRuntimeBackend):
    """Claims a handful of ops ONNX Runtime runs correctly."""

    name = "fake-ort"

    def rules(self) -> Sequence[OpRule]:
        # Input 0's dtype only: the Reduce ops' axes are int64.
        f32 = {0: frozenset({"float32"})}
        floats = frozenset({"float16", "float32", "float64"})
        ops = ["Relu", "Neg", "Abs", "Add", "Sub", "Div", "Exp", "Max", "Softmax"]
        ops += ["ReduceMax", "ReduceSum"]
        return [
            *(OpRule(op, since=13, dtypes=f32) for op in ops),
            # Relu's function body casts its zero with CastLike.
            OpRule("CastLike", since=15, dtypes={0: floats, 1: floats}),
            # Claimed, but ONNX has no node test for it.
            OpRule("FusedThing", domain="com.example"),
        ]


class _Shifted(OnnxRuntimePartition):
    """Adds 1 to every float output: a wrong engine."""

    def run(
        self, inputs: dict[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        results = super().run(inputs, outputs)
        return {k: v + 1 if v.dtype.kind == "f" else v for k, v in results.items()}


def _ops(spec: CompileSpec) -> set[str]:
    return {node.op_type for node in spec.model.graph}


class WrongRelu(FakeOrt):
    """Computes Relu wrong; everything else right."""

    name = "fake-wrong-relu"

    def compile(self, spec: CompileSpec) -> OnnxRuntimePartition:
        if "Relu" in _ops(spec):
            return _Shifted(spec)
        return super().compile(spec)


class FailingNeg(FakeOrt):
    """Raises while compiling Neg."""

    name = "fake-failing-neg"

    def compile(self, spec: CompileSpec) -> OnnxRuntimePartition:
        if "Neg" in _ops(spec):
            raise ExecutionError("fake engine: Neg is broken")
        return super().compile(spec)


class CrashingNeg(FakeOrt):
    """Kills its process while compiling Neg, as a segfaulting engine would."""

    name = "fake-crashing-neg"

    def compile(self, spec: CompileSpec) -> OnnxRuntimePartition:
        if "Neg" in _ops(spec):
            os._exit(139)
        return super().compile(spec)


class HangingAbs(FakeOrt):
    """Never finishes compiling Abs."""

    name = "fake-hanging-abs"

    def compile(self, spec: CompileSpec) -> OnnxRuntimePartition:
        if "Abs" in _ops(spec):
            time.sleep(600)
        return super().compile(spec)


class VetoingAdd(FakeOrt):
    """Its engine vetoes every Add node its rules proposed."""

    name = "fake-vetoing-add"

    def validate(self, model: ir.Model, nodes: Sequence[str]) -> dict[str, str]:
        by_name = {n.name: n for n in model.graph}
        return {n: "fake veto" for n in nodes if by_name[n].op_type == "Add"}


FAKE_OPS = [("", "Relu"), ("", "Neg"), ("", "Abs"), ("", "Add")]


@pytest.fixture
def register(monkeypatch: pytest.MonkeyPatch):
    """register(cls) -> name: make a fake backend findable by ``get_backend``."""

    def _register(cls: type[FakeOrt]) -> str:
        monkeypatch.setitem(
            ferry.backends._registry._BUILTIN, cls.name, f"{__name__}:{cls.__name__}"
        )
        monkeypatch.delitem(ferry.backends._registry._instances, cls.name, raising=False)
        return cls.name

    return _register


def _by_status(report: ConformanceReport, op: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for case in report.cases:
        if case.op == op:
            found[case.status] = found.get(case.status, 0) + 1
    return found


# --------------------------------------------------------------------------------------------------
# Collecting cases


def test_collect_cases_maps_cases_to_ops() -> None:
    cases = collect_cases()
    assert len(cases) > 1000
    by_name = {c.name: c for c in cases}
    assert by_name["test_relu"].key == ("", "Relu") and not by_name["test_relu"].expanded
    layer_norm = by_name["test_layer_normalization_2d_axis0_expanded"]
    assert layer_norm.op_type == "LayerNormalization" and layer_norm.expanded
    assert len(layer_norm.model.graph.node) > 1
    label = by_name["test_ai_onnx_ml_label_encoder_string_int"]
    assert label.op == "ai.onnx.ml::LabelEncoder"
    # Data sets are numpy throughout (ONNX mixes in TensorProtos and numpy scalars).
    for case in cases:
        for inputs, outputs in case.data_sets:
            for value in (*inputs, *outputs):
                assert value is None or isinstance(value, (np.ndarray, list))


def test_collect_cases_filters_by_op() -> None:
    cases = collect_cases({("", "Relu"), ("ai.onnx", "Softmax")})
    assert {c.op_type for c in cases} == {"Relu", "Softmax"}
    assert any(c.expanded for c in cases)  # Softmax's function body
    assert collect_cases(set()) == []


def test_sample_keeps_every_op_and_at_most_n_each() -> None:
    cases = collect_cases()
    sample = sample_cases(cases, 2)
    assert {(c.key, c.expanded) for c in sample} == {(c.key, c.expanded) for c in cases}
    counts: dict[tuple[Any, ...], int] = {}
    for case in sample:
        counts[(case.key, case.expanded)] = counts.get((case.key, case.expanded), 0) + 1
    assert max(counts.values()) == 2
    names = [c.name for c in cases]
    assert [c.name for c in sample] == sorted((c.name for c in sample), key=names.index)


# --------------------------------------------------------------------------------------------------
# Running cases on fake backends


def test_a_conforming_backend_passes_its_claimed_ops_and_skips_the_rest(register) -> None:
    backend = get_backend(register(FakeOrt))
    report = run_conformance(backend, [*FAKE_OPS, ("", "Softmax"), ("", "Conv")])
    assert report.has_rules and report.backend == "fake-ort"
    # Relu's function body (Constant, CastLike, Max) runs too: the table claims its ops.
    assert _by_status(report, "Relu") == {"pass": 2}
    assert _by_status(report, "Conv").get("skip") == len(collect_cases({("", "Conv")}))
    conv = next(c for c in report.cases if c.op == "Conv")
    assert conv.claimed is False and conv.reason == "not claimed: Conv is not supported"
    # The rules' dtype condition rejects the non-float32 Add cases; the float32 ones run.
    add = [c for c in report.cases if c.op == "Add" and not c.expanded]
    assert {c.status for c in add} == {"pass", "skip"}
    assert any("dtype" in (c.reason or "") for c in add if c.status == "skip")
    # Softmax's function body uses ops the table claims (Exp, ReduceMax, ...): it runs too.
    body = [c for c in report.cases if c.op == "Softmax" and c.expanded]
    assert body and all(c.status in ("pass", "skip") for c in body)
    assert any(c.status == "pass" and c.claimed for c in body)
    assert report.claimed_failures() == {}
    assert report.untested_ops == []  # com.example::FusedThing was not asked for
    rows = {row.label: row for row in report.ops()}
    assert rows["Relu"].claimed == "yes" and rows["Conv"].claimed == "no"


def test_claimed_op_with_wrong_results_is_reported(register) -> None:
    backend = get_backend(register(WrongRelu))
    report = run_conformance(backend, FAKE_OPS)
    failures = report.claimed_failures()
    assert list(failures) == ["Relu"]
    case = failures["Relu"][0]
    assert case.status == "fail" and case.max_abs_err == pytest.approx(1.0)
    assert "elements differ" in (case.reason or "")
    assert _by_status(report, "Neg") == {"pass": 2}


def test_check_backend_fails_listing_the_claimed_failing_op(register) -> None:
    name = register(WrongRelu)
    with pytest.raises(AssertionError, match=r"(?s)claim 1 op.*Relu: test_relu"):
        check_backend(name, full=True, workers=0)


def test_check_backend_passes_a_conforming_backend(register) -> None:
    report = check_backend(register(FakeOrt), full=False, workers=0)
    assert report.counts()["pass"] > 0


def test_check_backend_skips_a_backend_without_rules(monkeypatch) -> None:
    class NoRules(OnnxRuntimeBackend):
        name = "fake-no-rules"

        def rules(self) -> Sequence[OpRule]:
            raise NotImplementedError

    monkeypatch.setitem(ferry.backends._registry._instances, NoRules.name, NoRules())
    with pytest.raises(pytest.skip.Exception, match="publishes no rules"):
        check_backend(NoRules.name, full=False)


def test_an_engine_error_is_one_case_not_the_run(register) -> None:
    report = run_conformance(get_backend(register(FailingNeg)), FAKE_OPS)
    neg = [c for c in report.cases if c.op == "Neg"]
    assert neg and all(c.status == "error" for c in neg)
    assert neg[0].reason == "compile: fake engine: Neg is broken"
    assert _by_status(report, "Relu") == {"pass": 2}
    assert list(report.claimed_failures()) == ["Neg"]


def test_run_case_without_rules_runs_everything() -> None:
    case = next(
        c for c in collect_cases({("", "Conv")}) if c.name == "test_conv_with_strides_padding"
    )
    result = run_case(OnnxRuntimeBackend(), case)
    assert result.status == "pass" and result.claimed is None and result.max_abs_err is not None
    result = run_case(OnnxRuntimeBackend(), case, rules=RuleTable([OpRule("Relu")]))
    assert result.status == "skip" and result.claimed is False


def test_unrunnable_features_are_skipped_with_a_reason() -> None:
    by_name = {c.name: c for c in collect_cases()}
    backend = OnnxRuntimeBackend()
    for name, expected in [
        ("test_adam", "training op"),
        ("test_split_to_sequence_1", "is a sequence"),
        ("test_optional_has_element_empty_optional_input", "is an optional"),
        ("test_training_dropout", "Dropout in training mode"),
        ("test_bernoulli_seed", "draws random numbers"),
    ]:
        result = run_case(backend, by_name[name])
        assert result.status == "skip" and expected in (result.reason or ""), (name, result)
    # Training mode with a zero ratio is deterministic: it runs.
    assert run_case(backend, by_name["test_training_dropout_zero_ratio"]).status == "pass"


def test_validate_veto_is_a_skip_not_a_failure(register) -> None:
    report = run_conformance(get_backend(register(VetoingAdd)), [("", "Add")])
    ran = [c for c in report.cases if c.claimed]
    assert ran and all(c.status == "skip" for c in ran)
    assert "vetoed by fake-vetoing-add.validate()" in (ran[0].reason or "")
    assert report.claimed_failures() == {}
    assert list(report.vetoed()) == ["Add"] and len(report.vetoed()["Add"]) == len(ran)


def test_workers_contain_crashes_and_timeouts(register) -> None:
    crashing = get_backend(register(CrashingNeg))
    report = run_conformance(crashing, FAKE_OPS, workers=1)
    neg = [c for c in report.cases if c.op == "Neg"]
    assert neg and all(c.status == "error" and "crashed" in (c.reason or "") for c in neg)
    assert _by_status(report, "Relu") == {"pass": 2}  # the replacement worker carried on

    hanging = get_backend(register(HangingAbs))
    start = time.monotonic()
    report = run_conformance(hanging, [("", "Abs"), ("", "Relu")], workers=2, timeout=2.0)
    assert time.monotonic() - start < 60
    abs_cases = [c for c in report.cases if c.op == "Abs"]
    assert abs_cases and all(c.status == "error" for c in abs_cases)
    assert "timed out after 2 s" in (abs_cases[0].reason or "")
    assert _by_status(report, "Relu") == {"pass": 2}


def test_workers_give_the_same_results_as_in_process(register) -> None:
    backend = get_backend(register(WrongRelu))
    ops = [*FAKE_OPS, ("", "Softmax")]
    here = run_conformance(backend, ops)
    there = run_conformance(backend, ops, workers=2)
    assert [(c.case_name, c.status, c.reason) for c in here.cases] == [
        (c.case_name, c.status, c.reason) for c in there.cases
    ]


@pytest.mark.slow
def test_collection_survives_an_earlier_filtered_collect() -> None:
    """ONNX's collect_testcases keeps the first call's op filter for the process; ours does not."""
    import subprocess
    import sys

    code = (
        "from onnx.backend.test.case.node import collect_testcases\n"
        "assert {c.name[:9] for c in collect_testcases(op_type='Relu')} == {'test_relu'}\n"
        "from ferry.conformance import collect_cases\n"
        "cases = collect_cases()\n"
        "assert len(cases) > 1000, len(cases)\n"
        "assert len({c.name for c in cases}) == len(cases)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_write_table_markdown_and_json_round_trip(register, tmp_path: Path) -> None:
    report = run_conformance(get_backend(register(WrongRelu)), None, cases=collect_cases(FAKE_OPS))
    report.untested_ops = ["com.example::FusedThing"]
    md = write_table(report, tmp_path)
    assert md == tmp_path / "fake-wrong-relu.md"
    text = md.read_text()
    assert "| op | claimed by rules? | passed | failed | skipped | notes |" in text
    assert "**Ops the rules claim but fail:** `Relu` (1)" in text
    assert re.search(r"\| Relu \| yes \| 0 \| 1 \| 0 \| test_relu: output 0", text)
    assert "| Relu (function body) | yes | 1 | 0 | 0 |" in text
    assert "| com.example::FusedThing | yes | 0 | 0 | 0 | ONNX has no node test case" in text
    rows = [
        line.split(" | ")[0]
        for line in text.splitlines()
        if line.startswith("| ") and "---" not in line
    ]
    assert rows[1:] == sorted(rows[1:], key=lambda r: ("::" in r, r.lower()))
    data = json.loads(md.with_suffix(".json").read_text())
    assert data["claimed_failures"] == {"Relu": ["test_relu"]}
    assert data["counts"] == report.counts() and len(data["cases"]) == len(report.cases)
    again = ConformanceReport.from_dict(data)
    assert again.to_dict() == report.to_dict()


def test_cli_writes_the_table(register, tmp_path: Path, monkeypatch) -> None:
    name = register(FakeOrt)
    args = ["--backend", name, "--out", str(tmp_path), "--op", "Relu", "--workers", "0"]
    status = conformance.main([*args, "--checks", "node"])
    assert status == 0
    text = (tmp_path / f"{name}.md").read_text()
    assert (
        "| Relu | yes | 1 | 0 | 0 |" in text
        and "| Relu (function body) | yes | 1 | 0 | 0 |" in text
    )
    assert conformance.main(["--backend", "no-such-backend", "--out", str(tmp_path)]) == 2
    # A backend not in the registry, by module:Class: its wrong Relu fails the run.
    spec = f"{__name__}:WrongRelu"
    args = ["--backend", spec, "--out", str(tmp_path), "--op", "Relu", "--workers", "0"]
    args += ["--checks", "node"]
    assert conformance.main([*args, "--check"]) == 1
    assert (tmp_path / "fake-wrong-relu.md").exists()
