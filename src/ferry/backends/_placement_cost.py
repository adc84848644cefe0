"""What a plan's split costs per run: partitions, engine calls, and the tensors copied between
engines, with their bytes at given input sizes.

:func:`split_cost` is :meth:`~ferry.backends.PlacementReport.cost`: it checks the given input
shapes against the model (:func:`bind_shapes`), works out the boundary tensors' shapes at them
(ONNX shape inference and ONNX Runtime's symbolic inference on a copy of the model with those
inputs fixed, ``ferry.graph.with_input_shapes``), and warns when the plan has many pieces or
copies more between engines than the model's inputs weigh.

Before -> After::

    plan (x[N,16] -> [accel: Gemm] -> h[N,8] -> [onnxruntime: Relu]), shapes {x: [4, 16]}
    -> 2 partitions, 2 engine calls per run, 1 boundary tensor, 128 B per run
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import onnx
import onnx_ir as ir

from ferry.errors import InvalidInputError
from ferry.graph import (
    Dim,
    graph_inputs,
    inference_proto,
    proto_shapes,
    shape_of,
    symbolic_shape_inference,
    with_input_shapes,
)

if TYPE_CHECKING:
    from ferry.plan import Plan

__all__ = [
    "LARGE_BOUNDARY_BYTES",
    "LARGE_BOUNDARY_RATIO",
    "MANY_PARTITIONS",
    "BoundaryTensor",
    "EngineUse",
    "PlacementCost",
    "dim_text",
    "human_bytes",
    "plural",
    "split_cost",
    "sum_or_none",
    "tensor_bytes",
]

logger = logging.getLogger(__name__)

#: Plans with more partitions than this get a warning (:meth:`PlacementReport.cost`). Each cut
#: adds an engine call and a copy of its boundary tensors out of one engine and into the next per
#: run; a PP-OCR detector cut into 10 pieces ran at 0.61x the speed of ONNX Runtime alone. The
#: splits that pay have few pieces: an engine's body with pre- or post-processing on the fallback
#: (2 or 3 pieces), or one refused op in its middle (3); four leaves room for one more cut.
MANY_PARTITIONS = 4

#: Boundary bytes per run are worth a warning when they are more than this multiple of the bytes
#: of the model's inputs (:meth:`PlacementReport.cost`). A run copies its inputs into an engine
#: anyway; a split whose copies between engines outweigh that has made copying, not computing,
#: the larger part of what it adds (a detector's NMS on the fallback copies a fraction of the
#: image; a cut through an early feature map copies several images' worth).
LARGE_BOUNDARY_RATIO = 1.0

#: ... and at least this many bytes: below 1 MiB a host copy takes well under 0.1 ms (at the
#: ~10 GB/s of one core's memcpy), so a model with tiny inputs (token ids) is not warned about
#: for copying hidden states of a few hundred KiB.
LARGE_BOUNDARY_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class BoundaryTensor:
    """A value one partition produces and others read: it is copied between engines.

    Attributes:
        name: the value's name.
        producer: index of the partition that computes it.
        consumers: indices of the partitions that read it.
        dtype: its element type (numpy's name), when known.
        shape: its shape (symbolic dims as names, unknown ones as None), when known.
        nbytes: its size in bytes, when the shape is static; None when it depends on the input.
    """

    name: str
    producer: int
    consumers: tuple[int, ...]
    dtype: str | None
    shape: tuple[Dim, ...] | None
    nbytes: int | None


@dataclasses.dataclass(frozen=True)
class EngineUse:
    """What one backend runs of a plan: how many partitions, holding how many nodes."""

    backend: str
    partitions: int
    nodes: int


@dataclasses.dataclass(frozen=True)
class PlacementCost:
    """What a plan's split costs per run (:meth:`PlacementReport.cost`).

    Attributes:
        partitions: partitions in the plan.
        engine_calls: engine calls per run: the partitions that compute something read later
            (dead code is skipped at run time).
        engines: per backend, in order of its first partition: its partitions and nodes.
        boundary_tensors: values copied from one engine to another per run.
        boundary_bytes: their bytes per run (each tensor once); None while some size is
            unknown: it depends on input sizes not given, or shape inference cannot size it.
        unknown_sizes: the boundary tensors whose size is unknown.
        known_bytes: the bytes of those whose size is known (``boundary_bytes`` when all are).
        input_bytes: bytes of the model's inputs per run, when known.
        shapes: the input shapes the sizes were worked out at, when given.
        warnings: what about this split is likely to cost more than it saves.
        boundaries: the boundary tensors, with shapes and sizes at ``shapes`` where given.
    """

    partitions: int
    engine_calls: int
    engines: tuple[EngineUse, ...]
    boundary_tensors: int
    boundary_bytes: int | None
    unknown_sizes: tuple[str, ...]
    known_bytes: int = 0
    input_bytes: int | None = None
    shapes: Mapping[str, tuple[int, ...]] | None = None
    warnings: tuple[str, ...] = ()
    boundaries: tuple[BoundaryTensor, ...] = dataclasses.field(default=(), repr=False)

    def summary(self) -> str:
        """One line: partitions, engine calls, boundary tensors and their bytes per run."""
        if self.boundary_bytes is not None:
            size = f"{human_bytes(self.boundary_bytes)} per run"
        elif self.input_bytes is None:
            size = "bytes depend on input sizes (give --shape)"
        else:  # the inputs are sized; shape inference could not size some boundary
            size = (
                f"at least {human_bytes(self.known_bytes)} per run "
                f"({plural(len(self.unknown_sizes), 'tensor')} of unknown size)"
            )
        return (
            f"{plural(self.partitions, 'partition')}, "
            f"{plural(self.engine_calls, 'engine call')} per run, "
            f"{plural(self.boundary_tensors, 'boundary tensor')}, {size}"
        )

    def to_dict(self) -> dict[str, Any]:
        """The cost as JSON-ready data (``boundaries`` left out: the report lists them)."""
        return {
            "partitions": self.partitions,
            "engine_calls": self.engine_calls,
            "engines": {
                e.backend: {"partitions": e.partitions, "nodes": e.nodes} for e in self.engines
            },
            "boundary_tensors": self.boundary_tensors,
            "boundary_bytes": self.boundary_bytes,
            "unknown_sizes": list(self.unknown_sizes),
            "known_bytes": self.known_bytes,
            "input_bytes": self.input_bytes,
            "shapes": None
            if self.shapes is None
            else {name: list(dims) for name, dims in self.shapes.items()},
            "warnings": list(self.warnings),
        }


def split_cost(
    plan: Plan,
    boundaries: tuple[BoundaryTensor, ...],
    model: ir.Model | None,
    refused: Sequence[str],
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> PlacementCost:
    """What ``plan``'s split costs per run: partitions, engine calls, boundary tensors and bytes.

    Args:
        plan: the plan.
        boundaries: its boundary tensors, as placement found them (declared shapes).
        model: the prepared model it was made on, where known: shapes are inferred on it.
        refused: the op type of each node an engine refused (its fallback islands), named in
            the warning about many partitions.
        shapes: concrete shapes of (some of) the graph inputs. Symbolic dims of the boundary
            tensors are worked out from them: shape inference runs again on a copy of the
            model with those inputs fixed (which finds derived dims, such as ``H/4`` after
            strided convolutions), and a dim named like one of a given input's dims takes
            its size. Without shapes, sizes are those the model declares or implies.

    Returns:
        The cost; ``boundary_bytes`` is None, and ``unknown_sizes`` names the tensors, where
        some size stays unknown. ``warnings`` says when the plan has more than
        :data:`MANY_PARTITIONS` partitions, or its boundaries copy more than
        :data:`LARGE_BOUNDARY_RATIO` times the input bytes (and at least
        :data:`LARGE_BOUNDARY_BYTES`) per run.

    Raises:
        InvalidInputError: ``shapes`` names a value that is not a graph input, gives an input
            another rank or a fixed dim another size, gives a size that is not a
            non-negative integer, or gives one named dim two sizes.
    """
    fixed, symbols = bind_shapes(model, plan, shapes)
    if shapes is not None:
        boundaries = _boundaries_at(boundaries, model, fixed, symbols)
    engines: dict[str, list[int]] = {}
    for p in plan.partitions:
        use = engines.setdefault(p.backend, [0, 0])
        use[0] += 1
        use[1] += len(p.nodes)
    total = sum_or_none(b.nbytes for b in boundaries)
    known = sum(b.nbytes for b in boundaries if b.nbytes is not None)
    inputs = input_bytes(model, fixed, symbols)
    warnings: list[str] = []
    if len(plan.partitions) > MANY_PARTITIONS:
        warnings.append(_fragmentation_warning(len(plan.partitions), refused))
    if inputs and known > LARGE_BOUNDARY_RATIO * inputs and known >= LARGE_BOUNDARY_BYTES:
        warnings.append(
            f"{'' if total is not None else 'at least '}{human_bytes(known)} cross engines "
            f"per run, {known / inputs:.1f}x the model's inputs ({human_bytes(inputs)}): "
            "copying between engines may cost more than the split saves; compare with one "
            "engine (ferry bench)"
        )
    return PlacementCost(
        partitions=len(plan.partitions),
        engine_calls=sum(1 for p in plan.partitions if p.outputs),
        engines=tuple(EngineUse(name, n, nodes) for name, (n, nodes) in engines.items()),
        boundary_tensors=len(boundaries),
        boundary_bytes=total,
        unknown_sizes=tuple(b.name for b in boundaries if b.nbytes is None),
        known_bytes=known,
        input_bytes=inputs,
        shapes=None if shapes is None else {k: tuple(v) for k, v in fixed.items()},
        warnings=tuple(warnings),
        boundaries=boundaries,
    )


def _fragmentation_warning(n: int, refused: Sequence[str]) -> str:
    counts: dict[str, int] = {}
    for op_type in refused:
        counts[op_type] = counts.get(op_type, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ops = ", ".join(f"{op} x{count}" for op, count in ranked[:3])
    if len(ranked) > 3:
        ops += f" and {len(ranked) - 3} more"
    around = f", cut around ops an engine refused: {ops}" if ops else ""
    return (
        f"{n} partitions (more than {MANY_PARTITIONS}){around}. Each cut adds an engine call "
        "and a copy of its tensors per run, so a model cut into many pieces can run slower "
        "than on one engine: compare with one engine (ferry bench)"
    )


def _boundaries_at(
    boundaries: tuple[BoundaryTensor, ...],
    model: ir.Model | None,
    fixed: Mapping[str, tuple[int, ...]],
    symbols: Mapping[str, int],
) -> tuple[BoundaryTensor, ...]:
    """The boundary tensors with shapes and sizes worked out at the fixed input shapes."""
    inferred: list[dict[str, tuple[Dim, ...]]] = []
    values: dict[str, ir.Value] = {}
    if model is not None:
        values = {v.name or "": v for node in model.graph for v in node.outputs}
        if fixed:
            inferred = shapes_at(model, fixed)
    found = []
    for b in boundaries:
        shape = best_shape([*(i.get(b.name) for i in inferred), b.shape], symbols)
        value = values.get(b.name)
        dtype = value.dtype if value is not None else None
        found.append(dataclasses.replace(b, shape=shape, nbytes=tensor_bytes(dtype, shape)))
    return tuple(found)


def tensor_bytes(dtype: ir.DataType | None, shape: Sequence[Dim] | None) -> int | None:
    """Bytes of a tensor of ``dtype`` and ``shape``; None unless both are known and fixed."""
    if dtype is None or shape is None or not all(isinstance(d, int) for d in shape):
        return None
    try:
        bits = dtype.bitwidth
    except (TypeError, ValueError):  # strings and other types without a fixed width
        return None
    return math.ceil(math.prod(d for d in shape if isinstance(d, int)) * bits / 8)


def sum_or_none(sizes: Iterable[int | None]) -> int | None:
    """The sum of ``sizes``; None when any is None."""
    total = 0
    for size in sizes:
        if size is None:
            return None
        total += size
    return total


def plural(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def bind_shapes(
    model: ir.Model | None, plan: Plan, shapes: Mapping[str, Sequence[int]] | None
) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    """Check ``shapes`` against the model's inputs. Returns the inputs whose shapes are then fixed
    (given, or all of whose dims are fixed or named like a given dim), and the size each named
    dim of a given input takes."""
    declared: dict[str, tuple[Dim, ...] | None] = (
        {v.name or "": shape_of(v) for v in graph_inputs(model)}
        if model is not None
        else dict.fromkeys(plan.graph_inputs)
    )
    fixed: dict[str, tuple[int, ...]] = {}
    symbols: dict[str, int] = {}
    where: dict[str, str] = {}
    for name, dims in (shapes or {}).items():
        if name not in declared:
            raise InvalidInputError(
                f"a shape is given for {name!r}, which is not an input of the model; its inputs: "
                f"{', '.join(declared) or 'none'}"
            )
        if isinstance(dims, (str, bytes)) or not isinstance(dims, Sequence):
            raise InvalidInputError(
                f"the shape given for {name!r} must be a sequence of sizes, got {dims!r}"
            )
        sizes: list[int] = []
        for size in dims:
            if isinstance(size, bool) or not hasattr(size, "__index__") or int(size) < 0:
                raise InvalidInputError(
                    f"the shape given for {name!r} must be non-negative integers, got "
                    f"{list(dims)!r}"
                )
            sizes.append(int(size))
        want = declared[name]
        shown = "[" + ",".join(dim_text(d) for d in want or ()) + "]"
        if want is not None and len(want) != len(sizes):
            raise InvalidInputError(
                f"input {name!r} has rank {len(want)} (shape {shown}); the shape given for it, "
                f"{sizes}, has {len(sizes)} dims"
            )
        for axis, (d, size) in enumerate(zip(want or (), sizes)):
            if isinstance(d, int) and d != size:
                raise InvalidInputError(
                    f"input {name!r} has size {d} on axis {axis} (shape {shown}); the shape given "
                    f"for it, {sizes}, has {size}"
                )
            if isinstance(d, str):
                if symbols.get(d, size) != size:
                    raise InvalidInputError(
                        f"dim {d!r} is {symbols[d]} in the shape given for {where[d]!r} and "
                        f"{size} in the one given for {name!r}"
                    )
                symbols[d] = size
                where[d] = name
        fixed[name] = tuple(sizes)
    if shapes:
        for name, want in declared.items():
            if name in fixed or want is None:
                continue
            bound = [symbols.get(d) if isinstance(d, str) else d for d in want]
            if all(isinstance(d, int) for d in bound):
                fixed[name] = tuple(d for d in bound if isinstance(d, int))
    return fixed, symbols


def input_bytes(
    model: ir.Model | None, fixed: Mapping[str, tuple[int, ...]], symbols: Mapping[str, int]
) -> int | None:
    """Bytes of the model's inputs per run at ``fixed`` shapes; None when some size is unknown."""
    if model is None:
        return None
    sizes = []
    for value in graph_inputs(model):
        shape = fixed.get(value.name or "") or _bound(shape_of(value), symbols)
        sizes.append(tensor_bytes(value.dtype, shape))
    return sum_or_none(sizes)


def shapes_at(
    model: ir.Model, fixed: Mapping[str, tuple[int, ...]]
) -> list[dict[str, tuple[Dim, ...]]]:
    """The shapes of ``model``'s values with its inputs at the ``fixed`` shapes, as ONNX shape
    inference finds them and as ONNX Runtime's symbolic shape inference does (each where it
    works). The second folds shape computations the first cannot (PyTorch's ``Pad`` with pads
    computed by ``ConstantOfShape -> Concat -> Slice -> Transpose``, sequence lengths through
    ``Shape -> Gather -> Reshape``); neither knows every contrib op."""
    try:
        proto = inference_proto(with_input_shapes(model, fixed))
    except InvalidInputError as e:  # a size of 0 (an empty batch), which it refuses
        logger.info("no shape inference at the given shapes: %s", e)
        return []
    found: list[dict[str, tuple[Dim, ...]]] = []
    try:
        found.append(
            proto_shapes(
                onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
            )
        )
    except Exception as e:  # onnx raises a zoo of types; inference is best effort here
        logger.info("ONNX shape inference failed at the given shapes: %s", e)
    symbolic = symbolic_shape_inference(proto)
    if symbolic is not None:
        found.append(proto_shapes(symbolic))
    return found


def _bound(shape: tuple[Dim, ...] | None, symbols: Mapping[str, int]) -> tuple[Dim, ...] | None:
    """``shape`` with each named dim that ``symbols`` sizes replaced by its size."""
    if shape is None:
        return None
    return tuple(symbols.get(d, d) if isinstance(d, str) else d for d in shape)


def best_shape(
    candidates: Iterable[tuple[Dim, ...] | None], symbols: Mapping[str, int]
) -> tuple[Dim, ...] | None:
    """The most concrete of ``candidates`` (shapes of one value: inferred at fixed input shapes,
    then declared), named dims bound by ``symbols``; the earliest among equals."""
    bound = [s for s in (_bound(c, symbols) for c in candidates) if s is not None]
    if not bound:
        return None
    return max(bound, key=lambda s: (all(isinstance(d, int) for d in s), _known(s)))


def _known(shape: tuple[Dim, ...]) -> int:
    return sum(1 for d in shape if isinstance(d, int))


def dim_text(d: Dim) -> str:
    return "?" if d is None else str(d)


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
