"""Rewrite rules only tensorrt gains from: the modules in ``rules``, applied in that order.

None yet. TensorRT's builder fuses Conv/bias/activation, GELU, LayerNormalization and attention
itself from the standard ops the common rules leave; a rule here must be measured to pay on a GPU,
which the machines this project runs on do not have.
"""

from __future__ import annotations

from types import ModuleType

__all__ = ["rules"]

#: Rule modules of this package (each exports ``rules(ctx)`` and maybe ``passes(ctx)``), in order.
rules: tuple[ModuleType, ...] = ()
