"""Converters: bring models from other frameworks into the unified graph (ONNX as ``onnx_ir.Model``).

``convert(source, ...)`` picks the converter (``registry``), converts, checks the result and
verifies it against the source framework (``parity``). Each framework's converter lives in its own
module and imports its framework only when used.
"""

from __future__ import annotations

from ferry.converters._convert import ConversionResult, ParityError, convert
from ferry.converters.base import Converted, Converter, ConvertOptions
from ferry.converters.onnx import convert_onnx
from ferry.converters.registry import converter_names, get_converter, resolve_converter

__all__ = [
    "ConversionResult",
    "ConvertOptions",
    "Converted",
    "Converter",
    "ParityError",
    "convert",
    "convert_onnx",
    "converter_names",
    "get_converter",
    "resolve_converter",
]
