"""Channel dependency groups: which tensors must lose the same channels together.

A channel removed from a Conv's output must also leave its bias, the BatchNormalization and the
activations after it, every tensor an Add/Mul/... joins it with, the depthwise convs it passes
through, and the input channels of every layer that reads it. :func:`channel_groups` walks the
graph once, ties such tensors into one :class:`ChannelGroup` (union-find over values, the channel
axis being axis 1), and records for each group what to slice where. Concat and Flatten make a
*derived* group: its channels are its parents' channels, offset (Concat) or repeated per spatial
position (Flatten), so it follows its parents' choice instead of making its own.

Whatever pins a group's channel count (a graph output, a constant Reshape that cannot be
rewritten, a grouped conv that is not depthwise, an op not understood here) blocks the group,
with a reason naming the node; a blocked group keeps all its channels.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping

import numpy as np
import onnx_ir as ir

from ferry.graph import constant, node_reads, shape_of, subgraphs

__all__ = ["ChannelGroup", "Derivation", "Slice", "channel_groups"]

#: Ops that map each channel to itself, reading one tensor (their other inputs are scalars or
#: shapes: Clip's bounds, Dropout's ratio).
_UNARY = frozenset(
    [
        "Relu",
        "Clip",
        "Sigmoid",
        "HardSigmoid",
        "HardSwish",
        "Tanh",
        "LeakyRelu",
        "Elu",
        "Selu",
        "Celu",
        "Softplus",
        "Softsign",
        "Gelu",
        "Erf",
        "Mish",
        "ThresholdedRelu",
        "Swish",
        "Identity",
        "Cast",
        "Neg",
        "Abs",
        "Exp",
        "Log",
        "Sqrt",
        "Reciprocal",
        "Floor",
        "Ceil",
        "Round",
        "Sign",
        "Sin",
        "Cos",
        "Not",
        "IsNaN",
        "IsInf",
        "MaxPool",
        "AveragePool",
        "GlobalAveragePool",
        "GlobalMaxPool",
        "LpPool",
        "GlobalLpPool",
        "Dropout",
    ]
)
#: Elementwise ops with broadcasting: every input with channels shares the output's channels.
_BINARY = frozenset(
    [
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Max",
        "Min",
        "Sum",
        "Mean",
        "PRelu",
        "Pow",
        "Equal",
        "Less",
        "Greater",
        "And",
        "Or",
    ]
)
_REDUCE = frozenset(
    [
        "ReduceMean",
        "ReduceSum",
        "ReduceMax",
        "ReduceMin",
        "ReduceProd",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSumExp",
        "ReduceSumSquare",
        "ReduceLogSum",
    ]
)


@dataclasses.dataclass(frozen=True)
class Slice:
    """One axis of one node's constant input that follows a group's channels."""

    node: ir.Node
    index: int
    axis: int


@dataclasses.dataclass(frozen=True)
class Derivation:
    """How a derived group's channels come from its parents.

    ``parts`` are ``(parent value or None, channels)`` in order: Concat's inputs (None for a
    constant input, kept whole). ``repeat`` is Flatten's spatial size: parent channel ``c``
    becomes channels ``c*repeat .. c*repeat+repeat-1``.
    """

    node: ir.Node
    parts: tuple[tuple[ir.Value | None, int], ...]
    repeat: int = 1


@dataclasses.dataclass
class ChannelGroup:
    """Tensors that share one channel axis, and everything that must be sliced with it.

    Attributes:
        values: the tensors (their axis 1 is the group's channel axis).
        channels: the channel count, when known.
        sources: the layers whose output channels these are (weight slices along the output
            axis); they are what the criterion ranks.
        params: per-channel constants (biases, BatchNorm statistics, slopes, depthwise filters).
        consumers: the input-channel axes of the layers that read the group.
        group_attrs: depthwise convs whose ``group`` attribute equals the channel count.
        rewrites: ``(node, input index, position)`` of constant shapes whose entry is the
            group's channel count (a Reshape's target, a Resize's sizes).
        derivation: set for a derived group (Concat, Flatten).
        blocked: why the group keeps its channels; empty when it may be pruned.
    """

    values: list[ir.Value]
    channels: int | None = None
    sources: list[Slice] = dataclasses.field(default_factory=list)
    params: list[Slice] = dataclasses.field(default_factory=list)
    consumers: list[Slice] = dataclasses.field(default_factory=list)
    group_attrs: list[ir.Node] = dataclasses.field(default_factory=list)
    rewrites: list[tuple[ir.Node, int, int]] = dataclasses.field(default_factory=list)
    derivation: Derivation | None = None
    blocked: list[str] = dataclasses.field(default_factory=list)

    @property
    def name(self) -> str:
        """The group's name: its first source layer (or first tensor), and how many more."""
        names = [s.node.name or s.node.op_type for s in self.sources]
        if not names:
            return self.values[0].name or "?"
        return names[0] + (f" (+{len(names) - 1})" if len(names) > 1 else "")


class _Notes:
    """Facts about values gathered in one walk; :meth:`groups` ties them into groups."""

    def __init__(self) -> None:
        self.parent: dict[ir.Value, ir.Value] = {}
        self.sources: list[tuple[ir.Value, Slice]] = []
        self.params: list[tuple[ir.Value, Slice]] = []
        self.consumers: list[tuple[ir.Value, Slice]] = []
        self.group_attrs: list[tuple[ir.Value, ir.Node]] = []
        self.rewrites: list[tuple[ir.Value, tuple[ir.Node, int, int]]] = []
        self.derived: list[tuple[ir.Value, Derivation]] = []
        self.blocks: list[tuple[ir.Value, str]] = []
        self.order: dict[ir.Value, int] = {}

    def find(self, value: ir.Value) -> ir.Value:
        if value not in self.order:
            self.order[value] = len(self.order)
        root = value
        while self.parent.get(root, root) is not root:
            root = self.parent[root]
        while value is not root:  # path compression
            value, self.parent[value] = self.parent.get(value, value), root
        return root

    def join(self, *values: ir.Value | None) -> None:
        present = [v for v in values if v is not None]
        roots = [self.find(v) for v in present]
        for root in roots[1:]:
            if root is not roots[0]:
                self.parent[root] = roots[0]

    def block(self, values: Iterable[ir.Value | None], reason: str) -> None:
        for value in values:
            if value is not None:
                self.find(value)
                self.blocks.append((value, reason))

    def groups(self) -> list[ChannelGroup]:
        noted: list[ir.Value] = [
            *(v for v, _ in self.sources),
            *(v for v, _ in self.params),
            *(v for v, _ in self.consumers),
            *(v for v, _ in self.group_attrs),
            *(v for v, _ in self.rewrites),
            *(v for v, _ in self.derived),
            *(v for v, _ in self.blocks),
        ]
        for value in noted:
            self.find(value)
        by_root: dict[ir.Value, ChannelGroup] = {}
        for value in sorted(self.order, key=self.order.__getitem__):
            by_root.setdefault(self.find(value), ChannelGroup(values=[])).values.append(value)

        def group(value: ir.Value) -> ChannelGroup:
            return by_root[self.find(value)]

        for value, item in self.sources:
            group(value).sources.append(item)
        for value, item in self.params:
            group(value).params.append(item)
        for value, item in self.consumers:
            group(value).consumers.append(item)
        for value, node in self.group_attrs:
            group(value).group_attrs.append(node)
        for value, rewrite in self.rewrites:
            group(value).rewrites.append(rewrite)
        for value, reason in self.blocks:
            if reason not in group(value).blocked:
                group(value).blocked.append(reason)
        for value, derivation in self.derived:
            g = group(value)
            if g.derivation is not None:
                g.blocked.append(
                    f"{derivation.node.name} and {g.derivation.node.name} both define its channels"
                )
            g.derivation = derivation
        found = list(by_root.values())
        for g in found:
            _count_channels(g)
            if g.derivation is not None and g.sources:
                g.blocked.append(
                    f"{g.derivation.node.name} ({g.derivation.node.op_type}) output is joined "
                    f"with {g.sources[0].node.name}'s channels"
                )
        _block_parents(found, group)
        return found


def _count_channels(group: ChannelGroup) -> None:
    counts: set[int] = set()
    for value in group.values:
        shape = shape_of(value)
        if shape is not None and len(shape) > 1 and isinstance(shape[1], int):
            counts.add(shape[1])
    for item in group.sources:
        array = constant(item.node.inputs[item.index])
        if array is not None:
            counts.add(array.shape[item.axis])
    if len(counts) == 1:
        group.channels = counts.pop()
    elif counts:
        group.blocked.append(f"its tensors disagree on the channel count ({sorted(counts)})")


def _block_parents(
    groups: list[ChannelGroup], group_of: Callable[[ir.Value], ChannelGroup]
) -> None:
    """A derived group that must keep its channels pins its parents' channels too."""
    changed = True
    while changed:
        changed = False
        for g in groups:
            if not g.blocked or g.derivation is None:
                continue
            for parent, _ in g.derivation.parts:
                if parent is None:
                    continue
                pg = group_of(parent)
                if not pg.blocked:
                    node = g.derivation.node
                    pg.blocked.append(
                        f"it feeds {node.name} ({node.op_type}), whose channels are kept: "
                        f"{g.blocked[0]}"
                    )
                    changed = True


def channel_groups(model: ir.Model, exclude: Mapping[str, str] | None = None) -> list[ChannelGroup]:
    """Tie the model's tensors into channel groups.

    Before -> After::

        Conv_a -> BN -> Relu -> Add(., Conv_b) -> Conv_c
            -> one group: sources Conv_a, Conv_b (output axis), params BN, consumer Conv_c (axis 1)

    Args:
        model: a model with inferred shapes (:func:`ferry.graph.prepare`).
        exclude: tensors whose channels must be kept: value name -> the excluded node's name
            (the tensors a node's channels reach, so a name survives BatchNorm folding).

    Returns:
        Every group, blocked ones included (with their reasons).
    """
    notes = _Notes()
    graph = model.graph
    for node in graph:
        _visit(node, notes)
    for value in graph.outputs:
        notes.block([value], f"it reaches the graph output {value.name!r}")
    excluded = dict(exclude or {})
    for node in graph:
        for value in node.outputs:
            if value.name in excluded:
                notes.block([value], f"{excluded[value.name]} is excluded")
    return notes.groups()


def _rank(value: ir.Value | None) -> int | None:
    shape = shape_of(value) if value is not None else None
    return len(shape) if shape is not None else None


def _dim(value: ir.Value | None, axis: int) -> int | str | None:
    shape = shape_of(value) if value is not None else None
    if shape is None or len(shape) <= axis:
        return None
    return shape[axis]


def _inputs(node: ir.Node) -> list[ir.Value | None]:
    return list(node.inputs)


def _data(values: Iterable[ir.Value | None]) -> list[ir.Value]:
    """The values that are tensors flowing through the graph, not weights."""
    return [v for v in values if v is not None and constant(v) is None]


def _ints(node: ir.Node, name: str, index: int) -> list[int] | None:
    """An ints attribute, or (newer opsets) the constant input that replaced it."""
    attr = node.attributes.get(name)
    if attr is not None and not attr.is_ref():
        return list(attr.value)
    if len(node.inputs) > index and node.inputs[index] is not None:
        array = constant(node.inputs[index])
        return None if array is None else [int(v) for v in array.reshape(-1)]
    return None


def _visit(node: ir.Node, notes: _Notes) -> None:
    x = node.inputs[0] if node.inputs else None
    y = node.outputs[0] if node.outputs else None
    op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
    where = f"{node.name} ({op})"

    def unknown(why: str | None = None) -> None:
        reason = f"{where} {why}" if why else f"{where} is an op channel pruning does not follow"
        notes.block(_data(node_reads(node)), reason)
        notes.block(node.outputs, reason)

    if subgraphs(node) or node.domain not in ("", "ai.onnx"):
        unknown()
        return
    if op == "Constant":
        return
    handler = _HANDLERS.get(op)
    if handler is not None:
        handler(node, notes, unknown)
        return
    if op in _UNARY:
        extra = [o for o in node.outputs[1:] if o is not None and o.uses()]
        if extra:
            unknown(f"uses its second output {extra[0].name!r}")
            return
        notes.join(x, y)
        return
    if op in _BINARY:
        _binary(node, notes, unknown)
        return
    if op in _REDUCE:
        _reduce(node, notes, unknown)
        return
    if y is None and x is None:
        return
    unknown()


#: Blocks the node's tensors, saying why (None: an op channel pruning does not follow).
_Unknown = Callable[..., None]


def _conv(node: ir.Node, notes: _Notes, unknown: _Unknown) -> None:
    x, w_value = node.inputs[0], node.inputs[1]
    y = node.outputs[0]
    w = constant(w_value)
    if w is None or x is None:
        unknown("has weights that are not constant")
        return
    group = node.attributes.get_int("group", 1)
    bias = len(node.inputs) > 2 and node.inputs[2] is not None
    if group == 1:
        notes.consumers.append((x, Slice(node, 1, 1)))
        notes.find(y)
        notes.sources.append((y, Slice(node, 1, 0)))
        if bias:
            notes.params.append((y, Slice(node, 2, 0)))
        return
    if w.shape[1] == 1 and w.shape[0] == group:
        # Depthwise: channel c in gives channel c out, so in and out are one group.
        notes.join(x, y)
        notes.params.append((y, Slice(node, 1, 0)))
        if bias:
            notes.params.append((y, Slice(node, 2, 0)))
        notes.group_attrs.append((y, node))
        return
    unknown(f"is a grouped conv (group={group}) that is not depthwise")


def _conv_transpose(node: ir.Node, notes: _Notes, unknown: _Unknown) -> None:
    x, y = node.inputs[0], node.outputs[0]
    if constant(node.inputs[1]) is None or x is None:
        unknown("has weights that are not constant")
        return
    if node.attributes.get_int("group", 1) != 1:
        unknown("is a grouped ConvTranspose")
        return
    notes.consumers.append((x, Slice(node, 1, 0)))
    notes.find(y)
    notes.sources.append((y, Slice(node, 1, 1)))
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        notes.params.append((y, Slice(node, 2, 0)))


def _gemm(node: ir.Node, notes: _Notes, unknown: _Unknown) -> None:
    x, y = node.inputs[0], node.outputs[0]
    b = constant(node.inputs[1])
    trans_a = node.attributes.get_int("transA", 0)
    if x is None or b is None or trans_a:
        unknown("has a transposed input or weights that are not constant")
        return
    trans_b = node.attributes.get_int("transB", 0)
    notes.consumers.append((x, Slice(node, 1, 1 if trans_b else 0)))
    notes.find(y)
    notes.sources.append((y, Slice(node, 1, 0 if trans_b else 1)))
    c = constant(node.inputs[2]) if len(node.inputs) > 2 else None
    if c is not None and c.ndim >= 1 and c.shape[-1] == b.shape[0 if trans_b else 1] > 1:
        notes.params.append((y, Slice(node, 2, c.ndim - 1)))
    elif len(node.inputs) > 2 and node.inputs[2] is not None and c is None:
        notes.block([y], f"{node.name} (Gemm) adds a bias that is not constant")


def _matmul(node: ir.Node, notes: _Notes, unknown: _Unknown) -> None:
    x, y = node.inputs[0], node.outputs[0]
    b = constant(node.inputs[1])
    if x is None or b is None or b.ndim != 2 or _rank(x) != 2:
        unknown("is not a 2-D input times a constant matrix")
        return
    notes.consumers.append((x, Slice(node, 1, 0)))
    notes.find(y)
    notes.sources.append((y, Slice(node, 1, 1)))


def _batch_norm(node: ir.Node, notes: _Notes, unknown: _Unknown) -> None:
    if any(o is not None and o.uses() for o in node.outputs[1:]):
        unknown("runs in training mode")
        return
    notes.join(node.inputs[0], node.outputs[0])
    for index in range(1, 5):
        if constant(node.inputs[index]) is None:
            unknown("has statistics that are not constant")
            return
        notes.params.append((node.outputs[0], Slice(node, index, 0)))


def _instance_norm(node: ir.Node, notes: _Notes, unknown: _Unknown) -> None:
    if constant(node.inputs[1]) is None or constant(node.inputs[2]) is None:
        unknown("has parameters that are not constant")
        return
    notes.join(node.inputs[0], node.outputs[0])
    notes.params.append((node.outputs[0], Slice(node, 1, 0)))
    notes.params.append((node.outputs[0], Slice(node, 2, 0)))


def _binary(node: ir.Node, notes: _Notes, unknown: _Unknown) -> None:
    y = node.outputs[0]
    rank = _rank(y)
    if rank is None:
        unknown("has an output of unknown rank")
        return
    if rank < 2:
        notes.join(*_data(node.inputs))  # no channel axis, but keep whatever feeds it together
        notes.block(
            [y, *_data(node.inputs)], f"{node.name} ({node.op_type}) output has rank {rank}"
        )
        return
    notes.find(y)
    for index, value in enumerate(node.inputs):
        if value is None:
            continue
        array = constant(value)
        shape = tuple(array.shape) if array is not None else shape_of(value)
        if shape is None:
            unknown(f"input {value.name!r} has an unknown shape")
            return
        axis = 1 - (rank - len(shape))  # the input's axis that broadcasts onto channel axis 1
        if axis < 0 or shape[axis] == 1:
            continue  # the same value for every channel
        if array is not None:
            notes.params.append((y, Slice(node, index, axis)))
        elif axis == 1:
            notes.join(value, y)
        else:
            unknown(f"input {value.name!r} has channels on axis {axis}")
            return


def _reduce(node: ir.Node, notes: _Notes, unknown: _Unknown) -> None:
    x, y = node.inputs[0], node.outputs[0]
    rank = _rank(x)
    axes = _ints(node, "axes", 1)
    if rank is None or not axes:
        unknown("reduces over all axes or unknown axes")
        return
    axes = [a % rank for a in axes]
    if 0 in axes or 1 in axes:
        unknown("reduces over the batch or channel axis")
        return
    notes.join(x, y)


def _concat(node: ir.Node, notes: _Notes, unknown: _Unknown) -> None:
    y = node.outputs[0]
    rank = _rank(y)
    if rank is None:
        unknown("has an output of unknown rank")
        return
    axis = node.attributes.get_int("axis", 0) % rank
    if axis != 1:
        if any(constant(v) is not None for v in node.inputs):
            unknown("joins constants along another axis")
            return
        notes.join(y, *node.inputs)
        return
    parts: list[tuple[ir.Value | None, int]] = []
    for value in node.inputs:
        count = _dim(value, 1) if value is not None else None
        if value is None or not isinstance(count, int):
            unknown("has an input of unknown channel count")
            return
        if constant(value) is not None:
            parts.append((None, count))
        else:
            notes.find(value)
            parts.append((value, count))
    notes.find(y)
    notes.derived.append((y, Derivation(node, tuple(parts))))


def _flatten_like(node: ir.Node, notes: _Notes, unknown: _Unknown) -> bool:
    """Flatten (axis 1), or a Reshape to ``[N, C*spatial]``: a derived group, channel ``c``
    becoming features ``c*spatial ...``. False when ``node`` is not that."""
    x, y = node.inputs[0], node.outputs[0]
    if x is None:
        return False
    shape, out = shape_of(x), shape_of(y)
    if shape is None or len(shape) < 2 or out is None or len(out) != 2:
        return False
    spatial = shape[2:]
    channels = shape[1]
    if not isinstance(channels, int) or not all(isinstance(d, int) for d in spatial):
        return False
    repeat = math.prod([d for d in spatial if isinstance(d, int)])
    if out[1] != channels * repeat:
        return False
    notes.find(x)
    notes.find(y)
    notes.derived.append((y, Derivation(node, ((x, channels),), repeat=repeat)))
    return True


def _flatten(node: ir.Node, notes: _Notes, unknown: _Unknown) -> None:
    if node.attributes.get_int("axis", 1) == 1 and _flatten_like(node, notes, unknown):
        return
    unknown("does not flatten from the channel axis at a static spatial size")


def _reshape(node: ir.Node, notes: _Notes, unknown: _Unknown) -> None:
    x, y = node.inputs[0], node.outputs[0]
    target = constant(node.inputs[1]) if len(node.inputs) > 1 else None
    if target is None:
        unknown("has a target shape that is not constant")
        return
    t = [int(v) for v in target.reshape(-1)]
    shape, out = (shape_of(x) if x is not None else None), shape_of(y)
    pinned = f"pins the channel count with target shape {t}"
    if shape is None or out is None or len(shape) < 2 or len(out) < 2:
        unknown(pinned)
        return
    # Later dims fixed and one of them -1 would absorb the change instead of the channel dim.
    leading_ok = t[0] in (0, -1) or (isinstance(shape[0], int) and t[0] == shape[0])
    if len(out) == 2 and leading_ok and _flatten_like(node, notes, unknown):
        if t[1] not in (-1, 0):
            notes.rewrites.append((y, (node, 1, 1)))
        return
    same_channels = out[0] == shape[0] and out[1] == shape[1] and isinstance(shape[1], int)
    rest_in = shape[2:]
    rest_out = out[2:]
    if (
        same_channels
        and leading_ok
        and all(isinstance(d, int) for d in (*rest_in, *rest_out))
        and math.prod(rest_in) == math.prod(rest_out)  # type: ignore[arg-type]
        and -1 not in t[2:]
        and t[1] in (0, -1, shape[1])
    ):
        notes.join(x, y)
        if t[1] not in (0, -1):
            notes.rewrites.append((y, (node, 1, 1)))
        return
    unknown(pinned)


def _transpose(node: ir.Node, notes: _Notes, unknown: _Unknown) -> None:
    perm = _ints(node, "perm", 99)
    if perm is not None and len(perm) >= 2 and perm[0] == 0 and perm[1] == 1:
        notes.join(node.inputs[0], node.outputs[0])
        return
    unknown("moves the channel axis")


def _squeeze(node: ir.Node, notes: _Notes, unknown: _Unknown) -> None:
    axes = _ints(node, "axes", 1)
    rank = _rank(node.outputs[0] if node.op_type == "Unsqueeze" else node.inputs[0])
    if axes and rank is not None and all(a % rank >= 2 for a in axes):
        notes.join(node.inputs[0], node.outputs[0])
        return
    unknown("moves the channel axis")


def _softmax(node: ir.Node, notes: _Notes, unknown: _Unknown) -> None:
    rank = _rank(node.inputs[0])
    axis = node.attributes.get_int("axis", -1)
    if rank is not None and axis % rank != 1:
        notes.join(node.inputs[0], node.outputs[0])
        return
    unknown("normalizes over the channels")


def _pad(node: ir.Node, notes: _Notes, unknown: _Unknown) -> None:
    pads = _ints(node, "pads", 1)
    rank = _rank(node.inputs[0])
    if len(node.inputs) > 3 and node.inputs[3] is not None:
        unknown("pads selected axes")
        return
    if pads is not None and rank is not None and pads[1] == 0 and pads[rank + 1] == 0:
        notes.join(node.inputs[0], node.outputs[0])
        return
    unknown("pads the channel axis or has pads that are not constant")


def _slice(node: ir.Node, notes: _Notes, unknown: _Unknown) -> None:
    rank = _rank(node.inputs[0])
    axes = _ints(node, "axes", 3)
    starts = _ints(node, "starts", 1)
    if axes is None and starts is not None and rank is not None:
        axes = list(range(len(starts)))
    if axes is not None and rank is not None and all(a % rank >= 2 for a in axes):
        notes.join(node.inputs[0], node.outputs[0])
        return
    unknown("slices the channel axis")


def _split(node: ir.Node, notes: _Notes, unknown: _Unknown) -> None:
    rank = _rank(node.inputs[0])
    if rank is not None and node.attributes.get_int("axis", 0) % rank >= 2:
        notes.join(node.inputs[0], *node.outputs)
        return
    unknown("splits the channel axis into fixed sizes")


def _resize(node: ir.Node, notes: _Notes, unknown: _Unknown) -> None:
    x, y = node.inputs[0], node.outputs[0]
    sizes = constant(node.inputs[3]) if node.op_type == "Resize" and len(node.inputs) > 3 else None
    if sizes is not None and sizes.size:
        notes.join(x, y)
        notes.rewrites.append((y, (node, 3, 1)))
        return
    scales_index = 2 if node.op_type == "Resize" else 1
    scales = constant(node.inputs[scales_index]) if len(node.inputs) > scales_index else None
    if scales is None:
        scales_attr = node.attributes.get("scales")
        scales = np.asarray(scales_attr.value) if scales_attr is not None else None
    if scales is not None and scales.size > 1 and float(scales.reshape(-1)[1]) == 1.0:
        notes.join(x, y)
        return
    unknown("has scales that are not constant or scale the channels")


def _shape(node: ir.Node, notes: _Notes, unknown: _Unknown) -> None:
    rank = _rank(node.inputs[0])
    start = node.attributes.get_int("start", 0)
    end = node.attributes.get_int("end", rank if rank is not None else 1 << 30)
    if rank is not None:
        start, end = (start % rank if start < 0 else start), (end % rank if end < 0 else end)
        if not start <= 1 < end:
            return  # reads the batch or spatial sizes only
    notes.block([node.inputs[0]], f"{node.name} (Shape) reads the channel count")


_HANDLERS = {
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
    "Gemm": _gemm,
    "MatMul": _matmul,
    "BatchNormalization": _batch_norm,
    "InstanceNormalization": _instance_norm,
    "Concat": _concat,
    "Flatten": _flatten,
    "Reshape": _reshape,
    "Transpose": _transpose,
    "Squeeze": _squeeze,
    "Unsqueeze": _squeeze,
    "Softmax": _softmax,
    "LogSoftmax": _softmax,
    "Pad": _pad,
    "Slice": _slice,
    "Split": _split,
    "Resize": _resize,
    "Upsample": _resize,
    "Shape": _shape,
}
