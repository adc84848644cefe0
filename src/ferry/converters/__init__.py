"""Converters: bring models from other frameworks into the unified graph (ONNX as ``onnx_ir.Model``).

``convert(source, ...)`` picks the converter (by ``--from`` name, object type, file suffix or magic
bytes), converts, checks the result and verifies it against the source framework
(``ferry.parity``). Each framework's converter lives in a module of its own, loaded on first use,
and imports its framework only when it converts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ferry._lazy import lazy_getattr
from ferry.converters._base import Converted, Converter, ConvertOptions, ReferenceFn
from ferry.converters._convert import ConversionResult, ParityError, convert
from ferry.converters._onnx import OnnxConverter, check_model, convert_onnx
from ferry.converters._registry import converter_names, get_converter, resolve_converter

if TYPE_CHECKING:
    from ferry.converters._paddle import PaddleConverter
    from ferry.converters._paddle_process import PADDLE_PYTHON_ENV, find_paddle_python
    from ferry.converters._pytorch import PyTorchConverter
    from ferry.converters._pytorch_export import detach_from_torch, silence_exporter_logs
    from ferry.converters._sklearn import SklearnConverter
    from ferry.converters._tensorflow import TensorFlowConverter
    from ferry.converters._tflite import TFLiteConverter

__all__ = [
    "PADDLE_PYTHON_ENV",
    "ConversionResult",
    "ConvertOptions",
    "Converted",
    "Converter",
    "OnnxConverter",
    "PaddleConverter",
    "ParityError",
    "PyTorchConverter",
    "ReferenceFn",
    "SklearnConverter",
    "TFLiteConverter",
    "TensorFlowConverter",
    "check_model",
    "convert",
    "convert_onnx",
    "converter_names",
    "detach_from_torch",
    "find_paddle_python",
    "get_converter",
    "resolve_converter",
    "silence_exporter_logs",
]

# The framework converters' modules, loaded when first asked for (as the registry loads them).
__getattr__ = lazy_getattr(
    __name__,
    [name for name in __all__ if name not in globals()],
    [
        "_pytorch",
        "_pytorch_export",
        "_tensorflow",
        "_tflite",
        "_paddle",
        "_paddle_process",
        "_sklearn",
    ],
)
