"""Rewrite rules only openvino gains from: the modules in ``rules``, applied in that order.

None yet. OpenVINO's own compile-time transformations fuse GELU, LayerNormalization (MVN),
attention and Conv+bias on its CPU plugin from the standard ops the common rules leave, so a rule
here must first show, in benchmarks/optimizer.py's OpenVINO column, that it beats what OpenVINO does
itself.
"""

from __future__ import annotations

from types import ModuleType

__all__ = ["rules"]

#: Rule modules of this package (each exports ``rules(ctx)`` and maybe ``passes(ctx)``), in order.
rules: tuple[ModuleType, ...] = ()
