"""One translator per TFLite builtin op: ``TRANSLATORS[opcode](builder, op)``.

A translator reads its inputs as real numbers (``b.get``), writes ONNX nodes, and binds each
output tensor (``b.bind`` / ``b.bind_nchw``); quantization and layout are the builder's job. It
raises :class:`Unsupported` with a reason for a configuration it cannot translate. Options keep the
schema's field names (``op.options["stride_h"]``).

Layout: NCHW-only ONNX ops (Conv, ConvTranspose, pooling, DepthToSpace, LRN) take their input
through ``b.to_nchw``; layout-free ops (elementwise math, activations, QUANTIZE, CONCATENATION,
PAD, slices, reductions over H and W, RESIZE) whose computed inputs already exist in NCHW are
computed in NCHW too (``_nchw_inputs``), so a network's Transposes end up at its edges.

Weight layouts (schema.fbs): CONV_2D filters are ``[out, h, w, in]``; DEPTHWISE_CONV_2D filters
``[1, h, w, in * multiplier]``; TRANSPOSE_CONV weights ``[out, h, w, in]`` with the output shape as
input 0; FULLY_CONNECTED weights ``[out, in]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir

from ferry.converters._tflite.builder import NCHW, Builder, Unsupported, onnx_type
from ferry.formats import TFLiteOperator, TFLiteTensor, densify_tflite

__all__ = ["CONTROL_FLOW", "CUSTOM_TRANSLATORS", "TRANSLATORS", "Translator"]

Translator = Callable[[Builder, TFLiteOperator], None]

#: Ops that call other subgraphs; named in the error so the user knows why. (CALL_ONCE, which
#: initialises resource variables, is translated: see ``state``.)
CONTROL_FLOW = {"WHILE", "IF", "CALL", "STABLEHLO_WHILE", "STABLEHLO_COMPOSITE"}

_INT64_MAX = np.iinfo(np.int64).max
_INT64_MIN = np.iinfo(np.int64).min

# ActivationFunctionType
_NONE, _RELU, _RELU_N1_TO_1, _RELU6, _TANH, _SIGN_BIT = range(6)
# Padding
_SAME, _VALID = 0, 1

TRANSLATORS: dict[str, Translator] = {}


def _register(*names: str) -> Callable[[Translator], Translator]:
    def wrap(fn: Translator) -> Translator:
        for name in names:
            TRANSLATORS[name] = fn
        return fn

    return wrap


# ------------------------------------------------------------------------------------ helpers


def _activation(b: Builder, value: ir.Value, code: int) -> ir.Value:
    """Apply a ``fused_activation_function``."""
    if code == _NONE:
        return value
    if code == _RELU:
        return b.op1("Relu", [value])
    if code == _RELU6:
        return b.op1("Clip", [value, b.scalar(0.0), b.scalar(6.0)], name="Relu6")
    if code == _RELU_N1_TO_1:
        return b.op1("Clip", [value, b.scalar(-1.0), b.scalar(1.0)], name="ReluN1To1")
    if code == _TANH:
        return b.op1("Tanh", [value])
    raise Unsupported(f"fused activation {code} (SIGN_BIT) has no ONNX equivalent")


def _fused(b: Builder, op: TFLiteOperator, value: ir.Value) -> ir.Value:
    return _activation(b, value, int(op.options.get("fused_activation_function", _NONE)))


def _spatial(t: TFLiteTensor) -> tuple[int | None, int | None]:
    if t.rank != 4:
        raise Unsupported(f"input {t.name!r} has rank {t.rank}, expected 4 (NHWC)")
    h, w = t.dims[1], t.dims[2]
    return h, w


def _same_pads(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """TFLite's SAME padding of one spatial dim: the odd pixel goes after (bottom/right)."""
    out = -(-size // stride)
    effective = (kernel - 1) * dilation + 1
    total = max((out - 1) * stride + effective - size, 0)
    return total // 2, total - total // 2


def _padding(
    b: Builder,
    op: TFLiteOperator,
    x: TFLiteTensor,
    kernel: tuple[int, int],
    strides: tuple[int, int],
    dilations: tuple[int, int] = (1, 1),
) -> dict[str, object]:
    """ONNX pad attributes for TFLite SAME/VALID padding on NHWC input ``x``."""
    if int(op.options.get("padding", _SAME)) == _VALID:
        return {"pads": [0, 0, 0, 0]}
    h, w = _spatial(x)
    if h is None or w is None:
        # SAME_UPPER puts the odd pixel after, as TFLite does, for sizes known only at run time.
        return {"auto_pad": "SAME_UPPER"}
    top, bottom = _same_pads(h, kernel[0], strides[0], dilations[0])
    left, right = _same_pads(w, kernel[1], strides[1], dilations[1])
    return {"pads": [top, left, bottom, right]}


def _strides(op: TFLiteOperator) -> tuple[int, int]:
    return int(op.options.get("stride_h", 1)), int(op.options.get("stride_w", 1))


def _dilations(op: TFLiteOperator) -> tuple[int, int]:
    return int(op.options.get("dilation_h_factor", 1) or 1), int(
        op.options.get("dilation_w_factor", 1) or 1
    )


def _out(op: TFLiteOperator, i: int = 0) -> int:
    return op.outputs[i]


def _axes(b: Builder, i: int, what: str = "axes") -> list[int]:
    return [int(v) for v in np.asarray(b.static(i, what)).reshape(-1)]


def _as_int64(b: Builder, i: int) -> ir.Value:
    """Input i (an integer tensor) as int64, the type ONNX wants for shapes and indices."""
    data = b.constant(i)
    if data is not None:
        return b.ints(np.asarray(data).reshape(-1) if np.ndim(data) else [int(data)], "ints")
    value = b.raw(i)
    t = b.input_tensor(i)
    if t is not None and t.type == 4:
        return value
    return b.op1("Cast", [value], {"to": ir.DataType.INT64})


def _nchw_inputs(
    b: Builder, op: TFLiteOperator, indices: Sequence[int]
) -> list[ir.Value | None] | None:
    """The op's inputs in NCHW when computing it in NCHW saves Transposes: every computed input
    is rank 4 with an NCHW form already made by an NCHW op (at least one is), and every other
    input is a constant (laid out to broadcast the same). None: compute in NHWC."""
    if b.output_tensor().rank != 4:
        return None
    values: list[ir.Value | None] = []
    twins = 0
    for i in indices:
        t = b.input_tensor(i)
        if t is None:
            values.append(None)
            continue
        if b.is_constant(t.index):
            const = b.constant_nchw(t.index)
            if const is None:
                return None
            values.append(const)
            continue
        twin = b.nchw_twin(b.real(t.index)) if t.rank == 4 else None
        if twin is None:
            return None
        values.append(twin)
        twins += 1
    return values if twins else None


def _pointwise(
    b: Builder,
    op: TFLiteOperator,
    indices: Sequence[int],
    compute: Callable[[list[ir.Value | None]], ir.Value],
) -> None:
    """Bind the output of a layout-free computation (elementwise with broadcasting), done in
    NCHW when the inputs already are, else in NHWC."""
    nchw = _nchw_inputs(b, op, indices)
    if nchw is not None:
        b.bind_nchw(_out(op), compute(nchw))
    else:
        b.bind(_out(op), compute([b.get_opt(i) for i in indices]))


def _v(values: list[ir.Value | None], i: int) -> ir.Value:
    value = values[i]
    if value is None:
        raise Unsupported(f"input {i} is missing")
    return value


#: NHWC axis -> the same axis in NCHW.
_TO_NCHW_AXIS = (0, 2, 3, 1)


# ------------------------------------------------------------------------------- convolution


@_register("CONV_2D")
def _conv_2d(b: Builder, op: TFLiteOperator) -> None:
    x, w = b.need(0), b.need(1)
    if w.rank != 4:
        raise Unsupported(f"filter rank {w.rank}, expected 4 (OHWI)")
    _, kh, kw, cin_per_group = w.shape
    channels = x.dims[3] if x.rank == 4 else None
    groups = channels // cin_per_group if channels and cin_per_group else 1
    strides, dilations = _strides(op), _dilations(op)
    attrs: dict[str, object] = {
        "kernel_shape": [kh, kw],
        "strides": list(strides),
        "dilations": list(dilations),
        "group": groups,
        **_padding(b, op, x, (kh, kw), strides, dilations),
    }
    weight = b.weight(w.index, perm=NCHW)
    y = b.op1("Conv", [b.to_nchw(b.get(0)), weight, b.get_opt(2)], attrs)
    b.bind_nchw(_out(op), _fused(b, op, y))


@_register("DEPTHWISE_CONV_2D")
def _depthwise_conv_2d(b: Builder, op: TFLiteOperator) -> None:
    x, w = b.need(0), b.need(1)
    if w.rank != 4 or w.shape[0] != 1:
        raise Unsupported(f"filter shape {list(w.shape)}, expected [1, h, w, channels]")
    _, kh, kw, out_channels = w.shape
    channels = x.dims[3] if x.rank == 4 else None
    if channels is None:
        multiplier = int(op.options.get("depth_multiplier", 1) or 1)
        channels = out_channels // multiplier
    strides, dilations = _strides(op), _dilations(op)
    attrs: dict[str, object] = {
        "kernel_shape": [kh, kw],
        "strides": list(strides),
        "dilations": list(dilations),
        "group": channels,
        **_padding(b, op, x, (kh, kw), strides, dilations),
    }
    # [1, h, w, C*M] -> [C*M, 1, h, w]: output channel c*M+m reads input channel c, which is
    # exactly ONNX's grouped convolution with one group per input channel.
    weight = b.weight(w.index, perm=(3, 0, 1, 2))
    y = b.op1("Conv", [b.to_nchw(b.get(0)), weight, b.get_opt(2)], attrs)
    b.bind_nchw(_out(op), _fused(b, op, y))


@_register("TRANSPOSE_CONV")
def _transpose_conv(b: Builder, op: TFLiteOperator) -> None:
    shape = b.constant(0)
    out_dims = (
        [int(v) for v in shape.reshape(-1)] if shape is not None else list(b.output_tensor().dims)
    )
    same = int(op.options.get("padding", _SAME)) == _SAME
    _deconv(b, op, x=2, w=1, bias=3, out_dims=out_dims, same=same, strides=_strides(op))


def _deconv(
    b: Builder,
    op: TFLiteOperator,
    *,
    x: int,
    w: int,
    bias: int,
    out_dims: Sequence[int | None],
    same: bool,
    strides: tuple[int, int],
) -> None:
    """A transposed convolution with TFLite's padding, which crops the full output: SAME
    centres the crop (the odd pixel cropped at the end), VALID crops at the end only."""
    wt, xt = b.need(w), b.need(x)
    if wt.rank != 4:
        raise Unsupported(f"weight rank {wt.rank}, expected 4 (OHWI)")
    _, kh, kw, _ = wt.shape
    in_h, in_w = _spatial(xt)
    if in_h is None or in_w is None or None in out_dims[1:3]:
        raise Unsupported("its spatial sizes must be static to place TFLite's padding exactly")
    pads_begin, pads_end, extra = [], [], []
    for size, kernel, stride, out in zip(
        (in_h, in_w), (kh, kw), strides, (int(out_dims[1] or 0), int(out_dims[2] or 0))
    ):
        crop = (size - 1) * stride + kernel - out
        begin = max(crop, 0) // 2 if same else 0
        end = crop - begin
        pads_begin.append(begin)
        pads_end.append(max(end, 0))
        extra.append(max(-end, 0))  # an output larger than the full one is zero-extended
    attrs: dict[str, object] = {
        "kernel_shape": [kh, kw],
        "strides": list(strides),
        "pads": pads_begin + pads_end,
    }
    if any(extra):
        attrs["output_padding"] = extra
    # [out, h, w, in] -> [in, out, h, w], ONNX ConvTranspose's weight layout.
    weight = b.weight(wt.index, perm=(3, 0, 1, 2))
    y = b.op1("ConvTranspose", [b.to_nchw(b.get(x)), weight, b.get_opt(bias)], attrs)
    b.bind_nchw(_out(op), _fused(b, op, y))


def _convolution_2d_transpose_bias(b: Builder, op: TFLiteOperator) -> None:
    """MediaPipe's custom transposed convolution: (input, weights OHWI, bias); its options are
    TfLiteTransposeConvParams as raw int32s: padding (1 SAME, 2 VALID), stride_w, stride_h."""
    raw = op.custom_options or b""
    if len(raw) < 12:
        raise Unsupported("its custom options are not TfLiteTransposeConvParams")
    padding, stride_w, stride_h = (int(v) for v in np.frombuffer(raw[:12], dtype="<i4"))
    if padding not in (1, 2):
        raise Unsupported(f"padding code {padding}")
    out_dims = list(b.output_tensor().dims)
    _deconv(
        b, op, x=0, w=1, bias=2, out_dims=out_dims, same=padding == 1, strides=(stride_h, stride_w)
    )


#: Custom ops with a translation, by custom code.
CUSTOM_TRANSLATORS: dict[str, Translator] = {
    "Convolution2DTransposeBias": _convolution_2d_transpose_bias,
}


@_register("FULLY_CONNECTED")
def _fully_connected(b: Builder, op: TFLiteOperator) -> None:
    x, w = b.need(0), b.need(1)
    if int(op.options.get("weights_format", 0)) != 0:
        raise Unsupported("shuffled weights (weights_format SHUFFLED4x16INT8)")
    if w.rank != 2:
        raise Unsupported(f"weight rank {w.rank}, expected 2")
    in_features = w.shape[1]
    value = b.get(0)
    out_rank = b.output_tensor().rank
    bias = b.get_opt(2)
    if out_rank == 2 or not op.options.get("keep_num_dims", False):
        if x.rank != 2:
            value = b.op1("Reshape", [value, b.ints([-1, in_features], "shape")], name="flatten")
        y = b.op1("Gemm", [value, b.weight(w.index), bias], {"transB": 1})
    else:
        y = b.op1("MatMul", [value, b.weight(w.index, perm=(1, 0))])
        if bias is not None:
            y = b.op1("Add", [y, bias])
    b.bind(_out(op), _fused(b, op, y))


@_register("BATCH_MATMUL")
def _batch_matmul(b: Builder, op: TFLiteOperator) -> None:
    operands = []
    for i, flag in ((0, "adj_x"), (1, "adj_y")):
        t = b.need(i)
        value = b.get(i)
        if op.options.get(flag, False):
            perm = [*range(t.rank - 2), t.rank - 1, t.rank - 2]
            value = (
                b.weight(t.index, perm=perm)
                if b.is_constant(t.index)
                else b.op1("Transpose", [value], {"perm": perm})
            )
        operands.append(value)
    b.bind(_out(op), b.op1("MatMul", operands))


# ---------------------------------------------------------------------------------- pooling


def _pool(onnx_op: str) -> Translator:
    def translate(b: Builder, op: TFLiteOperator) -> None:
        x = b.need(0)
        kernel = (int(op.options["filter_height"]), int(op.options["filter_width"]))
        strides = _strides(op)
        attrs: dict[str, object] = {
            "kernel_shape": list(kernel),
            "strides": list(strides),
            **_padding(b, op, x, kernel, strides),
        }
        # TFLite averages over the valid pixels only: ONNX's count_include_pad=0 (the default).
        y = b.op1(onnx_op, [b.to_nchw(b.get(0))], attrs)
        b.bind_nchw(_out(op), _fused(b, op, y))

    return translate


TRANSLATORS["AVERAGE_POOL_2D"] = _pool("AveragePool")
TRANSLATORS["MAX_POOL_2D"] = _pool("MaxPool")


# ------------------------------------------------------------------------------ elementwise


def _binary(onnx_op: str) -> Translator:
    def translate(b: Builder, op: TFLiteOperator) -> None:
        _pointwise(b, op, (0, 1), lambda v: _fused(b, op, b.op1(onnx_op, [_v(v, 0), _v(v, 1)])))

    return translate


for _name, _onnx in {
    "ADD": "Add",
    "SUB": "Sub",
    "MUL": "Mul",
    "DIV": "Div",
    "MAXIMUM": "Max",
    "MINIMUM": "Min",
    "POW": "Pow",
    "LESS": "Less",
    "LESS_EQUAL": "LessOrEqual",
    "GREATER": "Greater",
    "GREATER_EQUAL": "GreaterOrEqual",
    "EQUAL": "Equal",
    "LOGICAL_AND": "And",
    "LOGICAL_OR": "Or",
}.items():
    TRANSLATORS[_name] = _binary(_onnx)


def _unary(onnx_op: str, **attrs: object) -> Translator:
    def translate(b: Builder, op: TFLiteOperator) -> None:
        _pointwise(b, op, (0,), lambda v: b.op1(onnx_op, [_v(v, 0)], attrs))

    return translate


for _name, _onnx in {
    "ABS": "Abs",
    "NEG": "Neg",
    "EXP": "Exp",
    "LOG": "Log",
    "SQRT": "Sqrt",
    "SIN": "Sin",
    "COS": "Cos",
    "FLOOR": "Floor",
    "CEIL": "Ceil",
    "ROUND": "Round",  # both round half to even
    "SIGN": "Sign",
    "RELU": "Relu",
    "LOGISTIC": "Sigmoid",
    "TANH": "Tanh",
    "HARD_SWISH": "HardSwish",  # x * relu6(x + 3) / 6 == x * clip(x / 6 + 0.5, 0, 1)
    "LOGICAL_NOT": "Not",
}.items():
    TRANSLATORS[_name] = _unary(_onnx)

TRANSLATORS["ELU"] = _unary("Elu", alpha=1.0)


def _clip(low: float, high: float, name: str) -> Translator:
    def translate(b: Builder, op: TFLiteOperator) -> None:
        _pointwise(
            b,
            op,
            (0,),
            lambda v: b.op1("Clip", [_v(v, 0), b.scalar(low), b.scalar(high)], name=name),
        )

    return translate


TRANSLATORS["RELU6"] = _clip(0.0, 6.0, "Relu6")
TRANSLATORS["RELU_N1_TO_1"] = _clip(-1.0, 1.0, "ReluN1To1")
TRANSLATORS["RELU_0_TO_1"] = _clip(0.0, 1.0, "Relu0To1")


@_register("NOT_EQUAL")
def _not_equal(b: Builder, op: TFLiteOperator) -> None:
    b.bind(_out(op), b.op1("Not", [b.op1("Equal", [b.get(0), b.get(1)])]))


@_register("RSQRT")
def _rsqrt(b: Builder, op: TFLiteOperator) -> None:
    _pointwise(b, op, (0,), lambda v: b.op1("Reciprocal", [b.op1("Sqrt", [_v(v, 0)])]))


@_register("SQUARE")
def _square(b: Builder, op: TFLiteOperator) -> None:
    _pointwise(b, op, (0,), lambda v: b.op1("Mul", [_v(v, 0), _v(v, 0)]))


def _squared(b: Builder, d: ir.Value) -> ir.Value:
    return b.op1("Mul", [d, d])


@_register("SQUARED_DIFFERENCE")
def _squared_difference(b: Builder, op: TFLiteOperator) -> None:
    _pointwise(b, op, (0, 1), lambda v: _squared(b, b.op1("Sub", [_v(v, 0), _v(v, 1)])))


@_register("FLOOR_DIV")
def _floor_div(b: Builder, op: TFLiteOperator) -> None:
    out = b.output_tensor()
    if out.type in (0, 1, 10):
        b.bind(_out(op), b.op1("Floor", [b.op1("Div", [b.get(0), b.get(1)])]))
        return
    # Integer floor division: ONNX's integer Div truncates; go through float64, exact for int32.
    to_f = {"to": ir.DataType.DOUBLE}
    q = b.op1(
        "Floor", [b.op1("Div", [b.op1("Cast", [b.get(0)], to_f), b.op1("Cast", [b.get(1)], to_f)])]
    )
    b.bind(_out(op), b.op1("Cast", [q], {"to": onnx_type(out.type)}))


@_register("FLOOR_MOD")
def _floor_mod(b: Builder, op: TFLiteOperator) -> None:
    out = b.output_tensor()
    x, y = b.get(0), b.get(1)
    if out.type in (0, 1, 10):
        q = b.op1("Floor", [b.op1("Div", [x, y])])
        b.bind(_out(op), b.op1("Sub", [x, b.op1("Mul", [q, y])]))
    else:
        b.bind(_out(op), b.op1("Mod", [x, y], {"fmod": 0}))  # sign of the divisor, like TF


@_register("LEAKY_RELU")
def _leaky_relu(b: Builder, op: TFLiteOperator) -> None:
    alpha = float(op.options.get("alpha", 0.2))
    _pointwise(b, op, (0,), lambda v: b.op1("LeakyRelu", [_v(v, 0)], {"alpha": alpha}))


@_register("PRELU")
def _prelu(b: Builder, op: TFLiteOperator) -> None:
    # TFLite's alpha broadcasts against the NHWC input from the right, as ONNX PRelu's does
    # (in NCHW, constant_nchw lays it out to broadcast the same way).
    _pointwise(b, op, (0, 1), lambda v: b.op1("PRelu", [_v(v, 0), _v(v, 1)]))


@_register("GELU")
def _gelu(b: Builder, op: TFLiteOperator) -> None:
    x = b.get(0)
    half_x = b.op1("Mul", [x, b.scalar(0.5)])
    if op.options.get("approximate", False):
        cube = b.op1("Mul", [b.op1("Mul", [x, x]), x])
        inner = b.op1("Add", [x, b.op1("Mul", [cube, b.scalar(0.044715)])])
        scaled = b.op1("Mul", [inner, b.scalar(math.sqrt(2.0 / math.pi))])
        core = b.op1("Tanh", [scaled])
    else:
        core = b.op1("Erf", [b.op1("Mul", [x, b.scalar(1.0 / math.sqrt(2.0))])])
    b.bind(_out(op), b.op1("Mul", [half_x, b.op1("Add", [core, b.scalar(1.0)])]))


@_register("SELECT", "SELECT_V2")
def _select(b: Builder, op: TFLiteOperator) -> None:
    cond = b.get(0)
    c, x = b.need(0), b.need(1)
    if op.opcode == "SELECT" and c.rank == 1 and x.rank > 1:
        # SELECT (v1) picks whole rows with a 1-D condition.
        cond = b.op1("Reshape", [cond, b.ints([-1] + [1] * (x.rank - 1), "shape")])
    b.bind(_out(op), b.op1("Where", [cond, b.get(1), b.get(2)]))


@_register("ADD_N")
def _add_n(b: Builder, op: TFLiteOperator) -> None:
    b.bind(_out(op), b.op1("Sum", [b.get(i) for i in range(len(op.inputs))]))


@_register("CAST")
def _cast(b: Builder, op: TFLiteOperator) -> None:
    # CAST converts the stored numbers: quantized inputs are not dequantized first.
    out = b.output_tensor()
    b.bind(_out(op), b.op1("Cast", [b.raw(0)], {"to": onnx_type(out.type)}))


# ----------------------------------------------------------------------------- quantization


@_register("DEQUANTIZE")
def _dequantize(b: Builder, op: TFLiteOperator) -> None:
    t = b.need(0)
    out = b.output_tensor()
    if b.is_constant(t.index) and t.sparsity is None:
        # Weights stored as int8/float16: keep them constant so consumers transpose in numpy.
        cast = onnx_type(out.type) if t.quant is None else None
        b.fold(out.index, t.index, cast)
        return
    if t.quant is not None:
        b.alias(out.index, b.get(0))
    else:
        b.bind(out.index, b.op1("Cast", [b.get(0)], {"to": onnx_type(out.type)}))


@_register("QUANTIZE")
def _quantize(b: Builder, op: TFLiteOperator) -> None:
    # Real numbers in, real numbers out: binding the output inserts its QuantizeLinear/
    # DequantizeLinear pair, which also requantizes int8 <-> uint8.
    _pointwise(b, op, (0,), lambda v: _v(v, 0))


@_register("DENSIFY")
def _densify(b: Builder, op: TFLiteOperator) -> None:
    t = b.need(0)
    if t.sparsity is None or t.data is None:
        raise Unsupported("its input is not a sparse constant")
    out = b.output_tensor()
    out.data = densify_tflite(t.data, t.sparsity, t.shape)
    out.quant = t.quant if out.quant is None else out.quant


# ------------------------------------------------------------------------------ activations


@_register("SOFTMAX")
def _softmax(b: Builder, op: TFLiteOperator) -> None:
    x = b.get(0)
    beta = float(op.options.get("beta", 1.0))
    if beta != 1.0:
        x = b.op1("Mul", [x, b.scalar(beta)], name="beta")
    b.bind(_out(op), b.op1("Softmax", [x], {"axis": -1}))


@_register("LOG_SOFTMAX")
def _log_softmax(b: Builder, op: TFLiteOperator) -> None:
    b.bind(_out(op), b.op1("LogSoftmax", [b.get(0)], {"axis": -1}))


@_register("L2_NORMALIZATION")
def _l2_normalization(b: Builder, op: TFLiteOperator) -> None:
    x = b.get(0)
    norm = b.op1("Sqrt", [b.op1("ReduceSumSquare", [x, b.ints([-1], "axes")], {"keepdims": 1})])
    norm = b.op1("Max", [norm, b.scalar(1e-6)])  # TFLite's epsilon
    b.bind(_out(op), _fused(b, op, b.op1("Div", [x, norm])))


@_register("LOCAL_RESPONSE_NORMALIZATION")
def _lrn(b: Builder, op: TFLiteOperator) -> None:
    o = op.options
    size = 2 * int(o.get("radius", 5)) + 1
    attrs = {
        "size": size,
        "alpha": float(o.get("alpha", 1.0)) * size,  # ONNX divides alpha by size, TF does not
        "beta": float(o.get("beta", 0.5)),
        "bias": float(o.get("bias", 1.0)),
    }
    y = b.op1("LRN", [b.to_nchw(b.get(0))], attrs)
    b.bind_nchw(_out(op), y)


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


# ------------------------------------------------------------------------------- resizing


def _resize(mode: str) -> Translator:
    def translate(b: Builder, op: TFLiteOperator) -> None:
        align = bool(op.options.get("align_corners", False))
        half = bool(op.options.get("half_pixel_centers", False))
        if align and half:
            raise Unsupported("align_corners and half_pixel_centers together")
        if align:
            transform = "align_corners"
        elif half:
            transform = "half_pixel"
        else:
            transform = "asymmetric"
        attrs: dict[str, object] = {"mode": mode, "coordinate_transformation_mode": transform}
        if mode == "nearest":
            # TFLite floors (asymmetric) or rounds half up (align_corners; half_pixel, where
            # round((out + 0.5) * scale - 0.5) == floor((out + 0.5) * scale)).
            attrs["nearest_mode"] = "floor" if transform == "asymmetric" else "round_prefer_ceil"
        # Sizes for all four NHWC dims rather than `axes=[1, 2]`: ONNX Runtime's layout
        # optimizer (ORT_ENABLE_ALL) breaks Resize nodes that have `axes` (seen with ORT 1.32).
        x = b.need(0)
        if x.rank != 4:
            raise Unsupported(f"input rank {x.rank}, expected 4 (NHWC)")
        batch, channels = x.dims[0], x.dims[3]
        hw = b.constant(1)
        twin = b.nchw_twin(b.get(0))
        if twin is not None and batch is not None and channels is not None and hw is not None:
            sizes = b.ints([batch, channels, *[int(v) for v in hw.reshape(-1)]], "sizes")
            b.bind_nchw(_out(op), b.op1("Resize", [twin, None, None, sizes], attrs))
            return
        if batch is not None and channels is not None and hw is not None:
            sizes = b.ints([batch, *[int(v) for v in hw.reshape(-1)], channels], "sizes")
        else:
            shape = b.op1("Shape", [b.get(0)])
            sizes = b.op1(
                "Concat",
                [
                    b.op1("Slice", [shape, b.ints([0], "starts"), b.ints([1], "ends")]),
                    _as_int64(b, 1),
                    b.op1("Slice", [shape, b.ints([3], "starts"), b.ints([4], "ends")]),
                ],
                {"axis": 0},
                name="sizes",
            )
        b.bind(_out(op), b.op1("Resize", [b.get(0), None, None, sizes], attrs))

    return translate


TRANSLATORS["RESIZE_BILINEAR"] = _resize("linear")
TRANSLATORS["RESIZE_NEAREST_NEIGHBOR"] = _resize("nearest")


@_register("SPACE_TO_BATCH_ND")
def _space_to_batch_nd(b: Builder, op: TFLiteOperator) -> None:
    """Pad the block dims, split each into (size / block, block), move the block offsets in
    front of the batch: [N, S.., C] -> [prod(block) * N, S / block.., C]."""
    x = b.need(0)
    block = _axes(b, 1, "block_shape")
    pads = np.asarray(b.static(2, "paddings"), dtype=np.int64).reshape(-1, 2)
    m = len(block)
    sizes = _static_dims(x, range(1, x.rank), "SPACE_TO_BATCH_ND")
    padded = [sizes[i] + int(pads[i].sum()) for i in range(m)]
    if any(p % k for p, k in zip(padded, block)):
        raise Unsupported("padded sizes that the block does not divide")
    rest = sizes[m:]
    value = b.get(0)
    if pads.any():
        full = np.zeros((x.rank, 2), dtype=np.int64)
        full[1 : m + 1] = pads
        value = b.op1("Pad", [value, b.ints(np.concatenate([full[:, 0], full[:, 1]]), "pads")])
    split = [-1]
    for p, k in zip(padded, block):
        split += [p // k, k]
    value = b.op1("Reshape", [value, b.ints(split + rest, "shape")])
    perm = [2 * i + 2 for i in range(m)] + [0] + [2 * i + 1 for i in range(m)]
    perm += list(range(2 * m + 1, 2 * m + 1 + len(rest)))
    value = b.op1("Transpose", [value], {"perm": perm})
    out = [-1] + [p // k for p, k in zip(padded, block)] + rest
    b.bind(_out(op), b.op1("Reshape", [value, b.ints(out, "shape")]))


@_register("BATCH_TO_SPACE_ND")
def _batch_to_space_nd(b: Builder, op: TFLiteOperator) -> None:
    """The inverse of SPACE_TO_BATCH_ND, then crop: [prod(block) * N, S.., C] -> [N, S * block
    - crops.., C]."""
    x = b.need(0)
    block = _axes(b, 1, "block_shape")
    crops = np.asarray(b.static(2, "crops"), dtype=np.int64).reshape(-1, 2)
    m = len(block)
    sizes = _static_dims(x, range(1, x.rank), "BATCH_TO_SPACE_ND")
    rest = sizes[m:]
    value = b.op1("Reshape", [b.get(0), b.ints([*block, -1, *sizes], "shape")])
    perm = [m]
    for i in range(m):
        perm += [m + 1 + i, i]
    perm += list(range(2 * m + 1, 2 * m + 1 + len(rest)))
    value = b.op1("Transpose", [value], {"perm": perm})
    full = [s * k for s, k in zip(sizes[:m], block)]
    value = b.op1("Reshape", [value, b.ints([-1, *full, *rest], "shape")])
    if crops.any():
        starts = [int(c) for c in crops[:, 0]]
        ends = [f - int(c) for f, c in zip(full, crops[:, 1])]
        value = b.op1(
            "Slice",
            [
                value,
                b.ints(starts, "starts"),
                b.ints(ends, "ends"),
                b.ints(range(1, m + 1), "axes"),
            ],
            name="crop",
        )
    b.bind(_out(op), value)


def _static_dims(t: TFLiteTensor, axes: range, what: str) -> list[int]:
    dims = [t.dims[a] for a in axes]
    if any(d is None for d in dims):
        raise Unsupported(f"{what} needs the non-batch dims of {t.name!r} static")
    return [int(d) for d in dims if d is not None]


@_register("DEPTH_TO_SPACE")
def _depth_to_space(b: Builder, op: TFLiteOperator) -> None:
    # TF's NHWC depth_to_space orders the depth as (block_y, block_x, channel): ONNX's DCR.
    block = int(op.options["block_size"])
    y = b.op1("DepthToSpace", [b.to_nchw(b.get(0))], {"blocksize": block, "mode": "DCR"})
    b.bind_nchw(_out(op), y)


@_register("SPACE_TO_DEPTH")
def _space_to_depth(b: Builder, op: TFLiteOperator) -> None:
    block = int(op.options["block_size"])
    y = b.op1("SpaceToDepth", [b.to_nchw(b.get(0))], {"blocksize": block})
    b.bind_nchw(_out(op), y)


# ------------------------------------------------------------------------------- recurrent

# UNIDIRECTIONAL_SEQUENCE_LSTM's inputs (lstm_shared.h): weights for the input, forget, cell and
# output gates from the input and from the previous output, peepholes, gate biases,
# projection, the two state tensors, layer-norm coefficients.
_LSTM_INPUT_W = (1, 2, 3, 4)
_LSTM_RECURRENT_W = (5, 6, 7, 8)
_LSTM_PEEPHOLE = (9, 10, 11)
_LSTM_BIAS = (12, 13, 14, 15)
_LSTM_PROJECTION, _LSTM_PROJECTION_BIAS = 16, 17
_LSTM_OUTPUT_STATE, _LSTM_CELL_STATE = 18, 19
_LSTM_LAYER_NORM = (20, 21, 22, 23)
_LSTM_ACTIVATIONS = {_RELU, _TANH, _RELU6, _RELU_N1_TO_1}


@_register("UNIDIRECTIONAL_SEQUENCE_LSTM")
def _unidirectional_sequence_lstm(b: Builder, op: TFLiteOperator) -> None:
    """TFLite's fused LSTM as an ONNX Scan over time, one step per iteration.

    ONNX's LSTM op cannot express TFLite's cell clipping (it clips gate pre-activations, TFLite
    clips the cell state), which Keras conversions always set; a Scan body computes TFLite's step
    exactly (lstm_eval.cc): i, f = sigmoid(x W + h R [+ p * c_prev] + b); g = act(...);
    c = clip(f * c_prev + i * g); o = sigmoid(... [+ p * c]); h = o * act(c) [projected].
    """
    o = op.options
    x_t = b.need(0)
    if x_t.quant is not None:
        raise Unsupported("integer-quantized LSTM kernels have no QDQ form here")
    if any(b.has_input(i) for i in _LSTM_LAYER_NORM):
        raise Unsupported("layer-normalized LSTM")
    act = int(o.get("fused_activation_function", _TANH))
    if act not in _LSTM_ACTIVATIONS:
        raise Unsupported(f"activation {act}")
    cifg = not b.has_input(_LSTM_INPUT_W[0])
    forget_w = b.need(_LSTM_INPUT_W[1])
    hidden = forget_w.shape[0]
    time_major = bool(o.get("time_major", False))
    cell_clip = float(o.get("cell_clip", 0.0) or 0.0)
    proj_clip = float(o.get("proj_clip", 0.0) or 0.0)
    gates = (1, 2, 3) if cifg else (0, 1, 2, 3)  # input, forget, cell, output

    # Input contributions of every gate for every step at once: [.., 4H] (input gate first).
    w_in = b.op1(
        "Concat",
        [b.weight(b.need(_LSTM_INPUT_W[g]).index, perm=(1, 0)) for g in gates],
        {"axis": 1},
        name="input_weights",
    )
    w_rec = b.op1(
        "Concat",
        [b.weight(b.need(_LSTM_RECURRENT_W[g]).index, perm=(1, 0)) for g in gates],
        {"axis": 1},
        name="recurrent_weights",
    )
    biases = [b.get_opt(_LSTM_BIAS[g]) for g in gates]
    x = b.op1("MatMul", [b.get(0), w_in], name="input_projection")
    if all(v is not None for v in biases):
        x = b.op1("Add", [x, b.op1("Concat", biases, {"axis": 0}, name="biases")])
    peep = {g: b.get_opt(_LSTM_PEEPHOLE[i]) for i, g in enumerate((0, 1, 3))}
    projection = b.get_opt(_LSTM_PROJECTION)
    projection_bias = b.get_opt(_LSTM_PROJECTION_BIAS)
    if projection is not None:
        projection = b.weight(b.need(_LSTM_PROJECTION).index, perm=(1, 0))
    h0 = _lstm_state(b, _LSTM_OUTPUT_STATE, x, time_major)
    c0 = _lstm_state(b, _LSTM_CELL_STATE, x, time_major)
    out_size = b.tensor(op.inputs[_LSTM_OUTPUT_STATE]).shape[-1]

    def activation(v: ir.Value) -> ir.Value:
        return _activation(b, v, act)

    h_in = ir.Value(name=b.unique(f"{b.prefix}/h_prev"), type=ir.TensorType(ir.DataType.FLOAT))
    c_in = ir.Value(name=b.unique(f"{b.prefix}/c_prev"), type=ir.TensorType(ir.DataType.FLOAT))
    x_in = ir.Value(name=b.unique(f"{b.prefix}/x_step"), type=ir.TensorType(ir.DataType.FLOAT))
    h_in.shape = ir.Shape([None, out_size])
    c_in.shape = ir.Shape([None, hidden])
    x_in.shape = ir.Shape([None, hidden * len(gates)])
    with b.body() as nodes:
        pre = b.op1("Add", [x_in, b.op1("MatMul", [h_in, w_rec])], name="gates")
        parts = b.node("Split", [pre], {"axis": 1, "num_outputs": len(gates)}, outputs=len(gates))
        by_gate = dict(zip(gates, parts))
        if peep[1] is not None:
            by_gate[1] = b.op1("Add", [by_gate[1], b.op1("Mul", [peep[1], c_in])])
        forget = b.op1("Sigmoid", [by_gate[1]], name="forget_gate")
        if cifg:
            inp = b.op1("Sub", [b.scalar(1.0), forget], name="input_gate")
        else:
            if peep[0] is not None:
                by_gate[0] = b.op1("Add", [by_gate[0], b.op1("Mul", [peep[0], c_in])])
            inp = b.op1("Sigmoid", [by_gate[0]], name="input_gate")
        cell = b.op1(
            "Add",
            [b.op1("Mul", [forget, c_in]), b.op1("Mul", [inp, activation(by_gate[2])])],
            name="cell",
        )
        if cell_clip > 0:
            cell = b.op1(
                "Clip", [cell, b.scalar(-cell_clip), b.scalar(cell_clip)], name="cell_clip"
            )
        if peep[3] is not None:
            by_gate[3] = b.op1("Add", [by_gate[3], b.op1("Mul", [peep[3], cell])])
        out_gate = b.op1("Sigmoid", [by_gate[3]], name="output_gate")
        h = b.op1("Mul", [out_gate, activation(cell)], name="output")
        if projection is not None:
            h = b.op1("MatMul", [h, projection], name="projection")
            if projection_bias is not None:
                h = b.op1("Add", [h, projection_bias])
            if proj_clip > 0:
                h = b.op1("Clip", [h, b.scalar(-proj_clip), b.scalar(proj_clip)], name="proj_clip")
        c_out = b.op1("Identity", [cell], name="c_next")
        h_out = b.op1("Identity", [h], name="h_next")
        y = b.op1("Identity", [h], name="y")
    body = ir.Graph([h_in, c_in, x_in], [h_out, c_out, y], nodes=nodes, name=f"{b.prefix}/step")
    axis = 0 if time_major else 1
    _, _, ys = b.node(
        "Scan",
        [h0, c0, x],
        {
            "body": body,
            "num_scan_inputs": 1,
            "scan_input_axes": [axis],
            "scan_output_axes": [axis],
        },
        outputs=3,
    )
    b.bind(_out(op), ys)


def _lstm_state(b: Builder, i: int, x: ir.Value, time_major: bool) -> ir.Value:
    """An LSTM's initial state: the state tensor's value, or zeros sized to the batch."""
    t = b.input_tensor(i)
    if t is None:
        raise Unsupported(f"state input {i} is missing")
    if t.data is not None or not t.is_variable:
        return b.get(i)
    # A zero-initialised state, [batch, size] with the batch read from the input at run time.
    shape = b.op1("Shape", [x])
    batch_axis = 1 if time_major else 0
    batch = b.op1(
        "Slice", [shape, b.ints([batch_axis], "starts"), b.ints([batch_axis + 1], "ends")]
    )
    size = b.ints([t.shape[-1]], "size")
    dims = b.op1("Concat", [batch, size], {"axis": 0})
    return b.op1("Expand", [b.const(np.zeros((1, 1), np.float32), f"{b.prefix}/zero"), dims])


# ------------------------------------------------------------------------ resource variables
# The variables are graph inputs and outputs (see ``state``): the builder makes the inputs
# before the walk and the outputs after it; these ops only route values between them.


def _state_problem(b: Builder, op: TFLiteOperator) -> None:
    why = b.state.problems.get(op.index)
    if why is not None:
        raise Unsupported(why)


@_register("CALL_ONCE", "VAR_HANDLE")
def _state_setup(b: Builder, op: TFLiteOperator) -> None:
    """CALL_ONCE's work is the state inputs' defaults; VAR_HANDLE's, naming them."""
    _state_problem(b, op)


@_register("READ_VARIABLE")
def _read_variable(b: Builder, op: TFLiteOperator) -> None:
    _state_problem(b, op)
    out = _out(op)
    source = b.state.aliases.get(out)
    if source is not None:  # the value it was last assigned (or read at the start)
        b.bind_raw(out, b.raw_of(source))
    elif not b.is_bound(out):  # the first read: the state input, made before the walk
        raise Unsupported("it reads a variable that ferry did not make a state input for")


@_register("ASSIGN_VARIABLE")
def _assign_variable(b: Builder, op: TFLiteOperator) -> None:
    """The value assigned last is the state output (``Builder.finish_outputs``)."""
    _state_problem(b, op)
    b.raw_of(op.inputs[1])  # computed (or a constant made) by now
