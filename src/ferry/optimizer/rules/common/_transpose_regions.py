"""Regions for transpose sinking (``_transpose``): growing from a Transpose the set of nodes a
pending permutation can flow through, counting the Transposes a rewrite would remove and add,
trimming nodes that do not pay, and rewriting a region that pays into the graph.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from ferry.optimizer.rules.common._transpose_graph import (
    Perm,
    _GraphInfo,
    _inverse,
    _is_identity,
    _perm_attr,
    _permuted_shape,
    _transposed_shape,
)
from ferry.optimizer.rules.common._transpose_plans import _handler, _Plan, _transpose

__all__: list[str] = []


class _Region:
    """Nodes that compute in a permuted layout, with what the change would cost in Transposes."""

    def __init__(self, info: _GraphInfo) -> None:
        self.info = info
        self.plans: dict[ir.Node, _Plan] = {}
        self.order: list[ir.Node] = []

    def produced_perm(self, value: ir.Value) -> Perm | None:
        node = value.producer()
        plan = None if node is None else self.plans.get(node)
        index = value.index()
        return None if plan is None or index is None else plan.out_perms[index]

    def rank(self, value: ir.Value) -> int | None:
        perm = self.produced_perm(value)
        return len(perm) if perm is not None else self.info.static_rank(value)

    def fits(self, node: ir.Node, plan: _Plan) -> bool:
        """Whether ``plan`` agrees with the layouts the region already gave its neighbours."""
        for value, perm in zip(node.inputs, plan.in_perms):
            if value is not None and perm is not None:
                produced = self.produced_perm(value)
                if produced is not None and produced != perm:
                    return False
        for value, perm in zip(node.outputs, plan.out_perms):
            for use in value.uses():
                other = self.plans.get(use.node)
                wanted = None if other is None else other.in_perms[use.idx]
                if wanted is not None and wanted != perm:
                    return False
        return True

    def add(self, node: ir.Node, plan: _Plan) -> None:
        self.plans[node] = plan
        self.order.append(node)

    def _contribution(self, value: ir.Value) -> int:
        """Transposes the region inserts for ``value``: one where a permuted value leaves the
        region, one per layout a non-constant value enters it in."""
        produced = self.produced_perm(value)
        if produced is not None:
            if _is_identity(produced):
                return 0
            if value.is_graph_output():
                return 1
            for use in value.uses():
                plan = self.plans.get(use.node)
                if plan is None or plan.in_perms[use.idx] is None:
                    return 1
            return 0
        perms: set[Perm] = set()
        for use in value.uses():
            plan = self.plans.get(use.node)
            perm = None if plan is None else plan.in_perms[use.idx]
            if perm is not None and not _is_identity(perm):
                perms.add(perm)
        if not perms or self.info.is_const(value):
            return 0
        return len(perms)

    @staticmethod
    def _values(nodes: Sequence[ir.Node]) -> set[ir.Value]:
        values: set[ir.Value] = set()
        for node in nodes:
            for value in node.inputs:
                if value is not None:
                    values.add(value)
            values.update(node.outputs)
        return values

    def cost(self) -> int:
        """Transposes after minus before, if the region were rewritten."""
        inserted = sum(self._contribution(v) for v in self._values(list(self.plans)))
        removed = sum(1 for node in self.plans if node.op_type == "Transpose")
        return inserted - removed

    def _removal_delta(self, node: ir.Node) -> int:
        values = self._values([node])
        before = sum(self._contribution(v) for v in values)
        plan = self.plans.pop(node)
        after = sum(self._contribution(v) for v in values)
        self.plans[node] = plan
        return after - before + (1 if node.op_type == "Transpose" else 0)

    def prune(self) -> None:
        """Drop nodes whose rewrite does not pay (ties too: a move that cancels nothing is
        left undone), latest joined first."""
        changed = True
        while changed:
            changed = False
            for node in reversed(self.order):
                if node in self.plans and self._removal_delta(node) <= 0:
                    del self.plans[node]
                    changed = True
        self.order = [n for n in self.order if n in self.plans]


def _target(node: ir.Node, graph: ir.Graph) -> Perm | None:
    """The output layout that would cancel a Transpose consuming ``node``'s first output."""
    if not node.outputs:
        return None
    for use in node.outputs[0].uses():
        consumer = use.node
        if consumer.op_type == "Transpose" and consumer.graph is graph and consumer.domain == "":
            q = _perm_attr(consumer, None)
            if q is not None:
                return _inverse(q)
    return None


def _grow(info: _GraphInfo, seed: ir.Node, forward: bool) -> _Region | None:
    """The region a Transpose's permutation can flow through, from its output (``forward``) or
    up from its input."""
    region = _Region(info)
    rank = None if seed.inputs[0] is None else info.static_rank(seed.inputs[0])
    q = _perm_attr(seed, rank)
    if q is None or seed.inputs[0] is None:
        return None
    plan = _transpose(seed, forward, tuple(range(len(q))), region, None)
    if plan is None:
        return None
    region.add(seed, plan)
    graph = info.graph
    work = [seed]

    def join(node: ir.Node, forward: bool, perm: Perm, index: int) -> None:
        handler = _handler(node)
        if handler is None or node.graph is not graph or node in region.plans:
            return
        target = _target(node, graph) if forward else None
        plan = handler(node, forward, perm, region, target)
        if plan is None:
            return
        known = plan.in_perms[index] if forward else plan.out_perms[index]
        if known == perm and region.fits(node, plan):
            region.add(node, plan)
            work.append(node)

    while work:
        node = work.pop()
        plan = region.plans[node]
        for value, perm in zip(node.outputs, plan.out_perms):
            if not _is_identity(perm):
                for use in value.uses():
                    join(use.node, True, perm, use.idx)
        for operand, in_perm in zip(node.inputs, plan.in_perms):
            if operand is None or in_perm is None or _is_identity(in_perm):
                continue
            producer = operand.producer()
            index = operand.index()
            if producer is not None and index is not None and not info.is_const(operand):
                join(producer, False, in_perm, index)
    return region


class _Edit:
    """Rewrites one region into the graph."""

    def __init__(self, info: _GraphInfo) -> None:
        self.info = info
        self.graph = info.graph
        self._boundary: dict[tuple[ir.Value, Perm], ir.Value] = {}

    def transpose(self, value: ir.Value, perm: Perm, hint: str) -> ir.Node:
        out = ir.Value(
            name=self.info.names.fresh(hint),
            shape=_transposed_shape(value.shape, perm),
            type=value.type,
        )
        return ir.Node(
            "",
            "Transpose",
            [value],
            [ir.AttrInt64s("perm", list(perm))],
            outputs=[out],
            name=self.info.names.fresh(f"{hint}_Transpose"),
        )

    def entering(self, value: ir.Value, perm: Perm, before: ir.Node) -> ir.Value:
        """``value`` (in the graph's layout) read in layout ``perm``."""
        if _is_identity(perm):
            return value
        key = (value, perm)
        if key in self._boundary:
            return self._boundary[key]
        array = self.info.array(value)
        base = value.name or "value"
        if array is not None:
            rank = len(perm)
            if array.size == 1 and array.ndim <= rank:
                result = value  # broadcasts the same in any layout
            else:
                full = array.reshape((1,) * (rank - array.ndim) + array.shape)
                moved = np.ascontiguousarray(np.transpose(full, _inverse(perm)))
                same = moved.shape == array.shape and np.array_equal(moved, array)
                result = value if same else self.info.constant(moved, f"{base}_t")
        else:
            node = self.transpose(value, _inverse(perm), f"{base}_t")
            self.graph.insert_before(before, node)
            result = node.outputs[0]
        self._boundary[key] = result
        return result

    def output_name(self, old: ir.Value, new: ir.Value) -> None:
        """Make ``new`` the graph output ``old`` was, under ``old``'s name."""
        name = old.name
        old.name = self.info.names.fresh(f"{name}_old")
        producer = new.producer()
        if (
            producer is not None
            and producer.graph is self.graph
            and not new.is_graph_output()
            and not new.is_graph_input()
            and not new.is_initializer()
        ):
            new.name = name
            target = new
        else:
            identity = ir.Node(
                "",
                "Identity",
                [new],
                outputs=[ir.Value(name=name, shape=old.shape, type=old.type)],
                name=self.info.names.fresh(f"{name}_Identity"),
            )
            self.graph.append(identity)
            target = identity.outputs[0]
        for i, out in enumerate(self.graph.outputs):
            if out is old:
                self.graph.outputs[i] = target

    def apply(self, region: _Region) -> None:
        plans = region.plans
        nodes = [n for n in self.graph if n in plans]
        old_shapes: dict[ir.Value, ir.Shape | None] = {}
        new_of: dict[ir.Value, ir.Value] = {}
        constants: set[ir.Value] = set()
        for node in nodes:
            plan = plans[node]
            for i, (value, perm) in enumerate(zip(node.inputs, plan.in_perms)):
                if value is None or perm is None:
                    continue
                if value in new_of:
                    source = new_of[value]
                else:
                    source = self.entering(value, perm, node)
                    if self.info.is_const(value):
                        constants.add(value)
                if node.op_type == "Transpose":
                    new_of[node.outputs[0]] = source
                elif source is not value:
                    node.replace_input_with(i, source)
            for value in node.outputs:
                old_shapes[value] = value.shape
            if node.op_type == "Transpose":
                continue
            if plan.rewrite is not None:
                for value in node.inputs:
                    if value is not None and self.info.is_const(value):
                        constants.add(value)
                plan.rewrite(node, self)
            for value, perm in zip(node.outputs, plan.out_perms):
                value.shape = _permuted_shape(value.shape, perm)
                new_of[value] = value

        for old, new in new_of.items():
            perm = region.produced_perm(old)
            if perm is None:  # every key is an output of the region
                continue
            outside = [
                use
                for use in old.uses()
                if use.node not in plans or plans[use.node].in_perms[use.idx] is None
            ]
            if not outside and not old.is_graph_output():
                continue
            result = new
            if not _is_identity(perm):
                node = self.transpose(new, perm, f"{old.name}_t")
                node.outputs[0].shape = old_shapes.get(old)
                self.graph.insert_after(old.producer() or nodes[-1], node)
                result = node.outputs[0]
            for use in outside:
                use.node.replace_input_with(use.idx, result)
            if old.is_graph_output() and result is not old:
                self.output_name(old, result)

        # Together: a Transpose of the region may still read another one's output.
        self.graph.remove([n for n in nodes if n.op_type == "Transpose"], safe=True)
        for value in constants:
            if value.uses() or value.is_graph_output():
                continue
            producer = value.producer()
            if producer is not None and producer.graph is self.graph:
                self.graph.remove(producer, safe=True)
            elif value.name and self.graph.initializers.get(value.name) is value:
                self.graph.initializers.pop(value.name)
