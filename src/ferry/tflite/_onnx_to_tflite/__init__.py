"""ferry's ONNX -> TFLite lowering (private): translators, layouts, folding, fusion, int8.

The core only: a prepared model (static shapes) becomes a :class:`~ferry.tflite.TFLiteModel`
that :func:`~ferry.tflite.write_tflite` writes. ``ferry.mobile`` prepares models with the
optimizer first and verifies its exports; the ``litert`` backend lowers partitions with it.
"""

from __future__ import annotations

from ferry.tflite._onnx_to_tflite._layout import Perm, inverse
from ferry.tflite._onnx_to_tflite._lower import (
    PRECISIONS,
    TRANSLATORS,
    IOInfo,
    Lowered,
    check_precision,
    infer_shapes,
    is_qdq,
    lower_prepared,
    node_problems,
    prepare_static,
    static_inputs,
)

__all__ = [
    "PRECISIONS",
    "TRANSLATORS",
    "IOInfo",
    "Lowered",
    "Perm",
    "check_precision",
    "infer_shapes",
    "inverse",
    "is_qdq",
    "lower_prepared",
    "node_problems",
    "prepare_static",
    "static_inputs",
]
