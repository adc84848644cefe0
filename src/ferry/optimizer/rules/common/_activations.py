"""Activation functions written out as elementwise arithmetic, fused back into their ONNX op.

Exporters decompose activations that an older opset lacks (``torch.onnx.export`` at opset 17
writes ``nn.GELU`` as eight ops; Keras models write HardSwish as ``x * relu6(x + 3) / 6``). Each
decomposed form reads and writes the whole activation several times; the fused op is one pass,
and engines have a kernel for it::

    Mul(HardSigmoid<alpha=1/6, beta=0.5>(x), x)       ->  HardSwish(x)          (opset >= 14)
    Div(Mul(Clip(Add(x, 3), 0, 6), x), 6)             ->  HardSwish(x)          (opset >= 14)
    Mul(Mul(Clip(Add(x, 3), 0, 6), x), 1/6)           ->  HardSwish(x)          (opset >= 14)
    Div(Clip(Add(x, 3), 0, 6), 6)                     ->  HardSigmoid(x, 1/6, 0.5)
    Mul(Clip(Add(x, 3), 0, 6), 1/6)                   ->  HardSigmoid(x, 1/6, 0.5)
    0.5 * x * (1 + Erf(x / sqrt(2)))                  ->  Gelu(x)               (opset >= 20)
    0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
                                                      ->  Gelu(x, approximate="tanh")  (opset >= 20)

The GELU forms are matched in every association and operand order exporters write
(``(x * 0.5) * E``, ``(x * E) * 0.5``, ``x * (0.5 * E)``), with ``x / 1.4142135`` or
``x * 0.70710677`` inside the Erf and ``Pow(x, 3)`` or ``x * x * x`` for the cube. Only at the
extended level: the fused op is a higher-level op that an engine may lack.

``rules/onnxruntime/_activations.py`` reuses the GELU patterns for models below opset 20, where
ONNX Runtime's contrib ``com.microsoft`` ``Gelu`` / ``FastGelu`` take the place of ``Gelu``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchResult
from onnxscript.rewriter._rewrite_rule import RewriteRule, RewriteRuleSet
from onnxscript.rewriter.rules.common import _fuse_hardswish

from ferry.optimizer.rules._context import RuleContext
from ferry.optimizer.rules.common._constants import constant

__all__ = ["GeluFusion", "gelu_rules", "rules"]

#: The element types Gelu and com.microsoft Gelu/FastGelu are defined for.
FLOAT_TYPES = frozenset(
    {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE}
)
#: HardSigmoid and HardSwish's, below opset 22 (which adds bfloat16).
HARD_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE})

#: How close a GELU decomposition's constants must be to the exact values: float16 stores
#: 0.044715 as 0.04471 (1e-4 off) and sqrt(2/pi) as 0.7979 (1e-4 off). Closer than any constant
#: a different function would use, and far below float16's own rounding of the result.
CONSTANT_RTOL = 1e-3


def scalar_operand(value: ir.Value | None, like: ir.Value) -> float | None:
    """The single number a constant operand ``value`` holds, when combining it elementwise with
    ``like`` cannot change ``like``'s shape (a scalar, or all-ones dims no more than its rank);
    else None. A graph input with a default (an initializer the caller may override) is not
    constant."""
    if value is None or value.is_graph_input():
        return None
    array = constant(value)
    if array is None or array.size != 1:
        return None
    if array.ndim > 0:
        rank = like.shape.rank() if like.shape is not None else None
        if rank is None or array.ndim > rank:
            return None
    return float(array.reshape(()))


def overridable_operand(context: Any) -> ir.Value | None:
    """A matched node's operand that holds a value only by default: a graph input that is also
    an initializer. onnxscript's constant patterns match it like a constant, but the caller may
    feed another value, so a rewrite must not bake it in."""
    for node in context.nodes:
        for value in node.inputs:
            if value is not None and value.is_graph_input() and value.const_value is not None:
                return value
    return None


def element_type(x: ir.Value, same_type: Sequence[ir.Value | None] = ()) -> ir.DataType | None:
    """``x``'s element type; when the model does not record it (an intermediate value of an
    export that ran no shape inference), that of a constant the match combined with ``x`` in an
    op that requires both operands to be of one type (``Add``, ``Mul``, ``Div``)."""
    if x.dtype is not None:
        return x.dtype
    for value in same_type:
        if value is not None and value.const_value is not None:
            return value.const_value.dtype
        array = constant(value)
        if array is not None:
            return ir.DataType.from_numpy(array.dtype)
    return None


def arithmetic_constants(context: Any) -> list[ir.Value]:
    """The constant operands of the matched ``Add``/``Sub``/``Mul``/``Div`` nodes. In a match
    whose every value has the element type of its input (GELU: ``Pow``, ``Erf`` and ``Tanh``
    keep it too), these have that type: ONNX types both operands of these ops alike."""
    return [
        value
        for node in context.nodes
        if node.op_type in ("Add", "Sub", "Mul", "Div")
        for value in node.inputs
        if value is not None and value.const_value is not None
    ]


def check_float(
    result: MatchResult,
    x: ir.Value,
    what: str,
    same_type: Sequence[ir.Value | None] = (),
    types: frozenset[ir.DataType] = FLOAT_TYPES,
) -> MatchResult:
    """Fail ``result`` unless ``x`` (or, its type unrecorded, a constant of the same type, see
    ``element_type``) is of a floating-point type the fused op accepts (one of ``types``)."""
    dtype = element_type(x, same_type)
    if dtype not in types:
        return result.fail(f"{x.name!r} is of type {dtype}; {what} is defined for floats", x)
    return result


def _or(op: Any, op_type: str, a: Any, b: Any) -> Any:
    """``op_type(a, b)`` or ``op_type(b, a)``: a commutative op in either operand order. (A
    disjunction at this one node, where ``RewriteRule.commute()`` would multiply the whole rule
    by two for every commutative node: 2^9 rules for the tanh form.) The matcher commits to the
    first alternative that matches locally, so one operand should be a constant or an op that
    tells the orders apart; a wrong commitment can only lose a match, never make a wrong one,
    since every later use of a variable must agree with its binding."""
    return pattern.OrValue([getattr(op, op_type)(a, b), getattr(op, op_type)(b, a)])


def _const(value: float) -> Any:
    return pattern.Constant(value, rel_tol=CONSTANT_RTOL)


# -- HardSwish / HardSigmoid -------------------------------------------------------------------


class _ClipFormGuard:
    """What onnxscript's Add/Clip/Div rules leave unchecked: ``x`` must be a float (on integers
    ``Div(_, 6)`` truncates, which HardSigmoid does not) and each constant must leave ``x``'s
    shape as it is (a ``[1, 1, 1, 1]`` bias would broadcast a rank-2 ``x`` to rank 4)."""

    def _guard(
        self, x: ir.Value, bias: ir.Value, clip_min: ir.Value, clip_max: ir.Value, scale: ir.Value
    ) -> MatchResult:
        result = check_float(MatchResult(), x, "HardSigmoid", [bias], HARD_TYPES)
        if not result:
            return result
        for role, value in (("bias", bias), ("min", clip_min), ("max", clip_max), ("scale", scale)):
            if scalar_operand(value, x) is None:
                return result.fail(
                    f"the Clip form's {role} operand {value.name!r} is not a scalar constant", value
                )
        return result


class _GuardedDivForm(_ClipFormGuard):
    """onnxscript's Div-by-6 rules, checked by :class:`_ClipFormGuard` first."""

    def check(
        self,
        op: Any,
        x: ir.Value,
        clip_min: ir.Value,
        clip_max: ir.Value,
        bias: ir.Value,
        divisor: ir.Value,
    ) -> MatchResult:
        result = self._guard(x, bias, clip_min, clip_max, divisor)
        upstream = super().check  # type: ignore[misc]  # the onnxscript rule after us in the MRO
        return upstream(op, x, clip_min, clip_max, bias, divisor) if result else result


class HardSwishFromClip(_GuardedDivForm, _fuse_hardswish.HardSwishFusion):
    """``Div(Mul(Clip(Add(x, 3), 0, 6), x), 6) -> HardSwish(x)`` (onnxscript's rule, guarded)."""


class HardSigmoidFromClip(_GuardedDivForm, _fuse_hardswish.HardSigmoidFusion):
    """``Div(Clip(Add(x, 3), 0, 6), 6) -> HardSigmoid(x, 1/6, 0.5)`` (onnxscript's, guarded)."""


class _ClipTimesSixth(_ClipFormGuard, pattern.RewriteRuleClassBase):
    """Base of the forms that multiply by 1/6 instead of dividing by 6 (Keras, TF ports)."""

    def check(
        self,
        op: Any,
        x: ir.Value,
        clip_min: ir.Value,
        clip_max: ir.Value,
        bias: ir.Value,
        sixth: ir.Value,
    ) -> MatchResult:
        result = self._guard(x, bias, clip_min, clip_max, sixth)
        if not result:
            return result
        for role, value, want in (
            ("Add", bias, 3.0),
            ("Clip min", clip_min, 0.0),
            ("Clip max", clip_max, 6.0),
            ("scale", sixth, 1 / 6),
        ):
            got = scalar_operand(value, x)
            if got is None or not math.isclose(got, want, rel_tol=1e-4):
                return result.fail(f"the {role} constant is {got}, not {want:g}", value)
        return result


class HardSwishFromClipTimesSixth(_ClipTimesSixth):
    """``Mul(Mul(Clip(Add(x, 3), 0, 6), x), 1/6) -> HardSwish(x)``"""

    def pattern(
        self,
        op: Any,
        x: ir.Value,
        clip_min: ir.Value,
        clip_max: ir.Value,
        bias: ir.Value,
        sixth: ir.Value,
    ) -> Any:
        return op.Mul(op.Mul(op.Clip(op.Add(x, bias), clip_min, clip_max), x), sixth)

    def rewrite(self, op: Any, x: ir.Value, **_: Any) -> Any:
        return op.HardSwish(x)


class HardSigmoidFromClipTimesSixth(_ClipTimesSixth):
    """``Mul(Clip(Add(x, 3), 0, 6), 1/6) -> HardSigmoid(x, 1/6, 0.5)``"""

    def pattern(
        self,
        op: Any,
        x: ir.Value,
        clip_min: ir.Value,
        clip_max: ir.Value,
        bias: ir.Value,
        sixth: ir.Value,
    ) -> Any:
        return op.Mul(op.Clip(op.Add(x, bias), clip_min, clip_max), sixth)

    def rewrite(self, op: Any, x: ir.Value, **_: Any) -> Any:
        return op.HardSigmoid(x, alpha=1 / 6, beta=0.5)


class HardSwishFromHardSigmoid(_fuse_hardswish.HardSwishFusionFromHardSigmoid):
    """``Mul(HardSigmoid<alpha=1/6, beta=0.5>(x), x) -> HardSwish(x)`` (onnxscript's rule, reading
    an absent attribute as its ONNX default: torch writes ``beta`` only when it is not 0.5)."""

    def check(self, op: Any, x: ir.Value, hardsigmoid_out: ir.Value) -> MatchResult:
        result = MatchResult()
        node = hardsigmoid_out.producer()
        assert node is not None
        alpha = node.attributes.get_float("alpha", 0.2)
        beta = node.attributes.get_float("beta", 0.5)
        if not math.isclose(alpha, 1 / 6, rel_tol=1e-5):
            return result.fail(f"HardSigmoid alpha is {alpha:g}, not 1/6", node)
        if not math.isclose(beta, 0.5, rel_tol=1e-5):
            return result.fail(f"HardSigmoid beta is {beta:g}, not 0.5", node)
        return result


def _hard_rules(opset: int) -> list[RewriteRule]:
    """HardSigmoid from its Clip form at any opset; HardSwish only where the opset has it."""
    sigmoid = [HardSigmoidFromClip.rule(), HardSigmoidFromClipTimesSixth.rule()]
    swish = [
        HardSwishFromClip.rule(),
        HardSwishFromClipTimesSixth.rule(),
        HardSwishFromHardSigmoid.rule(),
    ]
    chosen = (swish if opset >= 14 else []) + sigmoid
    return list(RewriteRuleSet(chosen, commute=True).rules)


# -- GELU --------------------------------------------------------------------------------------

Association = Literal["half_first", "half_last", "half_inner"]
Approximation = Literal["none", "tanh"]

#: What a matched GELU becomes: (op, x, approximate) -> value.
GeluEmitter = Callable[[Any, ir.Value, Approximation], Any]

_SQRT_2 = math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _onnx_gelu(op: Any, x: ir.Value, approximate: Approximation) -> Any:
    return op.Gelu(x, approximate="tanh") if approximate == "tanh" else op.Gelu(x)


class GeluFusion(pattern.RewriteRuleClassBase):
    """``0.5 * x * (1 + Erf(x / sqrt(2)))  ->  Gelu(x)`` and its tanh approximation
    ``0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))  ->  Gelu(x, approximate="tanh")``.

    One rule per association of the outer product and per operand order of its root ``Mul``
    (the root cannot be a disjunction); every inner commutative op matches either order. The
    constants must be scalars within ``CONSTANT_RTOL`` of their exact values (a mismatch fails
    with "Constant value mismatch: expected 0.5, got 0.4").

    Args:
        approximate: ``none`` (the Erf form) or ``tanh``.
        association: where the 0.5 joins: ``(x * 0.5) * E`` (``half_first``), ``(x * E) * 0.5``
            (``half_last``) or ``x * (0.5 * E)`` (``half_inner``), ``E`` being ``1 + Erf(..)``.
        swap_root: the root ``Mul``'s operands the other way round.
        emit: what to write in place of the match (ONNX ``Gelu`` by default).
        prefix: the rule's name prefix.
    """

    def __init__(
        self,
        approximate: Approximation,
        association: Association,
        swap_root: bool,
        emit: GeluEmitter = _onnx_gelu,
        prefix: str = "Gelu",
    ) -> None:
        super().__init__(
            f"{prefix}{'Tanh' if approximate == 'tanh' else 'Erf'}_{association}"
            f"{'_swapped' if swap_root else ''}"
        )
        self.approximate: Approximation = approximate
        self.association: Association = association
        self.swap_root = swap_root
        self.emit = emit

    def _inner(self, op: Any, x: Any) -> Any:
        """``Erf(x / sqrt(2))`` or ``Tanh(sqrt(2/pi) * (x + 0.044715 * x^3))``."""
        if self.approximate == "none":
            scaled = pattern.OrValue(
                [op.Div(x, _const(_SQRT_2)), _or(op, "Mul", x, _const(1 / _SQRT_2))]
            )
            return op.Erf(scaled)
        square = op.Mul(x, x)
        cube = pattern.OrValue([op.Pow(x, _const(3.0)), op.Mul(x, square), op.Mul(square, x)])
        inner = _or(op, "Add", x, _or(op, "Mul", _const(0.044715), cube))
        return op.Tanh(_or(op, "Mul", _const(_SQRT_2_OVER_PI), inner))

    def pattern(self, op: Any, x: Any) -> Any:
        half = _const(0.5)
        e = _or(op, "Add", self._inner(op, x), _const(1.0))
        if self.association == "half_first":
            a, b = _or(op, "Mul", x, half), e
        elif self.association == "half_last":
            a, b = _or(op, "Mul", x, e), half
        else:
            a, b = x, _or(op, "Mul", half, e)
        return op.Mul(b, a) if self.swap_root else op.Mul(a, b)

    def check(self, context: Any, x: ir.Value, **_: Any) -> MatchResult:  # type: ignore[override]
        result = check_float(MatchResult(), x, "Gelu", arithmetic_constants(context))
        if not result:
            return result
        if (default := overridable_operand(context)) is not None:
            return result.fail(
                f"{default.name!r} is a graph input with a default, not a constant", default
            )
        return result

    def rewrite(self, op: Any, x: ir.Value, **_: Any) -> Any:
        return self.emit(op, x, self.approximate)


def gelu_rules(emit: GeluEmitter = _onnx_gelu, prefix: str = "Gelu") -> list[RewriteRule]:
    """Every GELU rule (both approximations, all associations and root orders) emitting ``emit``."""
    approximations: tuple[Approximation, ...] = ("none", "tanh")
    associations: tuple[Association, ...] = ("half_first", "half_last", "half_inner")
    return [
        GeluFusion.rule(approximate, association, swap, emit, prefix)
        for approximate in approximations
        for association in associations
        for swap in (False, True)
    ]


def rules(ctx: RuleContext) -> list[RewriteRule]:
    """HardSwish/HardSigmoid and GELU fusions, at the extended level, where the opset has the op."""
    if not ctx.extended:
        return []
    return _hard_rules(ctx.opset) + (gelu_rules() if ctx.opset >= 20 else [])
