"""The OpenVINO rule generator's conclusions: rules derived from the forms' verdicts, checked, emitted.

For each op, the rule claims the op versions where some form passed, the input and output dtypes
seen passing, constant inputs when it only passed with them, dynamic dims when every dyn form of a
passing form passed; :data:`OVERRIDES` add what the data cannot (attribute limits, exclusions),
each with its reason. Finally every form is checked against the derived table (:func:`verify`):
a form the table accepts that failed is an error. :func:`emit` writes the table as the source of
``ferry/backends/_openvino_rules.py``.
"""

from __future__ import annotations

import dataclasses
import pprint
from collections import defaultdict
from typing import Any

import onnx
import onnx_ir as ir

from ferry.backends._openvino_problems import OVERRIDES, narrow, op_schema
from ferry.conformance._cases import ConformanceCase
from ferry.conformance._openvino_forms import (
    MIN_OPSET,
    Form,
    build_form,
    case_opset,
    effective_version,
    has_empty_input,
    op_versions,
    prepared,
)
from ferry.conformance._tables import module_head
from ferry.graph import dtype_name

__all__ = ["NATIVE", "OVERRIDES", "Observation", "derive", "emit", "observe", "verify"]

# Element types ferry can hand to OpenVINO and get back as numpy arrays with their values intact.
# Left out: float64 (the CPU plugin computes it in float32: 1 + 1e-10 == 1, 1e300 -> 3.4e38),
# bfloat16 (OpenVINO's Python API returns it as float16 bits), float8/int4/... (no numpy type),
# strings. int64/uint64 are kept though the plugin computes them in 32 bits: shapes, indices and
# ids fit, but arithmetic beyond 2**31 wraps (see NOTES in the generated module).
NATIVE = frozenset(
    {
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
    }
)
NOTES = (
    "int64/uint64: the CPU plugin computes them in 32 bits; values beyond 2**31 wrap "
    "(2**40 + 1 == 1 in Add). Shapes, indices and token ids fit.",
    "Results are compared in f32 (the adapter's default); bf16/f16 hints change precision, "
    "not which ops run.",
)


@dataclasses.dataclass
class Observation:
    """What one form showed.

    Attributes:
        form: the form.
        key: its node's ``(domain, op_type)``.
        version: the op's version at the form's opset.
        passed: whether the form passed.
        inputs / outputs: the dtype of each of the node's inputs and outputs, by index.
        model: the form as the partitioner sees it (nodes named), for checks against rules.
        empty: some input of the case's data has a zero-size dim.
    """

    form: Form
    key: tuple[str, str]
    version: int
    passed: bool
    inputs: dict[int, str]
    outputs: dict[int, str]
    model: ir.Model
    empty: bool = False


def _dtype_of(vi: onnx.ValueInfoProto) -> str | None:
    elem = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
    return dtype_name(ir.DataType(elem)) if elem else None


def observe(case: ConformanceCase, form: Form, result: dict[str, Any]) -> Observation | None:
    """The observation a form's verdict makes, or None when it makes none (no such form, no
    reference to compare with)."""
    proto = build_form(case, form)
    if proto is None or result["verdict"] in ("absent", "no-reference"):
        return None
    node = proto.graph.node[0]
    types = {vi.name: _dtype_of(vi) for vi in (*proto.graph.input, *proto.graph.output)}
    for init in proto.graph.initializer:
        types[init.name] = dtype_name(ir.DataType(init.data_type))
    opset = form.opset or case_opset(case)
    return Observation(
        form=form,
        key=(node.domain, node.op_type),
        version=effective_version(node.domain, node.op_type, opset),
        passed=result["verdict"] == "pass",
        inputs={i: t for i, n in enumerate(node.input) if n and (t := types.get(n))},
        outputs={i: t for i, n in enumerate(node.output) if n and (t := types.get(n))},
        empty=has_empty_input(case),
        model=prepared(proto),
    )


def derive(
    observations: list[Observation], max_opset: int
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Rules from observations: per op, per override variant (the observations it admits)."""
    by_op: dict[tuple[str, str], list[Observation]] = defaultdict(list)
    for ob in observations:
        by_op[ob.key].append(ob)
    rules: list[dict[str, Any]] = []
    excluded: dict[str, str] = {}
    for (domain, op_type), obs in sorted(by_op.items()):
        label = op_type if domain == "" else f"{domain}.{op_type}"
        override = OVERRIDES.get(label, {})
        if "exclude" in override:
            excluded[label] = override["exclude"]
            continue
        schema = op_schema(domain, op_type, max_opset)
        made = []
        for variant in override.get("variants", [{}]):
            limits = {k: v for k, v in override.items() if k != "variants"} | variant
            narrowed = narrow({"op": op_type, "inputs": {}}, limits, schema)
            admitted = [ob for ob in obs if _admits(narrowed, ob)]
            made += _derive_variant(domain, op_type, admitted, narrowed, max_opset)
        if made:
            rules += made
        elif not any(ob.passed for ob in obs):
            excluded[label] = "no test case passes"
        else:
            excluded[label] = "passes only with element types ferry cannot exchange (bfloat16, ...)"
    return rules, excluded


def _admits(limits: dict[str, Any], ob: Observation) -> bool:
    """Whether an observation's node meets a variant's limits (types, attributes, rank, absent
    inputs), whatever its constness and dims."""
    from ferry.backends._openvino import rules_from_data

    probe = {k: v for k, v in limits.items() if k not in ("const", "dynamic", "nonempty")}
    (rule,) = rules_from_data([{**probe, "since": 1, "until": 10**6}])
    node = next(iter(ob.model.graph))
    return rule.accepts(node, 1) is True


def _derive_variant(
    domain: str, op_type: str, obs: list[Observation], limits: dict[str, Any], max_opset: int
) -> list[dict[str, Any]]:
    # Only forms whose every input and output has a type ferry can exchange count.
    usable = [
        ob for ob in obs if all(t in NATIVE for t in (*ob.inputs.values(), *ob.outputs.values()))
    ]
    passing = [ob for ob in usable if ob.passed]
    if not passing:
        return []

    def key(ob: Observation, const: bool | None = None, dyn: bool | None = None) -> tuple[Any, ...]:
        f = ob.form
        return (
            f.case,
            f.opset,
            f.f16,
            f.const if const is None else const,
            f.dyn if dyn is None else dyn,
        )

    verdict = {key(ob): ob.passed for ob in obs}
    # Constant inputs are required when no form passed without them, or when some case passed
    # with them and failed without (Unsqueeze's axes, Tile's repeats).
    needs_const = not any(not ob.form.const for ob in passing) or any(
        not verdict.get(key(ob, const=False), True) for ob in passing if ob.form.const
    )
    with_const = {ob.form.case for ob in obs if ob.form.const}
    static_pass = {
        key(ob, dyn=True)
        for ob in passing
        if not ob.form.dyn and (ob.form.const or not needs_const or ob.form.case not in with_const)
    }
    twins = [ob for ob in usable if ob.form.dyn and key(ob) in static_pass]
    twins = [ob for ob in twins if not (limits.get("nonempty") and ob.empty)]  # the known gap
    # Dynamic dims fail for some element types only (int8 Div): split those off as static.
    bad = {ob.inputs.get(0) for ob in twins if not ob.passed}
    good = {ob.inputs.get(0) for ob in twins if ob.passed}
    types: dict[int, set[str]] = defaultdict(set)
    out_types: dict[int, set[str]] = defaultdict(set)
    for ob in passing:
        for i, t in ob.inputs.items():
            types[i].add(t)
        for i, t in ob.outputs.items():
            out_types[i].add(t)
    first = types.get(0, set())
    if not bad:
        groups = [(first, True)]
    elif None not in bad and not bad & good and first - bad:
        groups = [(first - bad, True), (first & bad, False)]
    else:
        groups = [(first, False)]
    versions = op_versions(domain, op_type)
    good_versions = sorted({ob.version for ob in passing})
    made = []
    for group_types, dynamic in groups:
        if not group_types and 0 in types:
            continue
        rule: dict[str, Any] = {"op": op_type}
        if domain:
            rule["domain"] = domain
        inputs = {i: tuple(sorted(t)) for i, t in sorted(types.items())}
        if 0 in inputs:
            inputs[0] = tuple(sorted(group_types))
        rule["inputs"] = inputs
        rule["outputs"] = {i: tuple(sorted(t)) for i, t in sorted(out_types.items())}
        if needs_const:
            n_inputs = max(len(ob.inputs) for ob in passing)
            rule["const"] = tuple(range(1, max(n_inputs, 2)))
        if not dynamic or limits.get("dynamic") is False:
            rule["dynamic"] = False
        for k in ("max_rank", "absent", "nonempty", "attrs", "note"):
            if k in limits:
                rule[k] = limits[k]
        for since, until in _ranges(good_versions, versions, max_opset):
            since = max(since, limits.get("since", since))
            if since <= until:
                head: dict[str, Any] = {k: rule[k] for k in ("op", "domain") if k in rule}
                rest = {k: v for k, v in rule.items() if k not in ("op", "domain")}
                made.append({**head, "since": since, "until": until, **rest})
    return made


def _ranges(good: list[int], versions: list[int], max_opset: int) -> list[tuple[int, int]]:
    """Opset ranges where the op's version is one that passed, merged where they touch."""
    spans = []
    for v in good:
        later = [w for w in versions if w > v]
        spans.append((max(v, MIN_OPSET), (later[0] - 1) if later else max_opset))
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return merged


def verify(
    cases: list[ConformanceCase],
    forms: list[Form],
    done: dict[int, dict[str, Any]],
    rules: list[dict[str, Any]],
) -> tuple[list[str], list[str]]:
    """Check the derived rules against every form run.

    Args:
        cases / forms: the cases and their forms (``Form.case`` indexes ``cases``).
        done: each form's verdict, by its index in ``forms``.
        rules: from :func:`derive`.

    Returns:
        ``(problems, gaps)``: forms the rules accept that failed, each one a bug in the rules; and
        the known gaps (dyn forms of empty-input cases for ops whose rules refuse visible empty
        inputs), by case name.
    """
    from ferry.backends import RuleTable
    from ferry.backends._openvino import rules_from_data

    table = RuleTable(rules_from_data(rules))
    problems, gaps = [], []
    for key, result in sorted(done.items()):
        if result["verdict"] in ("pass", "absent", "no-reference"):
            continue
        form = forms[key]
        case = cases[form.case]
        proto = build_form(case, form)
        if proto is None:
            continue
        model = prepared(proto)
        node = next(iter(model.graph))
        if table.supports(node, model.opset_imports) is True:
            line = f"{case.name} {form}: accepted but {result}"
            nonempty = OVERRIDES.get(node.op_type, {}).get("nonempty")
            if nonempty and form.dyn and has_empty_input(case):
                gaps.append(case.name)
            else:
                problems.append(line)
    return problems, sorted(set(gaps))


def emit(
    rules: list[dict[str, Any]], excluded: dict[str, str], summary: str, gaps: list[str]
) -> str:
    """The source of ``_openvino_rules.py``: the rules, the notes (the known gaps among them) and
    the ops left out with their reasons; ``summary`` ends its docstring."""
    lines = module_head(
        [
            "OpenVINO's ONNX op support on the CPU, as data. GENERATED: do not edit by hand.",
            "",
            "Regenerate with ``python -m ferry.conformance rules openvino``, then ``ruff format`` this",
            "file; the generator checks every claim against ONNX's node test cases.",
            summary,
        ]
    )
    lines += [
        "# Keys: op, domain (default ''), since/until (model opset), inputs/outputs ({index: dtypes}),",
        "# const (input indices that must be constants), dynamic (False: static shapes only),",
        "# attrs ({name: (allowed values, default when absent)}).",
        "RULES: tuple[dict[str, Any], ...] = (",
    ]
    for rule in rules:
        lines.append(
            "    " + pprint.pformat(rule, width=96, sort_dicts=False).replace("\n", "\n    ") + ","
        )
    lines.append(")")
    lines.append("")
    lines.append("#: What the rules claim that is not exact, for the reader.")
    lines.append("NOTES: tuple[str, ...] = (")
    for note in NOTES:
        lines.append(f"    {note!r},")
    if gaps:
        lines.append(
            f"    {'Zero-size inputs behind dynamic dims are not seen by the rules; failing cases: ' + ', '.join(gaps)!r},"
        )
    lines.append(")")
    lines.append("")
    lines.append("#: Ops with test cases that are not claimed, and why.")
    lines.append("EXCLUDED: dict[str, str] = {")
    for op, why in sorted(excluded.items()):
        lines.append(f"    {op!r}: {why!r},")
    lines.append("}")
    return "\n".join(lines) + "\n"
