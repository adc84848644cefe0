"""Export for phones and edge devices: ``.tflite`` through ferry's own ONNX -> TFLite lowering.

:func:`export_tflite` lowers an ONNX model to TFLite builtin ops (NHWC inside, weights converted
once), writes the ``.tflite`` file through :func:`ferry.tflite.write_tflite`, and verifies it in
LiteRT against ONNX Runtime on the source model; :func:`to_tflite_model` is the lowering alone
(plain data), :func:`lower_model` the lowering with what the report says about it.
:func:`export_ort_mobile` writes the ONNX Runtime Mobile form instead (``.ort`` and the op
config of a minimal build).
"""

from __future__ import annotations

from ferry.mobile._litert import Placement
from ferry.mobile._ort_mobile import OrtMobileExport, export_ort_mobile
from ferry.mobile._tflite_export import TFLiteExport, TFLiteReport, Verification, export_tflite
from ferry.mobile._tflite_lower import PRECISIONS, IOInfo, Lowered, lower_model, to_tflite_model

__all__ = [
    "PRECISIONS",
    "IOInfo",
    "Lowered",
    "OrtMobileExport",
    "Placement",
    "TFLiteExport",
    "TFLiteReport",
    "Verification",
    "export_ort_mobile",
    "export_tflite",
    "lower_model",
    "to_tflite_model",
]
