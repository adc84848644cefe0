"""The ONNX graph being written from one TFLite subgraph.

The builder maps each TFLite tensor to the ONNX value that holds it and gives translators a few
helpers so that each op's translator stays short:

- **Values.** ``get(i)`` is the value of the op's i-th input *as real numbers*: quantized tensors
  are seen through a ``DequantizeLinear``, so translators write float math and never rescale by
  hand. ``raw(i)`` is the stored integers, for the few ops that read them (CAST).
- **Quantization as QDQ.** ``bind(index, value)`` gives a TFLite tensor its value; when the tensor
  is quantized, a ``QuantizeLinear``/``DequantizeLinear`` pair is inserted, which rounds and clamps
  exactly where the integer kernel does (per-tensor or per-channel, any zero point).
- **Layout.** TFLite is NHWC and stays NHWC: graph inputs and outputs keep TFLite's layout. Ops
  that ONNX defines on NCHW only (Conv, pooling...) are wrapped in Transposes by
  ``to_nchw``/``bind_nchw``; a tensor made by one such op and read by the next is handed over in
  NCHW directly, so chains of convolutions carry no Transposes between them.
- **Names.** ONNX values carry the TFLite tensor names; helper values add a ``/suffix``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from ferry.errors import ConversionError
from ferry.tflite._schema import (
    TFLITE_INT4,
    TFLiteOperator,
    TFLiteQuant,
    TFLiteSubgraph,
    TFLiteTensor,
)
from ferry.tflite._tflite_to_onnx._state import State
from ferry.tflite._unsupported import Unsupported

__all__ = ["NCHW", "NHWC", "Builder", "onnx_type"]

logger = logging.getLogger(__name__)

NCHW = (0, 3, 1, 2)
NHWC = (0, 2, 3, 1)

_ONNX_TYPES = {
    0: ir.DataType.FLOAT,
    1: ir.DataType.FLOAT16,
    2: ir.DataType.INT32,
    3: ir.DataType.UINT8,
    4: ir.DataType.INT64,
    5: ir.DataType.STRING,
    6: ir.DataType.BOOL,
    7: ir.DataType.INT16,
    8: ir.DataType.COMPLEX64,
    9: ir.DataType.INT8,
    10: ir.DataType.DOUBLE,
    11: ir.DataType.COMPLEX128,
    12: ir.DataType.UINT64,
    15: ir.DataType.UINT32,
    16: ir.DataType.UINT16,
    17: ir.DataType.INT4,
    18: ir.DataType.BFLOAT16,
}

# Integer types whose quantized tensors become QDQ pairs (activations and weights).
_QDQ_TYPES = {3: np.uint8, 7: np.int16, 9: np.int8, 16: np.uint16}
# Constant-only quantized types dequantized through a DequantizeLinear (biases, int4 weights).
_DQ_CONST_TYPES = {2, TFLITE_INT4}
# Opset 21 is the first whose QuantizeLinear produces 16-bit integers.
_OPSET_16BIT_QDQ = 21


def onnx_type(tflite_type: int) -> ir.DataType:
    """The ONNX element type of a TFLite TensorType code."""
    try:
        return _ONNX_TYPES[tflite_type]
    except KeyError:
        raise Unsupported(f"TFLite tensor type {tflite_type} has no ONNX equivalent") from None


class Builder:
    """Accumulates the nodes, initializers and inputs of the ONNX graph for one subgraph.

    Args:
        subgraph: the TFLite subgraph being translated.
        opset: the default-domain opset the translators write for.
        state: its resource variables (``_state``), which become graph inputs and outputs.
    """

    def __init__(self, subgraph: TFLiteSubgraph, opset: int, state: State | None = None) -> None:
        self.sg = subgraph
        self.opset = opset
        self.state = state if state is not None else State()
        self.nodes: list[ir.Node] = []
        self.initializers: list[ir.Value] = []
        self.inputs: list[ir.Value] = []
        self.outputs: list[ir.Value] = []
        self._names: set[str] = set()
        self._node_names: set[str] = set()
        # Tensor index -> its value as real numbers (dequantized) / as stored.
        self._real: dict[int, ir.Value] = {}
        self._raw: dict[int, ir.Value] = {}
        # Values bound to a tensor, a graph input or an initializer: never renamed.
        self._owned: set[ir.Value] = set()
        # NHWC value -> the same data in NCHW, to skip Transpose pairs between NCHW ops.
        self._nchw: dict[ir.Value, ir.Value] = {}
        self._qparams: dict[tuple[int, str], tuple[ir.Value, ir.Value]] = {}
        # Tensor index -> (constant tensor it is a view of, element type to cast to).
        self._folded: dict[int, tuple[int, ir.DataType | None]] = {}
        self.op: TFLiteOperator | None = None
        # Names the graph's inputs and outputs must carry: reserved so that nothing else takes
        # them; the input, or the value bound to the output tensor, claims its name.
        self._reserved = {subgraph.tensors[i].name for i in (*subgraph.inputs, *subgraph.outputs)}
        self._reserved.update(v.input_name for v in self.state.inputs)
        self._reserved.update(v.output_name for v in self.state.outputs)

    # ---------------------------------------------------------------------------- naming

    def unique(self, base: str) -> str:
        """``base``, or ``base_<n>`` if that name is taken."""
        name = base
        n = 1
        while name in self._names or name in self._reserved:
            name = f"{base}_{n}"
            n += 1
        self._names.add(name)
        return name

    def claim(self, name: str) -> str:
        """A reserved graph input/output name if still free, else a unique variant of it."""
        if name in self._reserved:
            self._reserved.discard(name)
            self._names.add(name)
            return name
        return self.unique(name)

    @property
    def prefix(self) -> str:
        """The name the current op's helper nodes and values start with."""
        op = self.op
        if op is None:
            return "graph"
        if op.outputs and op.outputs[0] >= 0:
            # Fused TFLite names list every TF op folded in ("a/Relu;a/BiasAdd;a/conv"):
            # the first one is enough to tell where a helper belongs.
            return self.sg.tensors[op.outputs[0]].name.split(";")[0]
        return f"{op.opcode}_{op.index}"

    # ---------------------------------------------------------------------------- nodes

    @contextlib.contextmanager
    def body(self) -> Iterator[list[ir.Node]]:
        """Collect the nodes made inside the block into a list of their own (a Scan/Loop body)
        instead of the main graph. Constants still go to the main graph's initializers, which
        the body reads from the outer scope."""
        saved = self.nodes
        self.nodes = []
        try:
            yield self.nodes
        finally:
            self.nodes = saved

    def node(
        self,
        op_type: str,
        inputs: Sequence[ir.Value | None],
        attributes: Mapping[str, Any] | None = None,
        *,
        outputs: int = 1,
        name: str | None = None,
        domain: str = "",
    ) -> list[ir.Value]:
        """Append a node; return its outputs (named after the current op)."""
        base = f"{self.prefix}/{name or op_type}"
        node_name = base
        n = 1
        while node_name in self._node_names:  # nodes and values are separate namespaces
            node_name = f"{base}_{n}"
            n += 1
        self._node_names.add(node_name)
        node = ir.node(
            op_type,
            list(inputs),
            attributes=dict(attributes or {}),
            domain=domain,
            num_outputs=outputs,
            name=node_name,
        )
        for i, value in enumerate(node.outputs):
            value.name = self.unique(base if outputs == 1 else f"{base}:{i}")
        self.nodes.append(node)
        return list(node.outputs)

    def op1(
        self,
        op_type: str,
        inputs: Sequence[ir.Value | None],
        attributes: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
    ) -> ir.Value:
        """Append a single-output node; return its output."""
        return self.node(op_type, inputs, attributes, name=name)[0]

    # ---------------------------------------------------------------------------- constants

    def const(self, array: Any, name: str, dtype: Any = None) -> ir.Value:
        """An initializer holding ``array``, named ``name`` (made unique)."""
        arr = np.asarray(array, dtype=dtype)
        value = ir.Value(
            name=self.unique(name),
            shape=ir.Shape(arr.shape),
            type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)),
        )
        value.const_value = ir.Tensor(arr, name=value.name)
        self.initializers.append(value)
        self._own(value)
        return value

    def ints(self, values: Sequence[int] | np.ndarray, name: str = "ints") -> ir.Value:
        """An int64 1-D constant (shapes, axes, pads...)."""
        return self.const(np.asarray(values, dtype=np.int64).reshape(-1), f"{self.prefix}/{name}")

    def scalar(self, value: float | int, dtype: Any = np.float32, name: str = "c") -> ir.Value:
        """A 0-D constant."""
        return self.const(np.asarray(value, dtype=dtype), f"{self.prefix}/{name}")

    # ---------------------------------------------------------------------------- tensors

    def tensor(self, index: int) -> TFLiteTensor:
        return self.sg.tensors[index]

    def input_tensor(self, i: int) -> TFLiteTensor | None:
        """The current op's i-th input tensor, None when omitted."""
        op = self._current()
        if i >= len(op.inputs) or op.inputs[i] < 0:
            return None
        return self.sg.tensors[op.inputs[i]]

    def need(self, i: int) -> TFLiteTensor:
        """The current op's i-th input tensor, which the op cannot do without."""
        t = self.input_tensor(i)
        if t is None:
            raise Unsupported(f"its required input {i} is missing")
        return t

    def output_tensor(self, i: int = 0) -> TFLiteTensor:
        return self.sg.tensors[self._current().outputs[i]]

    def has_input(self, i: int) -> bool:
        return self.input_tensor(i) is not None

    def get(self, i: int) -> ir.Value:
        """The current op's i-th input, dequantized when quantized."""
        t = self.input_tensor(i)
        if t is None:
            raise Unsupported(f"input {i} is missing")
        return self.real(t.index)

    def get_opt(self, i: int) -> ir.Value | None:
        """Like :meth:`get`, but None for an omitted optional input."""
        t = self.input_tensor(i)
        return None if t is None else self.real(t.index)

    def raw(self, i: int) -> ir.Value:
        """The current op's i-th input as stored (quantized integers stay integers)."""
        t = self.input_tensor(i)
        if t is None:
            raise Unsupported(f"input {i} is missing")
        self.real(t.index)
        return self._raw.get(t.index) or self._real[t.index]

    def constant(self, i: int) -> np.ndarray | None:
        """The current op's i-th input's stored values when it is a constant, else None."""
        t = self.input_tensor(i)
        if t is None or t.data is None or t.sparsity is not None:
            return None
        return t.data

    def static(self, i: int, what: str) -> np.ndarray:
        """The i-th input's constant values; Unsupported when it is computed at run time."""
        data = self.constant(i)
        if data is None:
            raise Unsupported(
                f"its {what} (input {i}) must be a constant, not computed at run time"
            )
        return data

    def real(self, index: int) -> ir.Value:
        """Tensor ``index`` as real numbers (making constants on first use)."""
        if index in self._real:
            return self._real[index]
        if index in self._folded:
            self._real[index] = self.weight(index)
            return self._real[index]
        t = self.sg.tensors[index]
        if t.data is None and t.is_variable:
            # State tensors (LSTM states) start at zero and are read before they are written.
            shape = tuple(d if d is not None else 1 for d in t.dims)
            t.data = np.zeros(shape, dtype=_numpy_type(t))
        if t.opaque:
            raise Unsupported(f"constant {t.name!r} is of type {t.type_name}")
        if t.data is None:
            raise ConversionError(
                f"TFLite tensor {t.name!r} (#{index}) is read before any op writes it; "
                "the file's operators are not in execution order"
            )
        if t.sparsity is not None:
            raise Unsupported(
                f"tensor {t.name!r} is sparse; only DENSIFY may read a sparse constant"
            )
        axis = t.quant.axis if t.quant is not None else 0
        self._real[index] = self._constant_value(t, t.data, axis, "")
        return self._real[index]

    def weight(
        self, index: int, perm: Sequence[int] | None = None, shape: Sequence[int] | None = None
    ) -> ir.Value:
        """Tensor ``index`` as real numbers, optionally transposed then reshaped.

        A constant is transposed in numpy (its quantization axis follows), so that weights reach
        Conv/Gemm as ``DequantizeLinear(initializer)``, the form ONNX Runtime fuses into integer
        kernels. A computed tensor gets Transpose/Reshape nodes.
        """
        if index in self._folded:
            source, cast = self._folded[index]
            value = self.weight(source, perm, shape)
            return value if cast is None else self.op1("Cast", [value], {"to": cast})
        t = self.sg.tensors[index]
        identity = perm is None or list(perm) == list(range(len(perm)))
        if t.data is None or t.sparsity is not None:
            value = self.real(index)
            if not identity:
                value = self.op1("Transpose", [value], {"perm": list(perm or ())})
            if shape is not None:
                value = self.op1("Reshape", [value, self.ints(shape, "shape")])
            return value
        if identity and shape is None:
            return self.real(index)
        data = t.data
        axis = t.quant.axis if t.quant is not None else 0
        if not identity:
            data = np.transpose(data, perm)
            axis = list(perm or ()).index(axis) if t.quant is not None else 0
        if shape is not None:
            if t.quant is not None and t.quant.per_channel and data.ndim != len(shape):
                # Translators only reshape per-channel weights keeping the channel axis.
                raise ConversionError(f"cannot reshape per-channel quantized constant {t.name!r}")
            data = data.reshape(shape)
        return self._constant_value(t, np.asarray(data, order="C"), axis, "/transformed")

    def _constant_value(
        self, t: TFLiteTensor, data: np.ndarray, axis: int, suffix: str
    ) -> ir.Value:
        q = t.quant
        if q is None or not (t.type in _QDQ_TYPES or t.type in _DQ_CONST_TYPES):
            if q is not None and t.type == 4:
                # int64 biases (16x8 quantization): DequantizeLinear has no int64 input.
                return self.const(q.dequantize(data, axis), f"{t.name}{suffix}/dequantized")
            return self.const(data, t.name + suffix)
        stored = self.const(data, t.name + suffix)
        if not suffix:
            self._raw[t.index] = stored
        scale, zero = self._qparams_for(t, q, data.dtype, axis)
        attrs = {"axis": axis} if q.per_channel else {}
        out = self.op1("DequantizeLinear", [stored, scale, zero], attrs, name="dequantize")
        out.name = self.unique(f"{t.name}{suffix}/dequantized")
        self._own(out)
        return out

    def _qparams_for(
        self, t: TFLiteTensor, q: TFLiteQuant, dtype: np.dtype[Any], axis: int
    ) -> tuple[ir.Value, ir.Value]:
        key = (t.index, f"{dtype.str}/{axis}")
        if key not in self._qparams:
            if q.per_channel:
                scale = q.scale.astype(np.float32)
                zero = q.zero_point.astype(dtype)
            else:
                scale = np.asarray(q.scale[0], dtype=np.float32)
                zero = np.asarray(q.zero_point[0], dtype=dtype)
            self._qparams[key] = (
                self.const(scale, f"{t.name}/scale"),
                self.const(zero, f"{t.name}/zero_point"),
            )
        return self._qparams[key]

    # ---------------------------------------------------------------------------- inputs

    def add_input(
        self,
        index: int,
        shape: Sequence[int | str | None],
        *,
        name: str | None = None,
        default: np.ndarray | None = None,
    ) -> None:
        """Make tensor ``index`` a graph input of the given shape (TFLite layout and type).

        Args:
            index: the tensor.
            shape: its dims, symbolic ones as names.
            name: the input's name (default: the tensor's).
            default: the value it takes when a caller leaves it out: an initializer that is also
                an input (IR 4 and later), e.g. a state variable's initial value.
        """
        t = self.sg.tensors[index]
        value = ir.Value(
            name=self.claim(name or t.name),
            shape=ir.Shape(list(shape)),
            type=ir.TensorType(onnx_type(t.type)),
        )
        if default is not None:
            value.const_value = ir.Tensor(
                np.asarray(default, dtype=_numpy_type(t), order="C"), name=value.name
            )
            self.initializers.append(value)
        self.inputs.append(value)
        self._own(value)
        self.bind_raw(index, value)

    def bind_raw(self, index: int, stored: ir.Value) -> None:
        """Make ``stored`` (numbers as stored: the integers of a quantized tensor) the value of
        tensor ``index``, read with its own quantization (a resource variable's bytes, read by
        READ_VARIABLE)."""
        t = self.sg.tensors[index]
        if t.quant is not None and t.type in _QDQ_TYPES:
            self._raw[index] = stored
            scale, zero = self._qparams_for(t, t.quant, np.dtype(_QDQ_TYPES[t.type]), 0)
            out = self.op1("DequantizeLinear", [stored, scale, zero], name="dequantize")
            out.name = self.unique(f"{t.name}/dequantized")
            self._own(out)
            self._real[index] = out
        else:
            self._real[index] = stored

    # ---------------------------------------------------------------------------- outputs

    def bind(self, index: int, value: ir.Value) -> None:
        """Make ``value`` (real numbers, TFLite layout) the value of tensor ``index``.

        A quantized tensor is rounded through QuantizeLinear/DequantizeLinear; a fresh value is
        renamed after the tensor; a value already owned by another tensor is shared (aliased).
        """
        t = self.sg.tensors[index]
        if _is_qdq(t):
            self._bind_quantized(t, value, nchw=False)
            return
        if value not in self._owned:
            value.name = self._tensor_name(t)
            self._own(value)
        self._real[index] = value

    def bind_nchw(self, index: int, value: ir.Value) -> None:
        """Like :meth:`bind` for a value computed in NCHW: transpose it back to NHWC, and
        remember the NCHW form so that the next NCHW op reads it without a Transpose pair."""
        t = self.sg.tensors[index]
        if _is_qdq(t):
            self._bind_quantized(t, value, nchw=True)
            return
        nhwc = self.op1("Transpose", [value], {"perm": list(NHWC)}, name="to_nhwc")
        self._nchw[nhwc] = value
        self.bind(index, nhwc)

    def _bind_quantized(self, t: TFLiteTensor, value: ir.Value, *, nchw: bool) -> None:
        assert t.quant is not None
        dtype = np.dtype(_QDQ_TYPES[t.type])
        if dtype.itemsize == 2 and self.opset < _OPSET_16BIT_QDQ:
            raise ConversionError(
                f"16-bit quantized tensor {t.name!r} needs opset {_OPSET_16BIT_QDQ}"
            )  # the translator picks the opset up front from the tensor types
        scale, zero = self._qparams_for(t, t.quant, dtype, 0)
        q = self.op1("QuantizeLinear", [value, scale, zero], name="quantize")
        dq = self.op1("DequantizeLinear", [q, scale, zero], name="dequantize")
        if nchw:
            # NCHW consumers read dq; NHWC ones read the integers transposed, then dequantized,
            # so that a DequantizeLinear always feeds the op that computes with it (the QDQ
            # form ONNX Runtime fuses; unused halves are removed at the end).
            q.name = self.unique(f"{t.name}/nchw_quantized")
            dq.name = self.unique(f"{t.name}/nchw")
            stored = self.op1("Transpose", [q], {"perm": list(NHWC)}, name="to_nhwc")
            stored.name = self._tensor_name(t)
            real = self.op1("DequantizeLinear", [stored, scale, zero], name="dequantize")
            real.name = self.unique(f"{t.name}/dequantized")
            self._nchw[real] = dq
            self._owned.update({q, dq, stored, real})
            self._real[t.index] = real
            self._raw[t.index] = stored
        else:
            q.name = self._tensor_name(t)
            dq.name = self.unique(f"{t.name}/dequantized")
            self._owned.update({q, dq})
            self._real[t.index] = dq
            self._raw[t.index] = q

    def raw_of(self, index: int) -> ir.Value:
        """Tensor ``index`` as stored, in TFLite layout (the quantized integers for QDQ)."""
        return self._raw.get(index) or self.real(index)

    def alias(self, index: int, source: ir.Value) -> None:
        """Tensor ``index`` holds the same real values as ``source`` (QUANTIZE, DEQUANTIZE...)."""
        self.bind(index, source)

    def fold(self, index: int, source: int, cast: ir.DataType | None = None) -> None:
        """Tensor ``index`` is constant ``source`` read as real numbers (cast to ``cast``).

        DEQUANTIZE of a constant uses this so that its consumers still see a constant they can
        transpose in numpy (``weight``) rather than a computed tensor.
        """
        self._folded[index] = (source, cast)

    def is_constant(self, index: int) -> bool:
        """Whether tensor ``index`` is a constant (possibly through DEQUANTIZE/DENSIFY)."""
        if index in self._folded:
            return True
        t = self.sg.tensors[index]
        return t.data is not None and t.sparsity is None

    def is_bound(self, index: int) -> bool:
        t = self.sg.tensors[index]
        return index in self._real or index in self._folded or t.data is not None

    def _tensor_name(self, t: TFLiteTensor) -> str:
        if t.index in self.sg.outputs and t.index not in self.sg.inputs:
            return self.claim(t.name)
        return self.unique(t.name)

    def _own(self, value: ir.Value) -> None:
        self._owned.add(value)

    # ---------------------------------------------------------------------------- layout

    def nchw_twin(self, value: ir.Value) -> ir.Value | None:
        """The NCHW form of NHWC ``value`` if one exists already (made by an NCHW op)."""
        return self._nchw.get(value)

    def constant_nchw(self, index: int) -> ir.Value | None:
        """Constant tensor ``index`` laid out to broadcast against NCHW data as it does against
        NHWC data (left-padded to rank 4, then transposed); None if it is not a constant."""
        cast = None
        if index in self._folded:
            index, cast = self._folded[index]
        t = self.sg.tensors[index]
        if t.data is None or t.sparsity is not None or t.data.ndim > 4:
            return None
        if t.data.size == 1:
            value = self.real(index)  # broadcasts the same in any layout
        else:
            pad = 4 - t.data.ndim
            data = np.asarray(t.data.reshape((1,) * pad + t.data.shape).transpose(NCHW), order="C")
            axis = NCHW.index(t.quant.axis + pad) if t.quant is not None else 0
            value = self._constant_value(t, data, axis, "/nchw")
        return value if cast is None else self.op1("Cast", [value], {"to": cast})

    def to_nchw(self, value: ir.Value) -> ir.Value:
        """``value`` (rank 4, NHWC) in NCHW, reusing an existing NCHW form."""
        found = self._nchw.get(value)
        if found is not None:
            return found
        producer = value.producer()
        if (
            producer is not None
            and producer.op_type == "DequantizeLinear"
            and "axis" not in producer.attributes
            and producer.inputs[0] is not None
        ):
            # Per-tensor dequantization commutes with a transpose: transpose the integers so
            # that the DequantizeLinear stays next to the op that reads it.
            stored, scale, zero = producer.inputs
            moved = self.op1("Transpose", [stored], {"perm": list(NCHW)}, name="to_nchw")
            out = self.op1("DequantizeLinear", [moved, scale, zero], name="dequantize")
        else:
            out = self.op1("Transpose", [value], {"perm": list(NCHW)}, name="to_nchw")
        self._nchw[value] = out
        return out

    # ---------------------------------------------------------------------------- finishing

    def finish_outputs(self) -> None:
        """Create the graph outputs: each carries its TFLite tensor's name, type and layout."""
        taken: set[ir.Value] = set()
        for index in self.sg.outputs:
            t = self.sg.tensors[index]
            value = self.raw_of(index)
            if value.name != t.name or value in taken or value in self.inputs:
                # Aliases, graph inputs and repeated outputs need a value of their own. A
                # dequantized alias (DEQUANTIZE's output) gets its own DequantizeLinear rather
                # than an Identity behind one: ONNX Runtime's QDQ propagation mishandles the
                # latter from opset 21 on (ORT 1.32).
                producer = value.producer()
                if producer is not None and producer.op_type == "DequantizeLinear":
                    attrs = {k: a.value for k, a in producer.attributes.items()}
                    value = self.op1("DequantizeLinear", list(producer.inputs), attrs)
                else:
                    value = self.op1("Identity", [value], name="output")
                value.name = self.claim(t.name)
            taken.add(value)
            value.type = ir.TensorType(onnx_type(t.type))
            value.shape = ir.Shape(list(t.dims))
            self.outputs.append(value)
        for variable in self.state.outputs:
            assert variable.assigned is not None
            t = self.sg.tensors[variable.assigned]
            value = self.op1("Identity", [self.raw_of(variable.assigned)], name="state_out")
            value.name = self.claim(variable.output_name)
            value.type = ir.TensorType(onnx_type(t.type))
            value.shape = ir.Shape(list(t.dims))
            self.outputs.append(value)

    def _current(self) -> TFLiteOperator:
        if self.op is None:
            raise ConversionError("no TFLite op is being translated")  # a translator bug
        return self.op


def _is_qdq(t: TFLiteTensor) -> bool:
    """Whether tensor ``t`` is a quantized activation that becomes a QDQ pair."""
    if t.quant is None or t.type not in _QDQ_TYPES:
        return False
    if t.quant.per_channel:
        raise Unsupported(
            f"tensor {t.name!r} is quantized per channel, which TFLite only allows for constants"
        )
    return True


def _numpy_type(t: TFLiteTensor) -> np.dtype[Any]:
    return np.dtype(onnx_type(t.type).numpy())
