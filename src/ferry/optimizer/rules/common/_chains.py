"""Chains of the same op merged into one.

Exporters build stacks and slices step by step (tf2onnx writes ``tf.concat`` in a Python loop
as nested Concats; PyTorch's ``x[:, ::2, ::2]`` is one Slice per axis); each link is a pass
over the tensor::

    Concat(a, Concat(b, c, axis=k), axis=k)           ->  Concat(a, b, c, axis=k)
    Slice(Slice(x, s1, e1, axes1), s2, e2, axes2)     ->  Slice(x, s1+s2, e1+e2, axes1+axes2)
                                                          (constant, disjoint axes)
    Mul(Mul(x, c1), c2)                               ->  Mul(x, c1 * c2)      (constants)
    Add(Add(x, c1), c2)                               ->  Add(x, c1 + c2)      (constants)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchResult
from onnxscript.rewriter._rewrite_rule import RewriteRule

from ferry.optimizer.rules._context import RuleContext
from ferry.optimizer.rules.common._constants import (
    constant,
    constant_ints,
    made_by,
    new_initializer,
    replace_value,
)

__all__ = ["rules"]


class FlattenConcatsPass(ir.passes.InPlacePass):
    """Nested Concats on one axis made one (variadic: beyond what a fixed pattern matches).

    Before -> After::

        Concat(a, Concat(b, c, axis=k), axis=k)  ->  Concat(a, b, c, axis=k)
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in list(model.graph):
            if node.op_type != "Concat" or node.domain not in ("", "ai.onnx"):
                continue
            axis = node.attributes.get_int("axis", 0)
            flat: list[ir.Value | None] = []
            changed = False
            for value in node.inputs:
                producer = value.producer() if value is not None else None
                if (
                    producer is not None
                    and producer.op_type == "Concat"
                    and producer.domain in ("", "ai.onnx")
                    and producer.attributes.get_int("axis", 0) == axis
                    and len(value.uses()) == 1  # type: ignore[union-attr]
                    and not value.is_graph_output()  # type: ignore[union-attr]
                ):
                    flat += list(producer.inputs)
                    changed = True
                else:
                    flat.append(value)
            if changed:
                merged = ir.node("Concat", flat, attributes={"axis": axis}, name=node.name)
                model.graph.insert_before(node, merged)
                replace_value(model.graph, node.outputs[0], merged.outputs[0])
                modified = True
        return ir.passes.PassResult(model, modified=modified)


def _slice_parts(node: ir.Node, rank: int | None) -> tuple[list[int], ...] | None:
    """``(starts, ends, axes, steps)`` of an opset-10+ Slice with constant inputs, axes made
    non-negative (None when something is not constant or an axis cannot be resolved)."""
    inputs = list(node.inputs) + [None] * (5 - len(node.inputs))
    starts, ends = constant_ints(inputs[1]), constant_ints(inputs[2])
    if starts is None or ends is None or len(starts) != len(ends):
        return None
    axes = constant_ints(inputs[3]) if inputs[3] is not None else list(range(len(starts)))
    steps = constant_ints(inputs[4]) if inputs[4] is not None else [1] * len(starts)
    if axes is None or steps is None:
        return None
    if any(a < 0 for a in axes):
        if rank is None:
            return None
        axes = [a + rank if a < 0 else a for a in axes]
    return starts, ends, axes, steps


class SliceOfSlice(pattern.RewriteRuleClassBase):
    """``Slice(Slice(x, s1, e1, a1, t1), s2, e2, a2, t2) -> Slice(x, s1+s2, e1+e2, a1+a2, t1+t2)``
    for constant parameters on disjoint axes."""

    def __init__(self) -> None:
        super().__init__("SliceOfSlice")

    def pattern(self, op: Any, x: ir.Value) -> Any:
        inner = op.Slice(x, _allow_other_inputs=True, _outputs=["inner"])
        return op.Slice(inner, _allow_other_inputs=True, _outputs=["out"])

    def _parts(self, x: ir.Value, inner: ir.Value, out: ir.Value) -> tuple[list[int], ...] | None:
        rank = x.shape.rank() if x.shape is not None else None
        first = _slice_parts(made_by(inner), rank)
        second = _slice_parts(made_by(out), rank)
        if first is None or second is None or set(first[2]) & set(second[2]):
            return None
        return tuple(a + b for a, b in zip(first, second, strict=True))

    def check(self, context: Any, x: ir.Value, inner: ir.Value, out: ir.Value) -> MatchResult:
        result = MatchResult()
        if self._parts(x, inner, out) is None:
            return result.fail("the slices' parameters are not constant, or share an axis")
        return result

    def rewrite(self, op: Any, x: ir.Value, inner: ir.Value, out: ir.Value) -> Any:
        parts = self._parts(x, inner, out)
        assert parts is not None
        node = made_by(out)
        names = ("starts", "ends", "axes", "steps")
        values = [
            new_initializer(op, node, np.array(p, np.int64), f"{node.name or 'slice'}_{n}")
            for p, n in zip(parts, names, strict=True)
        ]
        return op.Slice(x, *values)


class ConstantChain(pattern.RewriteRuleClassBase):
    """``Mul(Mul(x, c1), c2) -> Mul(x, c1 * c2)`` (and ``Add``), constants either side."""

    def __init__(self, op_type: str, inner_first: bool, outer_first: bool) -> None:
        super().__init__(f"{op_type}Chain{int(inner_first)}{int(outer_first)}")
        self.op_type, self.inner_first, self.outer_first = op_type, inner_first, outer_first

    def pattern(self, op: Any, x: ir.Value, c1: ir.Value, c2: ir.Value) -> Any:
        make = getattr(op, self.op_type)
        inner = (
            make(x, c1, _outputs=["inner"]) if self.inner_first else make(c1, x, _outputs=["inner"])
        )
        return make(inner, c2) if self.outer_first else make(c2, inner)

    def check(
        self, context: Any, x: ir.Value, c1: ir.Value, c2: ir.Value, inner: ir.Value
    ) -> MatchResult:
        result = MatchResult()
        a, b = constant(c1), constant(c2)
        if a is None or b is None:
            return result.fail("an operand is not a constant")
        if constant(x) is not None:
            return result.fail("the whole chain is constant (folding's job)")
        if a.dtype != b.dtype or a.dtype.kind != "f":
            return result.fail("the constants are not floats of one type")
        if len(inner.uses()) != 1 or inner.is_graph_output():
            return result.fail("the inner result has other readers")
        if x.shape is None or x.shape.rank() is None or max(a.ndim, b.ndim) > x.shape.rank():
            return result.fail("the constants could broadcast the input to a higher rank")
        return result

    def rewrite(self, op: Any, x: ir.Value, c1: ir.Value, c2: ir.Value, inner: ir.Value) -> Any:
        a, b = constant(c1), constant(c2)
        assert a is not None and b is not None
        merged = (a * b if self.op_type == "Mul" else a + b).astype(a.dtype)
        value = new_initializer(op, made_by(inner), merged, f"{c1.name}_{self.op_type.lower()}")
        return getattr(op, self.op_type)(x, value)


def rules(ctx: RuleContext) -> list[RewriteRule]:
    """Every level."""
    chains = [
        ConstantChain.rule(op_type, inner_first, outer_first)
        for op_type in ("Mul", "Add")
        for inner_first in (True, False)
        for outer_first in (True, False)
    ]
    return [SliceOfSlice.rule(), *chains]


def passes(ctx: RuleContext) -> list[ir.passes.PassBase]:
    """Every level."""
    return [FlattenConcatsPass()]
