"""Tests of float values that TFLite has no op for, written with comparisons it has.

Attention blocks guard against rows that are all masked (``Where(IsNaN(p), 0, p)`` after a
Softmax of ``-inf`` scores); TFLite has no IS_NAN, but NaN is the one value unequal to itself.

Before -> After::

    IsNaN(x)                                  ->  NOT_EQUAL(x, x)
    IsInf(x, detect_positive, detect_negative) ->  EQUAL(x, +inf) / EQUAL(x, -inf) (LOGICAL_OR)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from ferry.tflite._onnx_to_tflite._builder import BOOL
from ferry.tflite._onnx_to_tflite._context import Lowering, attr
from ferry.tflite._unsupported import Unsupported

__all__ = ["OPS"]

Translator = Callable[[Lowering, ir.Node], None]


def _float_input(cx: Lowering, node: ir.Node) -> ir.Value:
    x = node.inputs[0]
    if x is None:
        raise Unsupported("the input is missing")
    if cx.dtype(x) != np.float32:
        raise Unsupported(f"{cx.dtype(x)} values (float32 is lowered)")
    return x


def _is_nan(cx: Lowering, node: ir.Node) -> None:
    x = _float_input(cx, node)
    perm = cx.perm(x)
    source = cx.get(x)
    cx.emit("NOT_EQUAL", [source, source], [cx.output(node.outputs[0], perm)])


def _is_inf(cx: Lowering, node: ir.Node) -> None:
    x = _float_input(cx, node)
    perm = cx.perm(x)
    source = cx.get(x)
    signs = [
        s
        for s, on in (
            (1.0, attr(node, "detect_positive", 1)),
            (-1.0, attr(node, "detect_negative", 1)),
        )
        if on
    ]
    out = node.outputs[0]
    if not signs:  # nothing detected: all false
        zero = cx.constant(np.asarray(np.nan, np.float32), "nan")
        cx.emit("EQUAL", [source, zero], [cx.output(out, perm)])
        return
    shape = cx.b.tensors[source].shape
    found = []
    for sign in signs:
        dest = (
            cx.output(out, perm)
            if len(signs) == 1
            else cx.temp(f"{out.name}/{sign:+.0f}", BOOL, shape)
        )
        inf = cx.constant(np.asarray(sign * np.inf, np.float32), "inf")
        cx.emit("EQUAL", [source, inf], [dest])
        found.append(dest)
    if len(found) == 2:
        cx.emit("LOGICAL_OR", found, [cx.output(out, perm)])


OPS: dict[str, Translator] = {"IsNaN": _is_nan, "IsInf": _is_inf}
