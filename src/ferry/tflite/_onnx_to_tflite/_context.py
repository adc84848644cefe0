"""What every op translator is handed: the ONNX values seen through their TFLite tensors.

An ONNX value is *held* by one TFLite tensor in some layout (:mod:`._layout`). A translator asks
for an input in the layout it needs (:meth:`Lowering.get`): the tensor as held when it fits, a
RESHAPE when only size-1 axes move, a TRANSPOSE otherwise (each made once per value and layout);
constants are written directly in the layout asked for. It declares its outputs in the layout it
produced them in (:meth:`Lowering.output`) and emits TFLite operators (:meth:`Lowering.emit`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import onnx_ir as ir

from ferry.graph import constant
from ferry.tflite._onnx_to_tflite._builder import INT32, Builder, tflite_type
from ferry.tflite._onnx_to_tflite._layout import (
    Perm,
    identity,
    memory_order_kept,
    permute,
    transpose_between,
)
from ferry.tflite._schema import TFLITE_DTYPES, TFLiteQuant
from ferry.tflite._unsupported import Unsupported

__all__ = ["ConstQuant", "Held", "Lowering", "Options", "WeightWriter", "attr"]


@dataclasses.dataclass(frozen=True)
class Held:
    """How an ONNX value is held: the TFLite tensor and its layout."""

    index: int
    perm: Perm


def attr(node: ir.Node, name: str, default: Any = None) -> Any:
    """An attribute's value (ints and floats as Python numbers, lists as tuples), or ``default``."""
    a = node.attributes.get(name)
    if a is None:
        return default
    value = a.value
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return tuple(value)
    return value


@dataclasses.dataclass
class Options:
    """The lowering's choices: the precision, and the 4-D inputs and outputs (by name) that the
    file holds channels-last instead of in ONNX's NCHW."""

    precision: str = "fp32"
    channels_last: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True)
class ConstQuant:
    """How a constant was stored in a quantized model (a DequantizeLinear of integers)."""

    values: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray
    axis: int


class WeightWriter(Protocol):
    """Writes weights, biases and constant operands in another number format (the int8
    export's quantizer)."""

    def weight(
        self,
        cx: Lowering,
        array: np.ndarray,
        name: str,
        value: ir.Value | None,
        axis: int,
        channels: slice | None,
    ) -> int: ...

    def bias(
        self, cx: Lowering, array: np.ndarray, name: str, source: int | None, weight: int | None
    ) -> int: ...

    def operand(self, cx: Lowering, array: np.ndarray, name: str, value: ir.Value) -> int: ...


class Lowering:
    """The state of one model's lowering: its values' tensors and the subgraph being written."""

    def __init__(self, model: ir.Model, options: Options) -> None:
        self.model = model
        self.options = options
        self.b = Builder()
        self.held: dict[ir.Value, Held] = {}
        self.folded: dict[ir.Value, np.ndarray] = {}
        #: Quantization of activations (int8 export): value -> (TFLite type, parameters).
        self.quant: dict[ir.Value, tuple[int, TFLiteQuant]] = {}
        #: How weights and biases are written when they are not plain float (int8 export).
        self.weights: WeightWriter | None = None
        #: Whether the node being lowered runs integer kernels (int8 export).
        self.int8 = False
        #: Constants that a quantized model stores as integers, by the value they dequantize to.
        self.const_quant: dict[ir.Value, ConstQuant] = {}
        #: (held tensor, layout) -> the tensor holding it in that layout (made once).
        self.views: dict[tuple[int, Perm], int] = {}
        #: integer tensor -> its DEQUANTIZE to float32 (int8 export, float nodes).
        self.dequantized: dict[int, int] = {}
        self.node: ir.Node | None = None
        #: What the report should say about how ops were lowered.
        self.notes: list[str] = []
        #: Nodes a translator lowered together with its own (a fused pattern): skipped.
        self.done: set[ir.Node] = set()

    # ------------------------------------------------------------------------------ reading

    def shape(self, value: ir.Value) -> tuple[int, ...]:
        const = self.const(value)
        if const is not None:
            return tuple(const.shape)
        if value.shape is None:
            raise Unsupported(f"the shape of {value.name!r} is unknown")
        dims = tuple(value.shape)
        if not all(isinstance(d, int) for d in dims):
            raise Unsupported(f"{value.name!r} has a dynamic shape {list(dims)}")
        return tuple(int(d) for d in dims)  # type: ignore[arg-type]

    def rank(self, value: ir.Value) -> int:
        return len(self.shape(value))

    def dtype(self, value: ir.Value) -> np.dtype[Any]:
        const = self.const(value)
        if const is not None:
            return const.dtype
        if value.dtype is None:
            raise Unsupported(f"the element type of {value.name!r} is unknown")
        return np.dtype(value.dtype.numpy())

    def ttype(self, value: ir.Value) -> int:
        if value in self.quant:
            return self.quant[value][0]
        code = tflite_type(self.dtype(value))
        if code is None:
            raise Unsupported(f"TFLite has no tensor type for {value.name!r} ({self.dtype(value)})")
        return code

    def const(self, value: ir.Value | None) -> np.ndarray | None:
        """The value's numbers when it is a constant (a weight, a Constant node's, or folded here),
        else None (an initializer that is also a graph input may be fed: not a constant)."""
        if value is None:
            return None
        if value in self.folded:
            return self.folded[value]
        array = constant(value)
        if array is None:
            return None
        self.folded[value] = array
        return array

    def int_const(self, value: ir.Value | None, what: str) -> list[int]:
        """A constant integer input (axes, sizes) as a list; Unsupported when not constant."""
        array = self.const(value)
        if array is None:
            raise Unsupported(f"{what} is computed at run time, not a constant")
        return [int(v) for v in np.asarray(array).reshape(-1)]

    def perm(self, value: ir.Value) -> Perm:
        """The layout the value is held in (constants: ONNX's own)."""
        held = self.held.get(value)
        return held.perm if held is not None else identity(self.rank(value))

    def is_held(self, value: ir.Value) -> bool:
        return value in self.held

    # ------------------------------------------------------------------------------ tensors

    def get(self, value: ir.Value, perm: Sequence[int] | None = None) -> int:
        """The tensor holding ``value`` in layout ``perm`` (default: as held)."""
        const = self.const(value)
        if const is not None and value not in self.held:
            perm = tuple(perm) if perm is not None else identity(const.ndim)
            array = const.transpose(perm) if const.ndim else const
            if self.int8 and self.weights is not None and value in self.const_quant:
                return self.weights.operand(self, array, value.name or "c", value)
            return self.constant(array, value.name or "c")
        held = self.held.get(value)
        if held is None:
            raise Unsupported(f"{value.name!r} is not computed by any lowered op")
        perm = held.perm if perm is None else tuple(perm)
        if perm == held.perm:
            return held.index
        key = (held.index, perm)
        if key in self.views:
            return self.views[key]
        shape = self.shape(value)
        out = self.b.tensor(
            f"{value.name}/{'x'.join(map(str, perm))}",
            self.b.tensors[held.index].type,
            permute(shape, perm),
            quant=self.b.tensors[held.index].quant,
        )
        if memory_order_kept(shape, held.perm, perm):
            self.emit("RESHAPE", [held.index, self.ints(permute(shape, perm))], [out])
        else:
            self.emit(
                "TRANSPOSE", [held.index, self.ints(transpose_between(held.perm, perm))], [out]
            )
        self.views[key] = out
        return out

    def get_broadcast(self, value: ir.Value, rank: int, perm: Sequence[int]) -> int:
        """``value`` broadcast against a rank-``rank`` tensor held as ``perm``: ONNX aligns the
        trailing axes, so leading size-1 axes are added first; constants lose them again (TFLite
        broadcasts by the trailing axes too) to stay small."""
        shape = self.shape(value)
        if len(shape) > rank:
            raise Unsupported(f"{value.name!r} has more dims than the result")
        full = (1,) * (rank - len(shape)) + shape
        const = self.const(value)
        if const is not None and value not in self.held:
            array = const.reshape(full).transpose(tuple(perm))
            while array.ndim > 1 and array.shape[0] == 1:
                array = array[0]
            if array.size == 1:
                array = array.reshape(())
            if self.int8 and self.weights is not None and value in self.const_quant:
                return self.weights.operand(self, array, value.name or "c", value)
            return self.constant(array, value.name or "c")
        if len(shape) == rank:
            return self.get(value, perm)
        base = self.get(value)
        held = self.perm(value)
        # Expanding with leading size-1 axes keeps the bytes; reorder only if the rest moves.
        expanded = tuple(a + rank - len(shape) for a in held)
        lead = tuple(range(rank - len(shape)))
        have = lead + expanded
        out_shape = permute(full, have)
        reshaped = self.temp(f"{value.name}/rank{rank}", self.ttype_of(base), out_shape, base)
        self.emit("RESHAPE", [base, self.ints(out_shape)], [reshaped])
        if memory_order_kept(full, have, perm):
            if tuple(perm) == have:
                return reshaped
            final = self.temp(
                f"{value.name}/rank{rank}", self.ttype_of(base), permute(full, perm), base
            )
            self.emit("RESHAPE", [reshaped, self.ints(permute(full, perm))], [final])
            return final
        final = self.temp(
            f"{value.name}/rank{rank}", self.ttype_of(base), permute(full, perm), base
        )
        self.emit("TRANSPOSE", [reshaped, self.ints(transpose_between(have, perm))], [final])
        return final

    def ttype_of(self, index: int) -> int:
        return self.b.tensors[index].type

    def constant(self, array: np.ndarray, name: str, *, quant: TFLiteQuant | None = None) -> int:
        return self.b.const(np.asarray(array), name, quant=quant)

    def weight(
        self,
        array: np.ndarray,
        name: str,
        node: ir.Node,
        *,
        axis: int = 0,
        value: ir.Value | None = None,
        channels: slice | None = None,
    ) -> int:
        """A weight tensor (filters, matrices) in the layout the op reads.

        Args:
            array: the float weights, in that layout.
            name: the tensor's name.
            node: the node it belongs to.
            axis: the output-channel axis in ``array`` (per-channel quantization runs along it).
            value: the ONNX value the weights come from (a quantized model's stored integers
                and scales are kept for it).
            channels: which of that value's output channels ``array`` holds (a grouped conv's
                group), when not all.
        """
        if self.int8 and self.weights is not None:
            return self.weights.weight(self, array, name, value, axis, channels)
        return self.constant(array, name)

    def bias(
        self,
        array: np.ndarray,
        name: str,
        node: ir.Node,
        *,
        source: int | None = None,
        weight: int | None = None,
    ) -> int:
        """A bias vector of an op reading tensor ``source`` with weights ``weight`` (quantized
        models store it as int32 at ``source``'s scale times ``weight``'s)."""
        if self.int8 and self.weights is not None:
            return self.weights.bias(self, array, name, source, weight)
        return self.constant(np.asarray(array, dtype=np.float32), name)

    def fill(self, value: float, like: int, name: str) -> int:
        """A scalar constant of tensor ``like``'s type (quantized with its parameters)."""
        tensor = self.b.tensors[like]
        if tensor.quant is not None:
            scale = float(tensor.quant.scale[0])
            zero = int(tensor.quant.zero_point[0])
            info = np.iinfo(TFLITE_DTYPES[tensor.type])
            q = int(np.clip(np.round(value / scale) + zero, info.min, info.max))
            return self.b.const(
                np.asarray(q, dtype=TFLITE_DTYPES[tensor.type]), name, quant=tensor.quant
            )
        return self.b.const(np.asarray(value, dtype=TFLITE_DTYPES[tensor.type]), name)

    def ints(self, values: Sequence[int], name: str = "shape") -> int:
        """An int32 constant (shapes, axes, permutations: what TFLite's ops read)."""
        return self.b.const(np.asarray(list(values), dtype=np.int32), name, ttype=INT32)

    def output(
        self, value: ir.Value, perm: Sequence[int] | None = None, *, ttype: int | None = None
    ) -> int:
        """A new tensor for node output ``value`` held as ``perm`` (default: ONNX's layout)."""
        shape = self.shape(value)
        perm = identity(len(shape)) if perm is None else tuple(perm)
        quant = self.quant.get(value)
        index = self.b.tensor(
            value.name or "v",
            ttype if ttype is not None else self.ttype(value),
            permute(shape, perm),
            quant=quant[1] if quant is not None and ttype is None else None,
        )
        self.held[value] = Held(index, perm)
        return index

    def alias(self, value: ir.Value, index: int, perm: Sequence[int]) -> None:
        """``value`` is held by an existing tensor (an op that only relabels)."""
        self.held[value] = Held(index, tuple(perm))

    def temp(
        self,
        name: str,
        ttype: int,
        shape: Sequence[int],
        like: int | None = None,
    ) -> int:
        """A helper tensor (quantized like tensor ``like``, when given)."""
        quant = self.b.tensors[like].quant if like is not None else None
        return self.b.tensor(name, ttype, shape, quant=quant)

    def emit(
        self,
        opcode: str,
        inputs: Sequence[int],
        outputs: Sequence[int],
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.b.op(opcode, inputs, outputs, options)
