"""Running rule modules on a model: one ``RewritePass`` for a module's pattern rules, its graph
passes, and the dead-code sweep after."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import onnx_ir as ir
import onnx_ir.passes.common as common_passes
from onnxscript.rewriter import RewritePass
from onnxscript.rewriter.pattern import RewriteRule

from ferry.optimizer.rules import RuleContext

__all__ = ["apply_rules", "module_passes"]


def module_passes(module: ModuleType, ctx: RuleContext) -> list[ir.passes.PassBase]:
    """The passes that run ``module``'s rules (and its own graph passes) for ``ctx``."""
    passes: list[ir.passes.PassBase] = []
    rules = list(module.rules(ctx)) if hasattr(module, "rules") else []
    if rules:
        passes.append(RewritePass(rules))
    if hasattr(module, "passes"):
        passes += list(module.passes(ctx))
    return passes


def apply_rules(
    model: ir.Model,
    rules: Sequence[RewriteRule] | ModuleType,
    ctx: RuleContext | None = None,
) -> bool:
    """Apply ``rules`` (a list, or a rule module for ``ctx``) to ``model`` in place, then drop what
    no longer feeds an output. Returns whether anything changed."""
    ctx = ctx or RuleContext()
    if isinstance(rules, ModuleType):
        passes = module_passes(rules, ctx)
    else:
        passes = [RewritePass(list(rules))] if rules else []
    if not passes:
        return False
    result = ir.passes.Sequential(*passes, common_passes.RemoveUnusedNodesPass())(model)
    return result.modified
