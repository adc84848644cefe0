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
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import onnx_ir as ir

from ferry.optimizer.rules._context import RuleContext

__all__ = ["SinkTransposesPass", "passes"]

logger = logging.getLogger(__name__)

Perm = tuple[int, ...]


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


# ---------------------------------------------------------------- permutations


def _is_identity(perm: Perm) -> bool:
    return all(i == v for i, v in enumerate(perm))


def _inverse(perm: Perm) -> Perm:
    inverse = [0] * len(perm)
    for i, v in enumerate(perm):
        inverse[v] = i
    return tuple(inverse)


def _compose(first: Perm, second: Perm) -> Perm:
    """``Transpose(Transpose(x, first), second) == Transpose(x, _compose(first, second))``."""
    return tuple(first[i] for i in second)


def _norm_axes(axes: Sequence[int], rank: int) -> list[int] | None:
    """Axes made non-negative, or None when one is out of range or repeated."""
    out = [a + rank if a < 0 else a for a in axes]
    if any(not 0 <= a < rank for a in out) or len(set(out)) != len(out):
        return None
    return out


def _permuted_shape(shape: ir.Shape | None, perm: Perm) -> ir.Shape | None:
    """The shape of ``new`` where ``old == Transpose(new, perm)`` and ``shape`` is old's."""
    if shape is None or len(shape) != len(perm):
        return None
    inverse = _inverse(perm)
    return ir.Shape([shape[inverse[j]] for j in range(len(perm))])


def _transposed_shape(shape: ir.Shape | None, perm: Perm) -> ir.Shape | None:
    """The shape of ``Transpose(x, perm)`` where ``shape`` is x's."""
    if shape is None or len(shape) != len(perm):
        return None
    return ir.Shape([shape[i] for i in perm])


# ---------------------------------------------------------------- graph helpers


def _graphs(graph: ir.Graph) -> Iterator[ir.Graph]:
    """``graph`` and, depth first, every subgraph of its nodes."""
    yield graph
    for node in graph:
        for attr in node.attributes.values():
            if attr.is_ref():
                continue
            if attr.type == ir.AttributeType.GRAPH:
                yield from _graphs(attr.as_graph())
            elif attr.type == ir.AttributeType.GRAPHS:
                for sub in attr.as_graphs():
                    yield from _graphs(sub)


class _Names:
    """Fresh value and node names, unique in the whole model (subgraphs see outer names)."""

    def __init__(self, graph: ir.Graph) -> None:
        self._taken: set[str] = set()
        self._counter = 0
        for g in _graphs(graph):
            for v in [*g.inputs, *g.outputs, *g.initializers.values()]:
                if v.name:
                    self._taken.add(v.name)
            for node in g:
                if node.name:
                    self._taken.add(node.name)
                self._taken.update(o.name for o in node.outputs if o.name)

    def fresh(self, hint: str) -> str:
        name = hint
        while name in self._taken:
            self._counter += 1
            name = f"{hint}_{self._counter}"
        self._taken.add(name)
        return name


def _perm_attr(node: ir.Node, rank: int | None) -> Perm | None:
    """A Transpose's permutation; the default (reversed dims) needs the rank."""
    attr = node.attributes.get("perm")
    if attr is not None:
        perm = tuple(attr.as_ints())
        return perm if sorted(perm) == list(range(len(perm))) else None
    return None if rank is None else tuple(reversed(range(rank)))


def _set_input(node: ir.Node, index: int, value: ir.Value) -> None:
    if len(node.inputs) <= index:
        node.resize_inputs(index + 1)
    node.replace_input_with(index, value)


class _GraphInfo:
    """One graph being optimized: its opset, the model's names, and constants read once."""

    def __init__(self, graph: ir.Graph, opset: int, names: _Names) -> None:
        self.graph = graph
        self.opset = opset
        self.names = names
        self._arrays: dict[ir.Value, np.ndarray | None] = {}

    def array(self, value: ir.Value) -> np.ndarray | None:
        """The value's constant content, if it is a constant this pass can permute."""
        if value in self._arrays:
            return self._arrays[value]
        array: np.ndarray | None = None
        if not value.is_graph_input():
            try:
                tensor = ir.convenience.get_const_tensor(value)
                if tensor is not None:
                    array = tensor.numpy()
                    # A permuted copy must be writable back with the same element type.
                    if ir.DataType.from_numpy(array.dtype) != tensor.dtype:
                        array = None
            except (ValueError, TypeError, NotImplementedError):
                array = None
        self._arrays[value] = array
        return array

    def constant(self, array: np.ndarray, hint: str) -> ir.Value:
        """A new initializer holding ``array``."""
        name = self.names.fresh(hint)
        value = ir.Value(
            name=name,
            shape=ir.Shape(array.shape),
            type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
            const_value=ir.tensor(array, name=name),
        )
        self.graph.register_initializer(value)
        return value

    def is_const(self, value: ir.Value) -> bool:
        return self.array(value) is not None

    def ints(self, value: ir.Value | None) -> list[int] | None:
        """A constant 0-D or 1-D integer input as a list."""
        if value is None:
            return None
        array = self.array(value)
        if array is None or array.dtype.kind not in "iu" or array.ndim > 1:
            return None
        return [int(x) for x in array.reshape(-1)]

    def static_rank(self, value: ir.Value) -> int | None:
        if value.shape is not None:
            return len(value.shape)
        array = self.array(value)
        return None if array is None else array.ndim


# ---------------------------------------------------------------- plans per op

#: Rewrites a node of the region in place, after its layout inputs were replaced.
_Rewrite = Callable[[ir.Node, "_Edit"], None]


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
_Handler = Callable[[ir.Node, bool, Perm, "_Region", "Perm | None"], "_Plan | None"]

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
    def rewrite(node: ir.Node, edit: _Edit) -> None:
        node.attributes[name] = ir.AttrInt64(name, value)

    return rewrite


def _set_axes(index: int | None, axes: Sequence[int], attr: str = "axes") -> _Rewrite:
    """Axes written back where they came from: input ``index``, else attribute ``attr``."""

    def rewrite(node: ir.Node, edit: _Edit) -> None:
        if index is None:
            node.attributes[attr] = ir.AttrInt64s(attr, list(axes))
        else:
            _set_input(node, index, edit.info.constant(np.array(axes, dtype=np.int64), f"{attr}_t"))

    return rewrite


def _elementwise(
    node: ir.Node, forward: bool, perm: Perm, region: _Region, target: Perm | None
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
    node: ir.Node, forward: bool, perm: Perm, region: _Region, target: Perm | None
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
    node: ir.Node, forward: bool, perm: Perm, region: _Region, target: Perm | None
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
    node: ir.Node, forward: bool, perm: Perm, region: _Region, target: Perm | None
) -> _Plan | None:
    if any(v is None or region.rank(v) != len(perm) for v in node.inputs):
        return None
    axis = _norm_axes([node.attributes.get_int("axis", 0)], len(perm))
    if axis is None:
        return None
    return _Plan([perm] * len(node.inputs), [perm], _set_attr_int("axis", perm[axis[0]]))


def _split(
    node: ir.Node, forward: bool, perm: Perm, region: _Region, target: Perm | None
) -> _Plan | None:
    axis = _norm_axes([node.attributes.get_int("axis", 0)], len(perm))
    if axis is None:
        return None
    in_perms: list[Perm | None] = [perm] + [None] * (len(node.inputs) - 1)
    return _Plan(in_perms, [perm] * len(node.outputs), _set_attr_int("axis", perm[axis[0]]))


def _slice(
    node: ir.Node, forward: bool, perm: Perm, region: _Region, target: Perm | None
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
    node: ir.Node, forward: bool, perm: Perm, region: _Region, target: Perm | None
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
    node: ir.Node, forward: bool, perm: Perm, region: _Region, target: Perm | None
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


def _squeeze_axes(node: ir.Node, region: _Region) -> tuple[int | None, list[int] | None]:
    """Where a Squeeze/Unsqueeze reads its axes (input index, or None for the attribute, as
    the opset has it) and their values; None values when absent or not constant."""
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        return 1, region.info.ints(node.inputs[1])
    ints = node.attributes.get_ints("axes", None)
    index = 1 if region.info.opset >= 13 and ints is None else None
    return index, None if ints is None else list(ints)


def _kept_dims(node: ir.Node, forward: bool, perm: Perm, region: _Region) -> _Kept | None:
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


def _reshape_kept(node: ir.Node, region: _Region) -> _Kept | None:
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
    node: ir.Node, forward: bool, perm: Perm, region: _Region, target: Perm | None
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
    node: ir.Node, forward: bool, perm: Perm, region: _Region, target: Perm | None
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


# ---------------------------------------------------------------- regions


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


# ---------------------------------------------------------------- rewriting


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
