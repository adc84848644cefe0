"""Rewrite rules for onnxruntime: the modules in ``rules``, applied in that order."""

from __future__ import annotations

from types import ModuleType

from ferry.optimizer.rules.onnxruntime import _activations, _attention, _decoder

__all__ = ["rules"]

#: Rule modules of this package (each exports ``rules(ctx)`` and maybe ``passes(ctx)``), in order.
rules: tuple[ModuleType, ...] = (
    _activations,
    _attention,
    _decoder,
)
