"""Rewrite rules for every engine: the modules in ``rules``, applied in that order."""

from __future__ import annotations

from types import ModuleType

from ferry.optimizer.rules.common import (
    _activations,
    _chains,
    _conv,
    _gemm,
    _layer_norm,
    _noop,
    _pad,
    _reshape,
    _shapes,
    _transpose,
)

__all__ = ["rules"]

#: Rule modules of this package (each exports ``rules(ctx)`` and maybe ``passes(ctx)``), in order.
rules: tuple[ModuleType, ...] = (
    _noop,
    _shapes,
    _transpose,
    _conv,
    _gemm,
    _pad,
    _reshape,
    _chains,
    _activations,
    _layer_norm,
)
