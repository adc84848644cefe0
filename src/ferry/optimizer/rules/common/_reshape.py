"""Chains of reshape-like ops collapsed into one Reshape.

TF exporters write a 1-D convolution as ``Reshape -> Unsqueeze -> Reshape -> Conv -> Reshape``
(tf2onnx's ``ExpandDims``/``Squeeze`` around a 2-D conv, then a transpose done as a reshape);
each only relabels the same buffer, but each is a node to schedule and, at a partition
boundary, a copy::

    Reshape(R(x), s)                 ->  Reshape(x, s)     R: Reshape, Flatten, Squeeze, Unsqueeze
    Unsqueeze(Reshape(x, s), axes)   ->  Reshape(x, s with 1s inserted at axes)
    Squeeze(Reshape(x, s), axes)     ->  Reshape(x, s without axes)      (s[axes] are literal 1s)

``s`` must be a constant without 0 entries (a 0 copies the input's dim at the same index, which
moves when the input changes) unless ``allowzero=1``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchResult
from onnxscript.rewriter._rewrite_rule import RewriteRule

from ferry.optimizer.rules._context import RuleContext
from ferry.optimizer.rules.common._constants import constant_ints, made_by, new_initializer

__all__ = ["rules"]


def _allowzero(node: ir.Node) -> bool:
    return node.attributes.get_int("allowzero", 0) == 1


def _axes(node: ir.Node) -> list[int] | None:
    """A Squeeze/Unsqueeze's axes: the attribute (opset < 13) or the constant second input."""
    attr = node.attributes.get("axes")
    if attr is not None:
        return list(attr.as_ints())
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        return constant_ints(node.inputs[1])
    return None


def _target(shape: ir.Value, reshape: ir.Node, result: MatchResult) -> list[int] | None:
    dims = constant_ints(shape)
    if dims is None:
        result.fail("the target shape is computed at run time")
        return None
    if 0 in dims and not _allowzero(reshape):
        result.fail("the target shape copies input dims (0 entries)")
        return None
    return dims


class ReshapeOfReshapeLike(pattern.RewriteRuleClassBase):
    """``Reshape(R(x), s) -> Reshape(x, s)`` for a reshape-like ``R``."""

    def __init__(self, inner: str) -> None:
        super().__init__(f"ReshapeOf{inner}")
        self.inner = inner

    def pattern(self, op: Any, x: ir.Value, shape: ir.Value) -> Any:
        inner = getattr(op, self.inner)(
            x, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["inner"]
        )
        return op.Reshape(inner, shape, _allow_other_attributes=True, _outputs=["out"])

    def check(
        self, context: Any, x: ir.Value, shape: ir.Value, inner: ir.Value, out: ir.Value
    ) -> MatchResult:
        result = MatchResult()
        _target(shape, made_by(out), result)
        return result

    def rewrite(self, op: Any, x: ir.Value, shape: ir.Value, inner: ir.Value, out: ir.Value) -> Any:
        return op.Reshape(x, shape, **made_by(out).attributes)


class _ReshapeThen(pattern.RewriteRuleClassBase):
    """Base for a Squeeze/Unsqueeze after a Reshape to a constant shape."""

    outer = ""

    def pattern(self, op: Any, x: ir.Value, shape: ir.Value) -> Any:
        reshaped = op.Reshape(x, shape, _allow_other_attributes=True, _outputs=["reshaped"])
        return getattr(op, self.outer)(
            reshaped, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["out"]
        )

    def check(
        self, context: Any, x: ir.Value, shape: ir.Value, reshaped: ir.Value, out: ir.Value
    ) -> MatchResult:
        result = MatchResult()
        dims = _target(shape, made_by(reshaped), result)
        if dims is None:
            return result
        axes = _axes(made_by(out))
        if axes is None:
            return result.fail(f"the {self.outer} axes are not constant")
        if self.new_dims(dims, axes) is None:
            return result.fail(f"the {self.outer} axes do not fit the shape {dims}")
        return result

    def rewrite(
        self, op: Any, x: ir.Value, shape: ir.Value, reshaped: ir.Value, out: ir.Value
    ) -> Any:
        dims = constant_ints(shape)
        axes = _axes(made_by(out))
        assert dims is not None and axes is not None
        new = self.new_dims(dims, axes)
        assert new is not None
        target = new_initializer(
            op, made_by(out), np.array(new, dtype=np.int64), f"{shape.name}_{self.outer.lower()}"
        )
        return op.Reshape(x, target, **made_by(reshaped).attributes)

    def new_dims(self, dims: list[int], axes: list[int]) -> list[int] | None:
        raise NotImplementedError


class UnsqueezeOfReshape(_ReshapeThen):
    """``Unsqueeze(Reshape(x, s), axes) -> Reshape(x, s with 1s at axes)``"""

    outer = "Unsqueeze"

    def new_dims(self, dims: list[int], axes: list[int]) -> list[int] | None:
        rank = len(dims) + len(axes)
        normalized = sorted(a + rank if a < 0 else a for a in axes)
        if len(set(normalized)) != len(normalized) or any(not 0 <= a < rank for a in normalized):
            return None
        out = list(dims)
        for a in normalized:
            out.insert(a, 1)
        return out


class SqueezeOfReshape(_ReshapeThen):
    """``Squeeze(Reshape(x, s), axes) -> Reshape(x, s without axes)`` where ``s[axes]`` are 1."""

    outer = "Squeeze"

    def new_dims(self, dims: list[int], axes: list[int]) -> list[int] | None:
        rank = len(dims)
        normalized = {a + rank if a < 0 else a for a in axes}
        if any(not 0 <= a < rank or dims[a] != 1 for a in normalized):
            return None
        return [d for i, d in enumerate(dims) if i not in normalized]


_REDUCES = (
    "ReduceMax",
    "ReduceMin",
    "ReduceMean",
    "ReduceSum",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
)


def _reduced_axes(reduce: ir.Node, rank: int) -> set[int] | None:
    """The axes a Reduce node reduces (attribute, or constant input from opset 18/13 for Sum)."""
    attr = reduce.attributes.get("axes")
    if attr is not None:
        axes = list(attr.as_ints())
    elif len(reduce.inputs) > 1 and reduce.inputs[1] is not None:
        found = constant_ints(reduce.inputs[1])
        if found is None:
            return None
        axes = found
    else:
        axes = []
    if not axes:
        if reduce.attributes.get_int("noop_with_empty_axes", 0):
            return None
        return set(range(rank))
    return {a + rank if a < 0 else a for a in axes}


class RestoredReduce(pattern.RewriteRuleClassBase):
    """A reduction that drops its axes, then a Reshape or Unsqueeze that puts them back as 1s:
    the reduction keeps them.

    ``Reshape(ReduceMax(x[N, 172, 309], keepdims=0), [-1, 1, 1]) -> ReduceMax(x, keepdims=1)``
    """

    def __init__(self, reduce: str, restore: str) -> None:
        super().__init__(f"{reduce}Then{restore}")
        self.reduce, self.restore = reduce, restore

    def pattern(self, op: Any, x: ir.Value) -> Any:
        reduced = getattr(op, self.reduce)(
            x, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["reduced"]
        )
        return getattr(op, self.restore)(
            reduced, _allow_other_inputs=True, _allow_other_attributes=True, _outputs=["out"]
        )

    def check(self, context: Any, x: ir.Value, reduced: ir.Value, out: ir.Value) -> MatchResult:
        result = MatchResult()
        reduce, restore = made_by(reduced), made_by(out)
        if reduce.attributes.get_int("keepdims", 1):
            return result.fail("the reduction keeps its axes already")
        if len(reduced.uses()) != 1 or reduced.is_graph_output():
            return result.fail("the reduced tensor has other readers")
        shape = x.shape
        if shape is None:
            return result.fail("the input's rank is unknown")
        rank = shape.rank()
        axes = _reduced_axes(reduce, rank)
        if axes is None:
            return result.fail("the reduced axes are not constant")
        if self.restore == "Unsqueeze":
            restored = _axes(restore)
            if restored is None or {a + rank if a < 0 else a for a in restored} != axes:
                return result.fail("the Unsqueeze restores other axes")
            return result
        if restore.attributes.get_int("allowzero", 0):
            return result.fail("the Reshape uses allowzero")
        target = constant_ints(restore.inputs[1])
        if target is None or len(target) != rank or target.count(-1) > 1:
            return result.fail("the Reshape's target is not a constant of the input's rank")
        keep = [1 if i in axes else shape[i] for i in range(rank)]
        kept_axes = [i for i in range(rank) if i not in axes]
        for i, (t, k) in enumerate(zip(target, keep, strict=True)):
            if t == 0:
                # A 0 copies the reduced tensor's dim i: x's dim kept_axes[i], which must be i.
                if i >= len(kept_axes) or kept_axes[i] != i:
                    return result.fail("a 0 in the Reshape's target copies a moved dim")
                continue
            if t != -1 and t != k:
                return result.fail(f"the Reshape's target {target} is not the kept shape")
            if t == -1 and isinstance(k, int):
                return result.fail("the Reshape's -1 stands for a known dim")
        unknown = [
            k for t, k in zip(target, keep, strict=True) if t != 0 and not isinstance(k, int)
        ]
        if len(unknown) != target.count(-1):
            return result.fail("the kept shape has symbolic dims the target does not leave open")
        return result

    def rewrite(self, op: Any, x: ir.Value, reduced: ir.Value, out: ir.Value) -> Any:
        reduce = made_by(reduced)
        attributes = {k: v for k, v in reduce.attributes.items() if k != "keepdims"}
        return getattr(op, self.reduce)(*reduce.inputs, keepdims=1, **attributes)


def rules(ctx: RuleContext) -> list[RewriteRule]:
    """Every level: the collapse only removes nodes."""
    return [
        *(
            ReshapeOfReshapeLike.rule(inner)
            for inner in ("Reshape", "Flatten", "Squeeze", "Unsqueeze")
        ),
        UnsqueezeOfReshape.rule(),
        SqueezeOfReshape.rule(),
        *(
            RestoredReduce.rule(reduce, restore)
            for reduce in _REDUCES
            for restore in ("Reshape", "Unsqueeze")
        ),
    ]
