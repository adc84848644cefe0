"""Nodes whose inputs are all constants, computed at export (ONNX's reference evaluator).

The optimizer folds what it can before the lowering; what remains constant after its size limits
or after the lowering's own folding (Shape of a static tensor...) is computed here, so that no
TFLite op computes what is known at export time.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir

__all__ = ["MAX_FOLDED_ELEMENTS", "evaluate"]

logger = logging.getLogger(__name__)

#: Results above this many elements are left to the model (a folded constant is stored in full).
MAX_FOLDED_ELEMENTS = 1 << 22

#: Ops never folded: their result depends on more than their inputs.
_KEEP = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial"}

#: Ops whose older versions ONNX's reference evaluator does not implement (onnx 1.17 to 1.23
#: have DequantizeLinear from version 19 only), with the first version it has: later versions
#: only added input types (float8, int4, blocks), so the older types compute the same there.
#: Without it, every weight-only quantized model's DequantizeLinear of int8 weights at opset
#: 10 to 18 stays unfolded and its convolutions see weights "computed at run time".
_EVALUATED_FROM = {"DequantizeLinear": 19}


def evaluate(
    node: ir.Node, inputs: Sequence[np.ndarray | None], opset: int
) -> list[np.ndarray] | None:
    """``node``'s outputs computed from constant ``inputs`` (None for an omitted input), or None
    when it cannot be (an op with subgraphs, a random op, a result too large, an evaluator error).
    """
    if node.op_type in _KEEP or any(
        a.type == ir.AttributeType.GRAPH for a in node.attributes.values()
    ):
        return None
    if node.domain not in ("", "ai.onnx"):
        return None
    names = [f"in{i}" if v is not None else "" for i, v in enumerate(inputs)]
    outs = [f"out{i}" for i in range(len(node.outputs))]
    proto = ir.serde.serialize_node(node)
    del proto.input[:]
    proto.input.extend(names)
    del proto.output[:]
    proto.output.extend(outs)
    graph = onnx.helper.make_graph(
        [proto],
        "fold",
        [
            onnx.helper.make_tensor_value_info(
                n, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape
            )
            for n, v in zip(names, inputs)
            if v is not None
        ],
        [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None) for n in outs],
    )
    opset = max(opset, _EVALUATED_FROM.get(node.op_type, 0))
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    try:
        from onnx.reference import ReferenceEvaluator

        results = ReferenceEvaluator(model).run(
            None, {n: v for n, v in zip(names, inputs) if v is not None}
        )
    except Exception as e:  # the evaluator raises many types; folding is an optimization here
        logger.debug("cannot fold %s (%s): %s", node.name, node.op_type, e)
        return None
    arrays = [np.asarray(r) for r in results]
    if sum(a.size for a in arrays) > MAX_FOLDED_ELEMENTS:
        return None
    return arrays
