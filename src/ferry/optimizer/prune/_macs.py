"""Multiply-accumulates of a model's layers: ``ferry.graph.flops`` counts them, once for all."""

from __future__ import annotations

from pathlib import Path

import onnx_ir as ir

from ferry.graph import flops, load_model


def macs(model: ir.Model | str | Path) -> int:
    """Multiply-accumulates of the model's Conv, ConvTranspose, Gemm and MatMul nodes.

    Shapes are the weights' own, else the declared ones, else ONNX shape inference's; a symbolic
    dim counts as 1 (so a symbolic batch gives the figure per sample). A node whose shapes stay
    unknown counts 0 (see :func:`ferry.graph.flops`, whose half this is).

    Args:
        model: the model, or a path to one.

    Returns:
        The number of multiply-accumulates of one run.
    """
    return flops(load_model(model)).macs
