"""Declared shapes a web bundle's model must not carry: those its own graph contradicts.

ONNX Runtime merges a declared shape that contradicts what its shape inference finds leniently
(a warning); onnxruntime-web refuses to load the model instead ("Mismatch between number of
inferred and declared dimensions"). Exporters leave such declarations behind: paddle2onnx
declares an OCR detector's rank-4 map as ``[?, ?]``. The bundle's copy gets the shapes the graph
really has; the user's file is never touched.

Before -> After (the bundle's ``model.onnx`` only)::

    output y: declared [a, b]         (Conv -> Sigmoid: really [N, 1, H, W])  ->  [N, 1, H, W]
    value  c: declared [N, 2, H, W]   (really [N, 1, H, W])                   ->  [N, 1, H, W]
    value  d: declared [N, 8]         (inference finds [N, 8], or nothing)    ->  unchanged

Where onnxruntime-web still refuses the model (its inference knows contrib ops ONNX's does not),
the export drops every intermediate declaration ONNX shape inference could not confirm and tries
again.

The truth is ONNX shape inference run from the inputs alone (every declaration left out), and for
graph outputs the shapes ONNX Runtime produced when the export ran the model: a dim both agree on
is kept (a name where inference has one, so it varies as the input does), a dim only the run
knows becomes unnamed (it may vary). Only declarations that contradict the truth are rewritten.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence

import onnx
import onnx_ir as ir

from ferry.graph import Dim, inference_proto, proto_shapes

__all__ = ["ShapeRepair", "describe_repairs", "repair_declared_shapes"]

logger = logging.getLogger(__name__)

#: How many repairs the report names one by one; the rest are counted.
_NAMED = 4


@dataclasses.dataclass(frozen=True)
class ShapeRepair:
    """One declared shape rewritten.

    Attributes:
        name: the value.
        before: the declared shape.
        after: the shape written instead (None dims unnamed); None when the declaration was
            dropped, left to the runtime's inference.
        output: whether the value is a graph output.
    """

    name: str
    before: tuple[Dim, ...]
    after: tuple[Dim, ...] | None
    output: bool

    def describe(self) -> str:
        """``'y' rank 2 -> 4``, ``'y' [N, 2] -> [N, 1]`` or ``'c' [a, b] dropped``."""
        if self.after is None:
            return f"{self.name!r} {_text(self.before)} dropped"
        if len(self.before) != len(self.after):
            return f"{self.name!r} rank {len(self.before)} -> {len(self.after)}"
        return f"{self.name!r} {_text(self.before)} -> {_text(self.after)}"

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "declared": list(self.before),
            "written": None if self.after is None else list(self.after),
            "output": self.output,
        }


def describe_repairs(repairs: Sequence[ShapeRepair]) -> str | None:
    """One report line for ``repairs`` (outputs first), or None when there are none."""
    if not repairs:
        return None
    ordered = sorted(repairs, key=lambda r: not r.output)
    named = ", ".join(r.describe() for r in ordered[:_NAMED])
    more = f" and {len(ordered) - _NAMED} more" if len(ordered) > _NAMED else ""
    return (
        f"repaired declared shapes the graph contradicts (onnxruntime-web refuses them): "
        f"{named}{more}"
    )


def repair_declared_shapes(
    proto: onnx.ModelProto,
    model: ir.Model,
    produced: Mapping[str, Sequence[int]] | None = None,
    *,
    drop_unconfirmed: bool = False,
) -> list[ShapeRepair]:
    """Rewrite, in ``proto``, the declared shapes of the main graph that its graph contradicts.

    Args:
        proto: the bundle's copy of the model (changed in place).
        model: the same model as ``onnx_ir`` holds it (read, not changed beyond what
            :func:`ferry.graph.inference_proto` does), for shape inference without the weights.
        produced: the graph outputs' shapes in a run on ONNX Runtime, where the export made one.
        drop_unconfirmed: also drop the shape of every intermediate value that ONNX shape
            inference finds nothing for (contrib ops), for the runtime to infer: for when
            onnxruntime-web's inference, which knows more ops, still contradicts one.

    Returns:
        What was rewritten, graph outputs first.
    """
    inferred = _inferred_from_inputs(model)
    sizes = {k: tuple(int(d) for d in v) for k, v in (produced or {}).items()}
    repairs: list[ShapeRepair] = []
    outputs = {o.name for o in proto.graph.output}
    declarations = proto_shapes(proto)
    for info in (*proto.graph.output, *proto.graph.value_info):
        declared = declarations.get(info.name)
        if declared is None:
            continue
        truth = inferred.get(info.name)
        after = _truth(declared, truth, sizes.get(info.name))
        if after is not None:
            _write_shape(info, after)
        elif drop_unconfirmed and truth is None and info.name not in outputs:
            info.type.tensor_type.ClearField("shape")
        else:
            continue
        repairs.append(ShapeRepair(info.name, declared, after, info.name in outputs))
    if repairs:
        logger.info("repaired %d declared shape(s) of the bundle's model", len(repairs))
    return sorted(repairs, key=lambda r: not r.output)


def _inferred_from_inputs(model: ir.Model) -> dict[str, tuple[Dim, ...]]:
    """ONNX shape inference from the graph inputs alone: no value info, no output shapes, so
    that no declaration (right or wrong) steers what is found. Empty when inference fails."""
    probe = inference_proto(model)
    del probe.graph.value_info[:]
    for output in probe.graph.output:
        if output.type.HasField("tensor_type"):
            output.type.tensor_type.ClearField("shape")
    try:
        done = onnx.shape_inference.infer_shapes(probe, strict_mode=False, data_prop=True)
    except Exception as e:  # onnx raises a zoo of types; without it only the run's shapes count
        logger.info("shape inference failed; declared shapes checked against the run only: %s", e)
        return {}
    # A name inference made up (unk__0) means nothing and could collide with the model's own.
    names = {
        d.dim_param for v in probe.graph.input for d in v.type.tensor_type.shape.dim if d.dim_param
    }
    return {
        k: tuple(d if not isinstance(d, str) or d in names else None for d in shape)
        for k, shape in proto_shapes(done).items()
    }


def _truth(
    declared: tuple[Dim, ...],
    inferred: tuple[Dim, ...] | None,
    produced: tuple[int, ...] | None,
) -> tuple[Dim, ...] | None:
    """The shape to write instead of ``declared``, or None when nothing contradicts it."""
    if produced is not None and inferred is not None and len(inferred) != len(produced):
        inferred = None  # the run is what ONNX Runtime really computed
    if produced is None and inferred is None:
        return None
    rank = len(produced) if produced is not None else len(inferred or ())
    if len(declared) == rank and all(
        not isinstance(d, int) or _known(i, inferred, produced) in (None, d)
        for i, d in enumerate(declared)
    ):
        return None
    out: list[Dim] = []
    for i in range(rank):
        guess = inferred[i] if inferred is not None else None
        if isinstance(guess, int) and produced is not None and guess != produced[i]:
            guess = None
        if not isinstance(guess, int) and len(declared) == rank:
            # A declaration this dim does not contradict is kept: the user's name rather than
            # one inference made up, or the size the run produced.
            kept = declared[i]
            if isinstance(kept, str) or (produced is not None and kept == produced[i]):
                guess = kept
        out.append(guess)
    return tuple(out)


def _known(
    i: int, inferred: tuple[Dim, ...] | None, produced: tuple[int, ...] | None
) -> int | None:
    """The fixed size of dim ``i`` that the truth knows (the run's, else inference's), or None."""
    if produced is not None:
        return produced[i]
    value = inferred[i] if inferred is not None else None
    return value if isinstance(value, int) else None


def _write_shape(info: onnx.ValueInfoProto, shape: tuple[Dim, ...]) -> None:
    tensor_type = info.type.tensor_type
    tensor_type.ClearField("shape")
    tensor_type.shape.SetInParent()  # rank 0 still has a shape
    dims = tensor_type.shape.dim
    for d in shape:
        entry = dims.add()
        if isinstance(d, int):
            entry.dim_value = d
        elif isinstance(d, str):
            entry.dim_param = d


def _text(shape: tuple[Dim, ...]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
