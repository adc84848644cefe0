"""Writing weights wherever a model keeps them: initializers or Constant nodes.

Paddle's exporter, for one, keeps every weight in a Constant node; PyTorch's in initializers.
Pruning edits a weight as seen by one node: when nobody else reads it, in place (same name, same
storage kind); when it is shared, the node gets its own copy, so the other readers keep theirs.
Reading them is :func:`ferry.graph.constant`'s job.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ferry.graph import constant

_ONNX_DOMAINS = ("", "ai.onnx")


def is_op(node: ir.Node, *ops: str) -> bool:
    """Whether ``node`` is one of the default-domain ``ops``."""
    return node.domain in _ONNX_DOMAINS and node.op_type in ops


def write(node: ir.Node, index: int, array: np.ndarray, *, shared_too: bool = False) -> None:
    """Give ``node``'s input ``index`` (a weight) the new contents ``array``.

    Before -> After::

        W (read by node only)          ->  W, new contents (initializer or Constant node as before)
        W (read by node and others)    ->  W unchanged; node reads a new initializer W.pruned.<node>

    ``shared_too`` changes a shared weight for every reader (zeroing weights, where every
    reader wants the same result, rather than changing one layer's shape).
    """
    value = node.inputs[index]
    if value is None:
        raise ValueError(f"{node.name} has no input {index} to write")
    array = np.ascontiguousarray(array)
    shared = not shared_too and (len(value.uses()) > 1 or value.is_graph_output())
    producer = value.producer()
    if not shared and value.const_value is not None:
        value.const_value = ir.tensor(array, name=value.name)
        _retype(value, array)
        return
    if not shared and producer is not None and is_op(producer, "Constant"):
        for key in [k for k in producer.attributes if k.startswith("value")]:
            del producer.attributes[key]
        producer.attributes["value"] = ir.Attr(
            "value", ir.AttributeType.TENSOR, ir.tensor(array, name=value.name)
        )
        _retype(value, array)
        return
    graph = node.graph
    if graph is None:
        raise ValueError(f"{node.name} is not in a graph")
    name = f"{value.name}.pruned.{node.name}"
    copy = ir.Value(name=name, const_value=ir.tensor(array, name=name))
    _retype(copy, array)
    graph.register_initializer(copy)
    node.replace_input_with(index, copy)


def _retype(value: ir.Value, array: np.ndarray) -> None:
    value.shape = ir.Shape(array.shape)
    value.dtype = ir.DataType.from_numpy(array.dtype)


def weight_inputs(node: ir.Node) -> list[tuple[int, int]]:
    """``(input index, reduction axis)`` of the weight ``node`` multiplies by, for the layers that
    carry the model's parameters (Conv, ConvTranspose, Gemm, MatMul); empty for other nodes or
    when the weight is not constant. The reduction axis is the input-channel axis."""
    if is_op(node, "Conv") and constant(_input(node, 1)) is not None:
        return [(1, 1)]
    if is_op(node, "ConvTranspose") and constant(_input(node, 1)) is not None:
        return [(1, 0)]
    if is_op(node, "Gemm"):
        found = []
        if constant(_input(node, 1)) is not None:
            found.append((1, 1 if node.attributes.get_int("transB", 0) else 0))
        return found
    if is_op(node, "MatMul"):
        b = constant(_input(node, 1))
        if b is not None and b.ndim >= 2:
            return [(1, b.ndim - 2)]
    return []


def _input(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if len(node.inputs) > index else None
