"""Reshape targets computed from shapes at run time, made constant where symbolic shapes prove them.

PyTorch's tracer writes ``x.view(x.size(0), x.size(1), -1)`` as ``Shape -> Gather -> Unsqueeze
-> Concat -> Reshape``: four to eight small nodes per reshape, run on every call, and each one a
place where a partition boundary or an engine's static-shape compiler stumbles. With symbolic
shape inference (ONNX Runtime's, which names every unknown dim and follows shape arithmetic) the
output's dims are known in terms of the input's, and the target can be written as a constant::

    Reshape(x[N, S, 8, 8], Concat(Shape(x)[0:2], [-1]))   ->  Reshape(x, [0, 0, -1])
    Reshape(x[1, S, 64], Concat([1], Shape(x)[1:2], [8, 8]))  ->  Reshape(x, [1, 0, 8, 8])

Each output dim becomes its fixed size, 0 when it is the input's dim at the same index (the same
symbol), and -1 for at most one dim left unknown. A Reshape whose output has two unknown dims
keeps its computed target; so does one with ``allowzero=1`` or a zero-size dim. Unused shape
arithmetic is then dead code.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import onnx
import onnx_ir as ir

from ferry.graph import Dim, inference_proto, proto_shapes, shape_of, symbolic_shape_inference
from ferry.optimizer.rules._context import RuleContext
from ferry.optimizer.rules.common._constants import constant_ints, replace_value

__all__ = ["StaticShapesPass", "passes"]

logger = logging.getLogger(__name__)


_RESHAPE_LIKE = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})


class StaticShapesPass(ir.passes.InPlacePass):
    """Shape arithmetic that symbolic shape inference proves, made constant.

    Before -> After::

        Reshape(x[N, S, 64], Concat(Slice(Shape(x), 0, 2), [-1]))  ->  Reshape(x, [0, 0, -1])
        Shape(y) where y is [1, 64, 56, 56] once inferred            ->  [1, 64, 56, 56]
        Unsqueeze(Squeeze(x[N, 36, 1, 172], 2), 3)                  ->  Reshape(x, [0, 36, 172, 1])
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        candidates = [
            node
            for node in graph
            if node.domain in ("", "ai.onnx")
            and (
                node.op_type in ("Shape", "Size")
                or (node.op_type == "Reshape" and _runtime_target(node))
                or (node.op_type in _RESHAPE_LIKE and _reshape_like_input(node) is not None)
                or node.op_type == "Transpose"
            )
        ]
        if not candidates:
            return ir.passes.PassResult(model, modified=False)
        # ONNX Runtime's inference stops at the first op it cannot follow (what it found up to
        # there still counts); ONNX's, in the values' shapes, fills in past it.
        inferred = symbolic_shape_inference(_without_declared_outputs(inference_proto(model)))
        if inferred is None:
            return ir.passes.PassResult(model, modified=False)
        shapes = proto_shapes(inferred)
        for value in graph.inputs:
            declared = shape_of(value)
            if value.name and declared is not None:
                shapes.setdefault(value.name, declared)

        def shape(value: ir.Value | None) -> tuple[Dim, ...] | None:
            if value is None:
                return None
            found = shapes.get(value.name or "")
            # A graph output's declared shape is the exporter's word, often wrong (an old
            # PyTorch export declares [1, seqlen] for a [20, 1, 8210] output).
            return found if value.is_graph_output() else _merged(found, shape_of(value))

        modified = False
        for node in candidates:
            if node.graph is None:
                continue  # removed by an earlier replacement in this pass
            if node.op_type in ("Shape", "Size"):
                modified |= _fold_shape(graph, node, shape(node.inputs[0]))
                continue
            if node.op_type == "Transpose":
                modified |= _unit_transpose_to_reshape(graph, node, shape(node.inputs[0]))
                continue
            source = (
                _reshape_like_input(node)
                if node.op_type != "Reshape" or not _runtime_target(node)
                else None
            )
            data = source if source is not None else node.inputs[0]
            target = _target(shape(data), shape(node.outputs[0]))
            if target is None and source is None and node.op_type == "Reshape":
                target = _copied_dims_target(node)
            if target is None:
                continue
            constant = _initializer(
                graph, f"{node.outputs[0].name}_target", np.array(target, np.int64)
            )
            if node.op_type == "Reshape" and source is None:
                node.replace_input_with(1, constant)
            else:
                reshape = ir.node("Reshape", [data, constant], name=f"{node.name}_reshape")
                graph.insert_before(node, reshape)
                replace_value(graph, node.outputs[0], reshape.outputs[0])
            modified = True
        return ir.passes.PassResult(model, modified=modified)


def _without_declared_outputs(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with its outputs' declared shapes out of inference's sight: each output is read
    through an Identity into a shapeless stand-in. Declared output shapes are the exporter's word
    and often wrong (an old PyTorch export declares [1, seqlen] for a [20, 1, 8210] output);
    simply clearing them makes ONNX Runtime's inference stop at the first node reading one."""
    outputs = list(proto.graph.output)
    del proto.graph.output[:]
    for output in outputs:
        stand_in = onnx.ValueInfoProto(name=f"{output.name}__ferry_declared")
        stand_in.type.tensor_type.elem_type = output.type.tensor_type.elem_type
        proto.graph.node.append(onnx.helper.make_node("Identity", [output.name], [stand_in.name]))
        proto.graph.output.append(stand_in)
    return proto


def _merged(
    symbolic: tuple[Dim, ...] | None, declared: tuple[Dim, ...] | None
) -> tuple[Dim, ...] | None:
    """One shape from ONNX Runtime's symbolic inference and the value's own (ONNX inference's):
    a fixed size either found wins (ORT's inference gives up on some ops, e.g. ConvInteger, and
    names the dim instead); sizes that contradict each other make the dim unknown."""
    if symbolic is None or declared is None or len(symbolic) != len(declared):
        return symbolic if symbolic is not None else declared
    dims: list[Dim] = []
    for a, b in zip(symbolic, declared, strict=True):
        if isinstance(a, int) and isinstance(b, int):
            dims.append(a if a == b else None)
        elif isinstance(b, int):
            dims.append(b)
        else:
            dims.append(a)
    return tuple(dims)


def _runtime_target(node: ir.Node) -> bool:
    """A Reshape whose target is computed at run time (and that may take a constant one)."""
    return (
        len(node.inputs) > 1
        and node.inputs[1] is not None
        and node.inputs[1].const_value is None
        and (node.attributes.get_int("allowzero") or 0) == 0
    )


def _reshape_like_input(node: ir.Node) -> ir.Value | None:
    """For a reshape-like node fed by another: the first one's input (the chain's source)."""
    if node.op_type not in _RESHAPE_LIKE or (node.attributes.get_int("allowzero") or 0):
        return None
    data = node.inputs[0] if node.inputs else None
    producer = data.producer() if data is not None else None
    if (
        producer is None
        or producer.op_type not in _RESHAPE_LIKE
        or producer.domain not in ("", "ai.onnx")
    ):
        return None
    if producer.attributes.get_int("allowzero") or 0:
        return None
    return producer.inputs[0]


def _copied_dims_target(reshape: ir.Node) -> list[int] | None:
    """A run-time Reshape target built from the data's own dims at the same index and constants
    (``Concat(Unsqueeze(Gather(Shape(x), 0)), [1024])``), as a constant (``[0, 1024]``); found
    from the graph's structure where shape inference cannot follow the model (contrib ops)."""
    data, target = reshape.inputs[0], reshape.inputs[1]
    concat = target.producer() if target is not None else None
    if (
        data is None
        or concat is None
        or concat.op_type != "Concat"
        or concat.domain not in ("", "ai.onnx")
    ):
        return None
    dims: list[int] = []
    for piece in concat.inputs:
        known = constant_ints(piece)
        if known is not None:
            dims += known
            continue
        index = _own_dim_index(piece, data)
        if index is None or index != len(dims):
            dims.append(-1)
        else:
            dims.append(0)
    if dims.count(-1) > 1:
        return None
    return dims


def _own_dim_index(piece: ir.Value | None, data: ir.Value) -> int | None:
    """``i`` when ``piece`` is ``Unsqueeze(Gather(Shape(data), i), [0])``; else None."""
    unsqueeze = piece.producer() if piece is not None else None
    if unsqueeze is None or unsqueeze.op_type != "Unsqueeze":
        return None
    axes = unsqueeze.attributes.get("axes")
    axes_list = (
        list(axes.as_ints())
        if axes is not None
        else constant_ints(unsqueeze.inputs[1] if len(unsqueeze.inputs) > 1 else None)
    )
    gather = unsqueeze.inputs[0].producer() if unsqueeze.inputs[0] is not None else None
    if (
        axes_list != [0]
        or gather is None
        or gather.op_type != "Gather"
        or (gather.attributes.get_int("axis") or 0)
    ):
        return None
    shape = gather.inputs[0].producer() if gather.inputs[0] is not None else None
    index = constant_ints(gather.inputs[1])
    if (
        shape is None
        or shape.op_type != "Shape"
        or shape.inputs[0] is not data
        or index is None
        or len(index) != 1
    ):
        return None
    start = shape.attributes.get_int("start") or 0
    if start < 0 or index[0] < 0:
        return None
    return start + index[0]


def _unit_transpose_to_reshape(
    graph: ir.Graph, node: ir.Node, dims: tuple[Dim, ...] | None
) -> bool:
    """A Transpose that only moves dims of size 1 reads memory in the same order: a Reshape.

    Before -> After::

        Transpose(x[N, 2, 1, 512], perm=[0, 2, 1, 3])  ->  Reshape(x, [0, 1, 2, 512])
    """
    perm = node.attributes.get("perm")
    if dims is None or perm is None:
        return False
    order = list(perm.as_ints())
    if sorted(order) != list(range(len(dims))):
        return False
    moved = [i for i in order if dims[i] != 1]
    if moved != sorted(moved):
        return False
    target = _target(dims, tuple(dims[i] for i in order))
    if target is None:
        return False
    constant = _initializer(graph, f"{node.outputs[0].name}_target", np.array(target, np.int64))
    reshape = ir.node("Reshape", [node.inputs[0], constant], name=f"{node.name}_reshape")
    graph.insert_before(node, reshape)
    replace_value(graph, node.outputs[0], reshape.outputs[0])
    return True


def _fold_shape(graph: ir.Graph, node: ir.Node, dims: tuple[Dim, ...] | None) -> bool:
    """Replace a Shape (with its start/end) or Size of a statically shaped value by a constant."""
    if dims is None:
        return False
    if node.op_type == "Size":
        if not all(isinstance(d, int) for d in dims):
            return False
        value = np.array(math.prod(d for d in dims if isinstance(d, int)), np.int64)
    else:
        rank = len(dims)
        start = node.attributes.get_int("start") or 0
        end = node.attributes.get_int("end")
        end = rank if end is None else end
        start, end = (max(0, min(rank, i + rank if i < 0 else i)) for i in (start, end))
        picked = dims[start:end]
        if not all(isinstance(d, int) for d in picked):
            return _fold_static_parts(graph, node, picked)
        value = np.array(picked, np.int64)
    constant = _initializer(graph, f"{node.outputs[0].name}_static", value)
    replace_value(graph, node.outputs[0], constant)
    return True


def _fold_static_parts(graph: ir.Graph, node: ir.Node, dims: tuple[Dim, ...]) -> bool:
    """For a Shape with some symbolic dims: its readers that pick only static dims
    (``Gather`` of constant indices) become constants."""
    modified = False
    for user, _ in list(node.outputs[0].uses()):
        if (
            user.op_type != "Gather"
            or user.domain not in ("", "ai.onnx")
            or (user.attributes.get_int("axis") or 0)
        ):
            continue
        index_value = user.inputs[1]
        indices = constant_ints(index_value)
        if indices is None or index_value is None or index_value.const_value is None:
            continue
        shape = index_value.const_value.shape
        picked = [dims[i] for i in indices if -len(dims) <= i < len(dims)]
        if len(picked) != len(indices) or not all(isinstance(d, int) for d in picked):
            continue
        value = np.array(picked, np.int64).reshape(shape.numpy())
        replace_value(
            graph, user.outputs[0], _initializer(graph, f"{user.outputs[0].name}_static", value)
        )
        modified = True
    return modified


def _initializer(graph: ir.Graph, base: str, array: np.ndarray) -> ir.Value:
    name, n = base, 0
    while name in graph.initializers:
        n += 1
        name = f"{base}_{n}"
    value = ir.Value(name=name, const_value=ir.tensor(array, name=name))
    value.shape = ir.Shape(array.shape)
    value.dtype = ir.DataType.INT64
    graph.register_initializer(value)
    return value


def _target(source: tuple[Dim, ...] | None, result: tuple[Dim, ...] | None) -> list[int] | None:
    """The constant target that reshapes a tensor of shape ``source`` to ``result``; None when
    the shapes do not determine one."""
    if source is None or result is None:
        return None
    target: list[int] = []
    unknown = 0
    for i, d in enumerate(result):
        if isinstance(d, int):
            if d == 0:
                return None  # a 0 in the target would copy, not mean an empty dim
            target.append(d)
        elif d is not None and i < len(source) and source[i] == d:
            target.append(0)
        else:
            unknown += 1
            target.append(-1)
    if unknown > 1 or any(d == 0 for d in source):
        return None
    return target


def passes(ctx: RuleContext) -> list[ir.passes.PassBase]:
    """Every level."""
    return [StaticShapesPass()]
