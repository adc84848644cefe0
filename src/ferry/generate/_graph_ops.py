"""A small graph writer over onnx_ir's tape: named initializers, cached constants and the few
composite patterns (RMSNorm, the projections) every decoder layer repeats.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

#: Opset of the standard-op graph: 21 is what onnxruntime 1.32 and OpenVINO both read, and the
#: first with blocked DequantizeLinear and Gelu's tanh form (20).
OPSET = 21

#: The contrib domain of onnxruntime's fused operators (MatMulNBits, GroupQueryAttention ...).
MS_DOMAIN = "com.microsoft"


class Builder:
    """Records nodes and initializers for one graph.

    Args:
        dtype: numpy float type of the activations (float32 for now).
        fused: Write onnxruntime's contrib operators where they exist (the "ort" flavour).
    """

    def __init__(self, dtype: type[np.floating[Any]] = np.float32, *, fused: bool = False) -> None:
        self.tape = ir.tape.Tape()
        self.dtype = dtype
        self.fused = fused
        self._consts: dict[tuple[str, bytes, tuple[int, ...]], ir.Value] = {}
        self._names: set[str] = set()
        self.uses_ms = False

    def op(
        self,
        op_type: str,
        inputs: Sequence[ir.Value | None],
        attributes: Mapping[str, Any] | None = None,
        *,
        domain: str = "",
        name: str | None = None,
    ) -> ir.Value:
        """One node with one output."""
        if domain == MS_DOMAIN:
            self.uses_ms = True
        out = self.tape.op(op_type, inputs, attributes, domain=domain)
        if name is not None:
            out.name = name
        return out

    def ops(
        self,
        op_type: str,
        inputs: Sequence[ir.Value | None],
        attributes: Mapping[str, Any] | None = None,
        *,
        num_outputs: int,
        domain: str = "",
    ) -> Sequence[ir.Value]:
        """One node with several outputs."""
        if domain == MS_DOMAIN:
            self.uses_ms = True
        return self.tape.op_multi_out(
            op_type, inputs, attributes, num_outputs=num_outputs, domain=domain
        )

    def init(self, name: str, array: np.ndarray) -> ir.Value:
        """A named initializer (a weight); names stay unique."""
        base, n = name, 1
        while name in self._names:
            name = f"{base}_{n}"
            n += 1
        self._names.add(name)
        return self.tape.initializer(ir.tensor(np.ascontiguousarray(array), name=name), name=name)

    def const(self, value: Any, dtype: Any = None) -> ir.Value:
        """A small constant, shared between every node that asks for the same value."""
        array = np.asarray(value, dtype=dtype if dtype is not None else self.dtype)
        key = (array.dtype.str, array.tobytes(), array.shape)
        if key not in self._consts:
            self._consts[key] = self.init(f"const_{len(self._consts)}", array)
        return self._consts[key]

    def ints(self, values: Sequence[int] | int) -> ir.Value:
        """An int64 constant (shapes, axes, indices)."""
        return self.const(values, np.int64)

    # composite patterns -------------------------------------------------------------------

    def rms_norm(self, x: ir.Value, weight: np.ndarray, eps: float, name: str) -> ir.Value:
        """x / sqrt(mean(x^2) + eps) * w over the last axis, decomposed in the exact pattern
        onnxruntime fuses into SimplifiedLayerNormalization (Pow, ReduceMean, Add, Sqrt, Div)
        and OpenVINO into its RMS node."""
        square = self.op("Pow", [x, self.const(2.0)])
        mean = self.op("ReduceMean", [square, self.ints([-1])], {"keepdims": 1})
        root = self.op("Sqrt", [self.op("Add", [mean, self.const(eps)])])
        normed = self.op("Div", [x, root])
        return self.op("Mul", [normed, self.init(name, weight.astype(self.dtype))])
