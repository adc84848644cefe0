"""TFLite -> ONNX translators: shapes and data movement (reshape, concat, split, slices, gather,
transpose, reductions...) and padding."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from ferry.tflite._schema import TFLiteOperator
from ferry.tflite._tflite_to_onnx._builder import NCHW, Builder, onnx_type
from ferry.tflite._tflite_to_onnx._ops import (
    _INT64_MAX,
    _INT64_MIN,
    _TO_NCHW_AXIS,
    TRANSLATORS,
    Translator,
    _as_int64,
    _axes,
    _fused,
    _nchw_inputs,
    _out,
    _register,
)
from ferry.tflite._unsupported import Unsupported

__all__: list[str] = []


# ---------------------------------------------------------------------------- shape and data


@_register("RESHAPE")
def _reshape(b: Builder, op: TFLiteOperator) -> None:
    out = b.output_tensor()
    if b.has_input(1) and b.constant(1) is not None:
        shape = [int(v) for v in np.asarray(b.constant(1)).reshape(-1)]
        target = b.ints(shape, "shape")
    elif b.has_input(1):
        target = _as_int64(b, 1)
        shape = None
    elif op.options.get("new_shape"):
        shape = [int(v) for v in op.options["new_shape"]]
        target = b.ints(shape, "shape")
    else:
        shape = [d if d is not None else -1 for d in out.dims]
        target = b.ints(shape, "shape")
    if shape is not None and shape.count(-1) > 1:
        # A shape with two open dims: the output tensor's own static shape says the answer.
        shape = [d if d is not None else -1 for d in out.dims]
        target = b.ints(shape, "shape")
    attrs = {"allowzero": 1} if shape is not None and 0 in shape else {}
    b.bind(_out(op), b.op1("Reshape", [b.get(0), target], attrs))


@_register("SQUEEZE")
def _squeeze(b: Builder, op: TFLiteOperator) -> None:
    x = b.need(0)
    axes = [int(a) for a in op.options.get("squeeze_dims", ()) or ()]
    if not axes:
        if None in x.dims:
            raise Unsupported("it squeezes every size-1 dim of an input whose shape is not static")
        axes = [i for i, d in enumerate(x.dims) if d == 1]
    b.bind(_out(op), b.op1("Squeeze", [b.get(0), b.ints(axes, "axes")]))


@_register("EXPAND_DIMS")
def _expand_dims(b: Builder, op: TFLiteOperator) -> None:
    axis = _axes(b, 1, "axis")
    b.bind(_out(op), b.op1("Unsqueeze", [b.get(0), b.ints(axis, "axes")]))


@_register("CONCATENATION")
def _concatenation(b: Builder, op: TFLiteOperator) -> None:
    axis = int(op.options.get("axis", 0))
    rank = b.output_tensor().rank
    indices = range(len(op.inputs))
    nchw = _nchw_inputs(b, op, indices)
    if nchw is not None:
        y = b.op1("Concat", nchw, {"axis": _TO_NCHW_AXIS[axis % rank]})
        b.bind_nchw(_out(op), _fused(b, op, y))
        return
    y = b.op1("Concat", [b.get(i) for i in indices], {"axis": axis})
    b.bind(_out(op), _fused(b, op, y))


@_register("PACK")
def _pack(b: Builder, op: TFLiteOperator) -> None:
    axis = int(op.options.get("axis", 0))
    parts = [b.op1("Unsqueeze", [b.get(i), b.ints([axis], "axes")]) for i in range(len(op.inputs))]
    b.bind(_out(op), b.op1("Concat", parts, {"axis": axis}) if len(parts) > 1 else parts[0])


@_register("UNPACK")
def _unpack(b: Builder, op: TFLiteOperator) -> None:
    axis = int(op.options.get("axis", 0))
    count = len(op.outputs)
    parts = (
        b.node("Split", [b.get(0)], {"axis": axis, "num_outputs": count}, outputs=count)
        if count > 1
        else [b.get(0)]
    )
    for index, part in zip(op.outputs, parts):
        b.bind(index, b.op1("Squeeze", [part, b.ints([axis], "axes")]))


def _split(
    b: Builder, op: TFLiteOperator, x_index: int, axis: int, sizes: list[int] | None
) -> None:
    count = len(op.outputs)
    x = b.need(x_index)
    value = b.get(x_index)
    if count == 1:
        b.bind(_out(op), b.op1("Identity", [value]))
        return
    if sizes is None:
        dim = x.dims[axis]
        if dim is None:
            parts = b.node("Split", [value], {"axis": axis, "num_outputs": count}, outputs=count)
            for index, part in zip(op.outputs, parts):
                b.bind(index, part)
            return
        sizes = [dim // count] * count
    parts = b.node("Split", [value, b.ints(sizes, "split")], {"axis": axis}, outputs=count)
    for index, part in zip(op.outputs, parts):
        b.bind(index, part)


@_register("SPLIT")
def _split_op(b: Builder, op: TFLiteOperator) -> None:
    # SPLIT's inputs are (axis, input), in that order.
    axis = _axes(b, 0, "axis")[0]
    _split(b, op, 1, axis, None)


@_register("SPLIT_V")
def _split_v(b: Builder, op: TFLiteOperator) -> None:
    x = b.need(0)
    sizes = _axes(b, 1, "size_splits")
    axis = _axes(b, 2, "axis")[0]
    if axis < 0:
        axis += x.rank
    if -1 in sizes:
        dim = x.dims[axis]
        if dim is None:
            raise Unsupported("its split sizes contain -1 on a dim whose size is not static")
        sizes[sizes.index(-1)] = dim - sum(s for s in sizes if s != -1)
    _split(b, op, 0, axis, sizes)


@_register("SLICE")
def _slice(b: Builder, op: TFLiteOperator) -> None:
    begin, size = b.constant(1), b.constant(2)
    if begin is None or size is None:
        start = _as_int64(b, 1)
        length = _as_int64(b, 2)
        # size -1 means "to the end".
        end = b.op1(
            "Where",
            [
                b.op1("Equal", [length, b.ints([-1], "minus_one")]),
                b.ints([_INT64_MAX], "max"),
                b.op1("Add", [start, length]),
            ],
        )
        b.bind(_out(op), b.op1("Slice", [b.get(0), start, end]))
        return
    starts = [int(v) for v in begin.reshape(-1)]
    ends = [_INT64_MAX if int(s) == -1 else st + int(s) for st, s in zip(starts, size.reshape(-1))]
    b.bind(_out(op), b.op1("Slice", [b.get(0), b.ints(starts, "starts"), b.ints(ends, "ends")]))


@_register("STRIDED_SLICE")
def _strided_slice(b: Builder, op: TFLiteOperator) -> None:
    x = b.need(0)
    begin = _axes(b, 1, "begin")
    end = _axes(b, 2, "end")
    strides = _axes(b, 3, "strides") if b.has_input(3) else [1] * len(begin)
    o = op.options
    plan = _strided_slice_plan(
        x.rank,
        begin,
        end,
        strides,
        begin_mask=int(o.get("begin_mask", 0)),
        end_mask=int(o.get("end_mask", 0)),
        ellipsis_mask=int(o.get("ellipsis_mask", 0)),
        new_axis_mask=int(o.get("new_axis_mask", 0)),
        shrink_axis_mask=int(o.get("shrink_axis_mask", 0)),
        offset=bool(o.get("offset", False)),
    )
    starts, ends, axes, steps, squeeze, unsqueeze = plan
    twin = b.nchw_twin(b.get(0)) if x.rank == 4 and axes else None
    if twin is not None and not squeeze and not unsqueeze:
        # A slice that keeps the rank can be taken on the NCHW form, its axes renumbered.
        nchw_axes = [_TO_NCHW_AXIS[a] for a in axes]
        inputs = [twin, b.ints(starts, "starts"), b.ints(ends, "ends")]
        inputs += [b.ints(nchw_axes, "axes"), b.ints(steps, "steps")]
        b.bind_nchw(_out(op), b.op1("Slice", inputs))
        return
    value = b.get(0)
    if axes:
        value = b.op1(
            "Slice",
            [
                value,
                b.ints(starts, "starts"),
                b.ints(ends, "ends"),
                b.ints(axes, "axes"),
                b.ints(steps, "steps"),
            ],
        )
    if squeeze:
        value = b.op1("Squeeze", [value, b.ints(squeeze, "axes")])
    if unsqueeze:
        value = b.op1("Unsqueeze", [value, b.ints(unsqueeze, "axes")])
    if not (axes or squeeze or unsqueeze):
        value = b.op1("Identity", [value])
    b.bind(_out(op), value)


def _strided_slice_plan(
    rank: int,
    begin: Sequence[int],
    end: Sequence[int],
    strides: Sequence[int],
    *,
    begin_mask: int,
    end_mask: int,
    ellipsis_mask: int,
    new_axis_mask: int,
    shrink_axis_mask: int,
    offset: bool,
) -> tuple[list[int], list[int], list[int], list[int], list[int], list[int]]:
    """TensorFlow's strided-slice semantics as ONNX Slice + Squeeze + Unsqueeze.

    Returns (starts, ends, axes, steps) for Slice on the input's dims, the dims Squeeze removes
    afterwards (shrink_axis), and the positions Unsqueeze inserts in the final shape (new_axis).
    """
    n = len(begin)
    if any(s == 0 for s in strides):
        raise Unsupported("a stride is 0")
    if not ellipsis_mask:
        # No ellipsis: the dims the spec leaves out are taken whole, as after an implicit one.
        ellipsis_mask = 1 << n
        n_spec = n + 1
    else:
        n_spec = n
    # The ellipsis stands for every input dim the other (non-new-axis) entries do not index.
    real_specs = sum(
        1
        for i in range(n_spec)
        if not (ellipsis_mask & (1 << i)) and not (new_axis_mask & (1 << i))
    )
    starts: list[int] = []
    ends: list[int] = []
    axes: list[int] = []
    steps: list[int] = []
    squeeze: list[int] = []
    final: list[str] = []  # per output dim: "keep" or "new"
    dim = 0
    for i in range(n_spec):
        bit = 1 << i
        if ellipsis_mask & bit:
            count = rank - real_specs
            for _ in range(max(count, 0)):
                final.append("keep")
                dim += 1
            continue
        if new_axis_mask & bit:
            final.append("new")
            continue
        if dim >= rank:
            raise Unsupported("its slice spec indexes past the input's rank")
        b_i, e_i, s_i = begin[i], end[i], strides[i]
        if offset:
            e_i = b_i + e_i
        if shrink_axis_mask & bit:
            start = b_i
            stop = b_i + 1 if b_i != -1 else _INT64_MAX
            starts.append(start)
            ends.append(stop)
            axes.append(dim)
            steps.append(1)
            squeeze.append(dim)
            dim += 1
            continue
        start = b_i if not begin_mask & bit else (0 if s_i > 0 else _INT64_MAX)
        stop = e_i if not end_mask & bit else (_INT64_MAX if s_i > 0 else _INT64_MIN)
        if not (begin_mask & bit and end_mask & bit and s_i == 1):
            starts.append(start)
            ends.append(stop)
            axes.append(dim)
            steps.append(s_i)
        final.append("keep")
        dim += 1
    unsqueeze = [pos for pos, kind in enumerate(final) if kind == "new"]
    return starts, ends, axes, steps, squeeze, unsqueeze


@_register("GATHER")
def _gather(b: Builder, op: TFLiteOperator) -> None:
    if int(op.options.get("batch_dims", 0)) != 0:
        raise Unsupported("batch_dims other than 0")
    axis = int(op.options.get("axis", 0))
    b.bind(_out(op), b.op1("Gather", [b.get(0), b.raw(1)], {"axis": axis}))


@_register("GATHER_ND")
def _gather_nd(b: Builder, op: TFLiteOperator) -> None:
    b.bind(_out(op), b.op1("GatherND", [b.get(0), _as_int64_tensor(b, 1)]))


@_register("EMBEDDING_LOOKUP")
def _embedding_lookup(b: Builder, op: TFLiteOperator) -> None:
    # Inputs are (ids, table).
    b.bind(_out(op), b.op1("Gather", [b.get(1), b.raw(0)], {"axis": 0}))


def _as_int64_tensor(b: Builder, i: int) -> ir.Value:
    t = b.need(i)
    value = b.raw(i)
    return value if t.type == 4 else b.op1("Cast", [value], {"to": ir.DataType.INT64})


@_register("TRANSPOSE")
def _transpose(b: Builder, op: TFLiteOperator) -> None:
    perm = _axes(b, 1, "permutation")
    b.bind(_out(op), b.op1("Transpose", [b.get(0)], {"perm": perm}))


@_register("TILE")
def _tile(b: Builder, op: TFLiteOperator) -> None:
    b.bind(_out(op), b.op1("Tile", [b.get(0), _as_int64(b, 1)]))


@_register("BROADCAST_TO")
def _broadcast_to(b: Builder, op: TFLiteOperator) -> None:
    b.bind(_out(op), b.op1("Expand", [b.get(0), _as_int64(b, 1)]))


@_register("FILL")
def _fill(b: Builder, op: TFLiteOperator) -> None:
    # Inputs are (dims, value).
    b.bind(_out(op), b.op1("Expand", [b.get(1), _as_int64(b, 0)]))


@_register("ZEROS_LIKE")
def _zeros_like(b: Builder, op: TFLiteOperator) -> None:
    x = b.get(0)
    zero = b.op1("Cast", [b.scalar(0, np.int32)], {"to": onnx_type(b.output_tensor().type)})
    b.bind(_out(op), b.op1("Expand", [zero, b.op1("Shape", [x])]))


@_register("SHAPE")
def _shape(b: Builder, op: TFLiteOperator) -> None:
    out = b.output_tensor()
    b.bind(_out(op), b.op1("Cast", [b.op1("Shape", [b.get(0)])], {"to": onnx_type(out.type)}))


@_register("RANK")
def _rank(b: Builder, op: TFLiteOperator) -> None:
    size = b.op1("Size", [b.op1("Shape", [b.get(0)])])
    out = b.output_tensor()
    b.bind(_out(op), b.op1("Cast", [size], {"to": onnx_type(out.type)}))


@_register("RANGE")
def _range(b: Builder, op: TFLiteOperator) -> None:
    b.bind(_out(op), b.op1("Range", [b.get(0), b.get(1), b.get(2)]))


@_register("REVERSE_V2")
def _reverse(b: Builder, op: TFLiteOperator) -> None:
    axes = _axes(b, 1)
    n = len(axes)
    value = b.op1(
        "Slice",
        [
            b.get(0),
            b.ints([-1] * n, "starts"),
            b.ints([_INT64_MIN] * n, "ends"),
            b.ints(axes, "axes"),
            b.ints([-1] * n, "steps"),
        ],
        name="Reverse",
    )
    b.bind(_out(op), value)


def _arg(onnx_op: str) -> Translator:
    def translate(b: Builder, op: TFLiteOperator) -> None:
        axis = _axes(b, 1, "axis")[0]
        index = b.op1(onnx_op, [b.get(0)], {"axis": axis, "keepdims": 0})
        out = b.output_tensor()
        if out.type != 4:
            index = b.op1("Cast", [index], {"to": onnx_type(out.type)})
        b.bind(_out(op), index)

    return translate


TRANSLATORS["ARG_MAX"] = _arg("ArgMax")
TRANSLATORS["ARG_MIN"] = _arg("ArgMin")


def _reduce(onnx_op: str, *, via_int: bool = False) -> Translator:
    def translate(b: Builder, op: TFLiteOperator) -> None:
        keep = 1 if op.options.get("keep_dims", False) else 0
        if not via_int and _reduce_nchw(b, op, onnx_op, keep):
            return
        axes = _as_int64(b, 1)
        value = b.get(0)
        if via_int:  # REDUCE_ANY / REDUCE_ALL on bool: max / min over 0 and 1
            value = b.op1("Cast", [value], {"to": ir.DataType.INT32})
        # An empty axes list reduces nothing in TF; ONNX would reduce everything.
        y = b.op1(onnx_op, [value, axes], {"keepdims": keep, "noop_with_empty_axes": 1})
        if via_int:
            y = b.op1("Cast", [y], {"to": ir.DataType.BOOL})
        b.bind(_out(op), y)

    return translate


def _reduce_nchw(b: Builder, op: TFLiteOperator, onnx_op: str, keep: int) -> bool:
    """Reduce an input that already is NCHW there, when the result's dims come out in the same
    order either way (a global pooling over H and W does; a reduction over H alone does not)."""
    x = b.input_tensor(0)
    data = b.constant(1)
    if x is None or x.rank != 4 or data is None:
        return False
    twin = b.nchw_twin(b.get(0))
    axes = sorted({int(a) % 4 for a in np.asarray(data).reshape(-1)})
    if twin is None or not axes:
        return False
    kept = [_TO_NCHW_AXIS[a] for a in range(4) if a not in axes]
    if not keep and kept != sorted(kept):
        return False
    nchw_axes = sorted(_TO_NCHW_AXIS[a] for a in axes)
    y = b.op1(onnx_op, [twin, b.ints(nchw_axes, "axes")], {"keepdims": keep})
    if keep:
        b.bind_nchw(_out(op), y)
    else:
        b.bind(_out(op), y)
    return True


TRANSLATORS["MEAN"] = _reduce("ReduceMean")
TRANSLATORS["SUM"] = _reduce("ReduceSum")
TRANSLATORS["REDUCE_MAX"] = _reduce("ReduceMax")
TRANSLATORS["REDUCE_MIN"] = _reduce("ReduceMin")
TRANSLATORS["REDUCE_PROD"] = _reduce("ReduceProd")
TRANSLATORS["REDUCE_ANY"] = _reduce("ReduceMax", via_int=True)
TRANSLATORS["REDUCE_ALL"] = _reduce("ReduceMin", via_int=True)


@_register("CUMSUM")
def _cumsum(b: Builder, op: TFLiteOperator) -> None:
    attrs = {
        "exclusive": int(bool(op.options.get("exclusive", False))),
        "reverse": int(bool(op.options.get("reverse", False))),
    }
    axis = b.scalar(_axes(b, 1, "axis")[0], np.int64, "axis")  # CumSum's axis is 0-D
    b.bind(_out(op), b.op1("CumSum", [b.get(0), axis], attrs))


@_register("TOPK_V2")
def _topk(b: Builder, op: TFLiteOperator) -> None:
    values, indices = b.node("TopK", [b.get(0), _as_int64(b, 1)], {"axis": -1}, outputs=2)
    b.bind(op.outputs[0], values)
    out = b.tensor(op.outputs[1])
    b.bind(op.outputs[1], b.op1("Cast", [indices], {"to": onnx_type(out.type)}))


@_register("WHERE")
def _where(b: Builder, op: TFLiteOperator) -> None:
    # TFLite WHERE (one input) lists the coordinates of true elements, [count, rank] int64.
    nz = b.op1("NonZero", [b.get(0)])
    out = b.output_tensor()
    value = b.op1("Transpose", [nz], {"perm": [1, 0]})
    if out.type != 4:
        value = b.op1("Cast", [value], {"to": onnx_type(out.type)})
    b.bind(_out(op), value)


# ------------------------------------------------------------------------------- padding


def _pads(b: Builder, i: int) -> ir.Value:
    """TFLite paddings [[before, after], ...] as ONNX pads [befores..., afters...]."""
    data = b.constant(i)
    if data is not None:
        pairs = np.asarray(data, dtype=np.int64).reshape(-1, 2)
        return b.ints(np.concatenate([pairs[:, 0], pairs[:, 1]]), "pads")
    computed = _as_int64_tensor(b, i)
    transposed = b.op1("Transpose", [computed], {"perm": [1, 0]})
    return b.op1("Reshape", [transposed, b.ints([-1], "shape")])


def _pad_nchw(b: Builder, op: TFLiteOperator, mode: str, value: ir.Value | None = None) -> bool:
    """Pad in NCHW when the input already is (and the paddings are constant)."""
    t = b.input_tensor(0)
    data = b.constant(1)
    twin = b.nchw_twin(b.get(0)) if t is not None and t.rank == 4 else None
    if twin is None or data is None:
        return False
    pairs = np.asarray(data, dtype=np.int64).reshape(-1, 2)[list(NCHW)]
    pads = b.ints(np.concatenate([pairs[:, 0], pairs[:, 1]]), "pads")
    b.bind_nchw(_out(op), b.op1("Pad", [twin, pads, value], {"mode": mode}))
    return True


@_register("PAD", "PADV2")
def _pad(b: Builder, op: TFLiteOperator) -> None:
    # A quantized PAD fills with the zero point, i.e. the real value 0, as Pad does here.
    value = b.get_opt(2) if op.opcode == "PADV2" else None
    if _pad_nchw(b, op, "constant", value):
        return
    b.bind(_out(op), b.op1("Pad", [b.get(0), _pads(b, 1), value], {"mode": "constant"}))


@_register("MIRROR_PAD")
def _mirror_pad(b: Builder, op: TFLiteOperator) -> None:
    if int(op.options.get("mode", 0)) == 0:  # REFLECT: mirror without the edge, as ONNX does
        if _pad_nchw(b, op, "reflect"):
            return
        b.bind(_out(op), b.op1("Pad", [b.get(0), _pads(b, 1)], {"mode": "reflect"}))
        return
    # SYMMETRIC mirrors including the edge, which ONNX Pad cannot: concatenate reversed slices.
    pairs = np.asarray(b.static(1, "paddings"), dtype=np.int64).reshape(-1, 2)
    value = b.get(0)
    for axis, (before, after) in enumerate(pairs.tolist()):
        parts = []
        if before:
            parts.append(_reversed_slice(b, value, axis, before - 1, _INT64_MIN))
        parts.append(value)
        if after:
            parts.append(_reversed_slice(b, value, axis, -1, -after - 1))
        if len(parts) > 1:
            value = b.op1("Concat", parts, {"axis": axis}, name="mirror")
    b.bind(_out(op), value)


def _reversed_slice(b: Builder, value: ir.Value, axis: int, start: int, end: int) -> ir.Value:
    inputs = [value, b.ints([start], "starts"), b.ints([end], "ends")]
    inputs += [b.ints([axis], "axes"), b.ints([-1], "steps")]
    return b.op1("Slice", inputs, name="mirror_slice")
