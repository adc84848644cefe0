"""Rewrite rules: ``common/`` (valid and useful on every engine) and ``<target>/`` (only where that
engine benefits).

Each rule module exports ``rules(ctx: RuleContext) -> list[RewriteRule]`` (onnxscript pattern
rules; a failed match returns a reason) and may export ``passes(ctx) -> list[PassBase]`` for
rewrites a local pattern cannot express (sinking transposes through a chain). ``rule_modules``
gives the modules that apply to a target, common first.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ferry.optimizer.rules._context import LEVELS, Level, RuleContext

__all__ = ["LEVELS", "TARGETS", "Level", "RuleContext", "rule_modules"]

#: Rule packages per engine, besides ``common``. A target without its own package uses ``common``.
TARGETS: tuple[str, ...] = ("onnxruntime", "openvino", "tensorrt")


def rule_modules(target: str | None) -> list[ModuleType]:
    """The rule modules for ``target``: every ``common`` module, then the target's own."""
    packages = ["common"] + ([target] if target in TARGETS else [])
    modules: list[ModuleType] = []
    for package in packages:
        pkg = importlib.import_module(f"{__name__}.{package}")
        modules += [importlib.import_module(f"{pkg.__name__}.{name}") for name in pkg.MODULES]
    return modules
