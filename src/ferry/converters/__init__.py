"""Converters: bring models from other formats into the unified graph (ONNX as ``onnx_ir.Model``)."""

from __future__ import annotations

from ferry.converters.onnx import convert_onnx

__all__ = ["convert_onnx"]
