"""Placement: which backend runs which nodes of a model.

``place(model, backends)`` gives a :class:`~ferry.plan.Plan`; ``explain`` gives the same plan with a
verdict per node (which backend took it, and why each backend tried before it did not) and the
tensors that cross partition boundaries. Placement only decides: lowering a partition to a
standalone model and compiling it belong to ``ferry.runtime``.

Algorithm (ONNX Runtime's ``GetCapability`` and TF-TRT's segmenter):

1. Work on the prepared copy (``ferry.graph.prepare``: every node and value named, shapes
   inferred so that rules see dtypes and ranks) with its top-level nodes in topological order. A
   node with subgraphs (If/Loop/Scan) is one unit; the outer values its bodies read count as its
   inputs.
2. Shape-computation chains (nodes that depend on run-time data but whose results only end in
   inputs that carry shapes, axes or sizes, e.g. ``Shape -> Gather -> Concat -> Reshape``'s second
   input) go where their consumers go on an engine that computes shapes itself
   (``computes_shapes``: OpenVINO), and stay on the fallback for the others (TensorRT wants them
   as constants, not computations). They never count toward a group's size.
3. Backend by backend, in priority order, a node is a candidate when it is not in ``force_cpu``,
   not in a shape chain, and the backend is capable of it (``_capability``: its rule table, then
   the engine's own veto).
4. Candidates are grouped in *waves* (ONNX Runtime's ``CreateSupportedPartitions``): walk the graph
   in Kahn's order, taking every ready non-candidate first, then every ready candidate into the
   current group until none is ready, then close the group. Each group is a contiguous stretch of
   one topological order of the graph, so it is convex (no path between two of its nodes leaves it)
   and the groups never form a cycle. Groups already given to a higher-priority backend take part
   as single units, which keeps that true across backends.
5. Groups with fewer than ``min_partition_size`` nodes that compute something (Identity, Reshape,
   Shape, Squeeze, Unsqueeze, Flatten, Dropout and Constant do not count) are dropped, unless the
   group is the whole model; their nodes go on to the next backend.
6. Whatever is left goes to the fallback in maximal groups, formed the same way; the order that
   last pass produces is the order of the plan.
7. Constant nodes (``Constant``, and ops computing only from constants, such as the
   ``Reshape(Constant, Identity(Constant))`` chains Paddle's exporter stores weights as) are data,
   not work: each joins the partition of its first reader, and like initializers their values are
   never partition inputs or outputs (lowering copies them into every partition that reads them),
   so that weights and inputs rules want constant (Reshape's shape) stay constant everywhere. A partition of dead code (nothing it computes is read
   later) hands on its dangling values, since engines refuse models without outputs.

What a split costs per run (partitions, engine calls, boundary tensors and their bytes, at given
input shapes) is :meth:`PlacementReport.cost`, which warns when a plan has many pieces or copies
more between engines than the model's inputs weigh.

Before -> After::

    Conv -> Relu -> Softmax -> Add     (accel takes Conv, Relu, Add; not Softmax)
    [accel: Conv, Relu] -> [onnxruntime: Softmax] -> [accel: Add]    (min_partition_size=1)
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import onnx
import onnx_ir as ir

from ferry.backends._api import Backend
from ferry.backends._base import require_base
from ferry.backends._capability import engine_capability, engine_vetoes, rule_verdicts
from ferry.backends._registry import FALLBACK, get_backend, parse_backends
from ferry.errors import FerryError, InvalidInputError
from ferry.graph import (
    Dim,
    dtype_name,
    graph_inputs,
    inference_proto,
    load_model,
    node_reads,
    prepare,
    proto_shapes,
    shape_of,
    subgraphs,
    symbolic_shape_inference,
)
from ferry.plan import Partition, Plan, boundary, is_constant, is_constant_node

if TYPE_CHECKING:
    import os

__all__ = [
    "DEFAULT_MIN_PARTITION_SIZE",
    "LARGE_BOUNDARY_BYTES",
    "LARGE_BOUNDARY_RATIO",
    "MANY_PARTITIONS",
    "SHAPE_INPUTS",
    "UNCOUNTED_OPS",
    "BoundaryTensor",
    "EngineUse",
    "NodeVerdict",
    "PlacementCost",
    "PlacementReport",
    "explain",
    "place",
]

logger = logging.getLogger(__name__)

#: Groups with fewer counted nodes than this are left to the next backend. TF-TRT's default
#: (``minimum_segment_size=3``): every partition boundary costs two host copies and an engine
#: call, which one or two ops rarely win back. ONNX Runtime's TensorRT provider defaults to 1.
DEFAULT_MIN_PARTITION_SIZE = 3

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

#: Ops that relabel or pass data on without computing; they do not count toward a group's size.
UNCOUNTED_OPS = frozenset(
    {
        "Identity",
        "Reshape",
        "Shape",
        "Size",
        "Squeeze",
        "Unsqueeze",
        "Flatten",
        "Dropout",
        "Constant",
    }
)

_REDUCE_OPS = (
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSum",
    "ReduceSumSquare",
)

#: Inputs that carry shapes, sizes, axes, pads or counts rather than tensor data, by op type
#: (default domain). A run-time computation whose results only end in these is a shape chain.
SHAPE_INPUTS: Mapping[str, frozenset[int]] = {
    "Reshape": frozenset({1}),
    "Expand": frozenset({1}),
    "Tile": frozenset({1}),
    "Resize": frozenset({1, 2, 3}),
    "Upsample": frozenset({1}),
    "ConstantOfShape": frozenset({0}),
    "Slice": frozenset({1, 2, 3, 4}),
    "Pad": frozenset({1, 3}),
    "Squeeze": frozenset({1}),
    "Unsqueeze": frozenset({1}),
    "Split": frozenset({1}),
    "TopK": frozenset({1}),
    "OneHot": frozenset({1}),
    "CumSum": frozenset({1}),
    "Range": frozenset({0, 1, 2}),
    "Trilu": frozenset({1}),
    "NonMaxSuppression": frozenset({2, 3, 4}),
    **{op: frozenset({1}) for op in _REDUCE_OPS},
}

_DEFAULT_DOMAINS = ("", "ai.onnx")

#: A backend object (deriving from ``BackendBase``), or a registry name.
BackendLike = Backend | str


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
            size = f"{_human_bytes(self.boundary_bytes)} per run"
        elif self.input_bytes is None:
            size = "bytes depend on input sizes (give --shape)"
        else:  # the inputs are sized; shape inference could not size some boundary
            size = (
                f"at least {_human_bytes(self.known_bytes)} per run "
                f"({_count(len(self.unknown_sizes), 'tensor')} of unknown size)"
            )
        return (
            f"{_count(self.partitions, 'partition')}, "
            f"{_count(self.engine_calls, 'engine call')} per run, "
            f"{_count(self.boundary_tensors, 'boundary tensor')}, {size}"
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
        return _total(b.nbytes for b in self.boundaries)

    def cost(self, shapes: Mapping[str, Sequence[int]] | None = None) -> PlacementCost:
        """What the split costs per run: partitions, engine calls, boundary tensors and bytes.

        Args:
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
        plan = self.plan
        fixed, symbols = _bind_shapes(self.model, plan, shapes)
        boundaries = self.boundaries
        if shapes is not None:
            boundaries = self._boundaries_at(fixed, symbols)
        engines: dict[str, list[int]] = {}
        for p in plan.partitions:
            use = engines.setdefault(p.backend, [0, 0])
            use[0] += 1
            use[1] += len(p.nodes)
        total = _total(b.nbytes for b in boundaries)
        known = sum(b.nbytes for b in boundaries if b.nbytes is not None)
        inputs = _input_bytes(self.model, fixed, symbols)
        warnings: list[str] = []
        if len(plan.partitions) > MANY_PARTITIONS:
            warnings.append(self._fragmentation_warning())
        if inputs and known > LARGE_BOUNDARY_RATIO * inputs and known >= LARGE_BOUNDARY_BYTES:
            warnings.append(
                f"{'' if total is not None else 'at least '}{_human_bytes(known)} cross engines "
                f"per run, {known / inputs:.1f}x the model's inputs ({_human_bytes(inputs)}): "
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

    def _fragmentation_warning(self) -> str:
        n = len(self.plan.partitions)
        refused: dict[str, int] = {}
        for v in self.nodes:
            if v.reasons and v.note is None:
                refused[v.op_type] = refused.get(v.op_type, 0) + 1
        ranked = sorted(refused.items(), key=lambda kv: (-kv[1], kv[0]))
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
        self, fixed: Mapping[str, tuple[int, ...]], symbols: Mapping[str, int]
    ) -> tuple[BoundaryTensor, ...]:
        """The boundary tensors with shapes and sizes worked out at the fixed input shapes."""
        inferred: list[dict[str, tuple[Dim, ...]]] = []
        values: dict[str, ir.Value] = {}
        if self.model is not None:
            values = {v.name or "": v for node in self.model.graph for v in node.outputs}
            if fixed:
                inferred = _shapes_at(self.model, fixed)
        found = []
        for b in self.boundaries:
            shape = _best_shape([*(i.get(b.name) for i in inferred), b.shape], symbols)
            value = values.get(b.name)
            dtype = value.dtype if value is not None else None
            found.append(dataclasses.replace(b, shape=shape, nbytes=_nbytes(dtype, shape)))
        return tuple(found)

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
            size = f"{_human_bytes(total)} per run"
        elif cost.input_bytes is None:
            size = "size depends on inputs"
        else:
            size = f"{len(cost.unknown_sizes)} of unknown size"
        lines.append(f"{len(cost.boundaries)} boundary tensor(s), {size}")
        for b in cost.boundaries:
            dtype = b.dtype or "?"
            shape = "?" if b.shape is None else "[" + ",".join(_dim(d) for d in b.shape) + "]"
            nbytes = _human_bytes(b.nbytes) if b.nbytes is not None else "dynamic size"
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


def place(
    model: ir.Model | onnx.ModelProto | str | os.PathLike[str],
    backends: Sequence[BackendLike] | str,
    *,
    min_partition_size: int = DEFAULT_MIN_PARTITION_SIZE,
    force_cpu: Iterable[str] = (),
    fallback: str = FALLBACK,
    validate: bool = True,
) -> Plan:
    """Split ``model`` across ``backends``; what none of them takes goes to ``fallback``.

    Args:
        model: the model (never modified). Node names in the plan are those of the model after
            ``ferry.graph.prepare``, which is what ``ferry.load`` names them too.
        backends: backend objects or registry names, highest priority first. The fallback may be
            among them; backends listed after it get nothing, since it takes every node.
        min_partition_size: groups with fewer nodes that compute something are left to the next
            backend (see :data:`UNCOUNTED_OPS`); a group that is the whole model is always kept.
        force_cpu: op types (``"Softmax"``, ``"domain::Op"``) or node names to run on the fallback.
        fallback: the backend that runs everything else (it needs no rules).
        validate: ask each engine's ``validate`` to veto nodes its rules over-claimed.

    Returns:
        The plan: partitions in an order where each one's inputs are graph inputs or outputs of
        earlier ones.

    Raises:
        BackendUnavailableError: a backend named by string is unknown or not installed.
        InvalidInputError: ``min_partition_size`` is below 1.
        FerryError: the graph has a cycle, or an engine failed while validating.
    """
    return _Partitioner(model, backends, min_partition_size, force_cpu, fallback, validate).run(
        with_report=False
    )[0]


def explain(
    model: ir.Model | onnx.ModelProto | str | os.PathLike[str],
    backends: Sequence[BackendLike] | str,
    *,
    min_partition_size: int = DEFAULT_MIN_PARTITION_SIZE,
    force_cpu: Iterable[str] = (),
    fallback: str = FALLBACK,
    validate: bool = True,
) -> PlacementReport:
    """Like :func:`place`, and say why: a verdict per node and the boundary tensors.

    Arguments are those of :func:`place`.
    """
    _, report = _Partitioner(
        model, backends, min_partition_size, force_cpu, fallback, validate
    ).run(with_report=True)
    assert report is not None  # with_report=True always builds one
    return report


# --------------------------------------------------------------------------------------------------


class _Partitioner:
    """One partitioning run; see the module docstring for the algorithm."""

    def __init__(
        self,
        model: ir.Model | onnx.ModelProto | str | os.PathLike[str],
        backends: Sequence[BackendLike] | str,
        min_partition_size: int,
        force_cpu: Iterable[str],
        fallback: str,
        validate: bool,
    ) -> None:
        if isinstance(min_partition_size, bool) or not isinstance(min_partition_size, int):
            raise InvalidInputError(
                f"min_partition_size must be an integer, got {min_partition_size!r}"
            )
        if min_partition_size < 1:
            raise InvalidInputError(
                f"min_partition_size must be at least 1, got {min_partition_size}"
            )
        self.min_size = min_partition_size
        self.fallback = fallback
        self.validate = validate
        self.backends = _resolve(backends, fallback)
        self.model = prepare(model if isinstance(model, ir.Model) else load_model(model))
        self.graph = _Dag(self.model)
        self.forced = self._forced(force_cpu)
        self.shape_chain = _shape_chain(self.graph)
        n = len(self.graph.nodes)
        #: reasons[i][backend]: why that backend did not take node i.
        self.reasons: list[dict[str, str]] = [{} for _ in range(n)]
        #: The backend each node went to (None while unassigned).
        self.assigned: list[str | None] = [None] * n
        # Units: single nodes, or groups fixed for a backend (contracted into one unit so that
        # later passes cannot make them part of a cycle). Constant nodes are not units.
        self.unit_of: list[int] = [-1] * n
        self.units: list[list[int]] = []
        for i in range(n):
            if not self.graph.attached[i]:
                self.unit_of[i] = len(self.units)
                self.units.append([i])

    # -- steps ---------------------------------------------------------------------------------

    def run(self, *, with_report: bool) -> tuple[Plan, PlacementReport | None]:
        for backend in self.backends:
            self._pass(backend)
        groups = self._fallback_pass()
        plan, part_of = self._emit(groups)
        logger.info(
            "partitioned %d node(s) into %d partition(s): %s",
            len(self.graph.nodes),
            len(plan.partitions),
            ", ".join(f"{p.backend}[{len(p.nodes)}]" for p in plan.partitions),
        )
        if not with_report:
            return plan, None
        return plan, self._report(plan, part_of)

    def _forced(self, force_cpu: Iterable[str]) -> list[str | None]:
        """For each node, the ``force_cpu`` entry that sends it to the fallback, if any."""
        if isinstance(force_cpu, str):
            force_cpu = [force_cpu]
        wanted = {str(entry) for entry in force_cpu}
        found: set[str] = set()
        forced: list[str | None] = []
        for i, node in enumerate(self.graph.nodes):
            hit = next(
                (key for key in (node.name or "", node.op_type, _op_name(node)) if key in wanted),
                None,
            )
            if hit is not None:
                found.add(hit)
                if self.graph.attached[i] and hit == node.name:
                    logger.warning(
                        "force_cpu entry %r is a constant (computed from constants only): it "
                        "travels with the partitions that read it",
                        hit,
                    )
            forced.append(hit)
        for entry in sorted(wanted - found):
            logger.warning("force_cpu entry %r matches no node name or op type in the model", entry)
        return forced

    def _pass(self, backend: Backend) -> None:
        """Give ``backend`` the groups of unassigned nodes it takes."""
        name = backend.name
        computes_shapes = backend.computes_shapes
        asked: list[int] = []
        for i in range(len(self.graph.nodes)):
            if self.assigned[i] is not None or self.graph.attached[i]:
                continue
            if self.forced[i] is not None:
                why = f"forced onto {self.fallback} by force_cpu entry {self.forced[i]!r}"
            elif self.shape_chain[i] and not computes_shapes:
                why = (
                    "computes a shape (its results only feed shape, axes or size inputs); "
                    f"shape computations stay on {self.fallback}"
                )
            else:
                asked.append(i)
                continue
            self.reasons[i][name] = why
        names = [self.graph.nodes[i].name or "" for i in asked]
        # The engine answers for itself, on the whole model, when it can be asked that way.
        answer = engine_capability(backend, self.model, names) if self.validate else None
        engine_first = answer is not None
        verdicts = answer if answer is not None else rule_verdicts(backend, self.model, names)
        candidates: set[int] = set()
        for i, node_name in zip(asked, names):
            if verdicts[node_name] is True:
                candidates.add(i)
            else:
                self.reasons[i][name] = str(verdicts[node_name])
        ranked = backend.ranked_inputs
        if ranked:
            while self._drop_rankless_reads(name, candidates, [candidates]):
                pass
        if self.validate and not engine_first and candidates:
            by_name = {self.graph.nodes[i].name or "": i for i in candidates}
            for node_name, why in engine_vetoes(backend, self.model, sorted(by_name)).items():
                candidates.discard(by_name[node_name])
                self.reasons[by_name[node_name]][name] = why
        everything = sum(1 for i in range(len(self.graph.nodes)) if not self.graph.attached[i])
        while True:
            kept: list[list[int]] = []
            for units in (seg for supported, seg in self._waves(candidates) if supported):
                members = sorted(i for u in units for i in self.units[u])
                size = sum(
                    1
                    for i in members
                    if not _uncounted(self.graph.nodes[i]) and not self.shape_chain[i]
                )
                if size < self.min_size and len(members) < everything:
                    why = (
                        f"its group of {len(members)} node(s) on {name} has {size} that compute "
                        f"(Identity/Reshape/Shape-like ops do not count), fewer than "
                        f"min_partition_size={self.min_size}"
                    )
                    for i in members:
                        self.reasons[i][name] = why
                    continue
                kept.append(members)
            # A group that reads a value of unknown rank from another engine cannot be compiled
            # by an engine that needs ranked inputs: leave those readers out and group again.
            if not (ranked and self._drop_rankless_reads(name, candidates, kept)):
                break
        for members in kept:
            self._fix(members, name)

    def _drop_rankless_reads(
        self, backend: str, candidates: set[int], groups: Iterable[Iterable[int]]
    ) -> bool:
        """Take out of ``candidates`` the nodes of ``groups`` that read a value of unknown rank from
        outside their group (a graph input, or a node of another engine); say whether any were."""
        dropped = False
        for group in [set(g) for g in groups]:
            for i in sorted(group):
                for value in self.graph.reads[i]:
                    if value.shape is not None or is_constant(value):
                        continue
                    if self.graph.producer_index(value) in group:
                        continue
                    candidates.discard(i)
                    self.reasons[i][backend] = (
                        f"reads {value.name!r}, whose rank is unknown, from outside its {backend} "
                        f"partition; {backend} needs inputs of known rank"
                    )
                    dropped = True
                    break
        return dropped

    def _fix(self, members: list[int], backend: str) -> None:
        """Make ``members`` (single-node units) one unit that runs on ``backend``."""
        unit = len(self.units)
        self.units.append(members)
        for i in members:
            self.unit_of[i] = unit
            self.assigned[i] = backend

    def _fallback_pass(self) -> list[tuple[str, list[int]]]:
        """Put every unassigned node on the fallback; give every group in plan order."""
        rest = {
            i
            for i in range(len(self.graph.nodes))
            if self.assigned[i] is None and not self.graph.attached[i]
        }
        groups: list[tuple[str, list[int]]] = []
        for supported, units in self._waves(rest):
            if supported:
                members = sorted(i for u in units for i in self.units[u])
                for i in members:
                    self.assigned[i] = self.fallback
                groups.append((self.fallback, members))
            else:
                (unit,) = units
                members = self.units[unit]
                backend = self.assigned[members[0]]
                assert backend is not None  # every unit is either fixed or in `rest`
                groups.append((backend, list(members)))
        return groups

    def _waves(self, supported: set[int]) -> list[tuple[bool, list[int]]]:
        """Kahn's walk over the unit graph in waves (ONNX Runtime's ``CreateSupportedPartitions``).

        Every ready unit that is not supported goes first (which makes more supported units
        ready); then every ready supported unit joins the current group until none is ready, and
        the group closes. Returns the walk as segments ``(supported, units)``: a supported segment
        is one group, an unsupported one a single unit. Ties go to the earlier node in the graph.
        """
        graph = self.graph
        n_units = len(self.units)
        alive = [False] * n_units
        for i in range(len(graph.nodes)):
            if not graph.attached[i]:
                alive[self.unit_of[i]] = True
        succ: list[set[int]] = [set() for _ in range(n_units)]
        indeg = [0] * n_units
        for i, preds in enumerate(graph.preds):
            if graph.attached[i]:
                continue
            ui = self.unit_of[i]
            for p in preds:
                if graph.attached[p]:
                    continue
                up = self.unit_of[p]
                if up != ui and ui not in succ[up]:
                    succ[up].add(ui)
                    indeg[ui] += 1
        is_sup = [False] * n_units
        for i in supported:
            is_sup[self.unit_of[i]] = True
        ready: tuple[list[tuple[int, int]], list[tuple[int, int]]] = ([], [])  # (unsup, sup)
        for u in range(n_units):
            if alive[u] and indeg[u] == 0:
                heapq.heappush(ready[is_sup[u]], (self.units[u][0], u))
        segments: list[tuple[bool, list[int]]] = []
        done = 0

        def release(u: int) -> None:
            for v in succ[u]:
                indeg[v] -= 1
                if indeg[v] == 0:
                    heapq.heappush(ready[is_sup[v]], (self.units[v][0], v))

        while ready[0] or ready[1]:
            while ready[0]:
                _, u = heapq.heappop(ready[0])
                segments.append((False, [u]))
                release(u)
                done += 1
            group: list[int] = []
            while ready[1]:
                _, u = heapq.heappop(ready[1])
                group.append(u)
                release(u)
                done += 1
            if group:
                segments.append((True, group))
        if done != sum(alive):
            # Cannot happen for a DAG whose groups came from earlier waves; a bug if it does.
            raise FerryError("internal error: the partition graph has a cycle; please report it")
        return segments

    def _emit(self, groups: list[tuple[str, list[int]]]) -> tuple[Plan, list[int]]:
        """Attach Constant nodes, then compute each partition's inputs and outputs."""
        graph = self.graph
        part_of = [-1] * len(graph.nodes)
        members: list[list[int]] = []
        backends: list[str] = []
        for index, (backend, nodes) in enumerate(groups):
            backends.append(backend)
            members.append(list(nodes))
            for i in nodes:
                part_of[i] = index
        orphans: list[int] = []
        # Readers first (reverse order), so that a constant node read by another one finds it
        # already placed.
        for i in reversed(range(len(graph.nodes))):
            if not graph.attached[i]:
                continue
            reading = [part_of[r] for r in graph.succs[i] if part_of[r] >= 0]
            if reading:
                target = min(reading)
            elif members:
                target = 0
            else:
                orphans.append(i)
                continue
            part_of[i] = target
            members[target].append(i)
            self.assigned[i] = backends[target]
        if orphans:  # a model of nothing but Constant nodes
            backends.append(self.fallback)
            members.append(orphans)
            for i in orphans:
                part_of[i] = len(members) - 1
                self.assigned[i] = self.fallback
        readers = {v: [graph.nodes[r] for r in rs] for v, rs in graph.readers.items()}
        partitions = []
        for index, nodes in enumerate(members):
            nodes.sort()
            names = tuple(graph.nodes[i].name or "" for i in nodes)
            inputs, outputs = boundary(self.model, names, readers=readers)
            partitions.append(Partition(backends[index], names, inputs, outputs))
        g = self.model.graph
        plan = Plan(
            partitions=tuple(partitions),
            graph_inputs=tuple(v.name or "" for v in g.inputs if v.name not in g.initializers),
            graph_outputs=tuple(v.name or "" for v in g.outputs),
        )
        return plan, part_of

    def _report(self, plan: Plan, part_of: list[int]) -> PlacementReport:
        graph = self.graph
        verdicts = []
        for i, node in enumerate(graph.nodes):
            backend = self.assigned[i]
            assert backend is not None
            note = None
            if graph.attached[i]:
                note = "a constant (computed from constants only): placed with its first reader"
            tried = {b: why for b, why in self.reasons[i].items() if b != backend}
            verdicts.append(
                NodeVerdict(node.name or "", _op_name(node), backend, part_of[i], tried, note)
            )
        boundaries = []
        for index, p in enumerate(plan.partitions):
            for name in p.outputs:
                value = graph.values[name]
                consumers = sorted(
                    {part_of[r] for r in graph.readers.get(value, ()) if part_of[r] != index}
                )
                if consumers:
                    boundaries.append(_boundary(value, index, tuple(consumers)))
        return PlacementReport(plan, tuple(verdicts), tuple(boundaries), self.model)


class _Dag:
    """The top-level nodes of a model as an integer-indexed DAG, in topological order.

    A node's reads are its inputs plus the outer values its subgraphs use, so If/Loop/Scan nodes
    are single units that depend on everything their bodies capture.
    """

    def __init__(self, model: ir.Model) -> None:
        self._build(model)
        if any(p >= i for i, preds in enumerate(self.preds) for p in preds):
            try:
                model.graph.sort()
            except ValueError as e:
                raise FerryError(
                    f"the graph of the model has a cycle, so it cannot be partitioned: {e}"
                ) from e
            self._build(model)

    def _build(self, model: ir.Model) -> None:
        self.nodes: list[ir.Node] = list(model.graph)
        self.index: dict[ir.Node, int] = {node: i for i, node in enumerate(self.nodes)}
        self.by_name: dict[str, int] = {node.name or "": i for i, node in enumerate(self.nodes)}
        self.reads: list[list[ir.Value]] = []
        self.readers: dict[ir.Value, list[int]] = {}
        self.values: dict[str, ir.Value] = {}
        self.preds: list[list[int]] = []
        self.succs: list[list[int]] = [[] for _ in self.nodes]
        for i, node in enumerate(self.nodes):
            reads = node_reads(node)
            self.reads.append(reads)
            preds: dict[int, None] = {}
            for value in reads:
                self.readers.setdefault(value, []).append(i)
                j = self.producer_index(value)
                if j is not None:
                    preds[j] = None
            self.preds.append(list(preds))
            for j in preds:
                self.succs[j].append(i)
            for value in node.outputs:
                self.values[value.name or ""] = value
        #: Constant nodes (Constant, and ops computing only from constants): data, not work;
        #: placed with their first reader, not grouped.
        memo: dict[ir.Node, float] = {}
        self.attached: list[bool] = [is_constant_node(node, memo) for node in self.nodes]

    def producer_index(self, value: ir.Value) -> int | None:
        producer = value.producer()
        return None if producer is None else self.index.get(producer)


def _shape_chain(graph: _Dag) -> list[bool]:
    """Which nodes compute shapes: run-time dependent, results only ending in shape inputs."""
    n = len(graph.nodes)
    runtime = [False] * n
    for i in range(n):
        for value in graph.reads[i]:
            j = graph.producer_index(value)
            if (j is not None and runtime[j]) or (
                value.is_graph_input() and not value.is_initializer()
            ):
                runtime[i] = True
                break
    chain = [False] * n
    for i in range(n - 1, -1, -1):
        node = graph.nodes[i]
        if not runtime[i] or subgraphs(node):
            continue
        used = False
        ok = True
        for value in node.outputs:
            if value.is_graph_output():
                ok = False
                break
            for use in value.uses():
                used = True
                j = graph.index.get(use.node)
                if j is None:  # read inside a subgraph: data as far as we can tell
                    ok = False
                    break
                consumer = use.node
                slots = (
                    SHAPE_INPUTS.get(consumer.op_type, frozenset())
                    if consumer.domain in _DEFAULT_DOMAINS
                    else frozenset()
                )
                if use.idx not in slots and not chain[j]:
                    ok = False
                    break
            if not ok:
                break
        chain[i] = ok and used
    return chain


def _resolve(backends: Sequence[BackendLike] | str, fallback: str) -> list[Backend]:
    """Backend objects in priority order, up to (not including) the fallback.

    Raises:
        InvalidInputError: an object given does not derive from ``BackendBase``.
    """
    items: list[BackendLike] = (
        list(parse_backends(backends)) if isinstance(backends, str) else list(backends)
    )
    found: list[Backend] = []
    seen: set[str] = set()
    for position, item in enumerate(items):
        if not isinstance(item, str):
            require_base(item, "a backend given to place()")
        name = item if isinstance(item, str) else item.name
        if name == fallback:
            rest = items[position + 1 :]
            if rest:
                logger.info(
                    "backends listed after the fallback %r get no nodes: %s",
                    fallback,
                    ", ".join(b if isinstance(b, str) else b.name for b in rest),
                )
            break
        if name in seen:
            continue
        seen.add(name)
        found.append(get_backend(item) if isinstance(item, str) else item)
    return found


def _uncounted(node: ir.Node) -> bool:
    return node.domain in _DEFAULT_DOMAINS and node.op_type in UNCOUNTED_OPS


def _op_name(node: ir.Node) -> str:
    return node.op_type if node.domain in _DEFAULT_DOMAINS else f"{node.domain}::{node.op_type}"


def _boundary(value: ir.Value, producer: int, consumers: tuple[int, ...]) -> BoundaryTensor:
    dtype = dtype_name(value.dtype) if value.dtype is not None else None
    shape = shape_of(value)
    return BoundaryTensor(
        value.name or "", producer, consumers, dtype, shape, _nbytes(value.dtype, shape)
    )


def _nbytes(dtype: ir.DataType | None, shape: Sequence[Dim] | None) -> int | None:
    """Bytes of a tensor of ``dtype`` and ``shape``; None unless both are known and fixed."""
    if dtype is None or shape is None or not all(isinstance(d, int) for d in shape):
        return None
    try:
        bits = dtype.bitwidth
    except (TypeError, ValueError):  # strings and other types without a fixed width
        return None
    return math.ceil(math.prod(d for d in shape if isinstance(d, int)) * bits / 8)


def _total(sizes: Iterable[int | None]) -> int | None:
    """The sum of ``sizes``; None when any is None."""
    total = 0
    for size in sizes:
        if size is None:
            return None
        total += size
    return total


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _bind_shapes(
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
        shown = "[" + ",".join(_dim(d) for d in want or ()) + "]"
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


def _input_bytes(
    model: ir.Model | None, fixed: Mapping[str, tuple[int, ...]], symbols: Mapping[str, int]
) -> int | None:
    """Bytes of the model's inputs per run at ``fixed`` shapes; None when some size is unknown."""
    if model is None:
        return None
    sizes = []
    for value in graph_inputs(model):
        shape = fixed.get(value.name or "") or _bound(shape_of(value), symbols)
        sizes.append(_nbytes(value.dtype, shape))
    return _total(sizes)


def _shapes_at(
    model: ir.Model, fixed: Mapping[str, tuple[int, ...]]
) -> list[dict[str, tuple[Dim, ...]]]:
    """The shapes of ``model``'s values with its inputs at the ``fixed`` shapes, as ONNX shape
    inference finds them and as ONNX Runtime's symbolic shape inference does (each where it
    works). The second folds shape computations the first cannot (PyTorch's ``Pad`` with pads
    computed by ``ConstantOfShape -> Concat -> Slice -> Transpose``, sequence lengths through
    ``Shape -> Gather -> Reshape``); neither knows every contrib op."""
    proto = inference_proto(_with_input_shapes(model, fixed))
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


def _with_input_shapes(model: ir.Model, fixed: Mapping[str, tuple[int, ...]]) -> ir.Model:
    """A copy of ``model`` (weights shared) whose inputs have the ``fixed`` shapes and whose node
    outputs have no shape declared, so that shape inference works them out from those."""
    try:
        copy = model.clone()
    except RuntimeError:  # onnx_ir clones only sorted graphs; a proto round trip takes any order
        copy = ir.from_proto(ir.to_proto(model))
    for node in copy.graph:
        for output in node.outputs:
            output.shape = None
    for value in graph_inputs(copy):
        shape = fixed.get(value.name or "")
        if shape is not None:
            value.shape = ir.Shape(list(shape))
    return copy


def _bound(shape: tuple[Dim, ...] | None, symbols: Mapping[str, int]) -> tuple[Dim, ...] | None:
    """``shape`` with each named dim that ``symbols`` sizes replaced by its size."""
    if shape is None:
        return None
    return tuple(symbols.get(d, d) if isinstance(d, str) else d for d in shape)


def _best_shape(
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


def _dim(d: Dim) -> str:
    return "?" if d is None else str(d)


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
