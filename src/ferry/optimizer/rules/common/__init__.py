"""Rewrite rules for every engine: the modules listed in ``MODULES``, applied in that order."""

from __future__ import annotations

#: Rule modules of this package (each exports ``rules(ctx)`` and maybe ``passes(ctx)``), in order.
MODULES: tuple[str, ...] = (
    "_noop",
    "_shapes",
    "_transpose",
    "_conv",
    "_gemm",
    "_pad",
    "_reshape",
    "_chains",
    "_activations",
    "_layer_norm",
)
