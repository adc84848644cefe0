"""Per-channel affine ops folded into the Conv before them.

Exporters often leave a Conv's bias, or a decomposed BatchNormalization, as separate elementwise
ops (paddle2onnx emits ``Conv`` without bias then ``Add``; a TF-ported ResNet normalizes with
``Sub``/``Mul``/``Add`` after each Conv). Each is a full pass over the activation that the Conv
can absorb into its weights for free::

    Conv(x, W, b) -> Add(c)   ->  Conv(x, W, b + c)
    Conv(x, W, b) -> Sub(c)   ->  Conv(x, W, b - c)
    Conv(x, W, b) -> Mul(s)   ->  Conv(x, W * s, b * s)
    Conv(x, W, b) -> Div(s)   ->  Conv(x, W / s, b / s)

where ``c``/``s`` are constants that vary at most along the output-channel axis (a scalar, or
shape ``[C, 1, ...]``/``[1, C, 1, ...]``). The Conv's output must have no other reader.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchResult
from onnxscript.rewriter._rewrite_rule import RewriteRule

from ferry.optimizer.rules._context import RuleContext
from ferry.optimizer.rules.common._constants import constant, made_by, new_initializer

__all__ = ["rules"]


def _per_channel(c: np.ndarray, out_rank: int, channels: int) -> np.ndarray | None:
    """``c`` as a vector over the ``channels`` output channels, when it broadcasts against the
    Conv's ``[N, C, ...]`` output along the channel axis only; else None."""
    if c.ndim > out_rank:
        return None
    full = c.reshape((1,) * (out_rank - c.ndim) + c.shape)
    dims: list[int] = [int(n) for n in np.shape(full)]
    if len(dims) < 2 or any(d != 1 for i, d in enumerate(dims) if i != 1):
        return None
    if dims[1] not in (1, channels):
        return None
    return np.broadcast_to(full.reshape(-1), (channels,))


class _ConvChannelAffine(pattern.RewriteRuleClassBase):
    """Base: ``<op>(Conv(x, W[, b]), c)`` with per-channel constant ``c`` -> one Conv."""

    op_type = ""
    #: ``Add(c, Conv(...))`` as well as ``Add(Conv(...), c)``.
    commutes = False

    def __init__(self, conv_first: bool = True) -> None:
        super().__init__(f"ConvChannel{self.op_type}{'' if conv_first else 'Swapped'}")
        self.conv_first = conv_first

    def pattern(self, op: Any, x: ir.Value, w: ir.Value, c: ir.Value) -> Any:
        conv = op.Conv(
            x, w, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["conv_out"]
        )
        args = (conv, c) if self.conv_first else (c, conv)
        return getattr(op, self.op_type)(*args)

    def check(
        self, context: Any, x: ir.Value, w: ir.Value, c: ir.Value, conv_out: ir.Value
    ) -> MatchResult:
        result = MatchResult()
        conv = made_by(conv_out)
        weights = constant(w)
        if weights is None or weights.ndim < 3:
            return result.fail("the Conv's weight is not a constant")
        if len(conv.inputs) > 2 and conv.inputs[2] is not None and constant(conv.inputs[2]) is None:
            return result.fail("the Conv's bias is not a constant")
        if conv_out.is_graph_output() or len(conv_out.uses()) != 1:
            return result.fail("the Conv's output has other readers")
        operand = constant(c)
        if operand is None:
            return result.fail(f"the {self.op_type} operand is not a constant")
        if operand.dtype != weights.dtype:
            return result.fail(f"the {self.op_type} operand's type differs from the weight's")
        rank = conv_out.shape.rank() if conv_out.shape is not None else weights.ndim
        vector = _per_channel(operand, rank, weights.shape[0])
        if vector is None:
            return result.fail(
                f"the {self.op_type} operand (shape {list(operand.shape)}) varies along more "
                "than the channel axis"
            )
        if self.op_type == "Div" and not np.all(vector != 0):
            return result.fail("the divisor has zeros")
        return result

    def rewrite(self, op: Any, x: ir.Value, w: ir.Value, c: ir.Value, conv_out: ir.Value) -> Any:
        conv = made_by(conv_out)
        weights = constant(w)
        assert weights is not None
        bias_value = conv.inputs[2] if len(conv.inputs) > 2 else None
        bias = constant(bias_value)
        if bias is None:
            bias = np.zeros(weights.shape[0], dtype=weights.dtype)
        operand = constant(c)
        assert operand is not None
        vector = _per_channel(
            operand, conv_out.shape.rank() if conv_out.shape else weights.ndim, weights.shape[0]
        )
        assert vector is not None
        new_w, new_b = self.fold(weights, bias, vector.astype(weights.dtype))
        suffix = self.op_type.lower()
        w_init = new_initializer(op, conv, new_w.astype(weights.dtype), f"{w.name}_{suffix}")
        b_init = new_initializer(op, conv, new_b.astype(weights.dtype), f"{w.name}_bias_{suffix}")
        return op.Conv(x, w_init, b_init, **conv.attributes)

    def fold(self, w: np.ndarray, b: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError


def _scale(w: np.ndarray, v: np.ndarray) -> np.ndarray:
    return w * v.reshape((-1,) + (1,) * (w.ndim - 1))


class ConvAdd(_ConvChannelAffine):
    """``Conv(x, W, b) -> Add(c)  ->  Conv(x, W, b + c)``"""

    op_type = "Add"

    def fold(self, w: np.ndarray, b: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return w, b + v


class ConvSub(_ConvChannelAffine):
    """``Conv(x, W, b) -> Sub(c)  ->  Conv(x, W, b - c)``"""

    op_type = "Sub"

    def fold(self, w: np.ndarray, b: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return w, b - v


class ConvMul(_ConvChannelAffine):
    """``Conv(x, W, b) -> Mul(s)  ->  Conv(x, W * s, b * s)``"""

    op_type = "Mul"

    def fold(self, w: np.ndarray, b: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return _scale(w, v), b * v


class ConvDiv(_ConvChannelAffine):
    """``Conv(x, W, b) -> Div(s)  ->  Conv(x, W / s, b / s)``"""

    op_type = "Div"

    def fold(self, w: np.ndarray, b: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return _scale(w, 1 / v), b / v


def rules(ctx: RuleContext) -> list[RewriteRule]:
    """Every level: the fold only removes work."""
    return [
        ConvAdd.rule(),
        ConvAdd.rule(conv_first=False),
        ConvSub.rule(),
        ConvMul.rule(),
        ConvMul.rule(conv_first=False),
        ConvDiv.rule(),
    ]
