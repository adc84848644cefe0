"""Counting a model's FLOPs (and multiply-accumulates): Conv, ConvTranspose, MatMul and Gemm.

A multiply-add counts as two FLOPs and one MAC. Symbolic dims count as 1 unless input shapes are
given, so the figure for a symbolic batch is per sample.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import onnx_ir as ir

from ferry.graph._dims import Dim, shape_of
from ferry.graph._prepare import infer_value_types
from ferry.graph._shapes import with_input_shapes
from ferry.graph._tensors import constant_tensor

__all__ = ["FlopCount", "flops"]

#: What ``infer_value_types`` gives: value name -> (dtype name, shape).
_ValueTypes = Mapping[str, tuple[str | None, tuple[Dim, ...] | None]]

#: Reads a value's dims for FLOP counting: a list of sizes, or None when unknown.
_DimsOf = Callable[[ir.Value | None], list[int] | None]


class FlopCount(NamedTuple):
    """FLOPs of one inference, and the nodes they could not be counted for."""

    #: FLOPs of the Conv, ConvTranspose, MatMul and Gemm nodes, subgraphs included.
    flops: int
    #: Nodes of those op types whose shapes stay unknown (they count 0).
    unknown_nodes: int

    @property
    def macs(self) -> int:
        """Multiply-accumulates: half the FLOPs."""
        return self.flops // 2


def flops(
    model: ir.Model,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    *,
    value_types: _ValueTypes | None = None,
) -> FlopCount:
    """Count the FLOPs of one inference of ``model`` (a multiply-add is two).

    A value's dims are, in order: its constant's (a weight's shape is its tensor's), its declared
    ones when all known, else ONNX shape inference's; with ``input_shapes``, inference at those
    shapes comes first. Symbolic dims that remain count as 1.

    Args:
        model: the model (not changed).
        input_shapes: concrete shapes of (some of) the inputs to count at.
        value_types: ``infer_value_types(model)`` when the caller has it already (only used
            without ``input_shapes``): inference is not run twice.

    Raises:
        InvalidInputError: ``input_shapes`` names an input the model does not have, or gives it
            another rank or a fixed dim another size.
    """
    if input_shapes:
        at = with_input_shapes(model, input_shapes, option="--shape")
        dims = _dims_reader(infer_value_types(at), concrete=True)
    else:
        dims = _dims_reader(
            value_types if value_types is not None else infer_value_types(model), concrete=False
        )
    total = 0
    unknown = 0
    for node in model.graph.all_nodes():
        if node.domain not in ("", "ai.onnx") or node.op_type not in _FLOP_COUNTERS:
            continue
        estimate = _FLOP_COUNTERS[node.op_type](node, dims)
        if estimate is None:
            unknown += 1
        else:
            total += estimate
    return FlopCount(total, unknown)


def _dims_reader(types: _ValueTypes, concrete: bool) -> _DimsOf:
    """A constant's dims, else declared ones, else inferred ones (``types``), symbolic dims as
    1; with ``concrete`` types (inferred at given input shapes), those come first."""

    def dims(value: ir.Value | None) -> list[int] | None:
        if value is None:
            return None
        inferred = types.get(value.name or "", (None, None))[1]
        if concrete and inferred is not None:
            shape: tuple[Dim, ...] | None = inferred
        else:
            tensor = constant_tensor(value)
            if tensor is not None:
                return list(tensor.shape.numpy())
            shape = shape_of(value)
            if shape is None or any(d is None for d in shape):
                shape = inferred
        if shape is None:
            return None
        return [d if isinstance(d, int) else 1 for d in shape]

    return dims


def _conv_flops(node: ir.Node, dims: _DimsOf) -> int | None:
    w = dims(_input(node, 1))
    out = dims(node.outputs[0])
    if w is None or out is None or len(out) < 2:
        return None
    # out [N, M, *spatial]; weight [M, C/group, *kernel]: each output element is one dot product.
    return 2 * math.prod(out) * math.prod(w[1:])


def _conv_transpose_flops(node: ir.Node, dims: _DimsOf) -> int | None:
    x = dims(_input(node, 0))
    w = dims(_input(node, 1))
    if x is None or w is None:
        return None
    # Each input element scatters into (M/group) * prod(kernel) outputs: weight [C, M/group, *k].
    return 2 * math.prod(x) * math.prod(w[1:])


def _matmul_flops(node: ir.Node, dims: _DimsOf) -> int | None:
    a = dims(_input(node, 0))
    out = dims(node.outputs[0])
    if a is None or out is None or not a:
        return None
    return 2 * math.prod(out) * a[-1]


def _gemm_flops(node: ir.Node, dims: _DimsOf) -> int | None:
    a = dims(_input(node, 0))
    out = dims(node.outputs[0])
    if a is None or out is None or len(a) != 2:
        return None
    trans_a = node.attributes.get_int("transA", 0)
    k = a[0] if trans_a else a[1]
    return 2 * math.prod(out) * k


def _input(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if index < len(node.inputs) else None


_FLOP_COUNTERS = {
    "Conv": _conv_flops,
    "ConvTranspose": _conv_transpose_flops,
    "MatMul": _matmul_flops,
    "Gemm": _gemm_flops,
}
