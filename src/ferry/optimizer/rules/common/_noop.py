"""Arithmetic that does nothing, removed, with exact constants only.

onnxscript's own no-op rules match ``x + 0`` with a tolerance, so ``Log(x + 1e-10)`` loses its
epsilon and a silent frame of audio becomes ``-inf``, then NaN (the kit's pitch model). These
match only constants exactly equal to the identity element, of one element, that broadcast
to nothing new::

    Add(x, 0) / Add(0, x) / Sub(x, 0)   ->  x
    Mul(x, 1) / Mul(1, x) / Div(x, 1)   ->  x
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchResult
from onnxscript.rewriter._rewrite_rule import RewriteRule

from ferry.optimizer.rules._context import RuleContext
from ferry.optimizer.rules.common._constants import constant

__all__ = ["rules"]

_IDENTITY = {"Add": 0, "Sub": 0, "Mul": 1, "Div": 1}


class NoOpArithmetic(pattern.RewriteRuleClassBase):
    """``<op>(x, identity element) -> x`` (see the module docstring)."""

    def __init__(self, op_type: str, constant_first: bool = False) -> None:
        super().__init__(f"NoOp{op_type}{'Swapped' if constant_first else ''}")
        self.op_type, self.constant_first = op_type, constant_first

    def pattern(self, op: Any, x: ir.Value, c: ir.Value) -> Any:
        args = (c, x) if self.constant_first else (x, c)
        return getattr(op, self.op_type)(*args, _outputs=["out"])

    def check(self, context: Any, x: ir.Value, c: ir.Value, out: ir.Value) -> MatchResult:
        result = MatchResult()
        value = constant(c)
        if value is None or value.size != 1:
            return result.fail("the operand is not a one-element constant")
        if value.reshape(-1)[0] != _IDENTITY[self.op_type]:
            return result.fail(f"the operand is not exactly {_IDENTITY[self.op_type]}")
        rank = x.shape.rank() if x.shape is not None else None
        if rank is None or value.ndim > rank:
            return result.fail("the constant could add dims to the result (rank unknown)")
        if x.dtype is not None and x.dtype.numpy() != value.dtype:
            return result.fail("the types differ")
        if out.is_graph_output() and x.is_graph_input():
            return result.fail("the op joins a graph input to a graph output")
        return result

    def rewrite(self, op: Any, x: ir.Value, c: ir.Value, out: ir.Value) -> Any:
        return op.Identity(x)


def rules(ctx: RuleContext) -> list[RewriteRule]:
    """Every level."""
    return [
        NoOpArithmetic.rule("Add"),
        NoOpArithmetic.rule("Add", constant_first=True),
        NoOpArithmetic.rule("Sub"),
        NoOpArithmetic.rule("Mul"),
        NoOpArithmetic.rule("Mul", constant_first=True),
        NoOpArithmetic.rule("Div"),
    ]
