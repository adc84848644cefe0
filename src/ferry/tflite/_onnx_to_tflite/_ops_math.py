"""Matrix products, reductions, softmax and arg-max.

Before -> After::

    Gemm(a, W, C, transB=1)        ->  FULLY_CONNECTED(a, W[N,K], C)       (alpha, beta folded)
    MatMul(x[...,K], W[K,N])       ->  FULLY_CONNECTED(x, W^T, keep_num_dims), in x's layout
    MatMul(a, b)                   ->  BATCH_MATMUL(a, b)
    Einsum("btgi,gih->btgh")       ->  BATCH_MATMUL over the shared labels (reshapes around it)
    ReduceMean(x, axes)            ->  MEAN(x, axes remapped to x's layout)
    Softmax(x, axis)               ->  SOFTMAX with the axis last (x's layout when it is already)
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from ferry.tflite._onnx_to_tflite._builder import INT32, INT64
from ferry.tflite._onnx_to_tflite._context import Lowering, attr
from ferry.tflite._onnx_to_tflite._layout import after_reduce, axis_of, identity, permute
from ferry.tflite._unsupported import Unsupported

__all__ = ["OPS"]

Translator = Callable[[Lowering, ir.Node], None]

FUSED = {"fused_activation_function": 0}


def _fc_options(keep_num_dims: bool = False) -> dict[str, object]:
    return {
        "fused_activation_function": 0,
        "weights_format": 0,
        "keep_num_dims": keep_num_dims,
        "asymmetric_quantize_inputs": False,
    }


def _gemm(cx: Lowering, node: ir.Node) -> None:
    a, b = node.inputs[0], node.inputs[1]
    if a is None or b is None:
        raise Unsupported("an input is missing")
    c = node.inputs[2] if len(node.inputs) > 2 else None
    alpha, beta = float(attr(node, "alpha", 1.0)), float(attr(node, "beta", 1.0))
    trans_a, trans_b = bool(attr(node, "transA", 0)), bool(attr(node, "transB", 0))
    out = node.outputs[0]
    m, n = cx.shape(out)
    a_t = cx.get(a, (1, 0) if trans_a else (0, 1))
    weights = cx.const(b)
    c_array = cx.const(c) if c is not None else None
    bias_vector = None
    if (
        c_array is not None
        and c_array.size in (1, n)
        and (c_array.ndim < 2 or c_array.shape[0] == 1)
    ):
        bias_vector = np.broadcast_to(c_array.reshape(-1) * beta, (n,)).astype(c_array.dtype)
    late_c = c is not None and bias_vector is None
    dest = cx.output(out) if not late_c else cx.temp(f"{out.name}/ab", cx.ttype(out), (m, n))
    if weights is not None:
        if cx.int8 and alpha != 1.0:
            raise Unsupported("alpha != 1 on integer weights")
        w = (weights if trans_b else weights.T) * alpha
        w_t = cx.weight(
            np.ascontiguousarray(w.astype(weights.dtype)), f"{node.name}/weights", node, value=b
        )
        bias_t = -1
        if bias_vector is not None:
            name = f"{node.name}/bias"
            bias_t = cx.bias(bias_vector, name, node, source=a_t, weight=w_t)
        cx.emit("FULLY_CONNECTED", [a_t, w_t, bias_t], [dest], _fc_options())
    else:
        b_t = cx.get(b, (1, 0) if trans_b else (0, 1))
        product = (
            dest
            if alpha == 1.0 and bias_vector is None
            else cx.temp(f"{out.name}/mm", cx.ttype(out), (m, n))
        )
        cx.emit("BATCH_MATMUL", [a_t, b_t], [product], {"adj_x": False, "adj_y": False})
        acc = product
        if alpha != 1.0:
            scaled = (
                dest if bias_vector is None else cx.temp(f"{out.name}/alpha", cx.ttype(out), (m, n))
            )
            cx.emit(
                "MUL", [acc, cx.constant(np.asarray(alpha, np.float32), "alpha")], [scaled], FUSED
            )
            acc = scaled
        if bias_vector is not None:
            cx.emit("ADD", [acc, cx.constant(bias_vector, "bias")], [dest], FUSED)
    if late_c:
        assert c is not None
        if beta != 1.0:
            if c_array is None:
                raise Unsupported("a computed C with beta != 1")
            c_t = cx.constant((c_array * beta).astype(c_array.dtype), "c")
        else:
            c_t = cx.get_broadcast(c, 2, (0, 1))
        cx.emit("ADD", [dest, c_t], [cx.output(out)], FUSED)


def _matmul(cx: Lowering, node: ir.Node) -> None:
    a, b = node.inputs[0], node.inputs[1]
    if a is None or b is None:
        raise Unsupported("an input is missing")
    ra, rb = cx.rank(a), cx.rank(b)
    if ra < 2 or rb < 2:
        raise Unsupported("a 1-D operand")
    out = node.outputs[0]
    weights = cx.const(b)
    if weights is not None and rb == 2:
        perm = cx.perm(a)
        if perm[-1] != ra - 1:
            perm = identity(ra)  # the contracted axis must be the tensor's last
        w_t = cx.weight(np.ascontiguousarray(weights.T), f"{node.name}/weights", node, value=b)
        cx.emit(
            "FULLY_CONNECTED",
            [cx.get(a, perm), w_t, -1],
            [cx.output(out, perm)],
            _fc_options(ra > 2),
        )
        return
    rank = cx.rank(out)
    ins = [_matmul_operand(cx, v, rank) for v in (a, b)]
    cx.emit("BATCH_MATMUL", ins, [cx.output(out)], {"adj_x": False, "adj_y": False})


def _matmul_operand(cx: Lowering, value: ir.Value, rank: int) -> int:
    """A BATCH_MATMUL operand at the result's rank in ONNX's layout. A constant keeps its
    leading size-1 axes (``get_broadcast`` drops them; BATCH_MATMUL needs rank 2 at least and
    LiteRT sizes a 1-D operand wrong)."""
    array = cx.const(value)
    stored_as_integers = cx.int8 and value in cx.const_quant  # written by the int8 writer
    if array is not None and not cx.is_held(value) and not stored_as_integers:
        full = array.reshape((1,) * (rank - array.ndim) + array.shape)
        return cx.constant(full, value.name or "c")
    return cx.get_broadcast(value, rank, identity(rank))


def _einsum(cx: Lowering, node: ir.Node) -> None:
    equation = attr(node, "equation")
    equation = (equation.decode() if isinstance(equation, bytes) else str(equation)).replace(
        " ", ""
    )
    if "->" not in equation or "." in equation:
        raise Unsupported(f"equation {equation!r} (explicit output, no ellipsis, is lowered)")
    lhs, result = equation.split("->")
    terms = lhs.split(",")
    if len(terms) != 2 or len(node.inputs) != 2:
        raise Unsupported(f"equation {equation!r} (two operands are lowered)")
    la, lb = terms
    a, b = node.inputs[0], node.inputs[1]
    if a is None or b is None:
        raise Unsupported("an input is missing")
    if any(len(set(t)) != len(t) for t in (la, lb, result)):
        raise Unsupported(f"equation {equation!r} repeats a label in one operand (a trace)")
    if any(ch not in la + lb for ch in result) or any(
        ch not in result and (ch not in la or ch not in lb) for ch in la + lb
    ):
        raise Unsupported(f"equation {equation!r} sums a label of one operand alone")
    batch = [ch for ch in result if ch in la and ch in lb]
    left = [ch for ch in result if ch in la and ch not in lb]
    right = [ch for ch in result if ch in lb and ch not in la]
    contract = [ch for ch in la if ch in lb and ch not in result]
    sa, sb = cx.shape(a), cx.shape(b)
    size = {**dict(zip(la, sa)), **dict(zip(lb, sb))}

    def prod(labels: list[str]) -> int:
        return math.prod(size[ch] for ch in labels)

    order_a = tuple(la.index(ch) for ch in batch + left + contract)
    order_b = tuple(lb.index(ch) for ch in batch + contract + right)
    nb, nl, nk, nr = prod(batch), prod(left), prod(contract), prod(right)
    out = node.outputs[0]
    ttype = cx.ttype(out)
    weights = cx.const(b)
    a_t = cx.get(a, order_a)
    flat_a = cx.temp(f"{out.name}/lhs", cx.ttype_of(a_t), (nb, nl, nk) if batch else (nl, nk), a_t)
    cx.emit("RESHAPE", [a_t, cx.ints(cx.b.tensors[flat_a].shape)], [flat_a])
    result_shape = (nb, nl, nr) if batch else (nl, nr)
    product = cx.temp(f"{out.name}/mm", ttype, result_shape)
    if weights is not None and not batch:
        w = weights.transpose(order_b).reshape(nk, nr).T
        w_t = cx.weight(np.ascontiguousarray(w), f"{node.name}/weights", node, axis=0)
        cx.emit("FULLY_CONNECTED", [flat_a, w_t, -1], [product], _fc_options())
    else:
        b_t = cx.get(b, order_b)
        flat_b = cx.temp(
            f"{out.name}/rhs", cx.ttype_of(b_t), (nb, nk, nr) if batch else (nk, nr), b_t
        )
        if weights is not None:
            flat_b = cx.constant(
                weights.transpose(order_b).reshape(cx.b.tensors[flat_b].shape), f"{node.name}/rhs"
            )
        else:
            cx.emit("RESHAPE", [b_t, cx.ints(cx.b.tensors[flat_b].shape)], [flat_b])
        cx.emit("BATCH_MATMUL", [flat_a, flat_b], [product], {"adj_x": False, "adj_y": False})
    labels = batch + left + right
    held = tuple(result.index(ch) for ch in labels)
    target = permute(cx.shape(out), held)
    cx.emit("RESHAPE", [product, cx.ints(target)], [cx.output(out, held)])


# ---------------------------------------------------------------------------------- reductions

_REDUCERS = {
    "ReduceMean": "MEAN",
    "ReduceSum": "SUM",
    "ReduceMax": "REDUCE_MAX",
    "ReduceMin": "REDUCE_MIN",
    "ReduceProd": "REDUCE_PROD",
}


def _reduce_axes(cx: Lowering, node: ir.Node, rank: int) -> list[int] | None:
    """The ONNX axes reduced (None: the op is an identity, noop_with_empty_axes)."""
    axes_v = node.inputs[1] if len(node.inputs) > 1 else None
    if axes_v is not None:
        axes = cx.int_const(axes_v, "the reduction's axes")
    else:
        axes = list(attr(node, "axes", ()))
    if not axes:
        if attr(node, "noop_with_empty_axes", 0):
            return None
        axes = list(range(rank))
    return sorted({a % rank for a in axes})


def _reduce(cx: Lowering, node: ir.Node) -> None:
    x = node.inputs[0]
    if x is None:
        raise Unsupported("the input is missing")
    rank = cx.rank(x)
    axes = _reduce_axes(cx, node, rank)
    out = node.outputs[0]
    perm = cx.perm(x)
    if axes is None:
        cx.alias(out, cx.get(x), perm)
        return
    keep = bool(attr(node, "keepdims", 1))
    source = cx.get(x)
    op = node.op_type
    if op in ("ReduceL2", "ReduceSumSquare", "ReduceL1", "ReduceLogSumExp"):
        pre = {
            "ReduceL2": "SQUARE",
            "ReduceSumSquare": "SQUARE",
            "ReduceL1": "ABS",
            "ReduceLogSumExp": "EXP",
        }[op]
        shape = cx.b.tensors[source].shape
        t = cx.temp(f"{out.name}/{pre.lower()}", cx.ttype(x), shape)
        cx.emit(pre, [source], [t])
        source = t
    opcode = _REDUCERS.get(op, "SUM")
    t_axes = sorted(axis_of(perm, a) for a in axes)
    q = after_reduce(perm, axes, keep)
    post = {"ReduceL2": "SQRT", "ReduceLogSumExp": "LOG"}.get(op)
    if post is None:
        dest = cx.output(out, q)
    else:
        dest = cx.temp(f"{out.name}/sum", cx.ttype(out), permute(cx.shape(out), q))
    cx.emit(opcode, [source, cx.ints(t_axes, "axes")], [dest], {"keep_dims": keep})
    if post is not None:
        cx.emit(post, [dest], [cx.output(out, q)])


def _softmax(opcode: str) -> Translator:
    def lower(cx: Lowering, node: ir.Node) -> None:
        x = node.inputs[0]
        if x is None:
            raise Unsupported("the input is missing")
        shape = cx.shape(x)
        rank = len(shape)
        opset = cx.model.opset_imports.get("", 13)
        axis = int(attr(node, "axis", -1 if opset >= 13 else 1)) % rank
        out = node.outputs[0]
        options = {"beta": 1.0} if opcode == "SOFTMAX" else None
        if opset < 13 and axis != rank - 1:
            # Before opset 13 the op flattens to [prod(:axis), prod(axis:)] first.
            flat = (math.prod(shape[:axis]), math.prod(shape[axis:]))
            source = cx.get(x, identity(rank))
            two = cx.temp(f"{out.name}/2d", cx.ttype(x), flat)
            cx.emit("RESHAPE", [source, cx.ints(flat)], [two])
            done = cx.temp(f"{out.name}/soft", cx.ttype(out), flat)
            cx.emit(opcode, [two], [done], options)
            cx.emit("RESHAPE", [done, cx.ints(shape)], [cx.output(out)])
            return
        perm = cx.perm(x)
        if perm[-1] != axis:
            perm = (*[p for p in perm if p != axis], axis)
        cx.emit(opcode, [cx.get(x, perm)], [cx.output(out, perm)], options)

    return lower


def _argmax(opcode: str) -> Translator:
    def lower(cx: Lowering, node: ir.Node) -> None:
        x = node.inputs[0]
        if x is None:
            raise Unsupported("the input is missing")
        if attr(node, "select_last_index", 0):
            raise Unsupported("select_last_index=1")
        rank = cx.rank(x)
        axis = int(attr(node, "axis", 0)) % rank
        keep = bool(attr(node, "keepdims", 1))
        perm = cx.perm(x)
        out = node.outputs[0]
        q = after_reduce(perm, [axis], False)
        ttype = cx.ttype(out)
        options = {"output_type": ttype if ttype in (INT32, INT64) else INT64}
        ins = [cx.get(x), cx.ints([axis_of(perm, axis)], "axis")]
        if not keep:
            cx.emit(opcode, ins, [cx.output(out, q)], options)
            return
        reduced = [cx.shape(x)[p] for p in q]
        flat = cx.temp(f"{out.name}/flat", options["output_type"], reduced)
        cx.emit(opcode, ins, [flat], options)
        target = permute(cx.shape(out), perm)
        cx.emit("RESHAPE", [flat, cx.ints(target)], [cx.output(out, perm)])

    return lower


OPS: dict[str, Translator] = {
    "Gemm": _gemm,
    "MatMul": _matmul,
    "Einsum": _einsum,
    **{
        op: _reduce
        for op in (*_REDUCERS, "ReduceL2", "ReduceL1", "ReduceSumSquare", "ReduceLogSumExp")
    },
    "Softmax": _softmax("SOFTMAX"),
    "LogSoftmax": _softmax("LOG_SOFTMAX"),
    "ArgMax": _argmax("ARG_MAX"),
    "ArgMin": _argmax("ARG_MIN"),
}
