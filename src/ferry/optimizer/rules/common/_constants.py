"""Reading constant operands the way every rule needs: initializers and ``Constant`` nodes alike.

``constant`` is :func:`ferry.graph.constant`: an initializer that is also a graph input is not a
constant (the caller may feed another value), so no rule folds it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

# Re-exported: every rule reads its constant operands through this module; the rules are ferry.graph's.
from ferry.graph import constant

__all__ = ["constant", "constant_ints", "made_by", "new_initializer", "replace_value"]


def constant_ints(value: ir.Value | None) -> list[int] | None:
    """A constant integer tensor's elements as a flat list (None when not constant or not ints)."""
    array = constant(value)
    if array is None or array.dtype.kind not in "iu":
        return None
    return [int(v) for v in array.reshape(-1)]


def new_initializer(op: Any, near: ir.Node, array: np.ndarray, base: str) -> ir.Value:
    """A new initializer holding ``array`` for a rewrite's replacement, under a name not yet used
    in ``near``'s graph. (onnxscript's rewriter drops, without a word, an initializer whose name
    is taken: the node would then read an undefined value.)"""
    graph = near.graph
    taken = graph.initializers if graph is not None else {}
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    return op.initializer(ir.tensor(array), name)


def made_by(value: ir.Value) -> ir.Node:
    """The node producing ``value``, which a matched pattern guarantees exists."""
    node = value.producer()
    if node is None:
        raise ValueError(f"{value.name!r} has no producer; the pattern guaranteed one")
    return node


def replace_value(graph: ir.Graph, old: ir.Value, new: ir.Value) -> None:
    """Point every reader of ``old`` at ``new``. A graph output keeps its name, type and shape:
    ``new`` takes them over (through an Identity when ``new`` is not a node's output here, e.g.
    an initializer), so that callers asking for the output by name still find it."""
    if new.type is None:
        new.type = old.type
    if new.shape is None:
        new.shape = old.shape
    if old.is_graph_output():
        producer = new.producer()
        if producer is None or producer.graph is not graph or new.is_graph_output():
            identity = ir.node("Identity", [new], name=f"{old.name}_identity")
            graph.append(identity)
            new = identity.outputs[0]
            new.type, new.shape = old.type, old.shape
        name = old.name
        old.name = None
        new.name = name
        for i, out in enumerate(graph.outputs):
            if out is old:
                graph.outputs[i] = new
    ir.convenience.replace_all_uses_with(old, new)
