"""One translator per TFLite builtin op: ``TRANSLATORS[opcode](builder, op)``; the shared helpers.

The translators live by op family in ``_ops_conv``, ``_ops_elementwise``, ``_ops_shape`` and
``_ops_rnn``; each registers its own into :data:`TRANSLATORS` (or :data:`CUSTOM_TRANSLATORS`)
when imported, and ``_translate`` imports them all.

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

from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir

from ferry.tflite._schema import TFLiteOperator, TFLiteTensor
from ferry.tflite._tflite_to_onnx._builder import Builder
from ferry.tflite._unsupported import Unsupported

__all__ = ["CONTROL_FLOW", "CUSTOM_TRANSLATORS", "TRANSLATORS", "Translator"]

Translator = Callable[[Builder, TFLiteOperator], None]

#: Ops that call other subgraphs; named in the error so the user knows why. (CALL_ONCE, which
#: initialises resource variables, is translated: see ``_state``.)
CONTROL_FLOW = {"WHILE", "IF", "CALL", "STABLEHLO_WHILE", "STABLEHLO_COMPOSITE"}

_INT64_MAX = np.iinfo(np.int64).max
_INT64_MIN = np.iinfo(np.int64).min

# ActivationFunctionType
_NONE, _RELU, _RELU_N1_TO_1, _RELU6, _TANH, _SIGN_BIT = range(6)
# Padding
_SAME, _VALID = 0, 1

TRANSLATORS: dict[str, Translator] = {}
#: Custom ops with a translation, by custom code.
CUSTOM_TRANSLATORS: dict[str, Translator] = {}


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
