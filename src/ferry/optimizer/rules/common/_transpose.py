"""Transposes sunk through layout-agnostic ops until they cancel, as ONNX Runtime's transpose
optimizer does, but decided per region and only where the graph ends up with fewer Transposes.

Exports of models written for another layout wrap every op in layout changes: a PyTorch export of
a TF-ported ResNet runs ``Conv -> Transpose(0,2,3,1) -> Add -> Mul -> Relu -> Transpose(0,3,1,2)
-> Conv``, a TFLite conversion puts NHWC<->NCHW pairs around each Conv. The elementwise ops in
between do not care about the layout, so the pairs can meet and vanish, which also leaves the
per-channel constants right behind the Convs (where ``_conv`` folds them in).

``Tp`` is ``Transpose(perm=p)``, ``p^-1`` its inverse, ``c`` a constant (initializer or
``Constant``):

    Tq(Tp(x))                     ->  x                              (q = p^-1)
    Tq(Tp(x))                     ->  T(p.q)(x)                      (otherwise; other users keep Tp)
    E(Tp(x))                      ->  Tp(E(x))                       (unary E: Relu, Cast, Clip, ...)
    E(Tp(x), c)                   ->  Tp(E(x, Tp^-1(unsqueezed c)))  (Add, Mul, Where, PRelu, ...)
    E(Tp(x), Tp(y))               ->  Tp(E(x, y))
    Concat(Tp(x), Tp(y), axis=a)  ->  Tp(Concat(x, y, axis=p[a]))
    Split/Softmax(Tp(x), axis=a)  ->  Tp(Split/Softmax(x, axis=p[a]))
    Slice(Tp(x), axes=A)          ->  Tp(Slice(x, axes=p[A]))
    Pad(Tp(x), pads)              ->  Tp(Pad(x, pads permuted by p))
    Reduce(Tp(x), axes=A)         ->  Tq(Reduce(x, axes=p[A]))       (q = p without the reduced axes)
    Squeeze/Unsqueeze(Tp(x))      ->  Tq(Squeeze/Unsqueeze(x))       (size-1 axes moved with p)
    Reshape(Tp(x))                ->  Tq(Reshape(x))                 (a Reshape that only drops or
                                                                     inserts size-1 dims)
    DequantizeLinear(Tp(x), s)    ->  Tp(DequantizeLinear(x, s, axis=p[axis]))
    Tp(x)                         ->  Reshape(x)                     (what is left, where p only
                                                                     moves size-1 dims)

Which of these to apply is decided for a whole region at a time: from each Transpose, the pass
grows the set of nodes a pending permutation can flow through (forwards through consumers, and
backwards through the producers of their other inputs, as in a residual ``Add`` whose two inputs
come from two transposed branches), counts the Transposes the rewrite would remove (every
Transpose inside the region) and add (where a permuted value leaves the region, or a non-constant
value enters it), trims nodes that do not pay, and rewrites only a region that removes more than
it adds. So the number of Transposes never grows, a chain that does not end in a cancellation is
left as it was, and repeating until no region pays reaches a fixed point. Values of unknown rank
stop a region; graph outputs keep their names; subgraphs are optimized on their own, with values
from outer scopes treated as region boundaries.

This module holds the pass and its driver; ``_transpose_graph`` has the permutation and graph
helpers, ``_transpose_plans`` the per-op handlers, and ``_transpose_regions`` growing, costing and
rewriting regions.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx_ir as ir

from ferry.optimizer.rules._context import RuleContext
from ferry.optimizer.rules.common._transpose_graph import (
    Perm,
    _GraphInfo,
    _graphs,
    _Names,
    _perm_attr,
)
from ferry.optimizer.rules.common._transpose_regions import _Edit, _grow, _Region

__all__ = ["SinkTransposesPass", "passes"]

logger = logging.getLogger(__name__)


def passes(ctx: RuleContext) -> list[ir.passes.PassBase]:
    """The transpose pass; it only removes work, so it runs at every level and for every target."""
    del ctx
    return [SinkTransposesPass()]


class SinkTransposesPass(ir.passes.InPlacePass):
    """Sink Transposes through layout-agnostic ops and cancel them, where that removes Transposes.

    See the module docstring for the rewrites (``Before -> After``) and how regions are chosen.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
        names = _Names(model.graph)
        modified = False
        for graph in list(_graphs(model.graph)):
            modified |= _optimize_graph(_GraphInfo(graph, opset, names))
        return ir.passes.PassResult(model, modified)


# ---------------------------------------------------------------- driver


def _dedupe(graph: ir.Graph) -> bool:
    """Transposes of the same value with the same permutation merged into the first."""
    seen: dict[tuple[ir.Value, Perm], ir.Node] = {}
    changed = False
    for node in list(graph):
        if node.op_type != "Transpose" or node.domain != "" or node.inputs[0] is None:
            continue
        perm = _perm_attr(node, None)
        if perm is None:
            continue
        key = (node.inputs[0], perm)
        keep = seen.get(key)
        if keep is None:
            seen[key] = node
        elif not node.outputs[0].is_graph_output():
            node.outputs[0].replace_all_uses_with(keep.outputs[0])
            graph.remove(node, safe=True)
            changed = True
    return changed


def _reshape_shape(node: ir.Node) -> list[int] | None:
    """The Reshape target equal to ``node`` (a Transpose), when it only moves size-1 dims."""
    data = node.inputs[0]
    if data is None or data.shape is None:
        return None
    dims = list(data.shape)
    perm = _perm_attr(node, len(dims))
    if perm is None or len(perm) != len(dims) or 0 in dims:
        return None
    kept = [i for i in perm if dims[i] != 1]
    if kept != sorted(kept):
        return None
    shape: list[int] = []
    for j, i in enumerate(perm):
        d = dims[i]
        if isinstance(d, int):
            shape.append(d)
        elif i == j:
            shape.append(0)  # copies the input dim at the same index
        elif -1 not in shape:
            shape.append(-1)
        else:
            return None
    return shape


def _to_reshapes(info: _GraphInfo) -> bool:
    """Transposes that only move size-1 dims turned into Reshapes, which copy nothing."""
    graph = info.graph
    changed = False
    for node in [n for n in graph if n.op_type == "Transpose" and n.domain == ""]:
        shape = _reshape_shape(node)
        if shape is None:
            continue
        target = info.constant(np.array(shape, dtype=np.int64), "reshape_shape")
        reshape = ir.Node(
            "",
            "Reshape",
            [node.inputs[0], target],
            outputs=[ir.Value(name=info.names.fresh(f"{node.outputs[0].name}_r"))],
            name=info.names.fresh(f"{node.name or 'Transpose'}_Reshape"),
        )
        ir.convenience.replace_nodes_and_values(
            graph, node, [node], [reshape], [node.outputs[0]], [reshape.outputs[0]]
        )
        changed = True
    return changed


def _count(graph: ir.Graph) -> int:
    return sum(1 for n in graph if n.op_type == "Transpose")


def _optimize_graph(info: _GraphInfo) -> bool:
    graph = info.graph
    modified = False
    while True:
        start = _count(graph)
        _dedupe(graph)
        for seed in [n for n in graph if n.op_type == "Transpose" and n.domain == ""]:
            if seed.graph is not graph:
                continue  # removed with an earlier region
            best: tuple[int, _Region] | None = None
            for forward in (True, False):
                region = _grow(info, seed, forward)
                if region is None:
                    continue
                region.prune()
                cost = region.cost()
                if cost < 0 and (best is None or cost < best[0]):
                    best = (cost, region)
            if best is None:
                continue
            before = _count(graph)
            _Edit(info).apply(best[1])
            after = _count(graph)
            if after - before != best[0]:
                logger.warning(
                    "transpose sinking in graph %r: expected %+d Transposes, got %+d",
                    graph.name,
                    best[0],
                    after - before,
                )
        # Every rewrite removes Transposes; stop as soon as a sweep removes none.
        if _count(graph) >= start:
            return _to_reshapes(info) or modified
        modified = True
