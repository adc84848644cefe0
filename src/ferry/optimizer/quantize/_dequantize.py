"""The float graph a reduced-precision model stands for, for ``quantize(..., requantize=True)``.

Before -> After::

    W_int8 -> DequantizeLinear(s, zp) -> Conv           W_float (= (W_int8 - zp) * s) -> Conv
    x -> QuantizeLinear -> DequantizeLinear -> Relu      x -> Relu
    W_int8 -> Cast(float) -> Mul(s) -> MatMul            W_float -> MatMul
    x -> DynamicQuantizeLinear -> ConvInteger(W_uint8, zp_x, zp_w) -> [+ int32 bias] -> Cast -> Mul(s_x * s_w)
                                                         x -> Conv(W - zp_w) -> [+ bias] -> Mul(s_w)
    x -> MatMulInteger(W, zp_x, zp_w) ... likewise       x -> MatMul(W - zp_w) ...
    DynamicQuantizeLSTM(X, W_int8, R_int8, B, ..., scales, zero points)
                                                         LSTM(X, W_float^T, R_float^T, B, ...)

Weights come back as the quantized values dequantized (what the source computes with, not the
float weights it was made from, which are gone); activations are no longer rounded. The scale
that multiplies a rewritten integer op's result is the weight's alone (the activation's is 1 once
the activation is float), so the arithmetic around it stays as it was and folds into constants.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir

from ferry.errors import InvalidInputError
from ferry.graph import INTEGER_WEIGHTS, reduced_precision

__all__ = ["dequantized"]

#: Ops whose all-constant inputs fold into one float weight (the expansion of a stored weight).
_FOLDABLE = frozenset(
    {
        "Cast",
        "Mul",
        "Sub",
        "Add",
        "Div",
        "Floor",
        "Round",
        "Reshape",
        "Transpose",
        "Unsqueeze",
        "Squeeze",
        "DequantizeLinear",
        "QuantizeLinear",
        "Identity",
    }
)


def dequantized(model: ir.Model) -> tuple[ir.Model, str]:
    """``model``'s float computation: stored weights dequantized into float initializers,
    activation Q/DQ dropped, dynamic int8 ops as their float ops.

    Args:
        model: a reduced-precision model (see :func:`ferry.graph.reduced_precision`); not
            modified.

    Returns:
        The float model and one line saying what was undone.

    Raises:
        InvalidInputError: quantization that cannot be undone here (QOperator ops such as
            QLinearConv, integer graph inputs or outputs, quantization inside subgraphs).
    """
    found = reduced_precision(model)
    work = ir.from_proto(ir.to_proto(model))
    graph = work.graph
    pairs = _drop_activation_qdq(graph)
    dynamic, products = _float_integer_ops(graph)
    _fold_constants(graph)
    _float_biases(graph, products)
    import onnx_ir.passes.common as common_passes

    common_passes.RemoveUnusedNodesPass()(work)
    stored, kept = _integer_weights(model), _integer_weights(work)
    left = reduced_precision(work)
    if left.ops:
        raise InvalidInputError(
            f"cannot recover the float graph of this {found.describe()} model: "
            f"{left.describe()} remain (integer graph inputs or outputs, QOperator ops or "
            "quantization inside subgraphs); quantize its float original instead"
        )
    from ferry.graph import prepare

    work = prepare(_retyped(work))
    words = (
        f"re-quantized from its dequantized float graph ({stored - kept} weight(s) dequantized, "
        f"{pairs} activation Q/DQ pair(s) dropped, {dynamic} dynamic int8 op(s) made float"
        + (f"; {kept} int8 weight(s) read by ops int8 does not quantize kept" if kept else "")
        + ")"
    )
    return work, words


def _constant(value: ir.Value | None) -> np.ndarray | None:
    if value is None or value.const_value is None:
        return None
    return value.const_value.numpy()


def _new_constant(graph: ir.Graph, array: np.ndarray, name: str) -> ir.Value:
    value = ir.Value(name=_fresh(graph, name), const_value=ir.tensor(array))
    value.dtype = value.const_value.dtype  # type: ignore[union-attr]
    value.shape = ir.Shape(array.shape)
    graph.register_initializer(value)
    return value


def _fresh(graph: ir.Graph, base: str) -> str:
    taken = {v.name for v in graph.initializers.values()}
    taken |= {v.name for n in graph for v in n.outputs}
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    return name


def _replace(graph: ir.Graph, old: ir.Value, new: ir.Value) -> None:
    """Every use of ``old`` reads ``new``; a graph output keeps its name through an Identity."""
    if old in graph.outputs:
        identity = ir.Node("", "Identity", [new], name=_fresh(graph, f"{old.name}_identity"))
        graph.append(identity)
        index = graph.outputs.index(old)
        out = identity.outputs[0]
        name = old.name
        old.name = _fresh(graph, f"{name}_replaced")
        out.name, out.type, out.shape = name, old.type, old.shape
        graph.outputs[index] = out
    ir.convenience.replace_all_uses_with(old, new)


def _drop_activation_qdq(graph: ir.Graph) -> int:
    """``Q -> DQ`` pairs replaced by Q's float input (activations, and float weights behind
    Q/DQ); returns how many.

    A pair whose range starts at 0 (zero point at the type's least value) is also a ReLU:
    ONNX Runtime's quantizer removes a ReLU it can leave to that clipping, so one comes back.
    """
    count = 0
    relus: dict[int, ir.Value] = {}
    for node in list(graph):
        if node.op_type != "DequantizeLinear" or node.inputs[0] is None:
            continue
        q = node.inputs[0].producer()
        if q is None or q.op_type != "QuantizeLinear" or q.inputs[0] is None:
            continue
        source = q.inputs[0]
        if _clips_at_zero(q) and id(q) not in relus:
            relu = ir.Node("", "Relu", [source], name=_fresh(graph, f"{q.name}_relu"))
            graph.insert_after(q, relu)
            relus[id(q)] = relu.outputs[0]
        _replace(graph, node.outputs[0], relus.get(id(q), source))
        count += 1
    return count


#: The least value of each quantized type.
_LEAST = {ir.DataType.INT8: -128, ir.DataType.UINT8: 0, ir.DataType.INT16: -32768}


def _clips_at_zero(quantize: ir.Node) -> bool:
    zero = quantize.inputs[2] if len(quantize.inputs) > 2 else None
    array = _constant(zero)
    if array is None:  # no zero point: uint8 at 0
        return zero is None
    if zero is None or zero.const_value is None:
        return False
    least = _LEAST.get(zero.const_value.dtype, 0)
    producer = quantize.inputs[0].producer() if quantize.inputs[0] is not None else None
    already = producer is not None and producer.op_type in ("Relu", "Clip", "Sigmoid")
    return bool(np.all(array == least)) and not already


def _float_integer_ops(graph: ir.Graph) -> tuple[int, list[ir.Value]]:
    """DynamicQuantizeLinear, ConvInteger, MatMulInteger and DynamicQuantizeLSTM as float ops;
    returns how many were rewritten, and the products that are float now."""
    count = 0
    retyped: list[ir.Value] = []
    for node in list(graph):
        if node.op_type == "DynamicQuantizeLinear":
            x, (y, scale, zero) = node.inputs[0], node.outputs
            assert x is not None
            _replace(graph, y, x)
            _replace(graph, scale, _new_constant(graph, np.array(1.0, np.float32), "unit_scale"))
            _replace(graph, zero, _new_constant(graph, np.array(0.0, np.float32), "zero_point"))
        elif node.op_type in ("ConvInteger", "MatMulInteger"):
            out = _integer_as_float(graph, node)
            retyped.append(out)
        elif node.op_type == "DynamicQuantizeLSTM":
            _lstm_as_float(graph, node)
        else:
            continue
        count += 1
    return count, retyped


def _float_biases(graph: ir.Graph, products: Sequence[ir.Value]) -> None:
    """An int32 bias (folded to a constant) added to a product that is float now: float too."""
    for value in products:
        for user, _ in list(value.uses()):
            for index, other in enumerate(user.inputs):
                array = _constant(other)
                if other is value or array is None or array.dtype.kind not in "iu":
                    continue
                assert other is not None
                user.replace_input_with(
                    index, _new_constant(graph, array.astype(np.float32), f"{other.name}_float")
                )


def _float_operand(
    graph: ir.Graph, node: ir.Node, value: ir.Value, zero: ir.Value | None, axis: int | None
) -> ir.Value:
    """``value - zero`` in float: a folded constant for a weight, nodes for an activation."""
    array = _constant(value)
    if array is not None:
        out = array.astype(np.float32)
        z = _constant(zero)
        if z is not None:
            z = z.astype(np.float32)
            if axis is not None and z.ndim == 1 and z.size > 1:
                shape = [1] * out.ndim
                shape[axis] = z.size
                z = z.reshape(shape)
            out = out - z
        return _new_constant(graph, out, f"{value.name}_float")
    if value.dtype in (ir.DataType.FLOAT, None) and (zero is None or _is_zero(zero)):
        return value  # a DynamicQuantizeLinear's input, float already
    cast = ir.Node("", "Cast", [value], {"to": ir.AttrInt64("to", ir.DataType.FLOAT)})
    graph.insert_before(node, cast)
    if zero is None:
        return cast.outputs[0]
    zcast = ir.Node("", "Cast", [zero], {"to": ir.AttrInt64("to", ir.DataType.FLOAT)})
    sub = ir.Node("", "Sub", [cast.outputs[0], zcast.outputs[0]])
    graph.insert_before(node, [zcast, sub])
    return sub.outputs[0]


def _is_zero(value: ir.Value) -> bool:
    array = _constant(value)
    return array is not None and not np.any(array)


def _integer_as_float(graph: ir.Graph, node: ir.Node) -> ir.Value:
    a, b = node.inputs[0], node.inputs[1]
    assert a is not None and b is not None
    a_zero = node.inputs[2] if len(node.inputs) > 2 else None
    b_zero = node.inputs[3] if len(node.inputs) > 3 else None
    conv = node.op_type == "ConvInteger"
    lhs = _float_operand(graph, node, a, a_zero, None)
    # ConvInteger's weight zero points are per output channel (axis 0); MatMulInteger's per
    # column (the last axis, where a 1-D array broadcasts anyway).
    rhs = _float_operand(graph, node, b, b_zero, 0 if conv else None)
    attributes = list(node.attributes.values()) if conv else []
    op = ir.Node("", "Conv" if conv else "MatMul", [lhs, rhs], attributes, name=node.name)
    graph.insert_before(node, op)
    out = op.outputs[0]
    out.dtype = ir.DataType.FLOAT
    _replace(graph, node.outputs[0], out)
    out.name = node.outputs[0].name
    node.outputs[0].name = _fresh(graph, f"{out.name}_int")
    graph.remove(node, safe=True)
    return out


def _lstm_as_float(graph: ir.Graph, node: ir.Node) -> None:
    """DynamicQuantizeLSTM (W, R: [directions, input|hidden, 4 * hidden], int8) -> LSTM (W, R:
    [directions, 4 * hidden, input|hidden], float)."""
    inputs = list(node.inputs) + [None] * (12 - len(node.inputs))
    weights = []
    for w, s, z in ((inputs[1], inputs[8], inputs[9]), (inputs[2], inputs[10], inputs[11])):
        q, scale, zero = _constant(w), _constant(s), _constant(z)
        if q is None or scale is None:
            raise InvalidInputError(
                f"DynamicQuantizeLSTM {node.name!r}: its weights are not constants; "
                "quantize its float original instead"
            )
        zero = np.zeros_like(scale) if zero is None else zero
        # Per direction ([D]) or per gate column ([D, 4H]): broadcast over the input axis.
        shape = (scale.shape[0], 1, -1 if scale.ndim > 1 else 1)
        real = (q.astype(np.float32) - zero.astype(np.float32).reshape(shape)) * scale.astype(
            np.float32
        ).reshape(shape)
        weights.append(
            _new_constant(graph, np.ascontiguousarray(real.transpose(0, 2, 1)), "lstm_w")
        )
    new_inputs: Sequence[ir.Value | None] = [inputs[0], *weights, *inputs[3:8]]
    while new_inputs and new_inputs[-1] is None:
        new_inputs = new_inputs[:-1]
    lstm = ir.Node(
        "",
        "LSTM",
        new_inputs,
        list(node.attributes.values()),
        num_outputs=len(node.outputs),
        name=node.name,
    )
    graph.insert_before(node, lstm)
    for old, new in zip(node.outputs, lstm.outputs, strict=True):
        new.dtype = ir.DataType.FLOAT
        _replace(graph, old, new)
        name = old.name
        old.name = _fresh(graph, f"{name}_int")
        new.name = name
    graph.remove(node, safe=True)


def _integer_weights(model: ir.Model) -> int:
    """Stored integer weights that something reads."""
    return sum(
        v.const_value is not None
        and v.const_value.dtype in INTEGER_WEIGHTS
        and v.const_value.size > _FEW
        and bool(v.uses())
        for v in model.graph.initializers.values()
    )


#: Ops whose weights quantization quantizes (static: Conv, Gemm, MatMul; the recurrent ones as
#: dynamic int8 does).
_WEIGHTED = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "LSTM", "GRU", "Attention"})
#: An integer constant of up to this many elements is arithmetic, not a stored weight.
_FEW = 16


def _widens_a_kept_weight(node: ir.Node, arrays: Sequence[np.ndarray | None]) -> bool:
    """A Cast widening a stored int8 weight that no weighted op reads (an embedding table
    read by Gather): left as it is, so the table stays int8 (quantization would store it float
    and leave it float, a 4x larger model)."""
    if node.op_type != "Cast" or not arrays or arrays[0] is None:
        return False
    if arrays[0].dtype.kind not in "iu" or arrays[0].itemsize != 1 or arrays[0].size <= _FEW:
        return False
    seen: set[int] = set()
    values = list(node.outputs)
    while values:
        value = values.pop()
        for user, _ in value.uses():
            if id(user) in seen:
                continue
            seen.add(id(user))
            if user.op_type in _WEIGHTED:
                return False
            if user.op_type in _FOLDABLE:  # the scale and zero point on the way
                values.extend(user.outputs)
    return True


def _fold_constants(graph: ir.Graph) -> None:
    """Nodes of :data:`_FOLDABLE` whose inputs are all constants, evaluated into float or
    integer initializers until none is left (but a Cast widening an int8 weight that no
    weighted op reads)."""
    from onnx.reference import ReferenceEvaluator

    changed = True
    while changed:
        changed = False
        for node in list(graph):
            if node.op_type not in _FOLDABLE or node.domain not in ("", "ai.onnx"):
                continue
            arrays = [_constant(v) if v is not None else None for v in node.inputs]
            if any(a is None for a, v in zip(arrays, node.inputs, strict=True) if v is not None):
                continue
            if _widens_a_kept_weight(node, arrays):
                continue
            names = [f"i{i}" if v is not None else "" for i, v in enumerate(node.inputs)]
            proto = onnx.helper.make_node(
                node.op_type,
                names,
                [f"o{i}" for i in range(len(node.outputs))],
                **{a.name: a.value for a in node.attributes.values()},
            )
            feeds = {n: a for n, a in zip(names, arrays, strict=True) if n}
            results = ReferenceEvaluator(proto).run(None, feeds)
            for old, array in zip(node.outputs, results, strict=True):
                new = _new_constant(graph, np.asarray(array), old.name or "folded")
                _replace(graph, old, new)
            graph.remove(node, safe=True)
            changed = True


def _retyped(model: ir.Model) -> ir.Model:
    """Stored value types cleared where they no longer hold (int32 products are float now),
    through a proto round trip that re-infers them."""
    for node in model.graph:
        for value in node.outputs:
            if value not in model.graph.outputs:
                value.type = None
                value.shape = None
    return model
