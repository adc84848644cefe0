"""Rewrite rules: ``common/`` (valid and useful on every engine) and ``<target>/`` (only where that
engine benefits).

Each rule module exports ``rules(ctx: RuleContext) -> list[RewriteRule]`` (onnxscript pattern
rules; a failed match returns a reason) and may export ``passes(ctx) -> list[PassBase]`` for
rewrites a local pattern cannot express (sinking transposes through a chain). ``rule_modules``
gives the modules that apply to a target, common first; each package lists its modules in its
own ``rules``, imported (no module is named by a string).
"""

from __future__ import annotations

from types import ModuleType

from ferry.optimizer.rules import common, onnxruntime, openvino, tensorrt
from ferry.optimizer.rules._context import LEVELS, Level, RuleContext

__all__ = ["LEVELS", "TARGETS", "Level", "RuleContext", "rule_modules"]

#: Rule packages per engine, besides ``common``. A target without its own package uses ``common``.
_PACKAGES: dict[str, ModuleType] = {
    "onnxruntime": onnxruntime,
    "openvino": openvino,
    "tensorrt": tensorrt,
}
TARGETS: tuple[str, ...] = tuple(_PACKAGES)


def rule_modules(target: str | None) -> list[ModuleType]:
    """The rule modules for ``target``: every ``common`` module, then the target's own."""
    own = _PACKAGES[target].rules if target in _PACKAGES else ()
    return [*common.rules, *own]
