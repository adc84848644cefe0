"""Helpers for backends' rule tables: attribute and constant lookups, subgraph checks."""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx_ir as ir

from ferry.backends.rules import RuleTable

__all__ = [
    "all_checks",
    "attr",
    "constant_array",
    "node_opsets",
    "output_used",
    "subgraphs",
    "subgraphs_supported",
]


def attr(node: ir.Node, name: str, default: Any = None) -> Any:
    """The value of attribute ``name`` of ``node`` (tuples for lists), or ``default``."""
    found = node.attributes.get(name)
    if found is None or found.is_ref():
        return default
    value = found.value
    if isinstance(value, list):
        return tuple(value)
    return value


def constant_array(value: ir.Value | None) -> np.ndarray | None:
    """The value of an initializer or of a Constant node's output; None when not known."""
    if value is None:
        return None
    if value.const_value is not None:
        return np.asarray(value.const_value.numpy())
    producer = value.producer()
    if producer is None or producer.op_type != "Constant" or producer.domain not in ("", "ai.onnx"):
        return None
    for name, found in producer.attributes.items():
        if name == "value":
            return np.asarray(found.as_tensor().numpy())
        if name == "value_int":
            return np.asarray(found.as_int(), dtype=np.int64)
        if name == "value_ints":
            return np.asarray(found.as_ints(), dtype=np.int64)
        if name == "value_float":
            return np.asarray(found.as_float(), dtype=np.float32)
        if name == "value_floats":
            return np.asarray(found.as_floats(), dtype=np.float32)
    return None


def output_used(node: ir.Node, index: int) -> bool:
    """Whether output ``index`` of ``node`` exists and is read (by a node or as a graph output)."""
    if index >= len(node.outputs):
        return False
    value = node.outputs[index]
    if value is None or not value.name:
        return False
    return bool(value.uses()) or value.is_graph_output()


# The model's opsets while subgraphs_supported walks a body: a body's own graph imports none.
_outer_opsets: contextvars.ContextVar[Mapping[str, int] | None] = contextvars.ContextVar(
    "ferry_outer_opsets", default=None
)


def node_opsets(node: ir.Node) -> dict[str, int]:
    """The opsets that apply to ``node``: its graph's imports; inside a body being checked, the
    model's; else the node's own version."""
    graph = node.graph
    opsets = dict(graph.opset_imports) if graph is not None else {}
    if not opsets:
        outer = _outer_opsets.get()
        if outer is not None:
            return dict(outer)
        if node.version is not None:
            opsets[node.domain] = node.version
    return opsets


def subgraphs(node: ir.Node) -> list[tuple[str, ir.Graph]]:
    """``(attribute name, graph)`` for every subgraph of ``node`` (If branches, Loop/Scan bodies)."""
    found: list[tuple[str, ir.Graph]] = []
    for name, value in node.attributes.items():
        if value.is_ref():
            continue
        if value.type == ir.AttributeType.GRAPH:
            found.append((name, value.as_graph()))
        elif value.type == ir.AttributeType.GRAPHS:
            found.extend((name, g) for g in value.as_graphs())
    return found


def subgraphs_supported(
    node: ir.Node, table: RuleTable, opsets: Mapping[str, int] | None = None
) -> bool | str:
    """True when every node inside ``node``'s subgraphs (at any depth) is accepted by ``table``.

    A control-flow node is only as runnable as its bodies: an If whose branch holds an op the
    engine lacks cannot go to that engine whole.
    """
    opsets = node_opsets(node) if opsets is None else opsets
    token = _outer_opsets.set(opsets)
    try:
        for name, graph in subgraphs(node):
            # Direct children only: a nested If/Loop checks its own bodies through its rule.
            for inner in graph:
                verdict = table.supports(inner, opsets)
                if verdict is not True:
                    label = inner.name or inner.op_type
                    return f"{name} holds node {label!r} it cannot run ({verdict})"
    finally:
        _outer_opsets.reset(token)
    return True


def all_checks(*checks: Callable[[ir.Node], bool | str] | None) -> Callable[[ir.Node], bool | str]:
    """One check that runs ``checks`` in order and returns the first reason."""
    present = [c for c in checks if c is not None]

    def check(node: ir.Node) -> bool | str:
        for c in present:
            verdict = c(node)
            if verdict is not True:
                return verdict
        return True

    return check
