"""The ops check of a web export: what onnxruntime-web's wasm build cannot load, all at once.

It reads the measured table (:mod:`ferry.web._ort_web_ops`). A model opset ``o`` resolves each
op to its newest schema version ``s <= o`` (ONNX's rule, which ONNX Runtime's kernel lookup
follows); the node runs when ``(domain, op, s)`` was measured to load. It is refused when it was
measured to be missing, or when the op or the opset does not exist for the runtime. An op
version the measurement could not reach (no ONNX test case loads at it, or a domain ONNX has
no test cases for, such as ``com.microsoft``) is listed as *unmeasured*, not refused: the
export's Node verification then runs the real model in the real runtime and settles it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import onnx
import onnx_ir as ir

from ferry.errors import UnsupportedOpError
from ferry.web import _ort_web_ops as table

__all__ = ["WebOpsCheck", "check_web_ops"]

_ONNX_DOMAINS = ("", "ai.onnx.ml")


@dataclasses.dataclass(frozen=True)
class WebOpsCheck:
    """The ops check of a model against onnxruntime-web's wasm build.

    Attributes:
        ort_web_version: the release the table was measured on.
        unsupported: ``(node name, op, reason)`` for every node the runtime cannot load.
        unmeasured: ``(node name, op)`` for nodes whose op version the table does not cover.
        opset_problems: domains whose opset the runtime cannot load, with the reason.
        ops: how many nodes were checked.
        max_ir_version: the highest IR version the runtime loads.
    """

    ort_web_version: str
    unsupported: tuple[tuple[str, str, str], ...]
    unmeasured: tuple[tuple[str, str], ...]
    opset_problems: tuple[str, ...]
    ops: int
    max_ir_version: int

    @property
    def passed(self) -> bool:
        return not self.unsupported and not self.opset_problems

    def summary(self) -> str:
        if not self.passed:
            return f"ops check FAILED: {len(self.unsupported)} node(s) onnxruntime-web lacks"
        note = f", {len(self.unmeasured)} unmeasured" if self.unmeasured else ""
        return f"ops check ok: {self.ops} node(s) onnxruntime-web {self.ort_web_version} runs{note}"

    def raise_if_unsupported(self) -> None:
        """Raise :class:`UnsupportedOpError` listing every problem, if there is one."""
        if self.passed:
            return
        lines = list(self.opset_problems)
        lines += [f"{name or '(unnamed)'} ({op}): {why}" for name, op, why in self.unsupported]
        raise UnsupportedOpError(
            f"onnxruntime-web {self.ort_web_version} (wasm) cannot run {len(lines)} part(s) of "
            "the model, so nothing was written:\n  "
            + "\n  ".join(lines)
            + "\nreplace these ops (or run `ferry convert --opset N` to a supported opset) "
            "before exporting for the web",
            ops=[(op, name) for name, op, _ in self.unsupported],
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "ort_web_version": self.ort_web_version,
            "passed": self.passed,
            "nodes": self.ops,
            "unsupported": [{"node": n, "op": o, "reason": r} for n, o, r in self.unsupported],
            "unmeasured": [{"node": n, "op": o} for n, o in self.unmeasured],
            "opset_problems": list(self.opset_problems),
        }


def _nodes(graph: ir.Graph) -> list[ir.Node]:
    found = []
    for node in graph:
        found.append(node)
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                found += _nodes(attr.as_graph())
            elif attr.type == ir.AttributeType.GRAPHS:
                for sub in attr.as_graphs():
                    found += _nodes(sub)
    return found


def _op(domain: str, op_type: str) -> str:
    return op_type if not domain else f"{domain}::{op_type}"


def check_web_ops(model: ir.Model) -> WebOpsCheck:
    """Check every node of ``model`` (subgraphs included) against the measured table."""
    opsets = {("" if d == "ai.onnx" else d): v for d, v in model.opset_imports.items()}
    problems = []
    for domain, version in sorted(opsets.items()):
        highest = table.MAX_OPSET.get(domain)
        if highest is not None and version > highest:
            problems.append(
                f"opset {version} of domain {domain or 'ai.onnx'}: onnxruntime-web "
                f"{table.ORT_WEB_VERSION} loads up to {highest} (`ferry convert --opset "
                f"{highest}` lowers it)"
            )
    supported_ops = {(d, o) for d, o, _ in table.SUPPORTED}
    unsupported: list[tuple[str, str, str]] = []
    unmeasured: list[tuple[str, str]] = []
    nodes = _nodes(model.graph)
    for node in nodes:
        domain = "" if node.domain == "ai.onnx" else node.domain
        name = node.name or ""
        op = _op(domain, node.op_type)
        if domain not in _ONNX_DOMAINS:
            unmeasured.append((name, op))
            continue
        opset = opsets.get(domain)
        if opset is None:
            unsupported.append((name, op, f"the model imports no opset for domain {domain}"))
            continue
        try:
            since = onnx.defs.get_schema(node.op_type, opset, domain).since_version
        except onnx.defs.SchemaError:
            unsupported.append((name, op, f"no such op in opset {opset} of ONNX"))
            continue
        key = (domain, node.op_type, since)
        if key in table.SUPPORTED:
            continue
        if key in table.MISSING or (
            (domain, node.op_type) not in supported_ops and _measured(domain, node.op_type)
        ):
            later = sorted(
                s for d, o, s in table.SUPPORTED if (d, o) == (domain, node.op_type) and s > since
            )
            hint = (
                f"; it has one from opset {later[0]} (`ferry convert --opset {later[0]}`)"
                if later
                else ""
            )
            unsupported.append(
                (
                    name,
                    op,
                    f"no kernel for {node.op_type} (version {since}) in the wasm build{hint}",
                )
            )
        else:
            unmeasured.append((name, op))
    return WebOpsCheck(
        ort_web_version=table.ORT_WEB_VERSION,
        unsupported=tuple(unsupported),
        unmeasured=tuple(unmeasured),
        opset_problems=tuple(problems),
        ops=len(nodes),
        max_ir_version=table.MAX_IR_VERSION,
    )


def _measured(domain: str, op_type: str) -> bool:
    """Whether the op was measured at all (some version of it was tried)."""
    return any((d, o) == (domain, op_type) for d, o, _ in table.MISSING)
