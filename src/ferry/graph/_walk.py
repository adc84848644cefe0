"""What an If/Loop/Scan node holds and reads, for everyone who walks a graph."""

from __future__ import annotations

import onnx_ir as ir

__all__ = ["named_subgraphs", "node_reads", "subgraphs"]


def named_subgraphs(node: ir.Node) -> list[tuple[str, ir.Graph]]:
    """``(attribute name, graph)`` for every graph ``node`` holds directly: If branches, Loop and
    Scan bodies (none for most ops)."""
    found: list[tuple[str, ir.Graph]] = []
    for name, attr in node.attributes.items():
        if attr.is_ref():
            continue
        if attr.type == ir.AttributeType.GRAPH:
            found.append((name, attr.as_graph()))
        elif attr.type == ir.AttributeType.GRAPHS:
            found.extend((name, g) for g in attr.as_graphs())
    return found


def subgraphs(node: ir.Node) -> list[ir.Graph]:
    """The graphs ``node`` holds directly (see :func:`named_subgraphs`)."""
    return [graph for _, graph in named_subgraphs(node)]


def node_reads(node: ir.Node) -> list[ir.Value]:
    """Every value of ``node``'s graph that ``node`` reads: its inputs, then the outer values its
    subgraphs read at any depth (If/Loop/Scan capture them), each once, in order of first read."""
    reads: dict[ir.Value, None] = {v: None for v in node.inputs if v is not None}
    graph = node.graph
    for body in subgraphs(node):
        for inner in body.all_nodes():
            for value in inner.inputs:
                # Only the node's own scope crosses; a body's values travel with the body.
                if value is not None and value.graph is graph:
                    reads[value] = None
    return list(reads)
