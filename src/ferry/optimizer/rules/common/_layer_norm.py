"""LayerNormalization from its decomposition.

Below opset 17 exporters had no LayerNormalization op and wrote it out (``torch.onnx.export`` at
opset 16, TF/Keras ports, hand-written BERTs); such models keep the decomposition after an opset
upgrade. It reads the activation five times where the fused op reads it once::

    mean = ReduceMean(x, axes=[-1]);  d = Sub(x, mean)
    var  = ReduceMean(Pow(d, 2) | Mul(d, d), axes=[-1])
    n    = Div(d, Sqrt(Add(var, eps)))  |  Mul(d, Reciprocal(Sqrt(Add(var, eps))))
    y    = Add(Mul(n, gamma), beta)
                                   ->  LayerNormalization(x, gamma, beta, axis=-1, epsilon=eps)

with the axes as an attribute (opset < 18) or an input (opset >= 18). Without ``gamma`` the
scale is a ones vector, so the normalized dim must be static; a scalar or ``[1, .., 1, D]``
constant ``gamma``/``beta`` is reshaped to the ``[D]`` vector the op takes. Both means must
reduce over the last axis only, with ``keepdims=1``. The float16 and bfloat16 forms compute in
float32 (``stash_type=1``), double in double.

The rules fire at the first node that completes a match in graph order, so the bare
normalization fuses before its ``Mul(gamma)`` and ``Add(beta)`` are seen; two follow-up rules
then take those in (and apply to any scale-only LayerNormalization the same way)::

    Mul(LayerNormalization(x, s), g)   ->  LayerNormalization(x, s * g)    (s constant)
    Add(LayerNormalization(x, s), b)   ->  LayerNormalization(x, s, b)

Extended level only, at opset 17 and later (where the op exists).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchResult
from onnxscript.rewriter._rewrite_rule import RewriteRule

from ferry.optimizer.rules._context import RuleContext
from ferry.optimizer.rules.common._activations import (
    element_type,
    overridable_operand,
    scalar_operand,
)
from ferry.optimizer.rules.common._constants import constant, constant_ints, new_initializer

__all__ = ["LayerNormBias", "LayerNormFusion", "LayerNormScale", "rules"]

#: The input types LayerNormalization (opset 17) is defined for.
LAYER_NORM_TYPES = frozenset(
    {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE}
)


def _stash_type(dtype: ir.DataType) -> int:
    # The op computes mean and variance in stash_type: float32 (its default) keeps half-precision
    # models at least as accurate as their decomposition was; double must stay double.
    return int(ir.DataType.DOUBLE if dtype == ir.DataType.DOUBLE else ir.DataType.FLOAT)


def _last_dim(x: ir.Value) -> int | ir.SymbolicDim | None:
    if x.shape is None or x.shape.rank() == 0:
        return None
    return x.shape[-1]


def norm_parameter(value: ir.Value, x: ir.Value, role: str) -> ir.Value | np.ndarray | str:
    """``value`` (a scale or bias multiplied/added onto the normalized ``x``) as LayerNormalization
    takes it: the value itself when it is a vector over the last axis, ``[D]``; a ``[D]`` array
    when it is a constant that broadcasts along the last axis only (a scalar, ``[1, .., 1, D]``);
    else the reason it is neither."""
    d = _last_dim(x)
    shape = value.shape
    if d is None:
        # x's shape is unrecorded (an export that ran no shape inference). A [G] vector still
        # fits: x's last dim is G, else the decomposition failed to broadcast too, or it is 1,
        # a "normalization" over one element that nothing writes.
        if shape is not None and shape.rank() == 1 and isinstance(shape[0], int):
            return value
        return f"the shape of {x.name!r} is unknown and {role} {value.name!r} is not a vector"
    if shape is not None and shape.rank() == 1 and shape[0] == d:
        return value
    array = None if value.is_graph_input() else constant(value)
    if array is not None and isinstance(d, int):
        rank = x.shape.rank() if x.shape is not None else 0
        leading_ones = all(n == 1 for n in array.shape[:-1])
        if array.ndim <= rank and leading_ones and (array.ndim == 0 or array.shape[-1] in (1, d)):
            return np.broadcast_to(array.reshape(-1), (d,)).copy()
    return (
        f"the {role} {value.name!r} (shape {shape}) is not a vector over the last axis of "
        f"{x.name!r} (size {d})"
    )


def _as_value(op: Any, near: ir.Node, param: ir.Value | np.ndarray, base: str) -> ir.Value:
    return param if isinstance(param, ir.Value) else new_initializer(op, near, param, base)


def _reduces_last_axis(mean: ir.Value, x: ir.Value) -> str | None:
    """Why the ReduceMean producing ``mean`` is not a mean over ``x``'s last axis with
    ``keepdims=1``, or None when it is."""
    node = mean.producer()
    assert node is not None
    if node.attributes.get_int("keepdims", 1) != 1:
        return f"{node.name!r} drops the reduced axis (keepdims=0)"
    axes_attr = node.attributes.get("axes")
    if axes_attr is not None:
        axes: list[int] | None = list(axes_attr.as_ints())
    elif len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = None if node.inputs[1].is_graph_input() else constant_ints(node.inputs[1])
        if axes is None:
            return f"the axes of {node.name!r} are computed at run time"
    else:
        axes = []  # reduces over every axis
    rank = x.shape.rank() if x.shape is not None else None
    if axes in ([-1], [rank - 1] if rank is not None else None):
        return None
    if axes == [] and rank == 1:
        return None
    return f"{node.name!r} reduces over axes {axes or 'all'}, not over the last axis only"


#: How the deviation is divided by the standard deviation.
NORMALIZE_FORMS = ("div", "mul_reciprocal", "reciprocal_mul")


class LayerNormFusion(pattern.RewriteRuleClassBase):
    """The decomposition, with or without ``Mul(gamma)``, -> ``LayerNormalization``.

    Args:
        axes_input: the ReduceMean axes are an input (opset >= 18), else an attribute.
        scaled: the match ends with ``Mul(normalized, gamma)``; else at the normalization (the
            scale is then a ones vector).
        form: for an unscaled match, its last node (a pattern's root cannot be a disjunction):
            ``Div(d, std)``, ``Mul(d, Reciprocal(std))`` or ``Mul(Reciprocal(std), d)``. A scaled
            match takes any of the three.
        swap_root: ``Mul(gamma, normalized)``.
    """

    def __init__(
        self, axes_input: bool, scaled: bool, form: str = "div", swap_root: bool = False
    ) -> None:
        super().__init__(
            f"LayerNorm{'Scaled' if scaled else ''}{'Swapped' if swap_root else ''}"
            f"{'' if scaled else form.title().replace('_', '')}"
            f"{'AxesInput' if axes_input else 'AxesAttr'}"
        )
        self.axes_input = axes_input
        self.scaled = scaled
        self.form = form
        self.swap_root = swap_root

    def _mean(self, op: Any, v: Any, name: str) -> Any:
        if self.axes_input:
            return op.ReduceMean(
                v, pattern.Var(f"{name}_axes"), _allow_other_attributes=True, _outputs=[name]
            )
        return op.ReduceMean(v, _allow_other_attributes=True, _outputs=[name])

    def pattern(self, op: Any, x: Any, epsilon: Any) -> Any:
        deviation = op.Sub(x, self._mean(op, x, "mean"))
        squared = pattern.OrValue(
            [op.Pow(deviation, pattern.Constant(2.0)), op.Mul(deviation, deviation)]
        )
        variance = self._mean(op, squared, "variance")
        std = op.Sqrt(pattern.OrValue([op.Add(variance, epsilon), op.Add(epsilon, variance)]))
        forms = {
            "div": lambda: op.Div(deviation, std),
            "mul_reciprocal": lambda: op.Mul(deviation, op.Reciprocal(std)),
            "reciprocal_mul": lambda: op.Mul(op.Reciprocal(std), deviation),
        }
        if not self.scaled:
            return forms[self.form]()
        normalized = pattern.OrValue([make() for make in forms.values()])
        gamma = pattern.Var("gamma")
        return op.Mul(gamma, normalized) if self.swap_root else op.Mul(normalized, gamma)

    def check(  # type: ignore[override]
        self,
        context: Any,
        x: ir.Value,
        epsilon: ir.Value,
        mean: ir.Value,
        variance: ir.Value,
        gamma: ir.Value | None = None,
        **_: Any,
    ) -> MatchResult:
        result = MatchResult()
        dtype = element_type(x, [epsilon])
        if dtype not in LAYER_NORM_TYPES:
            return result.fail(f"{x.name!r} is of type {dtype}; LayerNormalization is not", x)
        self._dtype = dtype
        for reduced in (mean, variance):
            if (why := _reduces_last_axis(reduced, x)) is not None:
                return result.fail(why, reduced)
        if scalar_operand(epsilon, x) is None:
            return result.fail(f"epsilon {epsilon.name!r} is not a scalar constant", epsilon)
        if (default := overridable_operand(context)) is not None:
            return result.fail(f"{default.name!r} is a graph input with a default", default)
        if gamma is not None:
            scale = norm_parameter(gamma, x, "scale")
        elif isinstance(d := _last_dim(x), int):
            scale = np.ones((d,), dtype=dtype.numpy())
        else:
            scale = f"the last dim of {x.name!r} is not static, so no ones scale can stand in"
        if isinstance(scale, str):
            return result.fail(scale, gamma if gamma is not None else x)
        self._scale = scale
        return result

    def rewrite(self, op: Any, x: ir.Value, epsilon: ir.Value, mean: ir.Value, **_: Any) -> Any:
        near = mean.producer()
        assert near is not None
        eps = scalar_operand(epsilon, x)
        assert eps is not None
        return op.LayerNormalization(
            x,
            _as_value(op, near, self._scale, f"{x.name}_ln_scale"),
            axis=-1,
            epsilon=eps,
            stash_type=_stash_type(self._dtype),
        )


def _layer_norm_last_axis(ln: ir.Value, x: ir.Value) -> str | None:
    """Why the LayerNormalization producing ``ln`` cannot take another scale or bias: it does
    not normalize the last axis alone, or its mean/inverse-std outputs are read."""
    node = ln.producer()
    assert node is not None
    axis = node.attributes.get_int("axis", -1)
    rank = x.shape.rank() if x.shape is not None else None
    if axis != -1 and (rank is None or axis != rank - 1):
        return f"{node.name!r} normalizes from axis {axis}, not the last axis only"
    if any(out.uses() or out.is_graph_output() for out in node.outputs[1:]):
        return f"{node.name!r}'s mean or inverse-std output is read"
    return None


class LayerNormScale(pattern.RewriteRuleClassBase):
    """``Mul(LayerNormalization(x, s), g) -> LayerNormalization(x, s * g)`` (``s`` constant; a
    ones ``s``, the one the bare fusion writes, takes ``g`` as it is)."""

    def __init__(self, swap_root: bool = False) -> None:
        super().__init__(f"LayerNormScale{'Swapped' if swap_root else ''}")
        self.swap_root = swap_root

    def pattern(self, op: Any, x: Any, scale: Any, gamma: Any) -> Any:
        ln = op.LayerNormalization(x, scale, _allow_other_attributes=True, _outputs=["ln"])
        return op.Mul(gamma, ln) if self.swap_root else op.Mul(ln, gamma)

    def check(  # type: ignore[override]
        self, context: Any, x: ir.Value, scale: ir.Value, gamma: ir.Value, ln: ir.Value, **_: Any
    ) -> MatchResult:
        result = MatchResult()
        if (why := _layer_norm_last_axis(ln, x)) is not None:
            return result.fail(why, ln)
        s = None if scale.is_graph_input() else constant(scale)
        if s is None:
            return result.fail(f"the scale {scale.name!r} is not a constant", scale)
        g = norm_parameter(gamma, x, "scale")
        if isinstance(g, str):
            return result.fail(g, gamma)
        if isinstance(g, ir.Value) and not np.all(s == 1):
            # A real scale times a vector: only a constant vector folds into it.
            g_const = None if gamma.is_graph_input() else constant(gamma)
            if g_const is None:
                return result.fail(
                    f"{gamma.name!r} is computed at run time and {scale.name!r} is not ones", gamma
                )
            g = g_const
        self._scale: ir.Value | np.ndarray = (
            g if isinstance(g, ir.Value) else (s * g).astype(s.dtype)
        )
        return result

    def rewrite(self, op: Any, x: ir.Value, ln: ir.Value, **_: Any) -> Any:
        node = ln.producer()
        assert node is not None
        attrs = {k: v for k, v in node.attributes.items()}
        return op.LayerNormalization(
            x, _as_value(op, node, self._scale, f"{x.name}_ln_scale"), **attrs
        )


class LayerNormBias(pattern.RewriteRuleClassBase):
    """``Add(LayerNormalization(x, s), b) -> LayerNormalization(x, s, b)``"""

    def __init__(self, swap_root: bool = False) -> None:
        super().__init__(f"LayerNormBias{'Swapped' if swap_root else ''}")
        self.swap_root = swap_root

    def pattern(self, op: Any, x: Any, scale: Any, beta: Any) -> Any:
        ln = op.LayerNormalization(x, scale, _allow_other_attributes=True, _outputs=["ln"])
        return op.Add(beta, ln) if self.swap_root else op.Add(ln, beta)

    def check(  # type: ignore[override]
        self, context: Any, x: ir.Value, beta: ir.Value, ln: ir.Value, **_: Any
    ) -> MatchResult:
        result = MatchResult()
        if (why := _layer_norm_last_axis(ln, x)) is not None:
            return result.fail(why, ln)
        b = norm_parameter(beta, x, "bias")
        if isinstance(b, str):
            return result.fail(b, beta)
        self._bias = b
        return result

    def rewrite(self, op: Any, x: ir.Value, scale: ir.Value, ln: ir.Value, **_: Any) -> Any:
        node = ln.producer()
        assert node is not None
        attrs = {k: v for k, v in node.attributes.items()}
        bias = _as_value(op, node, self._bias, f"{x.name}_ln_bias")
        return op.LayerNormalization(x, scale, bias, **attrs)


def rules(ctx: RuleContext) -> list[RewriteRule]:
    """The LayerNormalization fusions, at the extended level from opset 17."""
    if not ctx.extended or ctx.opset < 17:
        return []
    fused: list[RewriteRule] = []
    for axes_input in (False, True):
        fused += [LayerNormFusion.rule(axes_input, False, form) for form in NORMALIZE_FORMS]
        fused += [LayerNormFusion.rule(axes_input, True, "div", swap) for swap in (False, True)]
    follow_up = [
        cls.rule(swap) for cls in (LayerNormScale, LayerNormBias) for swap in (False, True)
    ]
    return fused + follow_up
