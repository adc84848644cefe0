"""Rewrite rules only tensorrt gains from: the modules listed in ``MODULES``, applied in that order.

None yet. TensorRT's builder fuses Conv/bias/activation, GELU, LayerNormalization and attention
itself from the standard ops the common rules leave; a rule here must be measured to pay on a GPU,
which the machines this project runs on do not have.
"""

from __future__ import annotations

#: Rule modules of this package (each exports ``rules(ctx)`` and maybe ``passes(ctx)``), in order.
MODULES: tuple[str, ...] = ()
