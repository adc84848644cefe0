"""GELU fused into ONNX Runtime's contrib ops where the model's opset predates ONNX ``Gelu``.

``Gelu`` joined ONNX at opset 20; a model exported at opset 17 (``torch.onnx.export``'s default
for years) keeps GELU as eight elementwise ops. ONNX Runtime has had ``com.microsoft`` ``Gelu``
and ``FastGelu`` on every execution provider it ships long before, so for that engine the same
patterns as ``rules/common/_activations.py`` fuse into them::

    0.5 * x * (1 + Erf(x / sqrt(2)))                               ->  com.microsoft.Gelu(x)
    0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))        ->  com.microsoft.FastGelu(x)

At opset 20 and later the common rules already wrote ONNX ``Gelu``, which ORT runs as well, so
these rules offer themselves only below it. Extended level only.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
from onnxscript.rewriter._rewrite_rule import RewriteRule

from ferry.optimizer.rules._context import RuleContext
from ferry.optimizer.rules.common._activations import Approximation, gelu_rules

__all__ = ["rules"]

#: ONNX Runtime's contrib op domain.
MS_DOMAIN = "com.microsoft"


def _contrib_gelu(op: Any, x: ir.Value, approximate: Approximation) -> Any:
    # FastGelu is the tanh approximation (ORT's name for it); Gelu the exact Erf form.
    if approximate == "tanh":
        return op.FastGelu(x, _domain=MS_DOMAIN)
    return op.Gelu(x, _domain=MS_DOMAIN)


def rules(ctx: RuleContext) -> list[RewriteRule]:
    """The GELU rules emitting ORT's contrib ops, for extended-level models below opset 20."""
    if not ctx.extended or ctx.opset >= 20:
        return []
    return gelu_rules(_contrib_gelu, prefix="OrtGelu")
