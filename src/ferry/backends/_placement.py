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

The report (``_placement_report``: a verdict per node, the boundary tensors) and what a split
costs per run (``_placement_cost``: partitions, engine calls, boundary tensors and their bytes at
given input shapes, :meth:`PlacementReport.cost`) live beside this module.

Before -> After::

    Conv -> Relu -> Softmax -> Add     (accel takes Conv, Relu, Add; not Softmax)
    [accel: Conv, Relu] -> [onnxruntime: Softmax] -> [accel: Add]    (min_partition_size=1)
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import onnx
import onnx_ir as ir

from ferry.backends._api import Backend
from ferry.backends._base import require_base
from ferry.backends._capability import engine_capability, engine_vetoes, rule_verdicts
from ferry.backends._placement_cost import BoundaryTensor, tensor_bytes
from ferry.backends._placement_report import NodeVerdict, PlacementReport
from ferry.backends._registry import FALLBACK, get_backend, parse_backends
from ferry.errors import FerryError, InvalidInputError
from ferry.graph import (
    dtype_name,
    load_model,
    node_reads,
    prepare,
    shape_of,
    subgraphs,
)
from ferry.plan import Partition, Plan, boundary, is_constant, is_constant_node

if TYPE_CHECKING:
    import os

__all__ = [
    "DEFAULT_MIN_PARTITION_SIZE",
    "SHAPE_INPUTS",
    "UNCOUNTED_OPS",
    "explain",
    "place",
]

logger = logging.getLogger(__name__)

#: Groups with fewer counted nodes than this are left to the next backend. TF-TRT's default
#: (``minimum_segment_size=3``): every partition boundary costs two host copies and an engine
#: call, which one or two ops rarely win back. ONNX Runtime's TensorRT provider defaults to 1.
DEFAULT_MIN_PARTITION_SIZE = 3

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
        value.name or "", producer, consumers, dtype, shape, tensor_bytes(value.dtype, shape)
    )
