"""Data movement: reshapes, transposes, concatenation, splits, slices, pads, gathers.

Before -> After (x held NHWC)::

    Transpose(x, perm)              ->  nothing: the result is x's tensor, relabelled
    Reshape(x[1,C,1,1], [1,C])      ->  RESHAPE (only size-1 axes move: no TRANSPOSE)
    Reshape(x[1,255,H,W], [1,3,85,H,W]) -> RESHAPE to [1,H,W,3,85], held as (0,3,4,1,2)
    Reshape(x[1,C,H,W], [1,C*H*W])  ->  TRANSPOSE to NCHW, RESHAPE  (the data must move)
    Concat(x, y, axis=1)            ->  CONCATENATION(axis=3)
    Slice / Pad / Split / Gather    ->  STRIDED_SLICE / PAD / SPLIT_V / GATHER, axes remapped
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from ferry.tflite._onnx_to_tflite._context import Lowering, attr
from ferry.tflite._onnx_to_tflite._layout import (
    after_reduce,
    after_transpose,
    axis_of,
    identity,
    permute,
    reshape_perm,
)
from ferry.tflite._onnx_to_tflite._ops_elementwise import shared_perm
from ferry.tflite._unsupported import Unsupported

__all__ = ["OPS", "reshape_to"]

Translator = Callable[[Lowering, ir.Node], None]


def reshape_to(cx: Lowering, x: ir.Value, out: ir.Value) -> None:
    """``out`` is ``x`` reshaped (to ``out``'s static shape), kept in x's layout if it can be."""
    in_shape, out_shape = cx.shape(x), cx.shape(out)
    perm = cx.perm(x)
    q = reshape_perm(in_shape, perm, out_shape)
    if q is None:
        perm = identity(len(in_shape))
        q = identity(len(out_shape))
    source = cx.get(x, perm)
    target = permute(out_shape, q)
    if tuple(cx.b.tensors[source].shape) == target:
        cx.alias(out, source, q)
        return
    cx.emit("RESHAPE", [source, cx.ints(target)], [cx.output(out, q)], {"new_shape": list(target)})


def _reshape(cx: Lowering, node: ir.Node) -> None:
    x = node.inputs[0]
    if x is None:
        raise Unsupported("the input is missing")
    reshape_to(cx, x, node.outputs[0])


def _transpose(cx: Lowering, node: ir.Node) -> None:
    x = node.inputs[0]
    if x is None:
        raise Unsupported("the input is missing")
    rank = cx.rank(x)
    onnx_perm = attr(node, "perm", None)
    onnx_perm = (
        tuple(reversed(range(rank)))
        if onnx_perm is None
        else tuple(int(p) % rank for p in onnx_perm)
    )
    cx.alias(node.outputs[0], cx.get(x), after_transpose(cx.perm(x), onnx_perm))


def _axis(node: ir.Node, rank: int, default: int = 0) -> int:
    axis = int(attr(node, "axis", default))
    if not -rank <= axis < max(rank, 1):
        raise Unsupported(f"axis {axis} is out of range for rank {rank}")
    return axis % max(rank, 1)


def _concat(cx: Lowering, node: ir.Node) -> None:
    out = node.outputs[0]
    rank = cx.rank(out)
    axis = _axis(node, rank)
    values = [v for v in node.inputs if v is not None and cx.shape(v)[axis : axis + 1] != (0,)]
    perm = shared_perm(cx, values, rank)
    tensors = [cx.get(v, perm) for v in values]
    options = {"axis": axis_of(perm, axis), "fused_activation_function": 0}
    if len(tensors) == 1:
        cx.alias(out, tensors[0], perm)
        return
    cx.emit("CONCATENATION", tensors, [cx.output(out, perm)], options)


def _split(cx: Lowering, node: ir.Node) -> None:
    x = node.inputs[0]
    if x is None:
        raise Unsupported("the input is missing")
    rank = cx.rank(x)
    axis = _axis(node, rank)
    sizes = [cx.shape(o)[axis] for o in node.outputs]
    perm = cx.perm(x)
    t_axis = axis_of(perm, axis)
    outs = [cx.output(o, perm) for o in node.outputs]
    if len(outs) == 1:
        cx.alias(node.outputs[0], cx.get(x), perm)
        return
    if len(set(sizes)) == 1:
        cx.emit("SPLIT", [cx.ints([t_axis], "axis"), cx.get(x)], outs, {"num_splits": len(outs)})
    else:
        ins = [cx.get(x), cx.ints(sizes, "sizes"), cx.ints([t_axis], "axis")]
        cx.emit("SPLIT_V", ins, outs, {"num_splits": len(outs)})


def _slice(cx: Lowering, node: ir.Node) -> None:
    x = node.inputs[0]
    if x is None:
        raise Unsupported("the input is missing")
    shape = cx.shape(x)
    rank = len(shape)
    if len(node.inputs) > 1:
        starts = cx.int_const(node.inputs[1], "Slice's starts")
        ends = cx.int_const(node.inputs[2], "Slice's ends")
        axes_v = node.inputs[3] if len(node.inputs) > 3 else None
        steps_v = node.inputs[4] if len(node.inputs) > 4 else None
        axes = (
            cx.int_const(axes_v, "Slice's axes") if axes_v is not None else list(range(len(starts)))
        )
        steps = cx.int_const(steps_v, "Slice's steps") if steps_v is not None else [1] * len(starts)
    else:
        starts, ends = list(attr(node, "starts", ())), list(attr(node, "ends", ()))
        axes = list(attr(node, "axes", range(len(starts))))
        steps = [1] * len(starts)
    begin, end, stride = [0] * rank, list(shape), [1] * rank
    end_mask = 0
    perm = cx.perm(x)
    for s, e, a, st in zip(starts, ends, axes, steps):
        a %= rank
        size = shape[a]
        if st == 0:
            raise Unsupported("a step of 0")
        s = s + size if s < 0 else s
        e = e + size if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), size), min(max(e, 0), size)
        else:
            s, e = min(max(s, 0), size - 1), min(max(e, -1), size - 1)
        begin[a], end[a], stride[a] = s, e, st
        if st < 0 and e < 0:
            end_mask |= 1 << axis_of(perm, a)  # "through index 0": no end index says it
    ins = [
        cx.get(x),
        cx.ints(permute(begin, perm), "begin"),
        cx.ints(permute(end, perm), "end"),
        cx.ints(permute(stride, perm), "strides"),
    ]
    options = {"begin_mask": 0, "end_mask": end_mask, "ellipsis_mask": 0, "new_axis_mask": 0,
               "shrink_axis_mask": 0, "offset": False}  # fmt: skip
    cx.emit("STRIDED_SLICE", ins, [cx.output(node.outputs[0], perm)], options)


def _pad(cx: Lowering, node: ir.Node) -> None:
    x = node.inputs[0]
    if x is None:
        raise Unsupported("the input is missing")
    rank = cx.rank(x)
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        pads = cx.int_const(node.inputs[1], "Pad's pads")
    else:
        pads = list(attr(node, "pads", ()))
    axes_v = node.inputs[3] if len(node.inputs) > 3 else None
    axes = (
        [a % rank for a in cx.int_const(axes_v, "Pad's axes")]
        if axes_v is not None
        else list(range(rank))
    )
    before, after = [0] * rank, [0] * rank
    for k, a in enumerate(axes):
        before[a], after[a] = pads[k], pads[k + len(axes)]
    if any(p < 0 for p in (*before, *after)):
        raise Unsupported("negative pads (cropping)")
    value = 0.0
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        found = cx.const(node.inputs[2])
        if found is None:
            raise Unsupported("the pad value is computed at run time")
        value = float(found.reshape(-1)[0]) if found.size else 0.0
    else:
        value = float(attr(node, "value", 0.0))
    mode = attr(node, "mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    perm = cx.perm(x)
    paddings = np.asarray([[before[p], after[p]] for p in perm], dtype=np.int32)
    pad_t = cx.constant(paddings, "paddings")
    out = cx.output(node.outputs[0], perm)
    if mode == "constant":
        if value == 0.0:
            cx.emit("PAD", [cx.get(x), pad_t], [out])
        else:
            cx.emit("PADV2", [cx.get(x), pad_t, cx.fill(value, cx.get(x), "pad_value")], [out])
    elif mode == "reflect":
        cx.emit("MIRROR_PAD", [cx.get(x), pad_t], [out], {"mode": 0})
    elif mode == "edge" and int(paddings.max(initial=0)) <= 1:
        # Repeating the edge once is SYMMETRIC mirroring by one.
        cx.emit("MIRROR_PAD", [cx.get(x), pad_t], [out], {"mode": 1})
    else:
        raise Unsupported(f"mode={mode!r}" + (" with pads above 1" if mode == "edge" else ""))


def _gather(cx: Lowering, node: ir.Node) -> None:
    data, indices = node.inputs[0], node.inputs[1]
    if data is None or indices is None:
        raise Unsupported("an input is missing")
    shape = cx.shape(data)
    rank = len(shape)
    axis = _axis(node, rank)
    found = cx.const(indices)
    out = node.outputs[0]
    if found is not None:
        found = np.where(found < 0, found + shape[axis], found).astype(np.int32)
        if found.ndim == 0:
            # One index: a slice of size 1, then the axis dropped (reshapes move no bytes).
            perm = cx.perm(data)
            begin = [0] * rank
            begin[axis] = int(found)
            size = list(shape)
            size[axis] = 1
            sliced = cx.temp(f"{out.name}/slice", cx.ttype(data), permute(size, perm), cx.get(data))
            ins = [
                cx.get(data),
                cx.ints(permute(begin, perm), "begin"),
                cx.ints(permute(size, perm), "size"),
            ]
            cx.emit("SLICE", ins, [sliced])
            q = after_reduce(perm, [axis], keepdims=False)
            target = permute(cx.shape(out), q)
            cx.emit(
                "RESHAPE",
                [sliced, cx.ints(target)],
                [cx.output(out, q)],
                {"new_shape": list(target)},
            )
            return
        index_t = cx.constant(found, "indices")
    else:
        if cx.dtype(indices).kind not in "iu":
            raise Unsupported("the indices are not integers")
        index_t = cx.get(indices, identity(cx.rank(indices)))
        # ONNX counts negative indices from the end; TFLite's GATHER refuses them. FLOOR_MOD by
        # the axis size maps [-n, n) onto [0, n) and leaves the rest out of range, as in ONNX.
        index_tensor = cx.b.tensors[index_t]
        # In the type the indices are held in (int64 ones may be held as int32).
        kind = np.int64 if index_tensor.type == 4 else np.int32  # TFLite's INT64 is 4
        axis_size = cx.constant(np.asarray(shape[axis], dtype=kind), "axis_size")
        wrapped = cx.temp(f"{out.name}/indices", index_tensor.type, index_tensor.shape)
        cx.emit("FLOOR_MOD", [index_t, axis_size], [wrapped])
        index_t = wrapped
    index_rank = cx.rank(indices)
    # Many indices per position: gathered in ONNX's layout, where the index dims land as ONNX
    # puts them.
    perm = cx.perm(data) if index_rank <= 1 else identity(rank)
    t_axis = axis_of(perm, axis)
    if index_rank == 0:
        q = after_reduce(perm, [axis], keepdims=False)
    elif index_rank == 1:
        q = perm
    else:
        q = identity(cx.rank(out))
    options = {"axis": t_axis, "batch_dims": 0}
    cx.emit("GATHER", [cx.get(data, perm), index_t], [cx.output(out, q)], options)


def _expand(cx: Lowering, node: ir.Node) -> None:
    x = node.inputs[0]
    if x is None:
        raise Unsupported("the input is missing")
    out = node.outputs[0]
    rank = cx.rank(out)
    perm = shared_perm(cx, [x], rank)
    source = cx.get_broadcast(x, rank, perm)
    target = permute(cx.shape(out), perm)
    if tuple(cx.b.tensors[source].shape) == target:
        cx.alias(out, source, perm)
        return
    cx.emit("BROADCAST_TO", [source, cx.ints(target)], [cx.output(out, perm)])


def _tile(cx: Lowering, node: ir.Node) -> None:
    x = node.inputs[0]
    if x is None:
        raise Unsupported("the input is missing")
    repeats = cx.int_const(node.inputs[1], "Tile's repeats")
    perm = cx.perm(x)
    ins = [cx.get(x), cx.ints(permute(repeats, perm), "multiples")]
    cx.emit("TILE", ins, [cx.output(node.outputs[0], perm)])


def _space_depth(opcode: str) -> Translator:
    def lower(cx: Lowering, node: ir.Node) -> None:
        x = node.inputs[0]
        if x is None:
            raise Unsupported("the input is missing")
        if cx.rank(x) != 4:
            raise Unsupported("only 4-D inputs")
        mode = attr(node, "mode", "DCR")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if mode not in ("DCR", "CRD"):
            raise Unsupported(f"mode={mode!r}")
        nhwc = (0, 2, 3, 1)
        block = int(attr(node, "blocksize"))
        options = {"block_size": block}
        out = node.outputs[0]
        if mode == "DCR":
            cx.emit(opcode, [cx.get(x, nhwc)], [cx.output(out, nhwc)], options)
            return
        # TFLite orders the deep side's channels DCR, (by * b + bx) * C + c; CRD (PyTorch's
        # PixelShuffle) orders them c * b * b + (by * b + bx): the same values, the channels
        # gathered into place on the deep side (after SPACE_TO_DEPTH, before DEPTH_TO_SPACE).
        bb = block * block
        if opcode == "SPACE_TO_DEPTH":
            channels = cx.shape(x)[1]
            order = np.arange(channels * bb).reshape(bb, channels).T.reshape(-1)
            moved = cx.temp(f"{out.name}/dcr", cx.ttype(x), permute(cx.shape(out), nhwc))
            cx.emit(opcode, [cx.get(x, nhwc)], [moved], options)
            gathered = [moved, cx.constant(order.astype(np.int32), "crd_order")]
            cx.emit("GATHER", gathered, [cx.output(out, nhwc)], {"axis": 3, "batch_dims": 0})
            return
        channels = cx.shape(out)[1]
        order = np.arange(channels * bb).reshape(channels, bb).T.reshape(-1)
        moved = cx.temp(f"{out.name}/dcr", cx.ttype(x), permute(cx.shape(x), nhwc))
        gathered = [cx.get(x, nhwc), cx.constant(order.astype(np.int32), "crd_order")]
        cx.emit("GATHER", gathered, [moved], {"axis": 3, "batch_dims": 0})
        cx.emit(opcode, [moved], [cx.output(out, nhwc)], options)

    return lower


def _where(cx: Lowering, node: ir.Node) -> None:
    cond, a, b = node.inputs[0], node.inputs[1], node.inputs[2]
    if cond is None or a is None or b is None:
        raise Unsupported("an input is missing")
    out = node.outputs[0]
    rank = cx.rank(out)
    perm = shared_perm(cx, [cond, a, b], rank)
    ins = [cx.get_broadcast(v, rank, perm) for v in (cond, a, b)]
    cx.emit("SELECT_V2", ins, [cx.output(out, perm)])


def _fold_shape(cx: Lowering, node: ir.Node) -> None:
    x = node.inputs[0]
    if x is None:
        raise Unsupported("the input is missing")
    shape = np.asarray(cx.shape(x), dtype=np.int64)
    if node.op_type == "Size":
        cx.folded[node.outputs[0]] = np.asarray(int(np.prod(shape)), dtype=np.int64)
        return
    rank = len(shape)
    start = int(attr(node, "start", 0))
    end = attr(node, "end", None)
    start = start + rank if start < 0 else start
    stop = rank if end is None else (int(end) + rank if int(end) < 0 else int(end))
    cx.folded[node.outputs[0]] = shape[max(start, 0) : min(stop, rank)]


OPS: dict[str, Translator] = {
    "Reshape": _reshape,
    "Flatten": _reshape,
    "Squeeze": _reshape,
    "Unsqueeze": _reshape,
    "Transpose": _transpose,
    "Concat": _concat,
    "Split": _split,
    "Slice": _slice,
    "Pad": _pad,
    "Gather": _gather,
    "Expand": _expand,
    "Tile": _tile,
    "DepthToSpace": _space_depth("DEPTH_TO_SPACE"),
    "SpaceToDepth": _space_depth("SPACE_TO_DEPTH"),
    "Where": _where,
    "Shape": _fold_shape,
    "Size": _fold_shape,
}
