"""What pruning did to a model: sizes, MACs, the groups it cut and what it left alone."""

from __future__ import annotations

import dataclasses
import zlib
from typing import Any

import numpy as np
import onnx_ir as ir

from ferry.optimizer.prune._weights import is_op

__all__ = ["PruneReport", "PruneResult", "Sizes", "sizes"]


@dataclasses.dataclass(frozen=True)
class Sizes:
    """A model's weights: elements, non-zero elements, bytes, and bytes once zlib-compressed."""

    params: int
    nonzero: int
    bytes: int
    compressed_bytes: int


def _tensors(model: ir.Model) -> list[ir.TensorProtocol]:
    found: list[ir.TensorProtocol] = [
        v.const_value for v in model.graph.initializers.values() if v.const_value is not None
    ]
    for node in model.graph.all_nodes():
        attr = node.attributes.get("value") if is_op(node, "Constant") else None
        if attr is not None and not attr.is_ref() and attr.type == ir.AttributeType.TENSOR:
            found.append(attr.as_tensor())
    return found


def sizes(model: ir.Model) -> Sizes:
    """Measure ``model``'s weights (initializers and Constant nodes)."""
    params = nonzero = nbytes = packed = 0
    for tensor in _tensors(model):
        array = np.asarray(tensor.numpy())
        params += array.size
        nonzero += int(np.count_nonzero(array))
        nbytes += array.nbytes
        # Level 1: the fastest; what matters is how much zeros shrink, not the best ratio.
        packed += len(zlib.compress(np.ascontiguousarray(array).tobytes(), 1))
    return Sizes(params, nonzero, nbytes, packed)


@dataclasses.dataclass(frozen=True)
class PruneReport:
    """What :func:`ferry.optimizer.prune.prune` did.

    Attributes:
        method: ``channel``, ``magnitude`` or ``2:4``.
        sparsity: what was asked (2:4 is always 0.5 of the layers it changes).
        criterion: how channels were ranked (channel pruning only).
        before / after: the weights' sizes (:class:`Sizes`).
        macs_before / macs_after: multiply-accumulates of one run (symbolic dims as 1).
        groups: one entry per channel group cut: ``name``, ``nodes`` (its source layers),
            ``channels``, ``kept``, ``removed`` and the ``criterion`` used.
        layers: the layers whose weights were zeroed (magnitude, 2:4).
        skipped: ``{"name", "reason"}`` for each group or layer left as it was.
        note: what the result is good for.
        multiple: channel counts were rounded up to a multiple of this (channel pruning).
    """

    method: str
    sparsity: float
    criterion: str | None
    before: Sizes
    after: Sizes
    macs_before: int
    macs_after: int
    groups: tuple[dict[str, Any], ...] = ()
    layers: tuple[str, ...] = ()
    skipped: tuple[dict[str, str], ...] = ()
    note: str = ""
    multiple: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        d = dataclasses.asdict(self)
        d["groups"] = [dict(g) for g in self.groups]
        d["layers"] = list(self.layers)
        d["skipped"] = [dict(s) for s in self.skipped]
        return d

    def lines(self) -> list[str]:
        """The report as lines of text for a terminal."""

        def change(before: int, after: int, unit: str = "") -> str:
            ratio = f" ({after / before:.0%})" if before else ""
            return f"{before:,}{unit} -> {after:,}{unit}{ratio}"

        b, a = self.before, self.after
        head = f"{self.method} pruning at sparsity {self.sparsity:g}"
        if self.criterion:
            head += f", channels ranked by {self.criterion}"
        if self.multiple and self.multiple > 1:
            head += f", counts kept multiples of {self.multiple} (the CPU's channel block)"
        out = [
            head,
            f"parameters: {change(b.params, a.params)}; non-zero: {change(b.nonzero, a.nonzero)}",
            f"weights: {change(b.bytes, a.bytes, ' B')}; "
            f"compressed: {change(b.compressed_bytes, a.compressed_bytes, ' B')}",
            f"MACs: {change(self.macs_before, self.macs_after)}",
        ]
        if self.groups:
            removed = sum(int(g["removed"]) for g in self.groups)
            out.append(f"{len(self.groups)} channel group(s) cut, {removed} channel(s) removed")
        if self.layers:
            out.append(f"{len(self.layers)} layer(s) zeroed")
        for item in self.skipped:
            out.append(f"kept {item['name']}: {item['reason']}")
        if self.note:
            out.append(self.note)
        return out


@dataclasses.dataclass(frozen=True)
class PruneResult:
    """The pruned model and its report."""

    model: ir.Model
    report: PruneReport
