"""What placement says about a plan: where each node went and why, and the tensors that cross
engines (``ferry plan --explain``).

:func:`~ferry.backends.explain` builds a :class:`PlacementReport`; :meth:`PlacementReport.cost`
(``_placement_cost``) counts what the split costs per run, and :meth:`PlacementReport.format`
writes it all as text.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ferry.backends._placement_cost import (
    BoundaryTensor,
    PlacementCost,
    dim_text,
    human_bytes,
    split_cost,
    sum_or_none,
)

if TYPE_CHECKING:
    import onnx_ir as ir

    from ferry.plan import Plan

__all__ = ["NodeVerdict", "PlacementReport"]


@dataclasses.dataclass(frozen=True)
class NodeVerdict:
    """Where one node went and why.

    Attributes:
        node: the node's name.
        op_type: its op (``"Softmax"``, or ``"domain::Op"`` outside the default domain).
        backend: the backend that runs it.
        partition: index of its partition in the plan.
        reasons: for each backend tried before ``backend`` (higher priority), why it did not take
            the node.
        note: why the node went where it did when no rule decided (Constant nodes).
    """

    node: str
    op_type: str
    backend: str
    partition: int
    reasons: Mapping[str, str]
    note: str | None = None


@dataclasses.dataclass(frozen=True)
class PlacementReport:
    """A plan together with the reasons behind it (``ferry plan --explain``).

    Attributes:
        plan: the plan ``partition`` returns for the same arguments.
        nodes: one verdict per node, in topological order.
        boundaries: the values that cross partitions, in plan order.
        model: the prepared model the plan was made on (node and value names match the plan's);
            :meth:`cost` infers boundary shapes on it. Not compared.
    """

    plan: Plan
    nodes: tuple[NodeVerdict, ...]
    boundaries: tuple[BoundaryTensor, ...]
    model: ir.Model | None = dataclasses.field(default=None, compare=False, repr=False)

    def node(self, name: str) -> NodeVerdict:
        """The verdict for the node called ``name``.

        Raises:
            KeyError: no node has that name.
        """
        for verdict in self.nodes:
            if verdict.node == name:
                return verdict
        raise KeyError(f"no node named {name!r} in the partitioned model")

    @property
    def boundary_bytes(self) -> int | None:
        """Bytes copied between partitions per run; None when some boundary shape is dynamic."""
        return sum_or_none(b.nbytes for b in self.boundaries)

    def cost(self, shapes: Mapping[str, Sequence[int]] | None = None) -> PlacementCost:
        """What the split costs per run: partitions, engine calls, boundary tensors and bytes
        (:func:`ferry.backends._placement_cost.split_cost` on this report's plan: ``shapes``,
        the result and the errors are described there)."""
        refused = [v.op_type for v in self.nodes if v.reasons and v.note is None]
        return split_cost(self.plan, self.boundaries, self.model, refused, shapes)

    def format(self, shapes: Mapping[str, Sequence[int]] | None = None) -> str:
        """The report as text: partitions and their cost (with boundary sizes at ``shapes``,
        see :meth:`cost`), warnings, boundary tensors, then every node's verdict."""
        plan = self.plan
        cost = self.cost(shapes)
        lines: list[str] = []
        counts: dict[str, int] = {}
        for p in plan.partitions:
            counts[p.backend] = counts.get(p.backend, 0) + len(p.nodes)
        summary = ", ".join(f"{name}: {n} node(s)" for name, n in counts.items())
        lines.append(f"{len(plan.partitions)} partition(s); {summary or 'no nodes'}")
        lines.append(f"cost: {cost.summary()}")
        lines.extend(f"warning: {w}" for w in cost.warnings)
        for index, p in enumerate(plan.partitions):
            lines.append(
                f"  #{index} {p.backend}: {len(p.nodes)} node(s); "
                f"in: {', '.join(p.inputs) or '-'}; out: {', '.join(p.outputs) or '-'}"
            )
        total = cost.boundary_bytes
        if total is not None:
            size = f"{human_bytes(total)} per run"
        elif cost.input_bytes is None:
            size = "size depends on inputs"
        else:
            size = f"{len(cost.unknown_sizes)} of unknown size"
        lines.append(f"{len(cost.boundaries)} boundary tensor(s), {size}")
        for b in cost.boundaries:
            dtype = b.dtype or "?"
            shape = "?" if b.shape is None else "[" + ",".join(dim_text(d) for d in b.shape) + "]"
            nbytes = human_bytes(b.nbytes) if b.nbytes is not None else "dynamic size"
            to = ", ".join(f"#{c}" for c in b.consumers)
            lines.append(f"  {b.name}: {dtype}{shape}, {nbytes}, #{b.producer} -> {to}")
        lines.append("nodes:")
        for v in self.nodes:
            line = f"  {v.node} ({v.op_type}) -> {v.backend} #{v.partition}"
            details = [f"{name}: {why}" for name, why in v.reasons.items()]
            if v.note:
                details.append(v.note)
            if details:
                line += "; " + "; ".join(details)
            lines.append(line)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()
