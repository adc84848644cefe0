"""Shape arithmetic folded before the lowering where the optimizer is not run (the ``litert``
backend): nodes computed from constants and static sizes alone become initializers, so that
shape inference sees through them.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ferry.graph import constant
from ferry.tflite._onnx_to_tflite._fold import evaluate

__all__ = ["fold_constants"]


#: Ops folded by :func:`fold_constants` only through what they are given (their results depend
#: on the quantization the lowering reads from them).
_QDQ = {"QuantizeLinear", "DequantizeLinear"}


def fold_constants(model: ir.Model) -> int:
    """Replace nodes computed from constants alone (and Shape/Size of a tensor of static shape)
    by initializers; return how many were. Graph outputs are left as they are.

    Before -> After::

        Shape(x[1,3,224,224]) -> Gather(2) -> Div(2) -> Concat -> Pad(x, pads)
            -> Pad(x, pads = initializer [0,0,56,56,...])  (then inference knows Pad's shape)
    """
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 13))
    count = 0
    for node in list(model.graph):
        if node.domain not in ("", "ai.onnx") or node.op_type in _QDQ:
            continue
        if any(out.is_graph_output() for out in node.outputs):
            continue
        results = _static_shape(node)
        if results is None:
            consts = [constant(v) for v in node.inputs]
            if any(c is None and v is not None for v, c in zip(node.inputs, consts)):
                continue
            results = evaluate(node, consts, opset)
        if results is None or len(results) != len(node.outputs):
            continue
        for value, array in zip(node.outputs, results):
            name = value.name
            tensor = ir.tensor(array, name=name)
            const = ir.Value(name=name, shape=ir.Shape(array.shape), const_value=tensor)
            const.dtype = tensor.dtype
            ir.convenience.replace_all_uses_with(value, const)
            value.name = None
            model.graph.register_initializer(const)
        model.graph.remove(node, safe=True)
        count += 1
    return count


def _static_shape(node: ir.Node) -> list[np.ndarray] | None:
    """A Shape or Size node's result, when its input's shape is static."""
    if node.op_type not in ("Shape", "Size") or not node.inputs or node.inputs[0] is None:
        return None
    shape = node.inputs[0].shape
    sizes = [d for d in shape if isinstance(d, int)] if shape is not None else []
    if shape is None or len(sizes) != len(shape):
        return None
    dims = np.asarray(sizes, dtype=np.int64)
    if node.op_type == "Size":
        return [np.asarray(int(np.prod(dims)), dtype=np.int64)]
    rank = len(dims)
    start_attr, end_attr = node.attributes.get("start"), node.attributes.get("end")
    start = int(start_attr.value) if start_attr is not None else 0
    stop = int(end_attr.value) if end_attr is not None else rank
    start = start + rank if start < 0 else start
    stop = stop + rank if stop < 0 else stop
    return [dims[max(start, 0) : min(stop, rank)]]
