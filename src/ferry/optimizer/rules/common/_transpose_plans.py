"""How each op computes in a permuted layout, for transpose sinking (``_transpose``): one handler
per op kind (elementwise, Concat, Split, Slice, Pad, Reduce, Squeeze/Unsqueeze/Reshape, ...) that
says which layout each input is read in and each output produced in, and how the node's axes and
parameters are rewritten.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import onnx_ir as ir

from ferry.optimizer.rules.common._transpose_graph import (
    Perm,
    _compose,
    _GraphInfo,
    _inverse,
    _norm_axes,
    _perm_attr,
    _set_input,
)

__all__: list[str] = []


class _RegionView(Protocol):
    """What a handler reads of the region it plans for (``_transpose_regions._Region``, which
    calls the handlers: a protocol keeps the two modules from importing each other)."""

    info: _GraphInfo

    def rank(self, value: ir.Value) -> int | None: ...


class _EditView(Protocol):
    """What a rewrite reads of the edit that applies it (``_transpose_regions._Edit``)."""

    info: _GraphInfo


#: Rewrites a node of the region in place, after its layout inputs were replaced.
_Rewrite = Callable[[ir.Node, _EditView], None]


@dataclasses.dataclass
class _Plan:
    """How a node computes in the permuted layout.

    ``in_perms[i]`` is the layout input ``i`` is read in (``old == Transpose(new, perm)``), None
    for inputs the layout does not touch (a Slice's starts, a Clip's bounds); ``out_perms[k]``
    the layout output ``k`` is produced in. ``rewrite`` updates attributes and parameter inputs.
    """

    in_perms: list[Perm | None]
    out_perms: list[Perm]
    rewrite: _Rewrite | None = None


#: (node, forward, perm, region, target) -> plan. Forward: ``perm`` is the layout of the node's
#: layout inputs; backward: of its outputs. ``target``: an output layout that would cancel a
#: consumer Transpose, for ops free to choose (Unsqueeze, Reshape).
_Handler = Callable[[ir.Node, bool, Perm, _RegionView, "Perm | None"], "_Plan | None"]

# fmt: off
_UNARY = frozenset((
    "Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "BitwiseNot", "Cast", "CastLike",
    "Ceil", "Celu", "Clip", "Cos", "Cosh", "Dropout", "Elu", "Erf", "Exp", "Floor", "Gelu",
    "HardSigmoid", "HardSwish", "Identity", "IsInf", "IsNaN", "LeakyRelu", "Log", "Mish", "Neg",
    "Not", "Reciprocal", "Relu", "Round", "Selu", "Shrink", "Sigmoid", "Sign", "Sin", "Sinh",
    "Softplus", "Softsign", "Sqrt", "Tan", "Tanh", "ThresholdedRelu",
))
_BROADCAST = frozenset((
    "Add", "And", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "Div", "Equal", "Greater",
    "GreaterOrEqual", "Less", "LessOrEqual", "Max", "Mean", "Min", "Mod", "Mul", "Or", "Pow",
    "PRelu", "Sub", "Sum", "Where", "Xor",
))
_REDUCE = frozenset((
    "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
    "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare",
))
# fmt: on


def _set_attr_int(name: str, value: int) -> _Rewrite:
    def rewrite(node: ir.Node, edit: _EditView) -> None:
        node.attributes[name] = ir.AttrInt64(name, value)

    return rewrite


def _set_axes(index: int | None, axes: Sequence[int], attr: str = "axes") -> _Rewrite:
    """Axes written back where they came from: input ``index``, else attribute ``attr``."""

    def rewrite(node: ir.Node, edit: _EditView) -> None:
        if index is None:
            node.attributes[attr] = ir.AttrInt64s(attr, list(axes))
        else:
            _set_input(node, index, edit.info.constant(np.array(axes, dtype=np.int64), f"{attr}_t"))

    return rewrite


def _elementwise(
    node: ir.Node, forward: bool, perm: Perm, region: _RegionView, target: Perm | None
) -> _Plan | None:
    rank = len(perm)
    broadcast = node.op_type in _BROADCAST
    in_perms: list[Perm | None] = [None] * len(node.inputs)
    for i in range(len(node.inputs)) if broadcast else range(1):
        value = node.inputs[i]
        if value is None:
            continue
        value_rank = region.rank(value)
        # A lower-rank operand broadcasts from the right: fine for a constant (unsqueezed when
        # permuted), not for a value that would need an Unsqueeze node as well.
        if value_rank is None or value_rank > rank:
            return None
        if value_rank < rank and not region.info.is_const(value):
            return None
        in_perms[i] = perm
    if in_perms[0] is None and not broadcast:
        return None
    return _Plan(in_perms, [perm] * len(node.outputs))


def _quantize(
    node: ir.Node, forward: bool, perm: Perm, region: _RegionView, target: Perm | None
) -> _Plan | None:
    if node.attributes.get_int("block_size", 0) or len(node.inputs) < 2 or node.inputs[1] is None:
        return None
    plan = _elementwise(node, forward, perm, region, target)
    scale_rank = region.rank(node.inputs[1])
    if plan is None or scale_rank is None or scale_rank > 1:
        return None
    if scale_rank == 1:  # per-axis: the axis moves with the layout
        axis = _norm_axes([node.attributes.get_int("axis", 1)], len(perm))
        if axis is None:
            return None
        plan.rewrite = _set_attr_int("axis", perm[axis[0]])
    return plan


def _softmax(
    node: ir.Node, forward: bool, perm: Perm, region: _RegionView, target: Perm | None
) -> _Plan | None:
    # Before opset 13 these flatten to 2-D at ``axis``: not a per-axis op.
    if region.info.opset < 13:
        return None
    plan = _elementwise(node, forward, perm, region, target)
    axis = _norm_axes([node.attributes.get_int("axis", -1)], len(perm))
    if plan is None or axis is None:
        return None
    plan.rewrite = _set_attr_int("axis", perm[axis[0]])
    return plan


def _concat(
    node: ir.Node, forward: bool, perm: Perm, region: _RegionView, target: Perm | None
) -> _Plan | None:
    if any(v is None or region.rank(v) != len(perm) for v in node.inputs):
        return None
    axis = _norm_axes([node.attributes.get_int("axis", 0)], len(perm))
    if axis is None:
        return None
    return _Plan([perm] * len(node.inputs), [perm], _set_attr_int("axis", perm[axis[0]]))


def _split(
    node: ir.Node, forward: bool, perm: Perm, region: _RegionView, target: Perm | None
) -> _Plan | None:
    axis = _norm_axes([node.attributes.get_int("axis", 0)], len(perm))
    if axis is None:
        return None
    in_perms: list[Perm | None] = [perm] + [None] * (len(node.inputs) - 1)
    return _Plan(in_perms, [perm] * len(node.outputs), _set_attr_int("axis", perm[axis[0]]))


def _slice(
    node: ir.Node, forward: bool, perm: Perm, region: _RegionView, target: Perm | None
) -> _Plan | None:
    if len(node.inputs) < 3 or "starts" in node.attributes:
        return None
    axes_value = node.inputs[3] if len(node.inputs) > 3 else None
    if axes_value is not None:
        axes = region.info.ints(axes_value)
    else:
        starts = node.inputs[1]
        count = None if starts is None else region.info.ints(starts)
        if count is None and starts is not None and starts.shape is not None:
            dims = list(starts.shape)
            count = list(range(dims[0])) if len(dims) == 1 and isinstance(dims[0], int) else None
        axes = None if count is None else list(range(len(count)))
    axes = None if axes is None else _norm_axes(axes, len(perm))
    if axes is None:
        return None
    in_perms: list[Perm | None] = [perm] + [None] * (len(node.inputs) - 1)
    return _Plan(in_perms, [perm], _set_axes(3, [perm[a] for a in axes]))


def _pad(
    node: ir.Node, forward: bool, perm: Perm, region: _RegionView, target: Perm | None
) -> _Plan | None:
    if "pads" in node.attributes or len(node.inputs) < 2:
        return None
    pads = region.info.ints(node.inputs[1])
    if pads is None:
        return None
    rank = len(perm)
    in_perms: list[Perm | None] = [perm] + [None] * (len(node.inputs) - 1)
    axes_value = node.inputs[3] if len(node.inputs) > 3 else None
    if axes_value is not None:
        axes = region.info.ints(axes_value)
        axes = None if axes is None else _norm_axes(axes, rank)
        if axes is None:
            return None
        return _Plan(in_perms, [perm], _set_axes(3, [perm[a] for a in axes]))
    if len(pads) != 2 * rank:
        return None
    new = [0] * (2 * rank)
    for i in range(rank):
        new[perm[i]] = pads[i]
        new[rank + perm[i]] = pads[rank + i]
    return _Plan(in_perms, [perm], _set_axes(1, new, "pads"))


def _reduce(
    node: ir.Node, forward: bool, perm: Perm, region: _RegionView, target: Perm | None
) -> _Plan | None:
    keepdims = node.attributes.get_int("keepdims", 1)
    index: int | None = None
    attr = "axes"
    raw: list[int] | None
    if node.op_type in ("ArgMax", "ArgMin"):
        raw, attr = [node.attributes.get_int("axis", 0)], "axis"
    elif len(node.inputs) > 1 and node.inputs[1] is not None:
        index, raw = 1, region.info.ints(node.inputs[1])
        if raw is None:
            return None
    else:
        ints = node.attributes.get_ints("axes", None)
        raw = None if ints is None else list(ints)
    in_perms: list[Perm | None] = [perm] + [None] * (len(node.inputs) - 1)
    if not raw:
        if node.attributes.get_int("noop_with_empty_axes", 0) or keepdims:
            return _Plan(in_perms, [perm])
        return _Plan(in_perms, [()]) if forward else None
    rank = len(perm) if forward or keepdims else len(perm) + len(raw)
    axes = _norm_axes(raw, rank)
    if axes is None:
        return None

    def write(new_axes: list[int]) -> _Rewrite:
        if attr == "axis":
            return _set_attr_int("axis", new_axes[0])
        return _set_axes(index, new_axes)

    if keepdims:
        return _Plan(in_perms, [perm], write([perm[a] for a in axes]))
    kept = [i for i in range(rank) if i not in axes]
    if forward:
        new_axes = sorted(perm[a] for a in axes)
        new_kept = [j for j in range(rank) if j not in new_axes]
        out = tuple(new_kept.index(perm[i]) for i in kept)
        return _Plan(in_perms, [out], write([perm[a] for a in axes]))
    # Backward: the reduced axes stay where they are, the kept ones take the output's order.
    p_in = list(range(rank))
    for k, i in enumerate(kept):
        p_in[i] = kept[perm[k]]
    in_perms[0] = tuple(p_in)
    return _Plan(in_perms, [perm])


@dataclasses.dataclass
class _Kept:
    """An op that only drops and inserts size-1 dims: the dims it keeps, in order, both sides.

    ``sizes[j]`` is kept dim ``j``'s static size, or None when symbolic (Reshape only).
    """

    rank_in: int
    rank_out: int
    kept_in: list[int]
    kept_out: list[int]
    sizes: list[int | None]


def _squeeze_axes(node: ir.Node, region: _RegionView) -> tuple[int | None, list[int] | None]:
    """Where a Squeeze/Unsqueeze reads its axes (input index, or None for the attribute, as
    the opset has it) and their values; None values when absent or not constant."""
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        return 1, region.info.ints(node.inputs[1])
    ints = node.attributes.get_ints("axes", None)
    index = 1 if region.info.opset >= 13 and ints is None else None
    return index, None if ints is None else list(ints)


def _kept_dims(node: ir.Node, forward: bool, perm: Perm, region: _RegionView) -> _Kept | None:
    data = node.inputs[0]
    if data is None:
        return None
    if node.op_type == "Squeeze":
        _, axes = _squeeze_axes(node, region)
        if axes is None:
            # Without axes every size-1 dim goes: the dims must all be known.
            shape = data.shape
            if shape is None or not all(isinstance(d, int) for d in shape):
                return None
            axes = [i for i, d in enumerate(shape) if d == 1]
        rank_in = len(perm) if forward else len(perm) + len(axes)
        norm = _norm_axes(axes, rank_in)
        if norm is None:
            return None
        kept = [i for i in range(rank_in) if i not in norm]
        return _Kept(rank_in, len(kept), kept, list(range(len(kept))), [None] * len(kept))
    if node.op_type == "Unsqueeze":
        _, axes = _squeeze_axes(node, region)
        if axes is None:
            return None
        rank_out = len(perm) + len(axes) if forward else len(perm)
        norm = _norm_axes(axes, rank_out)
        if norm is None:
            return None
        kept_out = [k for k in range(rank_out) if k not in norm]
        rank_in = len(kept_out)
        return _Kept(rank_in, rank_out, list(range(rank_in)), kept_out, [None] * rank_in)
    return _reshape_kept(node, region)


def _reshape_kept(node: ir.Node, region: _RegionView) -> _Kept | None:
    """A Reshape that keeps the order of the non-1 dims and only drops or inserts 1s."""
    data = node.inputs[0]
    shape = region.info.ints(node.inputs[1]) if len(node.inputs) > 1 else None
    if data is None or data.shape is None or shape is None:
        return None
    dims: list[int | None] = [d if isinstance(d, int) else None for d in data.shape]
    allowzero = node.attributes.get_int("allowzero", 0)
    if 0 in dims or (allowzero and 0 in shape) or any(e < -1 for e in shape):
        return None
    kept_in = [i for i, d in enumerate(dims) if d != 1]
    kept_out: list[int] = []
    for j, e in enumerate(shape):
        if e == 0 and j >= len(dims):
            return None
        size = dims[j] if e == 0 else e
        if size != 1:
            kept_out.append(j)
    if len(kept_in) != len(kept_out) or shape.count(-1) > 1:
        return None
    for i, j in zip(kept_in, kept_out):
        e = shape[j]
        # A -1 pairs with the one remaining dim: every other kept dim matches exactly and the
        # rest are 1s, so the inferred size is that dim's.
        if e == 0:
            same = j == i or (dims[i] is not None and dims[j] == dims[i])
        elif e > 0:
            same = dims[i] == e
        else:
            same = True
        if not same:
            return None
    return _Kept(len(dims), len(shape), kept_in, kept_out, [dims[i] for i in kept_in])


def _kept_forward(kept: _Kept, p_in: Perm, target: Perm | None) -> Perm:
    """The output layout for input layout ``p_in``; size-1 output dims go where ``target`` puts
    them when that makes the output layout ``target`` itself (so a consumer Transpose cancels)."""
    positions = [p_in[i] for i in kept.kept_in]
    ranks = sorted(positions)
    order = [ranks.index(p) for p in positions]
    ones = [k for k in range(kept.rank_out) if k not in kept.kept_out]

    def build(placed: dict[int, int]) -> Perm:
        free = [j for j in range(kept.rank_out) if j not in placed.values()]
        out = [0] * kept.rank_out
        for j, k in enumerate(kept.kept_out):
            out[k] = free[order[j]]
        for k, j in placed.items():
            out[k] = j
        return tuple(out)

    if target is not None and len(target) == kept.rank_out:
        candidate = build({k: target[k] for k in ones})
        if candidate == target:
            return candidate
    return build({k: k for k in ones})


def _kept_backward(kept: _Kept, p_out: Perm) -> Perm:
    """The input layout for output layout ``p_out``; dropped size-1 dims stay where they are."""
    positions = [p_out[k] for k in kept.kept_out]
    ranks = sorted(positions)
    p_in = list(range(kept.rank_in))
    for j, i in enumerate(kept.kept_in):
        p_in[i] = kept.kept_in[ranks.index(positions[j])]
    return tuple(p_in)


def _squeeze_like(
    node: ir.Node, forward: bool, perm: Perm, region: _RegionView, target: Perm | None
) -> _Plan | None:
    kept = _kept_dims(node, forward, perm, region)
    if kept is None or len(perm) != (kept.rank_in if forward else kept.rank_out):
        return None
    if forward:
        p_in, p_out = perm, _kept_forward(kept, perm, target)
    else:
        p_in, p_out = _kept_backward(kept, perm), perm
    in_perms: list[Perm | None] = [p_in] + [None] * (len(node.inputs) - 1)
    if node.op_type == "Squeeze":
        index, _ = _squeeze_axes(node, region)
        dropped = [i for i in range(kept.rank_in) if i not in kept.kept_in]
        return _Plan(in_perms, [p_out], _set_axes(index, sorted(p_in[i] for i in dropped)))
    ones = [k for k in range(kept.rank_out) if k not in kept.kept_out]
    if node.op_type == "Unsqueeze":
        index, _ = _squeeze_axes(node, region)
        return _Plan(in_perms, [p_out], _set_axes(index, sorted(p_out[k] for k in ones)))
    shape = [1] * kept.rank_out
    inferred = False
    allowzero = node.attributes.get_int("allowzero", 0)
    for j, k in enumerate(kept.kept_out):
        size = kept.sizes[j]
        if size is not None:
            shape[p_out[k]] = size
        elif p_out[k] == p_in[kept.kept_in[j]] and not allowzero:
            shape[p_out[k]] = 0  # copies the input dim at the same index
        elif not inferred:
            shape[p_out[k]], inferred = -1, True
        else:
            return None
    return _Plan(in_perms, [p_out], _set_axes(1, shape, "shape"))


def _transpose(
    node: ir.Node, forward: bool, perm: Perm, region: _RegionView, target: Perm | None
) -> _Plan | None:
    q = _perm_attr(node, len(perm))
    if q is None or len(q) != len(perm):
        return None
    # A Transpose in the region always disappears: its output is its input's new layout.
    if forward:
        return _Plan([perm], [_compose(perm, q)])
    return _Plan([_compose(perm, _inverse(q))], [perm])


_HANDLERS: dict[str, _Handler] = {
    **dict.fromkeys(_UNARY | _BROADCAST, _elementwise),
    **dict.fromkeys(_REDUCE | {"ArgMax", "ArgMin"}, _reduce),
    **dict.fromkeys(("QuantizeLinear", "DequantizeLinear"), _quantize),
    **dict.fromkeys(("Softmax", "LogSoftmax", "Hardmax"), _softmax),
    **dict.fromkeys(("Squeeze", "Unsqueeze", "Reshape"), _squeeze_like),
    "Transpose": _transpose,
    "Concat": _concat,
    "Split": _split,
    "Slice": _slice,
    "Pad": _pad,
}


def _handler(node: ir.Node) -> _Handler | None:
    if node.domain not in ("", "ai.onnx"):
        return None
    return _HANDLERS.get(node.op_type)
