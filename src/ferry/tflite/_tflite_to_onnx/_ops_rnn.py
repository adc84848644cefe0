"""TFLite -> ONNX translators: the recurrent op (UNIDIRECTIONAL_SEQUENCE_LSTM) and the
resource-variable ops of stateful models (see ``_state``)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ferry.tflite._schema import TFLiteOperator
from ferry.tflite._tflite_to_onnx._builder import Builder
from ferry.tflite._tflite_to_onnx._ops import (
    _RELU,
    _RELU6,
    _RELU_N1_TO_1,
    _TANH,
    _activation,
    _out,
    _register,
)
from ferry.tflite._unsupported import Unsupported

__all__: list[str] = []


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
# The variables are graph inputs and outputs (see ``_state``): the builder makes the inputs
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
