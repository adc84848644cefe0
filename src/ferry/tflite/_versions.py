"""The least version of a TFLite operator LiteRT needs, from its opcode, options and tensor
types: TensorFlow's ``op_version.cc`` (``GetBuiltinOperatorVersion``), which its converter uses.

Before -> After::

    CONV_2D(input int8, filter int8 per-channel, bias int32), version 0 (unset)
    -> 3
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ferry.tflite._schema import (
    OPTION_ENUMS,
    TFLITE_INT4,
    TFLiteOperator,
    TFLiteSchema,
    TFLiteTensor,
    tflite_schema,
)

__all__ = ["enum_values", "tflite_op_version"]


# TensorType codes, as op_version.cc names them.
_F32, _F16, _I32, _U8, _I64, _STR, _BOOL, _I16, _C64, _I8 = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9
_F64, _U16, _U32, _I4, _BF16 = 10, 16, 15, TFLITE_INT4, 18


class _Signature:
    """What op_version.cc asks of an op: its tensors' types and ranks, its options, and a few
    facts about its weights (``OpSignature`` and its ``ext_options``)."""

    def __init__(self, op: TFLiteOperator, tensors: Sequence[TFLiteTensor]) -> None:
        self.op = op
        self.inputs = [tensors[t] if t >= 0 else None for t in op.inputs]
        self.outputs = [tensors[t] if t >= 0 else None for t in op.outputs]

    def i(self, k: int) -> int | None:
        """Input ``k``'s TensorType; None when absent or omitted."""
        t = self.inputs[k] if k < len(self.inputs) else None
        return None if t is None else t.type

    def o(self, k: int) -> int | None:
        t = self.outputs[k] if k < len(self.outputs) else None
        return None if t is None else t.type

    def rank(self, k: int) -> int:
        t = self.inputs[k] if k < len(self.inputs) else None
        return 0 if t is None else len(t.shape)

    def shape(self, k: int) -> tuple[int, ...]:
        t = self.inputs[k] if k < len(self.inputs) else None
        return () if t is None else t.shape

    def opt(self, name: str, default: Any = 0) -> Any:
        value = self.op.options.get(name, default)
        if isinstance(value, str) and name in OPTION_ENUMS:  # "RELU6" -> 3
            value = enum_values(tflite_schema(), name).get(value.upper(), value)
        return value

    def quantized(self, k: int) -> bool:
        t = self.inputs[k] if k < len(self.inputs) else None
        return t is not None and t.quant is not None

    def scales(self, k: int, output: bool = False) -> int:
        pool = self.outputs if output else self.inputs
        t = pool[k] if k < len(pool) else None
        return 0 if t is None or t.quant is None else int(t.quant.scale.size)

    def first_scale(self, t: TFLiteTensor | None) -> float:
        return (
            0.0
            if t is None or t.quant is None or not t.quant.scale.size
            else float(t.quant.scale[0])
        )

    def per_channel(self, k: int, dim: int) -> bool:
        """Input ``k`` has as many scales as its dim ``dim`` (op_signature.cc's test)."""
        n, shape = self.scales(k), self.shape(k)
        return bool(n) and len(shape) > dim and n == shape[dim]

    def per_axis(self, t: TFLiteTensor | None) -> bool:
        """More than one scale, one per element of the quantized axis."""
        if t is None or t.quant is None or t.quant.scale.size <= 1:
            return False
        axis = t.quant.axis
        return 0 <= axis < len(t.shape) and t.quant.scale.size == t.shape[axis]

    def broadcast_over_4d(self) -> bool:
        """Two inputs of different shapes, one of more than 4 dims."""
        if len(self.inputs) < 2:
            return False
        return self.shape(0) != self.shape(1) and max(self.rank(k) for k in (0, 1)) > 4


def _v_conv(s: _Signature) -> int:
    i0, i1, o0 = s.i(0), s.i(1), s.o(0)
    if (i0, i1, o0) == (_I16, _I8, _I16) and s.opt("quantized_bias_type"):
        return 8
    if len(s.shape(0)) > 3 and len(s.shape(1)) > 3 and s.shape(0)[3] != s.shape(1)[3]:
        return 6  # grouped: the filter has fewer input channels than the input
    if (i0, i1, s.o(1)) == (_I16, _I16, _I16):
        return 4
    if (i0, i1, o0) == (_I8, _I8, _I8):
        return 3
    if (i0, i1, o0) == (_I8, _I4, _I8):
        return 7
    if (i0, i1, o0) == (_F32, _I8, _F32):
        return 5 if s.per_channel(1, 0) else 2
    return 1


def _v_depthwise(s: _Signature) -> int:
    i0, i1, o0 = s.i(0), s.i(1), s.o(0)
    if (i0, i1, s.o(1)) == (_I16, _I16, _I16):
        return 5
    if (i0, i1, o0) == (_F32, _I8, _F32):
        return 6 if s.per_channel(1, 3) else 4
    if (i0, i1, o0) == (_I8, _I8, _I8):
        return 3
    if (i0, i1, o0) == (_I8, _I4, _I8):
        return 7
    if s.opt("dilation_w_factor", 1) != 1 or s.opt("dilation_h_factor", 1) != 1:
        return 2
    return 1


def _v_fully_connected(s: _Signature) -> int:
    i0, i1, o0 = s.i(0), s.i(1), s.o(0)
    weights = s.inputs[1] if len(s.inputs) > 1 else None
    per_channel = s.scales(1) > 1 and bool(s.shape(1)) and s.scales(1) == s.shape(1)[0]
    if (i0, i1, o0) == (_I16, _I4, _I16):
        return 13
    if (i0, i1, o0) == (_F32, _I8, _F32) and per_channel:
        return 12
    if (i0, i1, o0) == (_I16, _I8, _I16) and s.opt("quantized_bias_type"):
        return 11
    if weights is not None and weights.sparsity is not None:
        return 8
    if (i0, i1, o0) == (_I16, _I16, _I16):
        return 7
    if len(s.inputs) == 2:
        return 6
    if s.opt("keep_num_dims", False):
        return 5
    if (i0, i1, o0) == (_I8, _I8, _I8):
        return 4
    if (i0, i1, o0) == (_I8, _I4, _I8):
        return 10
    if (i0, i1, o0) == (_F32, _I8, _F32):
        return 9 if s.opt("asymmetric_quantize_inputs", False) else 3
    if s.opt("weights_format") == 1:  # SHUFFLED4x16INT8
        return 2
    return 1


def _v_mul(s: _Signature) -> int:
    i0 = s.i(0)
    if i0 == _F16:
        return 8
    if (i0 == _I16 and not (s.quantized(0) or s.quantized(1))) or i0 == _U32:
        return 7
    if i0 == _C64:
        return 6
    if i0 == _I64:
        return 5
    if i0 == _I16:
        return 4
    a = s.first_scale(s.inputs[0] if s.inputs else None)
    b = s.first_scale(s.inputs[1] if len(s.inputs) > 1 else None)
    c = s.first_scale(s.outputs[0] if s.outputs else None)
    if a and b and c and a * b / c >= 1.0:
        return 3
    return 2 if i0 == _I8 else 1


def _v_add(s: _Signature) -> int:
    i0 = s.i(0)
    if i0 == _F16:
        return 6
    if i0 == _I16 and not s.quantized(0):
        return 5
    if i0 == _I64:
        return 4
    if i0 == _I16 and s.o(0) == _I16 and not s.opt("pot_scale_int16", True):
        return 3
    return 2 if i0 == _I8 else 1


def _v_sub(s: _Signature) -> int:
    i0 = s.i(0)
    if i0 == _I16 and s.o(0) == _I16 and not s.opt("pot_scale_int16", True):
        return 5
    if i0 == _I64:
        return 4
    if s.broadcast_over_4d():
        return 3
    return 2 if i0 == _I8 else 1


def _v_transpose(s: _Signature) -> int:
    i0, rank = s.i(0), s.rank(0)
    if rank > 6 or i0 == _BF16:
        return 8
    if i0 == _I4:
        return 7
    if rank > 5:
        return 6
    if i0 == _I16:
        return 5
    if rank > 4:
        return 4
    return _by_type({_BOOL: 3, _I8: 2})(s)


def _v_transpose_conv(s: _Signature) -> int:
    # Inputs: output shape, weights, input, bias; op_version.cc tests them as listed here.
    if (s.i(0), s.i(1), s.o(0)) == (_I16, _I8, _I16) and s.opt("quantized_bias_type"):
        return 5
    if s.opt("fused_activation_function"):
        return 4
    if len(s.inputs) == 4 and s.i(3) is not None:
        return 3
    return 2 if s.i(1) == _I8 else 1


def _v_lstm(s: _Signature) -> int:
    full = s.opt("kernel_type") == 0
    if full and (s.i(0), s.i(2), s.o(0)) == (_I16, _I8, _I16):
        return 5
    if full and (s.i(0), s.i(2), s.o(0)) == (_F32, _I8, _F32):
        return 4 if s.opt("asymmetric_quantize_inputs", False) else 3
    return 2 if s.opt("kernel_type") == 1 else 1


def _v_sequence_lstm(s: _Signature) -> int:
    if (s.i(0), s.i(2), s.o(0)) == (_I16, _I8, _I16):
        return 5
    if s.opt("diagonal_recurrent_tensors", False):
        return 4
    if (s.i(0), s.i(2), s.o(0)) == (_F32, _I8, _F32):
        return 3 if s.opt("asymmetric_quantize_inputs", False) else 2
    return 1


def _v_rnn(s: _Signature) -> int:
    if s.i(1) == _I8 and s.o(0) == _F32:
        return 3 if s.opt("asymmetric_quantize_inputs", False) else 2
    return 1


def _v_dequantize(s: _Signature) -> int:
    i0 = s.i(0)
    if i0 == _I4:
        return 6
    if i0 in (_I16, _F16):
        return 3
    if i0 == _I8:
        return 5 if s.per_axis(s.inputs[0]) else 2
    return 1


def _v_quantize(s: _Signature) -> int:
    if _I4 in (s.i(0), s.o(0)):
        return 4
    if s.per_axis(s.outputs[0] if s.outputs else None):
        return 3
    return 2 if s.o(0) == _I16 else 1


def _v_strided_slice(s: _Signature) -> int:
    i0 = s.i(0)
    if s.opt("offset", False):
        return 8
    if i0 == _U32:
        return 7
    if s.opt("ellipsis_mask") or s.opt("new_axis_mask"):
        return 6
    if i0 == _STR:
        return 5
    if s.rank(0) > 4:
        return 4
    return _by_type({_BOOL: 3, _I8: 2})(s)


def _v_slice(s: _Signature) -> int:
    i0 = s.i(0)
    if i0 == _I4:
        return 7
    if i0 == _U32:
        return 6
    if s.rank(0) > 4:
        return 5
    return _by_type({_I16: 4, _STR: 3, _I8: 2})(s)


def _v_resize(s: _Signature) -> int:
    if s.i(0) == _I16:
        return 4
    if s.opt("half_pixel_centers", False) or (
        s.op.opcode == "RESIZE_NEAREST_NEIGHBOR" and s.opt("align_corners", False)
    ):
        return 3
    return 2 if s.i(0) == _I8 else 1


def _v_cast(s: _Signature) -> int:
    ends = (s.i(0), s.o(0))
    if _BF16 in ends:
        return 7
    if ends == (_I4, _F32):
        return 6
    if _F64 in ends or _F16 in ends:
        return 5
    if _U16 in ends:
        return 4
    if _I8 in ends:
        return 3
    return 2 if _U32 in ends else 1


def _v_int16_int8(s: _Signature) -> int:
    """SOFTMAX, MEAN, RELU6...: int16 is version 3, int8 version 2."""
    return 3 if s.i(0) == _I16 else 2 if s.i(0) == _I8 else 1


def _v_int8(s: _Signature) -> int:
    return 2 if s.i(0) == _I8 else 1


def _v_pool_activation(s: _Signature) -> int:
    """Pools, TANH, LOGISTIC: int16 in and out is version 3, int8 version 2."""
    if s.i(0) == _I16 and s.o(0) == _I16:
        return 3
    return 2 if s.i(0) == _I8 else 1


def _by_type(table: Mapping[int, int], k: int = 0, other: int = 1) -> Callable[[_Signature], int]:
    """A rule that only looks at input ``k``'s type."""

    def rule(s: _Signature) -> int:
        t = s.i(k)
        return other if t is None else table.get(t, other)

    return rule


def _v_embedding_lookup(s: _Signature) -> int:
    per_channel = s.scales(1) > 1 and s.per_channel(1, 0)
    return 4 if s.i(1) == _I4 or per_channel else 1


def _v_gather(s: _Signature) -> int:
    if s.i(0) == _I4:
        return 7
    if s.i(1) == _I16:
        return 6
    if s.opt("batch_dims"):
        return 5
    return _by_type({_I16: 4, _BOOL: 3, _I8: 2})(s)


def _v_svdf(s: _Signature) -> int:
    if s.i(0) == _I8:
        return 3
    if (s.i(0), s.i(1), s.o(0)) == (_F32, _I8, _F32):
        return 4 if s.opt("asymmetric_quantize_inputs", False) else 2
    return 1


def _v_unpack(s: _Signature) -> int:
    if s.i(0) == _I16 and s.o(0) == _I16:
        return 4
    return _by_type({_I8: 2, _U8: 2, _BOOL: 3, _F16: 5, _BF16: 5})(s)


def _v_abs(s: _Signature) -> int:
    if s.i(0) == _I32:
        return 5
    if s.i(0) == _I16:
        return 3 if s.quantized(0) else 4
    return _by_type({_I8: 2, _U8: 2})(s)


def _v_maximum(s: _Signature) -> int:
    if s.i(0) == _I16 and s.o(0) == _I16:
        return 4
    return 3 if s.broadcast_over_4d() else _v_int8(s)


def _v_pack(s: _Signature) -> int:
    if s.i(0) == _I16 and s.o(0) == _I16:
        return 3
    return _by_type({_I8: 2, _U32: 4})(s)


def _v_space_batch(s: _Signature) -> int:
    if s.i(0) == _I16:
        return 4
    return 3 if s.rank(0) != 4 else _v_int8(s)


def _v_gather_nd(s: _Signature) -> int:
    if s.i(0) == _BOOL:
        return 5
    if s.i(1) == _I16:
        return 4
    return _by_type({_I16: 3, _STR: 2})(s)


def _v_fill(s: _Signature) -> int:
    if len(s.inputs) < 2:
        return 1
    return _by_type({_F16: 4, _I8: 3, _I16: 3, _BOOL: 2, _STR: 2}, k=1)(s)


def _v_batch_matmul(s: _Signature) -> int:
    if s.i(0) in (_I16, _I8):
        return 3 if s.i(0) == _I16 else 2
    hybrid = (s.i(0), s.i(1), s.o(0)) == (_F32, _I8, _F32)
    return 4 if hybrid and s.opt("asymmetric_quantize_inputs", False) else 1


def _v_pad(s: _Signature) -> int:
    if s.i(0) == _BOOL:
        return 5
    return 4 if s.rank(0) > 4 else _v_int16_int8(s)


def _v_select(s: _Signature) -> int:
    if s.i(0) == _U32:
        return 4
    return 3 if 5 in (s.rank(0), s.rank(1), s.rank(2)) else _v_int8(s)


def _v_topk(s: _Signature) -> int:
    return 3 if _I16 in (s.i(0), s.i(1), s.o(1)) else _v_int8(s)


def _v_dynamic_update_slice(s: _Signature) -> int:
    found = _by_type({_BF16: 6, _I4: 5, _I16: 4, _F16: 3}, other=0)(s)
    return found or (2 if s.i(2) == _I64 else 1)


_VERSION_RULES: dict[str, Callable[[_Signature], int]] = {
    "CONV_2D": _v_conv,
    "DEPTHWISE_CONV_2D": _v_depthwise,
    "FULLY_CONNECTED": _v_fully_connected,
    "MUL": _v_mul,
    "ADD": _v_add,
    "SUB": _v_sub,
    "TRANSPOSE": _v_transpose,
    "TRANSPOSE_CONV": _v_transpose_conv,
    "LSTM": _v_lstm,
    "UNIDIRECTIONAL_SEQUENCE_LSTM": _v_sequence_lstm,
    "RNN": _v_rnn,
    "UNIDIRECTIONAL_SEQUENCE_RNN": _v_rnn,
    "BIDIRECTIONAL_SEQUENCE_RNN": _v_rnn,
    "BIDIRECTIONAL_SEQUENCE_LSTM": _v_rnn,
    "DEQUANTIZE": _v_dequantize,
    "QUANTIZE": _v_quantize,
    "STRIDED_SLICE": _v_strided_slice,
    "SLICE": _v_slice,
    "RESIZE_BILINEAR": _v_resize,
    "RESIZE_NEAREST_NEIGHBOR": _v_resize,
    "CAST": _v_cast,
    "MAX_POOL_2D": _v_pool_activation,
    "AVERAGE_POOL_2D": _v_pool_activation,
    "TANH": _v_pool_activation,
    "LOGISTIC": _v_pool_activation,
    "FAKE_QUANT": lambda s: 2 if s.opt("narrow_range", False) else 1,
    "EMBEDDING_LOOKUP": _v_embedding_lookup,
    "GATHER": _v_gather,
    "SVDF": _v_svdf,
    "SIGN": _by_type({_I32: 2}),
    "SPLIT": _by_type({_I16: 4, _I32: 3, _I8: 2}, k=1),  # input 0 is the axis
    "SPARSE_TO_DENSE": _by_type({_I8: 3, _U8: 3, _I64: 2}, k=2),
    "UNPACK": _v_unpack,
    "FLOOR_DIV": _by_type({_I16: 3, _I8: 3, _F32: 2}),
    "FLOOR_MOD": _by_type({_I16: 2, _I8: 2}),
    "L2_NORMALIZATION": lambda s: 2 if s.o(0) == _I8 else 1,
    "ABS": _v_abs,
    "RELU": _by_type({_I16: 3, _I8: 2, _U8: 2}),
    "REVERSE_V2": _by_type({_I8: 3, _BOOL: 2}),
    "MAXIMUM": _v_maximum,
    "MINIMUM": _v_maximum,
    "PACK": _v_pack,
    "TILE": _by_type({_I8: 3, _STR: 2}),
    "SQUEEZE": _by_type({_STR: 2}),
    "SPACE_TO_BATCH_ND": _v_space_batch,
    "BATCH_TO_SPACE_ND": _v_space_batch,
    "GATHER_ND": _v_gather_nd,
    "DIV": lambda s: 2 if s.broadcast_over_4d() else 1,
    "FILL": _v_fill,
    "EQUAL": _by_type({_I16: 5, _STR: 3, _I8: 2}),
    "NOT_EQUAL": _by_type({_I16: 4, _STR: 3, _I8: 2}),
    "LEAKY_RELU": _by_type({_I16: 2}),
    "RANGE": _by_type({_I64: 2}),
    "BATCH_MATMUL": _v_batch_matmul,
    "PAD": _v_pad,
    "PADV2": _v_pad,
    "CONCATENATION": _by_type({_I4: 5, _U32: 4, _I16: 3, _I8: 2}),
    "SOFTMAX": _v_int16_int8,
    "MEAN": _v_int16_int8,
    "MIRROR_PAD": _v_int16_int8,
    "REDUCE_MAX": _v_int16_int8,
    "REDUCE_MIN": _v_int16_int8,
    "RELU6": _v_int16_int8,
    "RSQRT": _v_int16_int8,
    "ARG_MAX": _by_type({_BOOL: 3, _I8: 2}),
    "ARG_MIN": _by_type({_BOOL: 3, _I8: 2}),
    "SELECT": _v_select,
    "LESS": _by_type({_I16: 3, _I8: 2}),
    "GREATER_EQUAL": _by_type({_I16: 3, _I8: 2}),
    "SELECT_V2": _by_type({_U32: 2}),
    "SPACE_TO_DEPTH": _v_int8,
    "SPLIT_V": _v_int8,
    "SUM": _v_int8,
    "LOG_SOFTMAX": _v_int8,
    "GREATER": _v_int8,
    "LESS_EQUAL": _v_int8,
    "SQUARED_DIFFERENCE": _v_int8,
    "DEPTH_TO_SPACE": _v_int8,
    "TOPK_V2": _v_topk,
    "EXP": _by_type({_I8: 2, _I16: 2}),
    "LOG": _by_type({_I8: 2, _I16: 2}),
    "REDUCE_PROD": _by_type({_I8: 2, _I16: 2}),
    "SQRT": _by_type({_I8: 2, _I16: 2}),
    "DYNAMIC_UPDATE_SLICE": _v_dynamic_update_slice,
    "BROADCAST_TO": _by_type({_I8: 3, _I16: 3}, other=2),
    "WHERE": _by_type({_BOOL: 1}, other=2),
    "GELU": _by_type({_I8: 2, _U8: 2}),
}


def tflite_op_version(op: TFLiteOperator, tensors: Sequence[TFLiteTensor]) -> int:
    """The least version of ``op`` LiteRT needs, from its opcode, options and tensor types.

    Follows TensorFlow's ``op_version.cc`` (``GetBuiltinOperatorVersion``), which the converter
    uses: e.g. a float CONV_2D is 1, an int8 one (per-tensor or per-channel weights) 3, a float
    one with int8 weights (hybrid) 2, or 5 with per-channel weights. Custom ops and ops the
    file does not list are 1.

    Args:
        op: the operator.
        tensors: its subgraph's tensors (``op``'s indices point into them).
    """
    if op.opcode == "CUSTOM":
        return 1
    rule = _VERSION_RULES.get(op.opcode)
    return 1 if rule is None else rule(_Signature(op, tensors))


def enum_values(schema: TFLiteSchema, field: str) -> dict[str, int]:
    """The values of the enum an option field holds, by upper-case name."""
    enum = getattr(schema.module, OPTION_ENUMS[field], None)
    if enum is None:
        return {}
    return {k.upper(): v for k, v in vars(enum).items() if isinstance(v, int)}
