"""bfloat16 conversion: weights and compute in bf16, numerically sensitive ops and the graph's
inputs and outputs in float32.

Before -> After::

    x:f32 -> Conv(W:f32) -> Relu -> Softmax -> y:f32
    x:f32 -> Cast(bf16) -> Conv(W:bf16) -> Relu -> Cast(f32) -> Softmax -> y:f32

A node computes in bf16 when its op is in the standard domain, has no subgraph, sets no output
type by attribute (Cast, Constant...), is not kept, and its schema at the model's opset takes
bf16 wherever it takes the float tensors it is given (a type constraint binds inputs and outputs
together: Conv's X, W, B and Y are all bf16 or none). Inputs a schema types alone (Resize's
scales) stay float. A float value read both by bf16 and by float nodes is cast once per side.
Models below opset 22 are converted first: that is where Conv, pooling and most activations
take bf16.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

import ml_dtypes
import onnx
import onnx_ir as ir

from ferry.graph import prepare

__all__ = ["BF16_OPSET", "to_bf16", "upgrade_opset"]

#: The first opset whose Conv, MaxPool, GlobalAveragePool and HardSwish take bfloat16.
BF16_OPSET = 22
#: Ops whose output type an attribute sets, and so cannot follow their inputs into bf16.
_TYPED_BY_ATTRIBUTE = {
    "Cast", "CastLike", "Constant", "ConstantOfShape", "EyeLike", "RandomNormal",
    "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli",
}  # fmt: skip
_FLOAT, _BF16 = ir.DataType.FLOAT, ir.DataType.BFLOAT16


def to_bf16(model: ir.Model, keep: Collection[str]) -> tuple[ir.Model, int]:
    """``model`` (a copy) with every node it can computing in bf16, ops in ``keep`` in float32.

    Returns:
        The converted model and how many nodes compute in bf16.
    """
    work = ir.from_proto(ir.to_proto(model))
    if upgrade_opset(work, BF16_OPSET):
        work = prepare(work)  # the types of what the converter added
    opset = work.opset_imports.get("", BF16_OPSET)
    graph = work.graph
    reads: set[tuple[ir.Node, int]] = set()  # (node, input) pairs that read bf16
    made: list[ir.Value] = []  # outputs of converted nodes, now bf16
    casts: dict[ir.Value, ir.Value] = {}  # float value -> its Cast to bf16
    weights: list[ir.Value] = []  # float initializers some converted node reads
    for node in list(graph):
        slots = _bf16_slots(node, opset, keep)
        if slots is None:
            continue
        inputs, outputs = slots
        for index in inputs:
            value = node.inputs[index]
            assert value is not None
            reads.add((node, index))
            if value.dtype == _BF16:
                continue
            if value.is_initializer() and value.const_value is not None:
                weights.append(value)  # converted below, once every reader is known
                continue
            if value not in casts:
                cast = ir.node("Cast", [value], attributes={"to": _BF16})
                cast.outputs[0].dtype, cast.outputs[0].shape = _BF16, value.shape
                cast.outputs[0].name = f"{value.name}_bf16" if value.name else None
                graph.insert_before(node, cast)
                casts[value] = cast.outputs[0]
            node.replace_input_with(index, casts[value])
        for index in outputs:
            node.outputs[index].dtype = _BF16
            made.append(node.outputs[index])
    for weight in dict.fromkeys(weights):
        _weight_to_bf16(graph, weight, reads)
    for value in made:
        _float_for_float_readers(graph, value, reads)
    return work, len({v.producer() for v in made})


def upgrade_opset(model: ir.Model, version: int) -> bool:
    """Convert ``model`` in place to opset ``version`` if it is below; whether it was."""
    if model.opset_imports.get("", 1) >= version:
        return False
    from onnxscript.version_converter import ConvertVersionPass

    converter_log = logging.getLogger("onnxscript.version_converter")
    level = converter_log.level
    converter_log.setLevel(logging.ERROR)  # its fallback to onnx's converter is routine here
    try:
        ConvertVersionPass(target_version=version, fallback=True)(model)
    finally:
        converter_log.setLevel(level)
    return True


def _bf16_slots(
    node: ir.Node, opset: int, keep: Collection[str]
) -> tuple[list[int], list[int]] | None:
    """The input and output positions ``node`` would turn to bf16, or None to leave it float."""
    if node.domain not in ("", "ai.onnx") or node.op_type in keep:
        return None
    if node.op_type in _TYPED_BY_ATTRIBUTE or any(
        a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
        for a in node.attributes.values()
    ):
        return None
    try:
        schema = onnx.defs.get_schema(node.op_type, opset)
    except onnx.defs.SchemaError:
        return None
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    sides: tuple[tuple[Any, list[ir.Value | None]], ...] = (
        (schema.inputs, list(node.inputs)),
        (schema.outputs, list(node.outputs)),
    )
    bound: list[tuple[int, int, str, ir.Value]] = []  # (side, index, type parameter, value)
    for side, (formals, values) in enumerate(sides):
        for index, value in enumerate(values):
            if value is not None and formals:
                # The last formal may be variadic (Concat's inputs, Split's outputs).
                bound.append((side, index, formals[min(index, len(formals) - 1)].type_str, value))
    if any(value.dtype is None for *_, value in bound):
        return None  # an unknown type: do not guess
    floats = (_FLOAT, _BF16)  # bf16: made so by a node converted before this one
    chosen = {t for _, _, t, value in bound if value.dtype in floats and t in allowed}
    if not chosen or any("tensor(bfloat16)" not in allowed[t] for t in chosen):
        return None
    slots: tuple[list[int], list[int]] = ([], [])
    for side, index, t, value in bound:
        if t in chosen:
            if value.dtype not in floats:
                return None  # a parameter bound to float and to something else: not ours
            slots[side].append(index)
    return slots


def _weight_to_bf16(graph: ir.Graph, weight: ir.Value, reads: set[tuple[ir.Node, int]]) -> None:
    """A float initializer read by converted nodes becomes bf16: in place when only they read
    it, else a bf16 twin for them."""
    tensor = weight.const_value
    assert tensor is not None
    array = tensor.numpy().astype(ml_dtypes.bfloat16)
    uses = list(weight.uses())
    if all(use in reads for use in uses) and not weight.is_graph_output():
        weight.const_value = ir.Tensor(array, name=weight.name)
        weight.dtype = _BF16
        return
    twin = ir.Value(name=f"{weight.name}_bf16", const_value=ir.Tensor(array))
    twin.dtype, twin.shape = _BF16, weight.shape
    graph.register_initializer(twin)
    for user, index in uses:
        if (user, index) in reads:
            user.replace_input_with(index, twin)


def _float_for_float_readers(
    graph: ir.Graph, value: ir.Value, reads: set[tuple[ir.Node, int]]
) -> None:
    """A bf16 ``value``'s float readers (nodes and inputs left float, the graph's outputs) read
    one Cast back to float."""
    readers = [use for use in value.uses() if use not in reads]
    if not readers and not value.is_graph_output():
        return
    producer = value.producer()
    assert producer is not None
    cast = ir.node("Cast", [value], attributes={"to": _FLOAT})
    back = cast.outputs[0]
    back.dtype, back.shape = _FLOAT, value.shape
    graph.insert_after(producer, cast)
    for user, index in readers:
        user.replace_input_with(index, back)
    if value.is_graph_output():
        name = value.name
        for index, out in enumerate(graph.outputs):
            if out is value:
                graph.outputs[index] = back
        value.name = f"{name}_bf16"
        back.name = name
    else:
        back.name = f"{value.name}_f32" if value.name else None
