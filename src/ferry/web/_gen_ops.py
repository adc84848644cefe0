"""The onnxruntime-web op table generator: measures which ops the wasm build runs, as data.

It writes ``ferry/web/_ort_web_ops.py``. Run it after changing
:data:`ferry.web.PINNED_ORT_WEB_VERSION` (or onnx), and commit the result::

    python -m ferry.web._gen_ops                 # needs node and npm
    ruff format src/ferry/web/_ort_web_ops.py

Nothing is guessed. onnxruntime-web runs in Node as well as in a browser (the same wasm
binary), so the measurement loads one-node models in Node with the very runtime file a bundle
ships (``_probe_ops.mjs``):

1. The highest IR version and opset the runtime loads: an Identity model at rising versions.
2. Every single-node ONNX node test case (``onnx.backend.test.case.node``; ``_expanded``
   function bodies left out) is loaded at every opset at which its op has a schema version (a
   model opset ``o`` resolves an op to its newest schema ``s <= o``; the table is keyed by
   ``s``). At most :data:`_CASES_PER_OP` cases per op, spread over its cases, so that each
   element type the cases use is tried.
   An op version no single-node case reaches (no test case, or the cases need a newer
   schema) is tried as a one-node model built from its schema (float32 where allowed,
   unknown shapes, required attributes set to plain values).
3. ``(domain, op, since)`` is supported when at least one case loads; it is missing when none
   does and at least one was refused with ONNX Runtime's "Could not find an implementation" (no
   kernel for it). Other refusals (an attribute the older schema lacks) say nothing and are left
   out: such a version is *unmeasured*, and the export check says so instead of guessing.

Only the ``""`` and ``ai.onnx.ml`` domains have ONNX test cases; other domains are unmeasured.
"""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import onnx
from onnx import helper

from ferry.web._npm import PINNED_ORT_WEB_VERSION, RUNTIME_STEM, ensure_onnxruntime_web

__all__ = ["main", "measure", "render"]

_DOMAINS = ("", "ai.onnx.ml")
_CASES_PER_OP = 4
_MISSING = re.compile(r"Could not find an implementation|NOT_IMPLEMENTED|not implemented", re.I)
_PROBE = Path(__file__).with_name("_probe_ops.mjs")


def _onnx_cases() -> list[Any]:
    """ONNX's node test cases (onnx's own collector; this room sits below ``conformance``)."""
    import onnx.backend.test.case.node as node_cases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators overflow on purpose
        return list(node_cases.collect_testcases())


def _since_versions() -> dict[tuple[str, str], list[int]]:
    history: dict[tuple[str, str], set[int]] = collections.defaultdict(set)
    for schema in onnx.defs.get_all_schemas_with_history():
        domain = "" if schema.domain in ("", "ai.onnx") else schema.domain
        if domain in _DOMAINS and not schema.deprecated:
            history[domain, schema.name].add(schema.since_version)
    return {key: sorted(v) for key, v in history.items()}


def _spread(items: list[Any], n: int) -> list[Any]:
    if len(items) <= n:
        return items
    step = (len(items) - 1) / (n - 1)
    return [items[round(i * step)] for i in range(n)]


def _probe(dist: Path, models: list[Path]) -> list[dict[str, Any]]:
    """Load each model in Node; restarts after a crash so that one abort costs one model."""
    with tempfile.TemporaryDirectory() as tmp:
        listing = Path(tmp) / "cases.json"
        listing.write_text(json.dumps([{"file": str(m)} for m in models]))
        results: dict[int, dict[str, Any]] = {}
        start = 0
        while start < len(models):
            proc = subprocess.run(
                [
                    "node",
                    "--liftoff-only",
                    str(_PROBE),
                    str(dist),
                    RUNTIME_STEM,
                    str(listing),
                    str(start),
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            for line in proc.stdout.splitlines():
                if line.startswith("{"):
                    row = json.loads(line)
                    results[row["i"]] = row
            done = max(results, default=-1) + 1
            if done < len(models):
                # The runtime aborted on model ``done``: record it and go on after it.
                results[done] = {"i": done, "ok": False, "error": "crashed: " + proc.stderr[-200:]}
                done += 1
            start = done
        return [results[i] for i in range(len(models))]


def _model(nodes: list[onnx.NodeProto], opsets: dict[str, int], ir_version: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "probe",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()]
    )
    model.ir_version = ir_version
    return model


_ATTR_DEFAULTS: dict[Any, Any] = {
    onnx.defs.OpSchema.AttrType.INT: 1,
    onnx.defs.OpSchema.AttrType.FLOAT: 1.0,
    onnx.defs.OpSchema.AttrType.STRING: "",
    onnx.defs.OpSchema.AttrType.INTS: [1],
    onnx.defs.OpSchema.AttrType.FLOATS: [1.0],
    onnx.defs.OpSchema.AttrType.STRINGS: [""],
}
_PREFERRED_TYPES = ("tensor(float)", "tensor(int64)", "tensor(int32)", "tensor(string)")


def _schema_model(domain: str, op: str, since: int, ir_version: int) -> onnx.ModelProto | None:
    """A one-node model of ``op`` built from its schema alone, for ops no ONNX test case covers.

    Inputs and outputs are graph values of unknown shape, typed float32 where the schema allows
    it; required attributes get a plain value. None when the schema needs more (a graph
    attribute, a sequence or map type).
    """
    schema = onnx.defs.get_schema(op, since, domain)
    allowed = {c.type_param_str: list(c.allowed_type_strs) for c in schema.type_constraints}

    def elem(type_str: str) -> int | None:
        options = allowed.get(type_str, [type_str])
        pick = next((t for t in _PREFERRED_TYPES if t in options), options[0])
        match = re.fullmatch(r"tensor\((\w+)\)", pick)
        if match is None:
            return None
        name = {"float": "FLOAT", "double": "DOUBLE", "string": "STRING"}.get(
            match[1], match[1].upper()
        )
        return getattr(onnx.TensorProto, name, None)

    attrs: dict[str, Any] = {}
    for name, attr in schema.attributes.items():
        if attr.required:
            if attr.type not in _ATTR_DEFAULTS:
                return None
            attrs[name] = _ATTR_DEFAULTS[attr.type]
    ins, outs = [], []
    for i, formal in enumerate(schema.inputs):
        if formal.option == onnx.defs.OpSchema.FormalParameterOption.Optional:
            break
        t = elem(formal.type_str)
        if t is None:
            return None
        ins.append(helper.make_tensor_value_info(f"in{i}", t, None))
    for i, formal in enumerate(schema.outputs):
        if formal.option == onnx.defs.OpSchema.FormalParameterOption.Optional and i > 0:
            break
        t = elem(formal.type_str)
        if t is None:
            return None
        outs.append(helper.make_tensor_value_info(f"out{i}", t, None))
    node = helper.make_node(
        op, [v.name for v in ins], [v.name for v in outs], domain=domain, **attrs
    )
    opsets = {"": 21 if domain else since}
    if domain:
        opsets[domain] = since
    model = helper.make_model(
        helper.make_graph([node], "probe", ins, outs),
        opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
    )
    model.ir_version = ir_version
    return model


def measure(dist: Path) -> dict[str, Any]:
    """Measure the runtime in ``dist`` (onnxruntime-web's ``dist/`` folder).

    Returns:
        ``max_ir``, ``max_opset`` ({domain: opset}), ``supported`` and ``missing`` (sorted
        ``(domain, op, since)`` lists), and ``cases`` (how many models were loaded).
    """
    identity = [helper.make_node("Identity", ["x"], ["y"])]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        irs = list(range(7, 16))
        paths = []
        for ir_version in irs:
            paths.append(folder / f"ir{ir_version}.onnx")
            onnx.save(_model(identity, {"": 13}, ir_version), paths[-1])
        loaded = [ir for ir, r in zip(irs, _probe(dist, paths), strict=True) if r["ok"]]
        max_ir = max(loaded)
        opsets = list(range(13, 40))
        paths = []
        for opset in opsets:
            paths.append(folder / f"opset{opset}.onnx")
            onnx.save(_model(identity, {"": opset}, max_ir), paths[-1])
        results = _probe(dist, paths)
        max_opset = {"": max(o for o, r in zip(opsets, results, strict=True) if r["ok"])}
        paths = []
        for opset in range(1, 12):
            paths.append(folder / f"ml{opset}.onnx")
            onnx.save(_model(identity, {"": 13, "ai.onnx.ml": opset}, max_ir), paths[-1])
        results = _probe(dist, paths)
        max_opset["ai.onnx.ml"] = max(i + 1 for i, r in enumerate(results) if r["ok"])

        history = _since_versions()
        by_op: dict[tuple[str, str], list[Any]] = collections.defaultdict(list)
        for case in _onnx_cases():
            if case.name.endswith("_expanded") or "_expanded_ver" in case.name:
                continue
            if len(case.model.graph.node) != 1:
                continue
            node = case.model.graph.node[0]
            domain = "" if node.domain in ("", "ai.onnx") else node.domain
            if (domain, node.op_type) in history:
                by_op[domain, node.op_type].append(case)
        keys: list[tuple[str, str, int]] = []
        paths = []
        for (domain, op), cases in sorted(by_op.items()):
            for since in history[domain, op]:
                if since > max_opset.get(domain, 0):
                    continue
                for case in _spread(cases, _CASES_PER_OP):
                    model = onnx.ModelProto()
                    model.CopyFrom(case.model)
                    for entry in model.opset_import:
                        if ("" if entry.domain == "ai.onnx" else entry.domain) == domain:
                            entry.version = since
                    model.ir_version = min(model.ir_version, max_ir)
                    paths.append(folder / f"case{len(paths)}.onnx")
                    onnx.save(model, paths[-1])
                    keys.append((domain, op, since))
        covered = {(d, o, s) for d, o, s in keys}
        for (domain, op), versions in sorted(history.items()):
            for since in versions:
                if since > max_opset.get(domain, 0) or (domain, op, since) in covered:
                    continue
                built = _schema_model(domain, op, since, max_ir)
                if built is not None:
                    paths.append(folder / f"schema{len(paths)}.onnx")
                    onnx.save(built, paths[-1])
                    keys.append((domain, op, since))
        results = _probe(dist, paths)
    loads: dict[tuple[str, str, int], list[bool]] = collections.defaultdict(list)
    refusals: dict[tuple[str, str, int], bool] = collections.defaultdict(bool)
    for key, result in zip(keys, results, strict=True):
        loads[key].append(bool(result["ok"]))
        if not result["ok"] and _MISSING.search(result.get("error", "")):
            refusals[key] = True
    supported = sorted(k for k, v in loads.items() if any(v))
    missing = sorted(k for k, v in loads.items() if not any(v) and refusals[k])
    return {
        "max_ir": max_ir,
        "max_opset": max_opset,
        "supported": supported,
        "missing": missing,
        "cases": len(keys),
    }


def render(measured: dict[str, Any]) -> str:
    """The source of ``_ort_web_ops.py`` for ``measured`` (from :func:`measure`)."""

    def rows(items: list[tuple[str, str, int]]) -> str:
        return "".join(f"    ({d!r}, {o!r}, {s}),\n" for d, o, s in items)

    return (
        '"""onnxruntime-web (wasm build) op support, measured. GENERATED: do not edit by hand.\n\n'
        f"Measured on onnxruntime-web {PINNED_ORT_WEB_VERSION} ({RUNTIME_STEM}.wasm, in Node) "
        f"with onnx {onnx.__version__}\nby ``python -m ferry.web._gen_ops`` "
        f"({measured['cases']} one-node models; see ``ferry.web._gen_ops``).\n"
        '"""\n\n'
        "from __future__ import annotations\n\n"
        f"ORT_WEB_VERSION = {PINNED_ORT_WEB_VERSION!r}\n"
        f"ONNX_VERSION = {onnx.__version__!r}\n"
        "#: The highest model IR version the runtime loads.\n"
        f"MAX_IR_VERSION = {measured['max_ir']}\n"
        "#: The highest opset the runtime loads, per domain.\n"
        f"MAX_OPSET: dict[str, int] = {measured['max_opset']!r}\n\n"
        "#: (domain, op_type, since): the op's schema version ``since`` loads (a kernel exists).\n"
        "# fmt: off\n"
        "SUPPORTED: frozenset[tuple[str, str, int]] = frozenset({\n"
        f"{rows(measured['supported'])}"
        "})\n\n"
        '#: (domain, op_type, since): refused with "Could not find an implementation" in every case.\n'
        "MISSING: frozenset[tuple[str, str, int]] = frozenset({\n"
        f"{rows(measured['missing'])}"
        "})\n"
        "# fmt: on\n"
    )


def main() -> None:
    """Measure the pinned onnxruntime-web and write ``_ort_web_ops.py`` beside this module."""
    dist = ensure_onnxruntime_web(PINNED_ORT_WEB_VERSION)
    target = Path(__file__).with_name("_ort_web_ops.py")
    tmp = target.with_suffix(".py.tmp")
    tmp.write_text(render(measure(dist)), encoding="utf-8")
    tmp.replace(target)
    sys.stderr.write(f"wrote {target}\n")


if __name__ == "__main__":
    main()
