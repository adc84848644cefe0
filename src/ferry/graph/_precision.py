"""Whether a model is already reduced-precision, and how: the one place every verb asks.

Before -> After::

    model -> ReducedPrecision: the quantization it holds, by kind, with the ops that show it
        static QDQ        QuantizeLinear/DequantizeLinear pairs (ONNX Runtime's quantize_static,
                          NNCF, TensorRT's toolkit, PyTorch's QAT export)
        dynamic int8      DynamicQuantizeLinear, MatMulInteger, ConvInteger, DynamicQuantizeLSTM
                          (quantize_dynamic)
        QOperator int8    QLinearConv, QLinearMatMul, QGemm... (integer ops with their scales)
        weight-only int8  an integer constant widened by Cast (then scaled by Mul): weights stored
                          in int8, computed in float
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import onnx_ir as ir

__all__ = ["ReducedPrecision", "reduced_precision"]

#: Ops that quantize activations per call (ONNX Runtime's dynamic quantization).
DYNAMIC_OPS = frozenset(
    {
        "DynamicQuantizeLinear",
        "MatMulInteger",
        "ConvInteger",
        "DynamicQuantizeLSTM",
        "DynamicQuantizeMatMul",
        "MatMulIntegerToFloat",
    }
)
#: Integer ops that carry their own scales (the QOperator format).
QOPERATOR_OPS = frozenset(
    {
        "QLinearConv",
        "QLinearMatMul",
        "QGemm",
        "QLinearAdd",
        "QLinearMul",
        "QLinearSigmoid",
        "QLinearLeakyRelu",
        "QLinearAveragePool",
        "QLinearGlobalAveragePool",
        "QLinearConcat",
        "QLinearSoftmax",
        "QAttention",
    }
)
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
#: Element types weights are stored in when they are reduced below float16.
INTEGER_WEIGHTS = frozenset(
    {ir.DataType.INT8, ir.DataType.UINT8, ir.DataType.INT4, ir.DataType.UINT4}
)
_FLOATS = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16})
#: An integer constant of up to this many elements widened to float is arithmetic (a few
#: numbers), not a stored weight.
_FEW = 16


@dataclasses.dataclass(frozen=True)
class ReducedPrecision:
    """The quantization a model already holds.

    Attributes:
        ops: the quantization ops found, by op type (subgraphs included).
        weight_casts: integer weight constants widened to float by a Cast (weight-only int8).
        kinds: ``static QDQ``, ``dynamic int8``, ``QOperator int8``, ``weight-only int8``:
            the forms found, in that order; empty for a float model.
    """

    ops: dict[str, int]
    weight_casts: int
    kinds: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.kinds)

    def describe(self) -> str:
        """One line: ``static QDQ (QuantizeLinear x12, DequantizeLinear x17)``."""
        if not self.kinds:
            return "float (no quantization)"
        parts = []
        for kind in self.kinds:
            if kind == "weight-only int8":
                parts.append(f"{kind} ({self.weight_casts} integer weight(s) widened by Cast)")
                continue
            ops = _KIND_OPS[kind]
            found = ", ".join(f"{op} x{n}" for op, n in sorted(self.ops.items()) if op in ops)
            parts.append(f"{kind} ({found})")
        return "; ".join(parts)


_KIND_OPS = {"static QDQ": QDQ_OPS, "dynamic int8": DYNAMIC_OPS, "QOperator int8": QOPERATOR_OPS}


def reduced_precision(model: ir.Model) -> ReducedPrecision:
    """The quantization ``model`` already holds (false, with no kinds, for a float model).

    Args:
        model: any model; not modified.
    """
    ops: Counter[str] = Counter()
    casts = 0
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        op = node.op_type
        if op in QDQ_OPS or op in DYNAMIC_OPS or op in QOPERATOR_OPS:
            ops[op] += 1
        elif op == "Cast" and node.inputs and node.inputs[0] is not None:
            stored = node.inputs[0].const_value
            to = ir.DataType(node.attributes.get_int("to", 0))
            if stored is not None and to in _FLOATS and stored.dtype in INTEGER_WEIGHTS:
                casts += stored.size > _FEW
    kinds = []
    if any(op in QDQ_OPS for op in ops):
        kinds.append("static QDQ")
    if any(op in DYNAMIC_OPS for op in ops):
        kinds.append("dynamic int8")
    if any(op in QOPERATOR_OPS for op in ops):
        kinds.append("QOperator int8")
    if casts:
        kinds.append("weight-only int8")
    return ReducedPrecision(dict(ops), casts, tuple(kinds))
