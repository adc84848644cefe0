"""TFLite -> ONNX translators: elementwise math, quantization and activations (layout-free:
computed in NCHW when their inputs already are, see ``_ops._pointwise``)."""

from __future__ import annotations

import math

import onnx_ir as ir

from ferry.tflite._reader import densify_tflite
from ferry.tflite._schema import TFLiteOperator
from ferry.tflite._tflite_to_onnx._builder import Builder, onnx_type
from ferry.tflite._tflite_to_onnx._ops import (
    TRANSLATORS,
    Translator,
    _fused,
    _out,
    _pointwise,
    _register,
    _v,
)
from ferry.tflite._unsupported import Unsupported

__all__: list[str] = []


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
