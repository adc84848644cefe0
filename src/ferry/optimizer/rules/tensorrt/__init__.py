"""Rewrite rules for tensorrt: the modules listed in ``MODULES``, applied in that order."""

from __future__ import annotations

#: Rule modules of this package (each exports ``rules(ctx)`` and maybe ``passes(ctx)``), in order.
MODULES: tuple[str, ...] = ()
