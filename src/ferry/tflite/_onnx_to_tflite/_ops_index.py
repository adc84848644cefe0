"""Index arithmetic of end-to-end detectors: top-k, gathers by element, integer division.

A detector with its post-processing inside ranks the scores (TopK), splits each flat index into
a box and a class (integer Div and Mod) and picks the boxes (GatherElements). TFLite has no
GatherElements and its integer division floors where ONNX's truncates; both are written with the
ops it has.

Before -> After::

    TopK(x, k, largest=0)                 ->  NEG, TOPK_V2, NEG (the smallest: largest of -x)
    GatherElements(data, idx, axis)       ->  GATHER_ND(data, coords): coords[..., a] = idx,
                                              the other axes' own positions (constants)
    GatherND(data, idx), batch_dims=0     ->  GATHER_ND (negative coordinates wrapped)
    Div(a, b) on integers (truncates)     ->  SIGN(a) * SIGN(b) * FLOOR_DIV(|a|, |b|)
    Mod(a, b), fmod=0 (the divisor's sign) ->  FLOOR_MOD(a, b)
    Mod(a, b), fmod=1 (the dividend's)    ->  SIGN(a) * FLOOR_MOD(|a|, |b|)  (floats too)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx_ir as ir

from ferry.tflite._onnx_to_tflite._builder import INT32, INT64
from ferry.tflite._onnx_to_tflite._context import Lowering, attr
from ferry.tflite._onnx_to_tflite._layout import identity, permute
from ferry.tflite._onnx_to_tflite._ops_elementwise import OPS as ELEMENTWISE_OPS
from ferry.tflite._onnx_to_tflite._ops_elementwise import shared_perm
from ferry.tflite._unsupported import Unsupported

__all__ = ["OPS"]

Translator = Callable[[Lowering, ir.Node], None]

_FUSED = {"fused_activation_function": 0}

#: Producers whose integer results are never negative: their indices need no wrapping.
_NON_NEGATIVE = {"TopK", "ArgMax", "ArgMin", "NonZero"}


def _topk(cx: Lowering, node: ir.Node) -> None:
    """TOPK_V2 along the last axis (the value moved there first); the smallest k are the
    largest of the negated values."""
    x = node.inputs[0]
    if x is None:
        raise Unsupported("the input is missing")
    k = cx.int_const(node.inputs[1] if len(node.inputs) > 1 else None, "TopK's k")[0]
    rank = cx.rank(x)
    axis = int(attr(node, "axis", -1)) % rank
    largest = bool(attr(node, "largest", 1))
    perm = cx.perm(x)
    if perm[-1] != axis:
        perm = (*[p for p in perm if p != axis], axis)
    values, indices = node.outputs[0], node.outputs[1]
    source = cx.get(x, perm)
    if not largest:
        negated = cx.temp(f"{values.name}/neg_in", cx.ttype(x), cx.b.tensors[source].shape)
        cx.emit("NEG", [source], [negated])
        source = negated
    idx32 = cx.temp(f"{indices.name}/i32", INT32, permute(cx.shape(indices), perm))
    if largest:
        top = cx.output(values, perm)
    else:
        top = cx.temp(f"{values.name}/neg", cx.ttype(values), permute(cx.shape(values), perm))
    cx.emit("TOPK_V2", [source, cx.ints([k], "k")], [top, idx32])
    if not largest:
        cx.emit("NEG", [top], [cx.output(values, perm)])
    if cx.ttype(indices) == INT32:
        cx.alias(indices, idx32, perm)
    else:
        cx.emit("CAST", [idx32], [cx.output(indices, perm)])


def _non_negative(value: ir.Value) -> bool:
    producer = value.producer()
    return producer is not None and producer.op_type in _NON_NEGATIVE


def _gather_elements(cx: Lowering, node: ir.Node) -> None:
    """GATHER_ND with full coordinates: the index tensor along ``axis``, each other axis its
    own position (constant grids), concatenated on a last axis."""
    data, indices = node.inputs[0], node.inputs[1]
    if data is None or indices is None:
        raise Unsupported("an input is missing")
    shape = cx.shape(data)
    rank = len(shape)
    axis = int(attr(node, "axis", 0)) % rank
    idx_shape = cx.shape(indices)
    out = node.outputs[0]
    grids = np.indices(idx_shape, dtype=np.int32)  # grids[k]: each position's coordinate k
    found = cx.const(indices)
    if found is not None:
        grids[axis] = np.where(found < 0, found + shape[axis], found).astype(np.int32)
        coords = cx.constant(np.stack(list(grids), axis=-1), f"{out.name}/coords")
    else:
        size = np.asarray(shape[axis], dtype=np.int32)
        index_t = _int32_indices(cx, indices, f"{out.name}", size, "axis_size")
        column = cx.temp(f"{out.name}/column", INT32, (*idx_shape, 1))
        cx.emit("RESHAPE", [index_t, cx.ints((*idx_shape, 1))], [column])
        parts = []
        if axis > 0:
            parts.append(cx.constant(np.stack(list(grids[:axis]), axis=-1), f"{out.name}/before"))
        parts.append(column)
        if axis < rank - 1:
            after = np.stack(list(grids[axis + 1 :]), axis=-1)
            parts.append(cx.constant(after, f"{out.name}/after"))
        coords = column
        if len(parts) > 1:
            coords = cx.temp(f"{out.name}/coords", INT32, (*idx_shape, rank))
            options = {"axis": len(idx_shape), "fused_activation_function": 0}
            cx.emit("CONCATENATION", parts, [coords], options)
    source = cx.get(data, identity(rank))
    cx.emit("GATHER_ND", [source, coords], [cx.output(out)])


def _int32_indices(cx: Lowering, indices: ir.Value, name: str, sizes: np.ndarray, what: str) -> Any:
    """Computed indices as the int32 tensor TFLite's gathers take, negative ones wrapped by
    ``sizes`` (ONNX counts them from the end: [-n, n) onto [0, n))."""
    if cx.dtype(indices).kind not in "iu":
        raise Unsupported("the indices are not integers")
    shape = cx.shape(indices)
    index_t = cx.get(indices, identity(len(shape)))
    if cx.ttype_of(index_t) != INT32:
        cast = cx.temp(f"{name}/i32", INT32, shape)
        cx.emit("CAST", [index_t], [cast])
        index_t = cast
    if not _non_negative(indices):
        wrapped = cx.temp(f"{name}/wrapped", INT32, shape)
        cx.emit("FLOOR_MOD", [index_t, cx.constant(sizes, what)], [wrapped])
        index_t = wrapped
    return index_t


def _gather_nd(cx: Lowering, node: ir.Node) -> None:
    """GatherND without batch dims is TFLite's GATHER_ND; negative coordinates wrapped by the
    size of the axis each one indexes."""
    data, indices = node.inputs[0], node.inputs[1]
    if data is None or indices is None:
        raise Unsupported("an input is missing")
    if int(attr(node, "batch_dims", 0)):
        raise Unsupported("batch_dims > 0 (TFLite's GATHER_ND has none)")
    shape = cx.shape(data)
    idx_shape = cx.shape(indices)
    depth = idx_shape[-1]
    sizes = np.asarray(shape[:depth], dtype=np.int32)
    found = cx.const(indices)
    if found is not None:
        coords = cx.constant(np.where(found < 0, found + sizes, found).astype(np.int32), "coords")
    else:
        coords = _int32_indices(cx, indices, f"{indices.name}", sizes, "axis_sizes")
    source = cx.get(data, identity(len(shape)))
    cx.emit("GATHER_ND", [source, coords], [cx.output(node.outputs[0])])


# ------------------------------------------------------------------------ integer arithmetic


def _int32_operands(cx: Lowering, node: ir.Node) -> tuple[list[int], tuple[int, ...], int]:
    """Both operands broadcast to the result's rank in one layout, integers as int32 (TFLite's
    integer division and SIGN take int32; int64 is cast down, which index arithmetic fits),
    float32 as it is: the tensors, the layout and the result's TFLite type."""
    a, b = node.inputs[0], node.inputs[1]
    if a is None or b is None:
        raise Unsupported("an input is missing")
    out = node.outputs[0]
    rank = cx.rank(out)
    perm = shared_perm(cx, [a, b], rank)
    tensors = []
    for v in (a, b):
        t = cx.get_broadcast(v, rank, perm)
        if cx.dtype(v) == np.float32:  # Mod of floats (fmod=1): computed in float32
            tensors.append(t)
            continue
        if cx.ttype_of(t) == INT64:
            if cx.b.is_const(t):
                t = cx.constant(np.asarray(cx.b.tensors[t].data).astype(np.int32), "i32")
            else:
                cast = cx.temp(f"{v.name}/i32", INT32, cx.b.tensors[t].shape)
                cx.emit("CAST", [t], [cast])
                t = cast
        elif cx.ttype_of(t) != INT32:
            raise Unsupported(f"integer arithmetic on {cx.dtype(v)} (int32 and int64 are lowered)")
        tensors.append(t)
    return tensors, perm, cx.ttype(out)


def _finish_int(
    cx: Lowering, node: ir.Node, result: int, perm: tuple[int, ...], ttype: int
) -> None:
    """``result`` as the node's output (an int32 one cast back to int64 when that is its type)."""
    out = node.outputs[0]
    if ttype == cx.ttype_of(result):
        cx.alias(out, result, perm)
    else:
        cx.emit("CAST", [result], [cx.output(out, perm)])


def _apply(cx: Lowering, opcode: str, ins: list[int], name: str) -> int:
    """``opcode`` of tensors ``ins`` into a new tensor of their type and broadcast shape."""
    shapes = [cx.b.tensors[i].shape for i in ins]
    shape = np.broadcast_shapes(*shapes)
    dest = cx.temp(name, cx.ttype_of(ins[0]), shape)
    cx.emit(opcode, ins, [dest], _FUSED if opcode in ("MUL", "ADD", "SUB") else None)
    return dest


def _magnitude_and_sign(cx: Lowering, t: int, name: str) -> tuple[int, int | None]:
    """``|t|`` and ``sign(t)`` (None when t is a constant that is never negative)."""
    if cx.b.is_const(t):
        array = np.asarray(cx.b.tensors[t].data)
        if (array >= 0).all():
            return t, None
        return cx.constant(np.abs(array), f"{name}/abs"), cx.constant(np.sign(array), "sign")
    # |t| as t * sign(t): LiteRT's reference kernels have no int32 ABS.
    sign = _apply(cx, "SIGN", [t], f"{name}/sign")
    return _apply(cx, "MUL", [t, sign], f"{name}/abs"), sign


def _int_div(cx: Lowering, node: ir.Node) -> None:
    """Integer Div truncates toward zero: the floor of the magnitudes, signed."""
    (a, b), perm, ttype = _int32_operands(cx, node)
    name = node.outputs[0].name or "div"
    if _non_negative(node.inputs[0]):  # type: ignore[arg-type]
        abs_a, sign_a = a, None
    else:
        abs_a, sign_a = _magnitude_and_sign(cx, a, f"{name}/a")
    abs_b, sign_b = _magnitude_and_sign(cx, b, f"{name}/b")
    result = _apply(cx, "FLOOR_DIV", [abs_a, abs_b], f"{name}/floor")
    for sign in (sign_a, sign_b):
        if sign is not None:
            result = _apply(cx, "MUL", [result, sign], f"{name}/signed")
    _finish_int(cx, node, result, perm, ttype)


def _div(cx: Lowering, node: ir.Node) -> None:
    x = node.inputs[0]
    if x is not None and cx.dtype(x).kind in "iu":
        _int_div(cx, node)
        return
    ELEMENTWISE_OPS["Div"](cx, node)


def _mod(cx: Lowering, node: ir.Node) -> None:
    a_v = node.inputs[0]
    if a_v is None:
        raise Unsupported("an input is missing")
    fmod = bool(attr(node, "fmod", 0))
    if cx.dtype(a_v).kind == "f":
        if not fmod:
            raise Unsupported("Mod of floats without fmod=1 (ONNX requires it)")
        if cx.dtype(a_v) != np.float32:
            raise Unsupported(f"Mod of {cx.dtype(a_v)} (float32 is lowered)")
    (a, b), perm, ttype = _int32_operands(cx, node)
    name = node.outputs[0].name or "mod"
    if not fmod:
        result = _apply(cx, "FLOOR_MOD", [a, b], f"{name}/floor_mod")
    else:
        abs_a, sign_a = _magnitude_and_sign(cx, a, f"{name}/a")
        abs_b, _ = _magnitude_and_sign(cx, b, f"{name}/b")
        result = _apply(cx, "FLOOR_MOD", [abs_a, abs_b], f"{name}/floor_mod")
        if sign_a is not None:
            result = _apply(cx, "MUL", [result, sign_a], f"{name}/signed")
    _finish_int(cx, node, result, perm, ttype)


OPS: dict[str, Translator] = {
    "TopK": _topk,
    "GatherElements": _gather_elements,
    "GatherND": _gather_nd,
    "Div": _div,
    "Mod": _mod,
}
