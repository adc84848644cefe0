"""A constant Pad folded into the pooling op after it (onnxscript folds Pads into Conv).

Framework ports write "same" pooling as an explicit Pad then a pool without padding; the pool
pads for free while it reads::

    Pad(x, pads, 0) -> AveragePool(pads=0)      ->  AveragePool(pads, count_include_pad=1)
    Pad(x, pads, -inf) -> MaxPool(pads=0)       ->  MaxPool(pads)
    Relu -> Pad(x, pads, 0) -> MaxPool(pads=0)  ->  Relu -> MaxPool(pads)   (x >= 0: a 0 never wins
                                                                         over a real element)

Only spatial pads (none on the batch and channel axes), non-negative, mode ``constant``, a pool
without ``auto_pad`` or ``ceil_mode`` (whose windows past the end would see the pads differently).
"""

from __future__ import annotations

import math
from typing import Any

import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchResult
from onnxscript.rewriter._rewrite_rule import RewriteRule

from ferry.optimizer.rules._context import RuleContext
from ferry.optimizer.rules.common._constants import constant, constant_ints, made_by

__all__ = ["rules"]

#: Producers whose outputs are never negative: a zero pad is then neutral for MaxPool.
_NON_NEGATIVE = {"Relu", "Sigmoid", "Softmax", "Abs", "Exp", "Softplus"}


class PadIntoPool(pattern.RewriteRuleClassBase):
    """``Pad -> AveragePool/MaxPool`` -> the pool with the pads (see the module docstring)."""

    def __init__(self, pool: str) -> None:
        super().__init__(f"PadInto{pool}")
        self.pool = pool

    def pattern(self, op: Any, x: ir.Value, pads: ir.Value) -> Any:
        padded = op.Pad(
            x, pads, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["padded"]
        )
        return getattr(op, self.pool)(padded, _allow_other_attributes=True, _outputs=["out"])

    def check(
        self, context: Any, x: ir.Value, pads: ir.Value, padded: ir.Value, out: ir.Value
    ) -> MatchResult:
        result = MatchResult()
        pad, pool = made_by(padded), made_by(out)
        if pad.attributes.get_string("mode", "constant") != "constant":
            return result.fail("the Pad is not constant-mode")
        if len(pad.inputs) > 3 and pad.inputs[3] is not None:
            return result.fail("the Pad names its axes (opset 18 form); not folded")
        values = constant_ints(pads)
        if values is None:
            return result.fail("the pads are computed at run time")
        rank = len(values) // 2
        if rank < 3 or any(values[i] for i in (0, 1, rank, rank + 1)) or min(values) < 0:
            return result.fail("the Pad pads the batch or channel axis, or crops")
        if len(padded.uses()) != 1 or padded.is_graph_output():
            return result.fail("the padded tensor has other readers")
        if len(pool.outputs) > 1 and pool.outputs[1] is not None and pool.outputs[1].uses():
            return result.fail("the MaxPool's indices are used")
        if pool.attributes.get_string("auto_pad", "NOTSET") != "NOTSET":
            return result.fail("the pool uses auto_pad")
        if pool.attributes.get_int("ceil_mode", 0):
            return result.fail("the pool uses ceil_mode")
        if any(pool.attributes.get_ints("pads", [])):
            return result.fail("the pool pads already")
        fill = (
            constant(pad.inputs[2]) if len(pad.inputs) > 2 and pad.inputs[2] is not None else None
        )
        fill_value = 0.0 if fill is None or fill.size == 0 else float(fill.reshape(-1)[0])
        if self.pool == "AveragePool":
            if fill_value != 0.0:
                return result.fail("the Pad fills with a non-zero value")
            return result
        producer = x.producer()
        if fill_value == -math.inf:
            return result
        if fill_value == 0.0 and producer is not None and producer.op_type in _NON_NEGATIVE:
            return result
        return result.fail("the Pad's fill could win the max (not -inf, input may be negative)")

    def rewrite(self, op: Any, x: ir.Value, pads: ir.Value, padded: ir.Value, out: ir.Value) -> Any:
        pool = made_by(out)
        values = constant_ints(pads)
        assert values is not None
        rank = len(values) // 2
        spatial = values[2:rank] + values[rank + 2 :]
        attributes = {k: v for k, v in pool.attributes.items() if k != "pads"}
        if self.pool == "AveragePool":
            attributes["count_include_pad"] = ir.AttrInt64("count_include_pad", 1)
        return getattr(op, self.pool)(x, pads=spatial, **attributes)


def rules(ctx: RuleContext) -> list[RewriteRule]:
    """Every level."""
    return [PadIntoPool.rule("AveragePool"), PadIntoPool.rule("MaxPool")]
