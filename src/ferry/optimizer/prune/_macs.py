"""Multiply-accumulates of a model's layers, at static shapes."""

from __future__ import annotations

import math
from pathlib import Path

import onnx_ir as ir

from ferry.graph import infer_value_types, load_model, shape_of
from ferry.optimizer.prune._weights import is_op, read


def macs(model: ir.Model | str | Path) -> int:
    """Multiply-accumulates of the model's Conv, ConvTranspose, Gemm and MatMul nodes.

    Shapes are the declared ones, else ONNX shape inference's; a symbolic dim counts as 1 (so a
    symbolic batch gives the figure per sample). A node whose shapes stay unknown counts 0.

    Args:
        model: the model, or a path to one.

    Returns:
        The number of multiply-accumulates of one run.
    """
    model = load_model(model)
    inferred = infer_value_types(model)

    def dims(value: ir.Value | None) -> list[int] | None:
        if value is None:
            return None
        array = read(value)
        if array is not None:
            return list(array.shape)
        shape = shape_of(value)
        if shape is None or any(d is None for d in shape):
            shape = inferred.get(value.name or "", (None, None))[1]
        if shape is None:
            return None
        return [d if isinstance(d, int) else 1 for d in shape]

    total = 0
    for node in model.graph.all_nodes():
        inputs = [*node.inputs, None, None]
        out = dims(node.outputs[0]) if node.outputs else None
        if is_op(node, "Conv"):
            w = dims(inputs[1])
            if w is not None and out is not None:
                # Each output element is one dot product over C/group * kernel.
                total += math.prod(out) * math.prod(w[1:])
        elif is_op(node, "ConvTranspose"):
            x, w = dims(inputs[0]), dims(inputs[1])
            if x is not None and w is not None:
                # Each input element scatters into (M/group) * kernel outputs.
                total += math.prod(x) * math.prod(w[1:])
        elif is_op(node, "Gemm"):
            a = dims(inputs[0])
            if a is not None and out is not None and len(a) == 2:
                k = a[0] if node.attributes.get_int("transA", 0) else a[1]
                total += math.prod(out) * k
        elif is_op(node, "MatMul"):
            a = dims(inputs[0])
            if a is not None and out is not None and a:
                total += math.prod(out) * a[-1]
    return total
