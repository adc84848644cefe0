"""The ONNX Runtime rule generator: measures the ops ONNX Runtime's CPU provider runs, as data.

It writes ``ferry/backends/_onnxruntime_ops.py``. Run it after upgrading onnxruntime or onnx,
and commit the result::

    python -m ferry.conformance rules onnxruntime
    ruff format src/ferry/backends/_onnxruntime_ops.py

(``--op Relu --out -`` measures one op and prints the partial table: a smoke run.)

Nothing here is guessed. The algorithm:

1. The highest opset ONNX Runtime loads, per domain: a one-node model is loaded at rising opsets
   until ONNX Runtime refuses it (``ValidateOpsetForDomain``).
2. Kernels: ONNX Runtime's own kernel registry (``get_all_opkernel_def``) lists every CPU kernel
   with the schema versions it covers and its type constraints. A model opset ``o`` resolves an
   op to the newest schema version ``s <= o`` (from ONNX Runtime's schema registry); the op runs
   at ``o`` when a kernel serves ``s``: a kernel registered for ``[a, b]`` serves ``a..b``, an
   open-ended one (``[a, INT_MAX]``) only ``a`` itself (ONNX Runtime's own lookup rule).
   Kernels register type *combinations* (OneHot: indices x depth x values); registrations that
   differ in one type parameter are joined, so each row allows exactly registered combinations.
   Type parameters map to input and output indices through the ONNX schema. Where a kernel
   takes float32, float16 is added: ONNX Runtime's InsertCastTransformer (always on) runs
   float16 nodes through float kernels between Casts.
3. Ops with no kernel at some schema version (function ops such as ``Swish`` or ``CastLike``,
   which ONNX Runtime inlines, ``Constant``, which it folds, and old versions) are tried for real,
   at every model opset of the span (inlining depends on it): each of ONNX's node test cases for
   the op is loaded at that opset and, one type parameter at a time, with the inputs and outputs
   of that parameter retyped to each type the schema allows. What loads is recorded.
4. ONNX's node test cases are run at their own opsets and compared with their expected outputs
   (``ferry.parity``, strict, with the case's tolerance for floats and bit for bit otherwise);
   the names of the cases that fail are recorded (``CONFORMANCE_FAILURES``) for the conformance
   tier, which must skip exactly those.

Only the ``""`` and ``ai.onnx.ml`` domains are measured; ``com.microsoft`` ops are listed by name
from the kernel registry and accepted permissively.
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Collection, Iterable, Iterator
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from ferry.conformance._cases import ConformanceCase, collect_cases, normal_domain
from ferry.conformance._compare import compare_output
from ferry.conformance._tables import module_head
from ferry.graph import dtype_name

__all__ = ["max_opsets", "measure", "render"]

_DOMAINS = ("", "ai.onnx.ml")
_INT_MAX = 2**31 - 1
_CONTRIB_DOMAINS = ("com.microsoft", "com.microsoft.nchwc")

#: One rule row: (domain, op_type, since, until, input dtypes, output dtypes).
Row = tuple[str, str, int, int, Any, Any]


def _session(model: onnx.ModelProto) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _loads(model: onnx.ModelProto) -> bool:
    try:
        _session(model)
    except Exception:  # ORT's C++ errors: the op (at this version or type) is not runnable
        return False
    return True


def max_opsets() -> dict[str, int]:
    """The highest opset ONNX Runtime loads for each measured domain."""
    from onnx import TensorProto, helper

    found: dict[str, int] = {}
    for domain, op in (("", "Identity"), ("ai.onnx.ml", "Binarizer")):
        top = 0
        for version in range(1, 64):
            node = helper.make_node(op, ["x"], ["y"], domain=domain)
            graph = helper.make_graph(
                [node],
                "probe",
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
            )
            opsets = [helper.make_opsetid(domain, version)]
            if domain:
                opsets.append(helper.make_opsetid("", 17))
            model = helper.make_model(graph, opset_imports=opsets)
            model.ir_version = 8
            if _loads(model):
                top = version
            elif top:
                break
        found[domain] = top
    return found


def _type_names(type_strs: Iterable[str]) -> frozenset[str] | None:
    """``tensor(float)`` -> ``float32``; None when any type is not a plain tensor."""
    names = set()
    for t in type_strs:
        if not t.startswith("tensor(") or not t.endswith(")"):
            return None
        elem = t[len("tensor(") : -1]
        proto_type = onnx.TensorProto.DataType.Value("FLOAT" if elem == "float" else elem.upper())
        names.add(dtype_name(ir.DataType(proto_type)))
    return frozenset(names)


#: A kernel registration: the element types each type parameter (``T``, ``T1``...) may take.
Box = tuple[tuple[str, frozenset[str]], ...]


def _box(constraints: dict[str, list[str]]) -> Box:
    """One kernel registration's type constraints as a box (sequence/map types left out).

    float16 joins float32 wherever a kernel takes float32: ONNX Runtime's InsertCastTransformer
    (always on) runs float16 nodes through float kernels between Casts.
    """
    slots: list[tuple[str, frozenset[str]]] = []
    for param, types in sorted(constraints.items()):
        names = _type_names(types)
        if names is None:
            continue
        if "float32" in names:
            names = names | {"float16"}
        slots.append((param, names))
    return tuple(slots)


def _compact(box: Box, schema: onnx.defs.OpSchema) -> tuple[Any, Any]:
    """A box as the data module's (inputs, outputs) for ``schema``'s formal parameters.

    Inputs: None, a tuple of names when one type parameter types every input (variadic ones
    too), or ``((index, names), ...)``; outputs: None or ``((index, names), ...)``.
    """
    allowed = dict(box)
    in_params = [p.type_str for p in schema.inputs]
    inputs: Any = None
    if in_params and len(set(in_params)) == 1 and in_params[0] in allowed:
        inputs = tuple(sorted(allowed[in_params[0]]))
    else:
        pairs = tuple(
            (i, tuple(sorted(allowed[p]))) for i, p in enumerate(in_params) if p in allowed
        )
        inputs = pairs or None
    outs = tuple(
        (i, tuple(sorted(allowed[p.type_str])))
        for i, p in enumerate(schema.outputs)
        if p.type_str in allowed
    )
    return inputs, outs or None


def _merge_boxes(boxes: Iterable[Box]) -> list[Box]:
    """Fewest boxes covering the same type combinations: join two that differ in one slot only.

    Kernels register type combinations (OneHot: indices x depth x values); one box per
    combination would be exact but long, one union per slot would claim combinations no kernel
    has. Joining boxes that differ in a single slot keeps exactly the registered combinations.
    """
    merged = list(dict.fromkeys(boxes))
    changed = True
    while changed:
        changed = False
        for i, a in enumerate(merged):
            for j in range(i + 1, len(merged)):
                b = merged[j]
                if [slot for slot, _ in a] != [slot for slot, _ in b]:
                    continue
                differ = [k for k, (x, y) in enumerate(zip(a, b)) if x[1] != y[1]]
                if len(differ) > 1:
                    continue
                joined = tuple(
                    (slot, names | b[k][1]) if k in differ else (slot, names)
                    for k, (slot, names) in enumerate(a)
                )
                merged[i] = joined
                del merged[j]
                changed = True
                break
            if changed:
                break
    return merged


def _kernel_matches(start: int, end: int, since: int) -> bool:
    """ONNX Runtime's kernel lookup: an open-ended kernel serves exactly its first version."""
    return start == since or (start < since and end != _INT_MAX and end >= since)


def _schema_versions(domain: str) -> dict[str, list[int]]:
    from onnxruntime.capi import _pybind_state as C

    versions: dict[str, set[int]] = collections.defaultdict(set)
    for s in C.get_all_operator_schema():
        if s.domain == domain:
            versions[s.name].add(s.since_version)
    return {op: sorted(v) for op, v in versions.items()}


def _kernels(domain: str) -> dict[str, list[tuple[int, int, dict[str, list[str]]]]]:
    from onnxruntime.capi import _pybind_state as C

    found: dict[str, list[tuple[int, int, dict[str, list[str]]]]] = collections.defaultdict(list)
    for k in C.get_all_opkernel_def():
        if k.domain == domain and k.provider == "CPUExecutionProvider":
            start, end = k.version_range
            found[k.op_name].append((start, end, dict(k.type_constraints)))
    return found


def _testcases() -> dict[tuple[str, str], list[ConformanceCase]]:
    """ONNX's node test cases of one op each (every node the same op), by ``(domain, op_type)``.

    An expanded function test exercises the op's body, not the op: left out.
    """
    by_op: dict[tuple[str, str], list[ConformanceCase]] = collections.defaultdict(list)
    for case in collect_cases():
        nodes = case.model.graph.node
        if len({(n.domain, n.op_type) for n in nodes}) == 1:
            by_op[(normal_domain(nodes[0].domain), nodes[0].op_type)].append(case)
    return by_op


def _at_opset(model: onnx.ModelProto, domain: str, version: int) -> onnx.ModelProto:
    changed = copy.deepcopy(model)
    for opset in changed.opset_import:
        if opset.domain in ((domain, "ai.onnx") if domain == "" else (domain,)):
            opset.version = version
    return changed


def _retyped(
    model: onnx.ModelProto, inputs: Iterable[int], outputs: Iterable[int], elem_type: int
) -> onnx.ModelProto:
    """``model`` (one node) with the node's inputs and outputs at these indices retyped."""
    changed = copy.deepcopy(model)
    node = changed.graph.node[0]
    names = {node.input[i] for i in inputs if i < len(node.input)}
    names |= {node.output[i] for i in outputs if i < len(node.output)}
    for vi in (*changed.graph.input, *changed.graph.output):
        if vi.name in names and vi.type.HasField("tensor_type"):
            vi.type.tensor_type.elem_type = elem_type
    return changed


def _probe_box(model: onnx.ModelProto, schema: onnx.defs.OpSchema) -> Box:
    """For each type parameter of the node's inputs: the element types with which it loads.

    Each parameter is probed alone (the others keep the test case's types): its inputs and
    outputs are retyped to every type its constraint allows, and the model is loaded.
    """
    constraint = {c.type_param_str: list(c.allowed_type_strs) for c in schema.type_constraints}
    fed = {vi.name for vi in model.graph.input}
    node = model.graph.node[0]
    slots: list[tuple[str, frozenset[str]]] = []
    for param in dict.fromkeys(p.type_str for p in schema.inputs):
        if param not in constraint:
            continue
        ins = [i for i, p in enumerate(schema.inputs) if p.type_str == param]
        if not any(i < len(node.input) and node.input[i] in fed for i in ins):
            continue  # no graph input to retype (an initializer, or absent): not probed
        outs = [i for i, p in enumerate(schema.outputs) if p.type_str == param]
        names = _type_names(constraint[param])
        if names is None:
            continue
        ok = {
            name
            for name in names
            if _loads(_retyped(model, ins, outs, ir.DataType[_ir_name(name)].value))
        }
        if ok:
            slots.append((param, frozenset(ok)))
    return tuple(sorted(slots))


def _ir_name(numpy_name: str) -> str:
    for dt in ir.DataType:
        if dt.value and dtype_name(dt) == numpy_name:
            return dt.name
    raise KeyError(numpy_name)


def measure(
    ops: Collection[str] | None = None,
) -> tuple[dict[str, int], list[Row], list[tuple[str, str]], list[str]]:
    """Measure the installed onnxruntime: max opsets, rule rows, contrib ops, failing cases.

    Args:
        ops: measure only these op types (rows and failing cases; a smoke run); None: all.
    """
    tops = max_opsets()
    cases = _testcases()
    if ops is not None:
        cases = collections.defaultdict(list, {k: v for k, v in cases.items() if k[1] in ops})
    rows: list[Row] = []
    for domain in _DOMAINS:
        top = tops[domain]
        kernels = _kernels(domain)
        for op, versions in sorted(_schema_versions(domain).items()):
            versions = [v for v in versions if v <= top]
            if not versions or (ops is not None and op not in ops):
                continue
            try:
                onnx.defs.get_schema(op, top, domain)
            except onnx.defs.SchemaError:
                continue  # ORT-only legacy op ONNX no longer defines
            spans: list[tuple[int, int, tuple[Any, Any]]] = []
            for i, since in enumerate(versions):
                until = versions[i + 1] - 1 if i + 1 < len(versions) else top
                try:
                    schema = onnx.defs.get_schema(op, since, domain)
                except onnx.defs.SchemaError:
                    continue  # a version only ONNX Runtime defines (its old contrib ops)
                if schema.since_version != since:
                    continue
                matching = [k for k in kernels.get(op, []) if _kernel_matches(k[0], k[1], since)]
                if matching:
                    boxes = _merge_boxes(_box(k[2]) for k in matching)
                    spans.extend((since, until, _compact(box, schema)) for box in boxes)
                    continue
                # No kernel: a function op ONNX Runtime inlines, or not runnable. Inlining
                # depends on the model's opset, so every opset of the span is tried.
                for opset in range(since, until + 1):
                    for case in cases.get((domain, op), []):
                        model = _at_opset(case.model, domain, opset)
                        if _loads(model):
                            box = _probe_box(model, schema)
                            spans.append((opset, opset, _compact(box, schema)))
                            break
            rows.extend(_merge(domain, op, spans))
    contrib = sorted((domain, op) for domain in _CONTRIB_DOMAINS for op in _kernels(domain))
    failures = sorted(_conformance_failures(cases))
    return tops, rows, contrib, failures


def _merge(domain: str, op: str, spans: list[tuple[int, int, tuple[Any, Any]]]) -> Iterator[Row]:
    """Join adjacent opset spans that allow the same types into one row per type set."""
    by_types: dict[tuple[Any, Any], list[list[int]]] = {}
    for since, until, types in spans:
        runs = by_types.setdefault(types, [])
        if runs and runs[-1][1] + 1 == since:
            runs[-1][1] = until
        else:
            runs.append([since, until])
    rows = [
        (domain, op, since, until, inputs, outputs)
        for (inputs, outputs), runs in by_types.items()
        for since, until in runs
    ]
    yield from sorted(rows, key=lambda r: (r[2], r[3]))


def _conformance_failures(cases: dict[tuple[str, str], list[ConformanceCase]]) -> Iterator[str]:
    for group in cases.values():
        for case in group:
            try:
                session = _session(case.model)
            except Exception:
                continue  # not runnable at all: the rows above do not claim it
            names = [i.name for i in case.model.graph.input]
            for inputs, expected in case.data_sets:
                feeds = dict(zip(names, inputs))
                if any(_unfeedable(v) for v in (*feeds.values(), *expected)):
                    break  # ORT's Python API cannot pass bfloat16/float8/int4 arrays: unverifiable
                try:
                    got = session.run(None, feeds)
                except Exception:
                    yield case.name
                    break
                if not all(_close(g, e, case) for g, e in zip(got, expected)):
                    yield case.name
                    break


def _unfeedable(value: Any) -> bool:
    if isinstance(value, list):
        return any(_unfeedable(v) for v in value)
    return isinstance(value, np.ndarray) and value.dtype.type.__module__.startswith("ml_dtypes")


def _close(got: Any, expected: Any, case: ConformanceCase) -> bool:
    """Floats within the case's tolerance; ints, bools and strings bit for bit; sequences are
    not compared."""
    if isinstance(expected, list):
        return True
    want = np.asarray(expected)
    exact = not (want.dtype.kind in "fc" and want.dtype.itemsize >= 2)
    atol, rtol = (0.0, 0.0) if exact else (case.atol, case.rtol)
    return compare_output("output", got, want, atol=atol, rtol=rtol).passed


def render(
    tops: dict[str, int], rows: list[Row], contrib: list[tuple[str, str]], failures: list[str]
) -> str:
    """The source of ``_onnxruntime_ops.py`` from :func:`measure`'s results (``ruff format`` it)."""
    import onnxruntime

    lines = module_head(
        [
            "ONNX Runtime CPU op support, measured. GENERATED: do not edit by hand.",
            "",
            f"Measured on onnxruntime {onnxruntime.__version__} with onnx {onnx.__version__} by",
            "``python -m ferry.conformance rules onnxruntime`` (see ``ferry.conformance._gen_onnxruntime``).",
        ]
    )
    lines += [
        f"ORT_VERSION = {onnxruntime.__version__!r}",
        f"ONNX_VERSION = {onnx.__version__!r}",
        "#: The highest opset ONNX Runtime loads, per domain.",
        f"MAX_OPSET: dict[str, int] = {tops!r}",
        "",
        "#: (domain, op_type, since, until, inputs, outputs): the op runs for model opsets",
        "#: since..until with these element types. inputs: None (unchecked), a tuple of dtype",
        "#: names (every input), or ((input index, names), ...); outputs: None or",
        "#: ((output index, names), ...). An op may have several rows for one opset: a node",
        "#: runs when any of them allows its types (kernels register type combinations).",
        "# fmt: off",
        "OPS: tuple[tuple[str, str, int, int, Any, Any], ...] = (",
    ]
    for domain, op, since, until, inputs, outputs in rows:
        lines.append(f"    ({domain!r}, {op!r}, {since}, {until}, {inputs!r}, {outputs!r}),")
    lines += [
        ")",
        "",
        "#: (domain, op_type) of com.microsoft and com.microsoft.nchwc ops with a CPU kernel:",
        "#: accepted permissively (any opset, any types).",
        "CONTRIB_OPS: tuple[tuple[str, str], ...] = (",
    ]
    lines += [f"    {pair!r}," for pair in contrib]
    lines += [
        ")",
        "",
        "#: ONNX node test cases that load but whose results ONNX Runtime gets wrong (or rejects",
        "#: at run time); the conformance tier skips exactly these.",
        "CONFORMANCE_FAILURES: frozenset[str] = frozenset({",
    ]
    lines += [f"    {name!r}," for name in failures]
    lines += ["})", "# fmt: on", ""]
    # Names hold no quotes, so swapping repr's quote style is safe; it matches ruff's style.
    return "\n".join(lines).replace("'", '"')
