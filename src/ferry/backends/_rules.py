"""Declarative op support: what a backend says it runs, and the check of a node against that.

A backend lists ``OpRule``s; placement asks ``supports(rules, node, opset)`` for every node and
gets ``True`` or the reason it is not taken ("Resize: mode 'cubic' not supported", "input 1 of
Reshape must be constant"). Several rules may share an op (different opset ranges or dtypes): a
node is taken when any of them accepts it. The helpers below (attribute and constant lookups,
checks of control-flow bodies) are what rule tables' ``check`` functions are written with.
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import onnx_ir as ir

from ferry.graph import constant, dtype_name, named_subgraphs
from ferry.plan import is_constant

__all__ = [
    "FLOAT_TYPES",
    "NodeCheck",
    "OpRule",
    "RuleTable",
    "all_checks",
    "attr",
    "constant_array",
    "is_constant",
    "node_opsets",
    "output_used",
    "subgraphs_supported",
    "supports",
]

#: The value of an initializer or of a Constant node's output, None when not a constant: the
#: name rule tables know :func:`ferry.graph.constant` by (an initializer that is also a graph
#: input is not a constant: the caller may feed another value).
constant_array = constant

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


class RuleTable:
    """A backend's rules indexed by ``(domain, op_type)``.

    ``fallback`` answers for ops no rule names (default: not supported).
    """

    def __init__(self, rules: Iterable[OpRule], fallback: NodeCheck | None = None) -> None:
        self._by_key: dict[tuple[str, str], list[OpRule]] = {}
        self._fallback = fallback
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
            if self._fallback is not None:
                return self._fallback(node)
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


def attr(node: ir.Node, name: str, default: Any = None) -> Any:
    """The value of attribute ``name`` of ``node`` (tuples for lists), or ``default``."""
    found = node.attributes.get(name)
    if found is None or found.is_ref():
        return default
    value = found.value
    if isinstance(value, list):
        return tuple(value)
    return value


def output_used(node: ir.Node, index: int) -> bool:
    """Whether output ``index`` of ``node`` exists and is read (by a node or as a graph output)."""
    if index >= len(node.outputs):
        return False
    value = node.outputs[index]
    if value is None or not value.name:
        return False
    return bool(value.uses()) or value.is_graph_output()


# The model's opsets while subgraphs_supported walks a body: a body's own graph imports none.
_outer_opsets: contextvars.ContextVar[Mapping[str, int] | None] = contextvars.ContextVar(
    "ferry_outer_opsets", default=None
)


def node_opsets(node: ir.Node) -> dict[str, int]:
    """The opsets that apply to ``node``: its graph's imports; inside a body being checked, the
    model's; else the node's own version."""
    graph = node.graph
    opsets = dict(graph.opset_imports) if graph is not None else {}
    if not opsets:
        outer = _outer_opsets.get()
        if outer is not None:
            return dict(outer)
        if node.version is not None:
            opsets[node.domain] = node.version
    return opsets


def subgraphs_supported(
    node: ir.Node, table: RuleTable, opsets: Mapping[str, int] | None = None
) -> bool | str:
    """True when every node inside ``node``'s subgraphs (at any depth) is accepted by ``table``.

    A control-flow node is only as runnable as its bodies: an If whose branch holds an op the
    engine lacks cannot go to that engine whole.
    """
    opsets = node_opsets(node) if opsets is None else opsets
    token = _outer_opsets.set(opsets)
    try:
        for name, graph in named_subgraphs(node):
            # Direct children only: a nested If/Loop checks its own bodies through its rule.
            for inner in graph:
                verdict = table.supports(inner, opsets)
                if verdict is not True:
                    label = inner.name or inner.op_type
                    return f"{name} holds node {label!r} it cannot run ({verdict})"
    finally:
        _outer_opsets.reset(token)
    return True


def all_checks(*checks: Callable[[ir.Node], bool | str] | None) -> Callable[[ir.Node], bool | str]:
    """One check that runs ``checks`` in order and returns the first reason."""
    present = [c for c in checks if c is not None]

    def check(node: ir.Node) -> bool | str:
        for c in present:
            verdict = c(node)
            if verdict is not True:
                return verdict
        return True

    return check
