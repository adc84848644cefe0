"""Full-integer int8 export from a QDQ model (``ferry quantize --target tflite``).

Before -> After::

    x -> Q(s,z) -> DQ -> Conv(W: DQ(int8 per-channel), B: DQ(int32)) -> Q(s2,z2) -> DQ -> ...
        -> x: float32 input -> QUANTIZE -> int8 (s,z) -> CONV_2D(int8 W per-axis, int32 B)
           -> int8 (s2,z2) -> ... -> DEQUANTIZE -> float32 output

Each activation Q/DQ pair becomes the quantization parameters of one int8 tensor: the op before
the pair writes the integers directly. Weights keep the integers and scales the QDQ model stores
(quantized_dimension on the output channel in TFLite's layout), biases their int32 values at
``input_scale * weight_scale``. A node runs integer kernels when its inputs and outputs all have
parameters and TFLite has an int8 kernel for it; otherwise it runs in float between a DEQUANTIZE
and a QUANTIZE, as the quantizer left it. Ops whose int8 kernels need their input's parameters on
the output (pooling, concatenation, reshapes, pads, resizing) get a requantizing QUANTIZE in front
where the model's parameters differ, and LOGISTIC/TANH/SOFTMAX write the fixed parameters their
kernels produce, then requantize: what TFLite's converter does.

Integers that no QuantizeLinear made (an int8 model input, a streaming model's int8 state) take
the parameters of the DequantizeLinear reading them, and ops that only move integers (the
Transposes a converted TFLite model has between its Q and DQ, an Identity to a state output)
pass their input's parameters on. uint8 activations (a model's uint8 output, uint8 QDQ pairs)
run as int8 at the zero point less 128, the same numbers; a QUANTIZE converts where the model's
own inputs and outputs are uint8, as TFLite's converter does for ``inference_type=uint8``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx_ir as ir

from ferry.tflite._onnx_to_tflite._builder import FLOAT32, INT8, INT32, Builder
from ferry.tflite._onnx_to_tflite._context import ConstQuant, Held, Lowering, attr
from ferry.tflite._schema import TFLiteOperator, TFLiteQuant
from ferry.tflite._unsupported import Unsupported

__all__ = ["INT8_OPS", "Int8Weights", "finish_int8", "fold_qdq", "run_node"]

Translator = Callable[[Lowering, ir.Node], None]

#: ONNX ops lowered to TFLite int8 kernels when their tensors are quantized.
INT8_OPS = {
    "Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "Sub", "Mul", "Relu", "Clip", "HardSwish",
    "HardSigmoid", "LeakyRelu", "PRelu", "Sigmoid", "Tanh", "Softmax", "MaxPool", "AveragePool",
    "GlobalAveragePool", "GlobalMaxPool", "Concat", "Reshape", "Flatten", "Squeeze",
    "Unsqueeze", "Transpose", "Slice", "Split", "Pad", "Resize", "Upsample", "ReduceMean",
    "ReduceMax", "DepthToSpace", "SpaceToDepth", "Identity",
}  # fmt: skip

#: Float inputs that are settings, not operands (they need no quantization).
_SETTINGS = {"Resize": {1, 2, 3}, "Upsample": {1}, "Clip": {1, 2}, "Pad": {2}}

#: Output parameters LiteRT's int8 kernels of these ops produce (scale, zero point).
_FIXED_OUTPUT = {
    "LOGISTIC": (1 / 256, -128),
    "TANH": (1 / 128, 0),
    "SOFTMAX": (1 / 256, -128),
    "LOG_SOFTMAX": (16 / 256, 127),
}

#: Ops whose int8 kernels take inputs at any parameters and whose weights (none) do not depend
#: on them: a tensor only these read may take the parameters its producer's kernel fixes.
_RESCALING = {"ADD", "SUB", "MUL", "DEQUANTIZE", "QUANTIZE", "HARD_SWISH", "MEAN", "SUM"}

#: Ops whose int8 kernels write at any output parameters (rescaling their accumulators):
#: what only a parameter-keeping op reads may take that op's parameters directly.
_FREE_OUTPUT = {
    "CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV", "ADD", "SUB", "MUL",
    "MEAN", "HARD_SWISH", "QUANTIZE", "BATCH_MATMUL",
}  # fmt: skip

#: Ops whose int8 kernels keep the input's parameters on the output.
_SAME_PARAMS = {
    "MAX_POOL_2D", "AVERAGE_POOL_2D", "CONCATENATION", "RESHAPE", "TRANSPOSE", "STRIDED_SLICE",
    "SLICE", "PAD", "PADV2", "MIRROR_PAD", "SPLIT", "SPLIT_V", "GATHER", "RESIZE_BILINEAR",
    "RESIZE_NEAREST_NEIGHBOR", "SPACE_TO_DEPTH", "DEPTH_TO_SPACE", "REDUCE_MAX", "REDUCE_MIN",
    "BROADCAST_TO", "TILE", "PACK", "UNPACK",
}  # fmt: skip

#: TFLite's TensorType code of uint8.
UINT8 = 3

#: The activation types a QDQ model may quantize to, as TFLite tensor types.
_INT_TYPES: dict[np.dtype[Any], int] = {np.dtype("int8"): INT8, np.dtype("uint8"): UINT8}

#: ONNX ops that only move numbers around: on quantized values (integers between a Q and its
#: DQ, or what a DQ made of them) their outputs hold the input's numbers at its parameters.
_MOVES = {
    "Identity", "Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Split",
    "Gather", "DepthToSpace", "SpaceToDepth", "Expand", "Tile", "Concat",
}  # fmt: skip


def _per_tensor(cx: Lowering, node: ir.Node) -> tuple[float, int, np.dtype[np.generic]]:
    scale = cx.const(node.inputs[1])
    zero_v = node.inputs[2] if len(node.inputs) > 2 else None
    zero = cx.const(zero_v) if zero_v is not None else np.zeros((), np.uint8)
    if scale is None or zero is None:
        raise Unsupported("the scale or zero point is computed at run time")
    if scale.size != 1 or zero.size != 1:
        raise Unsupported("per-channel quantization of an activation")
    return float(scale.reshape(())), int(zero.reshape(())), zero.dtype


def _as_int8(quant: tuple[int, TFLiteQuant]) -> tuple[int, TFLiteQuant]:
    """uint8 parameters as int8 ones: the same real numbers, the zero point 128 lower."""
    ttype, q = quant
    if ttype != UINT8:
        return quant
    return INT8, _quant(q.scale, q.zero_point - 128, q.axis)


def _is_integer(value: ir.Value | None) -> bool:
    return value is not None and value.dtype is not None and value.dtype.is_integer()


def fold_qdq(cx: Lowering) -> list[str]:
    """Read the QDQ model's quantization: constants behind a DequantizeLinear become float
    constants that remember their integers; each Q/DQ pair's parameters go to the values they
    quantize (and to the float value before the pair, when the pair is all that reads it);
    integers no Q made take their DQ's parameters, and ops that move integers pass them on."""
    notes: list[str] = []
    for node in cx.model.graph:
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type in _MOVES:
            _pass_on(cx, node)
        elif node.op_type == "DequantizeLinear":
            source = node.inputs[0]
            stored = cx.const(source)
            if stored is None:
                if source is not None and source not in cx.quant:
                    # Integers from outside any Q (a model input, a state): the DQ's parameters.
                    try:
                        step, zp, dtype = _per_tensor(cx, node)
                    except Unsupported:
                        continue
                    if dtype not in _INT_TYPES:
                        raise Unsupported(
                            f"{dtype} activations (TFLite's integer kernels take int8)"
                        )
                    cx.quant[source] = (_INT_TYPES[dtype], _quant([step], [zp], 0))
                if source in cx.quant:
                    cx.quant[node.outputs[0]] = _as_int8(cx.quant[source])
                continue
            scale = cx.const(node.inputs[1])
            zero_v = node.inputs[2] if len(node.inputs) > 2 else None
            zero = cx.const(zero_v) if zero_v is not None else np.zeros(1, stored.dtype)
            if scale is None or zero is None:
                continue
            axis = int(attr(node, "axis", 1)) % max(stored.ndim, 1)
            shape = [1] * stored.ndim
            if scale.size > 1:
                shape[axis] = -1
            real = (stored.astype(np.float64) - zero.astype(np.float64).reshape(shape or ())) * (
                scale.astype(np.float64).reshape(shape or ())
            )
            out = node.outputs[0]
            cx.folded[out] = real.astype(np.float32)
            cx.const_quant[out] = ConstQuant(stored, scale.reshape(-1), zero.reshape(-1), axis)
        elif node.op_type == "QuantizeLinear":
            x, q = node.inputs[0], node.outputs[0]
            try:
                step, zp, dtype = _per_tensor(cx, node)
            except Unsupported:
                continue
            if dtype not in _INT_TYPES:
                raise Unsupported(
                    f"{dtype} activations (TFLite's integer kernels take int8, and uint8)"
                )
            quant = (_INT_TYPES[dtype], _quant([step], [zp], 0))
            constant = cx.const(x)
            if constant is not None:
                info = np.iinfo(str(dtype))
                ints = np.clip(np.round(constant / step) + zp, info.min, info.max)
                cx.folded[q] = ints.astype(dtype)
                continue
            # A uint8 value inside the model runs as int8; uint8 stays where the model's
            # output is uint8 (a QUANTIZE converts).
            cx.quant[q] = quant if q.is_graph_output() else _as_int8(quant)
            if (
                x is not None
                and x.producer() is not None
                and not x.is_graph_output()
                and len(x.uses()) == 1
            ):
                cx.quant[x] = _as_int8(quant)  # the op before the pair writes the integers itself
                _clamped_input(cx, x)
    return notes


#: Activations that only clamp: the op before one may write at its output's parameters.
_CLAMPS = {"Relu", "Clip"}


def _clamped_input(cx: Lowering, x: ir.Value) -> None:
    """``op -> Relu -> Q`` (a fused activation as a TFLite model or an exporter writes it): the
    op writes at the Q's parameters, which saturate where the clamp would (TFLite fuses the
    activation into it again); without them it would run in float."""
    act = x.producer()
    if act is None or act.op_type not in _CLAMPS or not act.inputs:
        return
    before = act.inputs[0]
    if (
        before is None
        or before.producer() is None
        or before.is_graph_output()
        or len(before.uses()) != 1
        or before in cx.quant
        or _is_integer(before)
    ):
        return
    cx.quant[before] = cx.quant[x]


def _pass_on(cx: Lowering, node: ir.Node) -> None:
    """An op moving quantized numbers (integers, or what a DQ made of them): its outputs hold
    the numbers of its data input at the same parameters, so that what reads them (a Gemm after
    a flattening Reshape) runs integer kernels too; a Q after it sets its own. A Concat only of
    inputs at one set of parameters (its int8 kernel would requantize, the integers' would not).
    """
    data = [v for v in node.inputs[: None if node.op_type == "Concat" else 1] if v is not None]
    if not data or not all(v in cx.quant for v in data):
        return
    first = cx.quant[data[0]]
    if not all(cx.quant[v][0] == first[0] and _same(cx.quant[v][1], first[1]) for v in data):
        return
    for out in node.outputs:
        if out not in cx.quant:
            cx.quant[out] = first


def _quant(scale: list[float] | np.ndarray, zero: list[int] | np.ndarray, axis: int) -> TFLiteQuant:
    return TFLiteQuant(
        scale=np.asarray(scale, dtype=np.float32).reshape(-1),
        zero_point=np.asarray(zero, dtype=np.int64).reshape(-1),
        axis=axis,
    )


def _same(a: TFLiteQuant | None, b: TFLiteQuant | None) -> bool:
    if a is None or b is None:
        return a is b
    return (
        a.scale.size == b.scale.size
        and bool(np.allclose(a.scale, b.scale, rtol=1e-6, atol=0))
        and bool(np.array_equal(a.zero_point, b.zero_point))
    )


# ---------------------------------------------------------------------- Q and DQ as translators


def _quantize(cx: Lowering, node: ir.Node) -> None:
    x, q = node.inputs[0], node.outputs[0]
    if x is None:
        raise Unsupported("the input is missing")
    if q not in cx.quant:
        _per_tensor(cx, node)  # raises with the reason
        raise Unsupported("the quantized type is not int8")
    source = cx.get(x)
    perm = cx.perm(x)
    tensor = cx.b.tensors[source]
    if tensor.type == cx.quant[q][0] and _same(tensor.quant, cx.quant[q][1]):
        cx.alias(q, source, perm)
        return
    # From float, or requantizing integers (other parameters, int8 <-> uint8).
    cx.emit("QUANTIZE", [source], [cx.output(q, perm)])


def _dequantize(cx: Lowering, node: ir.Node) -> None:
    q, out = node.inputs[0], node.outputs[0]
    if q is None:
        raise Unsupported("the input is missing")
    source = cx.get(q)
    tensor = cx.b.tensors[source]
    if tensor.quant is not None and out in cx.quant:
        if tensor.type == cx.quant[out][0]:
            cx.alias(out, source, cx.perm(q))  # the integers stand for the float value
        else:  # a uint8 input: its numbers as int8, for the integer kernels after it
            cx.emit("QUANTIZE", [source], [cx.output(out, cx.perm(q))])
        return
    cx.emit("DEQUANTIZE", [source], [cx.output(out, cx.perm(q), ttype=0)])


QDQ_OPS: dict[str, Translator] = {"QuantizeLinear": _quantize, "DequantizeLinear": _dequantize}


# ------------------------------------------------------------------------- running one node


def _int8_ready(cx: Lowering, node: ir.Node) -> bool:
    if node.op_type not in INT8_OPS:
        return False
    settings = _SETTINGS.get(node.op_type, set())
    for k, value in enumerate(node.inputs):
        if value is None or k in settings:
            continue
        array = cx.const(value)
        if array is not None and not cx.is_held(value):
            if array.dtype.kind == "f" and value not in cx.const_quant:
                return False
            continue
        if value not in cx.quant:
            return False
    return all(o in cx.quant for o in node.outputs if o.uses() or o.is_graph_output())


def run_node(cx: Lowering, node: ir.Node, translator: Translator) -> None:
    """Lower ``node`` with integer kernels when it can be, else in float between a DEQUANTIZE
    of its integer inputs and a QUANTIZE of its quantized outputs."""
    if node.op_type in QDQ_OPS:
        QDQ_OPS[node.op_type](cx, node)
        return
    if _int8_ready(cx, node):
        ops, views, floats = len(cx.b.operators), dict(cx.views), dict(cx.dequantized)
        cx.int8 = True
        try:
            translator(cx, node)
            return
        except Unsupported:
            del cx.b.operators[ops:]  # what the attempt wrote is dropped; float instead
            cx.views, cx.dequantized = views, floats
        finally:
            cx.int8 = False
    _run_float(cx, node, translator)


def _run_float(cx: Lowering, node: ir.Node, translator: Translator) -> None:
    held: dict[ir.Value, Held] = {}
    hidden: dict[ir.Value, tuple[int, TFLiteQuant]] = {}
    for value in node.inputs:
        if value is None or value in held or value not in cx.held:
            continue
        index = cx.held[value].index
        if cx.b.tensors[index].quant is not None:
            held[value] = cx.held[value]
            cx.held[value] = Held(_dequantized(cx, index), held[value].perm)
        if value in cx.quant:
            hidden[value] = cx.quant.pop(value)
    outputs = {o: cx.quant.pop(o) for o in node.outputs if o in cx.quant}
    fused_before = set(cx.done)
    try:
        translator(cx, node)
    finally:
        cx.held.update(held)
        cx.quant.update(hidden)
        # A pattern lowered at once (GELU from its Erf) wrote the last node's output, which
        # was declared quantized: the float op wrote floats there.
        for fused in cx.done - fused_before:
            for value in fused.outputs:
                done = cx.held.get(value)
                if value in cx.quant and done is not None:
                    tensor = cx.b.tensors[done.index]
                    if tensor.quant is not None and not cx.b.is_const(done.index):
                        tensor.type, tensor.quant = FLOAT32, None
                        outputs[value] = cx.quant.pop(value)
        for value, quant in outputs.items():
            cx.quant[value] = quant
            done = cx.held.get(value)
            if done is None:
                continue
            shape = cx.b.tensors[done.index].shape
            q = cx.b.tensor(f"{value.name}/int8", quant[0], shape, quant=quant[1])
            cx.emit("QUANTIZE", [done.index], [q])
            cx.held[value] = Held(q, done.perm)


def _dequantized(cx: Lowering, index: int) -> int:
    """The float32 tensor of integer tensor ``index`` (one DEQUANTIZE per tensor)."""
    found = cx.dequantized.get(index)
    if found is not None:
        return found
    tensor = cx.b.tensors[index]
    out = cx.b.tensor(f"{tensor.name}/float", FLOAT32, tensor.shape)
    cx.emit("DEQUANTIZE", [index], [out])
    cx.dequantized[index] = out
    return out


# ------------------------------------------------------------------------------ the weights


class Int8Weights:
    """Writes weights as int8 (the QDQ model's integers and scales), biases as int32, and
    constant operands with their own parameters."""

    def weight(
        self,
        cx: Lowering,
        array: np.ndarray,
        name: str,
        value: ir.Value | None,
        axis: int,
        channels: slice | None,
    ) -> int:
        info = cx.const_quant.get(value) if value is not None else None
        if info is None:
            raise Unsupported("float weights in an integer op")
        if np.any(info.zero_point != 0) or info.values.dtype != np.int8:
            raise Unsupported("weights not symmetric int8 (TFLite's kernels take zero point 0)")
        scale = info.scale.astype(np.float64)
        if scale.size > 1 and channels is not None:
            scale = scale[channels]
        count = array.shape[axis]
        if scale.size not in (1, count):
            raise Unsupported("weight scales along an axis other than the output channels")
        shape = [1] * array.ndim
        shape[axis] = -1
        per = scale.reshape(shape) if scale.size > 1 else scale.reshape(())
        ints = np.round(array.astype(np.float64) / per)
        if np.abs(ints).max(initial=0) > 127:
            raise Unsupported("weights outside [-127, 127]")
        quant = _quant(scale, np.zeros(scale.size, np.int64), axis if scale.size > 1 else 0)
        return cx.b.const(ints.astype(np.int8), name, ttype=INT8, quant=quant)

    def bias(
        self, cx: Lowering, array: np.ndarray, name: str, source: int | None, weight: int | None
    ) -> int:
        if source is None or weight is None:
            raise Unsupported("a bias without its op's input and weights")
        s_in, s_w = cx.b.tensors[source].quant, cx.b.tensors[weight].quant
        if s_in is None or s_w is None:
            raise Unsupported("a float input or weights")
        scale = float(s_in.scale[0]) * s_w.scale.astype(np.float64)
        ints = np.round(array.astype(np.float64) / np.broadcast_to(scale, (array.size,)))
        # One scale per weight scale: XNNPACK refuses per-channel bias scales on per-tensor
        # weights (a per-tensor QDQ model's).
        return cx.b.const(
            ints.astype(np.int32),
            name,
            ttype=INT32,
            quant=_quant(scale.reshape(-1), np.zeros(scale.size, np.int64), 0),
        )

    def operand(self, cx: Lowering, array: np.ndarray, name: str, value: ir.Value) -> int:
        info = cx.const_quant[value]
        if info.scale.size != 1 or info.values.dtype != np.int8:
            raise Unsupported("a per-channel or non-int8 constant operand")
        scale, zero = float(info.scale[0]), int(info.zero_point[0])
        ints = np.clip(np.round(array.astype(np.float64) / scale) + zero, -128, 127)
        return cx.b.const(ints.astype(np.int8), name, ttype=INT8, quant=_quant([scale], [zero], 0))


def hard_sigmoid(cx: Lowering, node: ir.Node, alpha: float, beta: float) -> None:
    """HardSigmoid on integers: ADD(x, 3, RELU6) into [0, 6] at 6/255, then MUL by 1/6."""
    if not (np.isclose(alpha * 6, 1.0) and np.isclose(beta, 0.5)):
        raise Unsupported(f"alpha={alpha}, beta={beta} on integers (1/6 and 0.5 are lowered)")
    x, out = node.inputs[0], node.outputs[0]
    assert x is not None
    perm = cx.perm(x)
    shape = [cx.shape(out)[p] for p in perm]
    relu6 = cx.b.tensor(f"{out.name}/relu6", INT8, shape, quant=_quant([6 / 255], [-128], 0))
    cx.emit("ADD", [cx.get(x), scalar(cx, 3.0)], [relu6], {"fused_activation_function": 3})
    cx.emit(
        "MUL", [relu6, scalar(cx, 1 / 6)], [cx.output(out, perm)], {"fused_activation_function": 0}
    )


def scalar(cx: Lowering, value: float) -> int:
    """An int8 scalar constant holding ``value`` exactly at its own scale."""
    scale = abs(value) / 127 if value else 1.0
    q = 127 if value > 0 else (-127 if value < 0 else 0)
    return cx.b.const(np.asarray(q, np.int8), "scalar", ttype=INT8, quant=_quant([scale], [0], 0))


# ------------------------------------------------------------------------------ after lowering


def finish_int8(cx: Lowering, outputs: set[int]) -> list[str]:
    """Give ops the parameters their int8 kernels need (requantizing around them)."""
    b = cx.b
    readers: dict[int, list[str]] = {}
    producer: dict[int, str] = {}
    for op in b.operators:
        for i in op.inputs:
            readers.setdefault(i, []).append(op.opcode)
        for o in op.outputs:
            producer[o] = op.opcode
    ops = []
    requantized = 0
    for op in b.operators:
        fixed = _FIXED_OUTPUT.get(op.opcode)
        out = b.tensors[op.outputs[0]] if op.outputs else None
        if fixed is not None and out is not None and out.type == INT8:
            want = _quant([fixed[0]], [fixed[1]], 0)
            users = readers.get(op.outputs[0], [])
            if op.outputs[0] not in outputs and users and set(users) <= _RESCALING:
                out.quant = want  # its readers rescale anyway: the kernel's own parameters
            if not _same(out.quant, want):
                temp = b.tensor(f"{out.name}/kernel", INT8, out.shape, quant=want)
                final = op.outputs[0]
                op.outputs = (temp, *op.outputs[1:])
                ops.append(op)
                ops.append(_requant(b, temp, final))
                requantized += 1
                continue
        if op.opcode in _SAME_PARAMS and out is not None and out.type == INT8:
            target = out.quant
            inputs = list(op.inputs)
            data = (
                [0] if op.opcode not in ("CONCATENATION", "PACK", "SPLIT") else range(len(inputs))
            )
            if op.opcode == "SPLIT":
                data = [1]
            for k in data:
                t = inputs[k]
                tensor = b.tensors[t] if t >= 0 else None
                if tensor is None or tensor.type != INT8 or tensor.data is not None:
                    continue
                if len(op.outputs) > 1:
                    continue  # several outputs: handled below
                if not _same(tensor.quant, target):
                    if (
                        producer.get(t) in _FREE_OUTPUT
                        and len(readers.get(t, [])) == 1
                        and t not in outputs
                    ):
                        tensor.quant = target  # its producer may write at these parameters
                        continue
                    temp = b.tensor(f"{tensor.name}/requant", INT8, tensor.shape, quant=target)
                    ops.append(_requant(b, t, temp))
                    inputs[k] = temp
                    requantized += 1
            op.inputs = tuple(inputs)
            if len(op.outputs) > 1:
                source = b.tensors[op.inputs[1 if op.opcode == "SPLIT" else 0]]
                tail = []
                outs = list(op.outputs)
                for j, o in enumerate(outs):
                    if b.tensors[o].type == INT8 and not _same(b.tensors[o].quant, source.quant):
                        temp = b.tensor(
                            f"{b.tensors[o].name}/kernel",
                            INT8,
                            b.tensors[o].shape,
                            quant=source.quant,
                        )
                        tail.append(_requant(b, temp, o))
                        outs[j] = temp
                        requantized += 1
                op.outputs = tuple(outs)
                ops.append(op)
                ops.extend(tail)
                continue
        ops.append(op)
    b.operators = ops
    return (
        [f"int8: {requantized} requantizing QUANTIZE op(s) where kernels fix their parameters"]
        if requantized
        else []
    )


def _requant(b: Builder, source: int, dest: int) -> TFLiteOperator:
    return TFLiteOperator(
        index=0, opcode="QUANTIZE", custom_code=None, version=0, inputs=(source,),
        outputs=(dest,), options={}, custom_options=None,
    )  # fmt: skip
