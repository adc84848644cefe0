"""Declarative op support: what a backend says it runs, and the check of a node against that.

A backend lists ``OpRule``s; the partitioner asks ``supports(rules, node, opset)`` for every node and
gets ``True`` or the reason it is not taken ("Resize: mode 'cubic' not supported", "input 1 of
Reshape must be constant"). Several rules may share an op (different opset ranges or dtypes): a
node is taken when any of them accepts it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence

import onnx_ir as ir

from ferry.graph import dtype_name

__all__ = ["FLOAT_TYPES", "OpRule", "RuleTable", "is_constant", "supports"]

#: dtype names, as ``ferry.graph.dtype_name`` spells them.
FLOAT_TYPES = frozenset({"float32", "float16", "bfloat16"})

#: ``check`` returns True, or a reason the node cannot run.
NodeCheck = Callable[[ir.Node], bool | str]


@dataclasses.dataclass(frozen=True)
class OpRule:
    """One op a backend runs, and the conditions under which it does.

    Attributes:
        op_type: ONNX op type (``"Conv"``).
        domain: op domain (``""`` for the default ONNX domain).
        since / until: the model's opset for ``domain`` must lie in ``[since, until]``.
        dtypes: allowed element types: one set for every input, or a mapping from input index to a
            set (indices not named are unchecked). None: any type.
        const_inputs: indices of inputs that must be constants (initializers or Constant outputs).
        min_rank / max_rank: rank limits on every input whose rank is known.
        dynamic_dims: whether inputs may have symbolic or unknown dims.
        check: anything else, e.g. an attribute value; returns True or a reason.
    """

    op_type: str
    domain: str = ""
    since: int = 1
    until: int | None = None
    dtypes: frozenset[str] | Mapping[int, frozenset[str]] | None = None
    const_inputs: tuple[int, ...] = ()
    min_rank: int | None = None
    max_rank: int | None = None
    dynamic_dims: bool = True
    check: NodeCheck | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.domain, self.op_type)

    def accepts(self, node: ir.Node, opset: int) -> bool | str:
        """True when ``node`` meets this rule, else the first reason it does not."""
        if opset < self.since or (self.until is not None and opset > self.until):
            upper = self.until if self.until is not None else "latest"
            return f"opset {opset} outside supported range {self.since}..{upper}"
        for index, value in enumerate(node.inputs):
            if value is None:
                continue
            reason = self._check_input(node, index, value)
            if reason is not None:
                return reason
        if self.check is not None:
            verdict = self.check(node)
            if verdict is not True:
                return verdict if isinstance(verdict, str) else "rejected by the backend's check"
        return True

    def _check_input(self, node: ir.Node, index: int, value: ir.Value) -> str | None:
        if index in self.const_inputs and not is_constant(value):
            return f"input {index} ({value.name}) must be a constant"
        allowed = self.dtypes.get(index) if isinstance(self.dtypes, Mapping) else self.dtypes
        if allowed is not None and value.dtype is not None:
            name = dtype_name(value.dtype)
            if name not in allowed:
                return f"input {index} has dtype {name}; supported: {', '.join(sorted(allowed))}"
        shape = value.shape
        if shape is None:
            return None if self.dynamic_dims else f"input {index} has an unknown shape"
        rank = len(shape)
        if self.min_rank is not None and rank < self.min_rank:
            return f"input {index} has rank {rank}; needs at least {self.min_rank}"
        if self.max_rank is not None and rank > self.max_rank:
            return f"input {index} has rank {rank}; supports at most {self.max_rank}"
        if not self.dynamic_dims and not all(isinstance(d, int) for d in shape):
            return f"input {index} has dynamic dims {shape}; needs static shapes"
        return None


def is_constant(value: ir.Value) -> bool:
    """Whether ``value`` is known before the graph runs: an initializer or a Constant's output."""
    if value.const_value is not None or value.is_initializer():
        return True
    producer = value.producer()
    return (
        producer is not None
        and producer.op_type == "Constant"
        and producer.domain in ("", "ai.onnx")
    )


class RuleTable:
    """A backend's rules indexed by ``(domain, op_type)``."""

    def __init__(self, rules: Iterable[OpRule]) -> None:
        self._by_key: dict[tuple[str, str], list[OpRule]] = {}
        for rule in rules:
            self._by_key.setdefault(_normal(rule.domain, rule.op_type), []).append(rule)

    def __contains__(self, key: tuple[str, str]) -> bool:
        return _normal(*key) in self._by_key

    def ops(self) -> list[tuple[str, str]]:
        """Every ``(domain, op_type)`` the table claims."""
        return sorted(self._by_key)

    def supports(self, node: ir.Node, opsets: Mapping[str, int]) -> bool | str:
        """True when some rule accepts ``node``; else why not (the reason of the last rule tried)."""
        rules = self._by_key.get(_normal(node.domain, node.op_type))
        if not rules:
            return f"{_op_name(node)} is not supported"
        opset = opsets.get(
            node.domain, opsets.get("ai.onnx" if node.domain == "" else node.domain, 1)
        )
        reason: bool | str = True
        for rule in rules:
            reason = rule.accepts(node, opset)
            if reason is True:
                return True
        return f"{_op_name(node)}: {reason}"


def supports(
    rules: Sequence[OpRule] | RuleTable, node: ir.Node, opsets: Mapping[str, int]
) -> bool | str:
    """Whether a backend with ``rules`` runs ``node`` (True) or why not (a reason)."""
    table = rules if isinstance(rules, RuleTable) else RuleTable(rules)
    return table.supports(node, opsets)


def _normal(domain: str, op_type: str) -> tuple[str, str]:
    return ("" if domain in ("", "ai.onnx") else domain, op_type)


def _op_name(node: ir.Node) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
