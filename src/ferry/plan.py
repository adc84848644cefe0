"""The Plan: which backend runs which nodes, as plain data; and cutting a node set out of a model.

A Plan is what placement decides and what a Session executes: an ordered list of partitions, each
``(backend, node names, input names, output names, options)``, in an order where every partition's
inputs are graph inputs or outputs of earlier partitions. It round-trips through JSON so that it can
be saved beside a model (``plan.json``), reviewed, edited and reloaded. :func:`check_plan` checks a
plan against its model before anything is compiled.

:func:`cut` is the one way ferry turns a set of nodes into a standalone model, whoever asks
(lowering a plan's partitions, an engine asked which nodes it takes, bisecting a failing
partition)::

    model + node names [+ the boundary, when the caller fixes it]
        -> ir.Model whose nodes are those nodes (in the model's order), whose inputs are what they
           read from outside and whose outputs are what they hand on

What a node set reads and hands on (:func:`boundary`) counts the outer values that If/Loop/Scan
bodies read as reads of their node. Constants belong to whoever reads them: initializers are carried
as initializers, constant nodes elsewhere (``Constant``, and ops that compute only from constants,
:func:`is_constant_node`) are copied in, and values with a known constant value become
initializers; none of them is ever a boundary value. A node set whose values nobody reads
(dead code) hands on its dangling values, since engines refuse a model without outputs.

Weights come along by reference: the cut model shares the source's tensors, nothing is copied, and
the source model is never changed. Every boundary value is typed: the source's declared type,
else what ONNX shape inference finds on the whole model.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx_ir as ir

from ferry.errors import PlanError
from ferry.graph import (
    Dim,
    atomic_path,
    dtype_name,
    graph_inputs,
    infer_value_types,
    node_reads,
    subgraphs,
)

__all__ = [
    "PLAN_FORMAT_VERSION",
    "Partition",
    "Plan",
    "ValueTypes",
    "boundary",
    "check_plan",
    "cut",
    "cut_partition",
    "is_constant",
    "is_constant_node",
    "value_readers",
]

PLAN_FORMAT_VERSION = 1

#: What ``ferry.graph.infer_value_types`` gives: value name -> (numpy dtype name, shape).
ValueTypes = Mapping[str, tuple[str | None, tuple[Dim, ...] | None]]

# Below IR 4 every initializer had to be listed as a graph input; cut models never list them.
_MIN_IR_VERSION = 4

_DTYPES_BY_NAME = {dtype_name(t): t for t in ir.DataType if t != ir.DataType.UNDEFINED}


@dataclasses.dataclass(frozen=True)
class Partition:
    """A connected piece of the graph that one backend runs.

    Attributes:
        backend: the backend's registry name, e.g. ``"onnxruntime"``.
        nodes: names of the nodes, in topological order.
        inputs: names of the values it reads from outside (graph inputs or earlier partitions).
        outputs: names of the values it hands on (graph outputs or inputs of later partitions).
        options: backend options for this partition (precision, threads, ...).
    """

    backend: str
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    options: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "nodes": list(self.nodes),
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "options": dict(self.options),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Partition:
        return cls(
            backend=str(d["backend"]),
            nodes=tuple(d["nodes"]),
            inputs=tuple(d["inputs"]),
            outputs=tuple(d["outputs"]),
            options=dict(d.get("options", {})),
        )


@dataclasses.dataclass(frozen=True)
class Plan:
    """An ordered list of partitions covering every node of a model once."""

    partitions: tuple[Partition, ...]
    graph_inputs: tuple[str, ...]
    graph_outputs: tuple[str, ...]

    @classmethod
    def whole_graph(
        cls, model: ir.Model, backend: str = "onnxruntime", options: dict[str, Any] | None = None
    ) -> Plan:
        """The trivial plan: one backend runs every node. Nodes must be named (see NameFixPass)."""
        graph = model.graph
        inputs = tuple(v.name or "" for v in graph.inputs if v.name not in graph.initializers)
        outputs = tuple(v.name or "" for v in graph.outputs)
        nodes = tuple(node.name or "" for node in graph)
        if not all(nodes) or not all(inputs) or not all(outputs):
            raise ValueError("every node and value needs a name before a plan can refer to it")
        part = Partition(backend, nodes, inputs, outputs, dict(options or {}))
        return cls((part,), inputs, outputs)

    def with_options(self, options: Mapping[str, Mapping[str, Any]]) -> Plan:
        """This plan with ``options[backend]`` merged over each of that backend's partitions'."""
        parts = tuple(
            dataclasses.replace(p, options={**p.options, **options[p.backend]})
            if p.backend in options
            else p
            for p in self.partitions
        )
        return dataclasses.replace(self, partitions=parts)

    @property
    def backends(self) -> list[str]:
        """The backends the plan uses, in order of first use."""
        return list(dict.fromkeys(p.backend for p in self.partitions))

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT_VERSION,
            "graph_inputs": list(self.graph_inputs),
            "graph_outputs": list(self.graph_outputs),
            "partitions": [p.to_dict() for p in self.partitions],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        version = d.get("format")
        if version != PLAN_FORMAT_VERSION:
            raise PlanError(
                f"plan format {version!r} is not supported (this ferry reads format "
                f"{PLAN_FORMAT_VERSION}); re-create the plan with `ferry plan`"
            )
        try:
            return cls(
                partitions=tuple(Partition.from_dict(p) for p in d["partitions"]),
                graph_inputs=tuple(d["graph_inputs"]),
                graph_outputs=tuple(d["graph_outputs"]),
            )
        except (KeyError, TypeError) as e:
            raise PlanError(f"malformed plan: missing or wrong field {e}") from e

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(f"plan is not valid JSON: {e}") from e
        if not isinstance(data, dict):
            raise PlanError("malformed plan: expected a JSON object")
        return cls.from_dict(data)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the plan as JSON, atomically."""
        with atomic_path(path) as tmp:
            tmp.write_text(self.to_json() + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Plan:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise PlanError(f"cannot read plan {path}: {e.strerror}") from e
        return cls.from_json(text)


def check_plan(model: ir.Model, plan: Plan) -> None:
    """Check that ``plan`` can run ``model``.

    Raises:
        PlanError: naming the partition and node or value at fault when a node is unknown,
            missing from every partition or in two, a partition reads a value that no graph
            input, constant or earlier partition gives, or a graph output is computed nowhere.
    """
    graph = model.graph
    by_name = _nodes_by_name(graph)
    owner: dict[str, int] = {}
    for index, partition in enumerate(plan.partitions):
        if not partition.nodes:
            raise PlanError(f"partition {index} ({partition.backend}) has no nodes; remove it")
        unknown = [name for name in partition.nodes if name not in by_name]
        if unknown:
            raise PlanError(
                f"partition {index} ({partition.backend}) names {len(unknown)} node(s) the "
                f"model does not have: {_names(unknown)}; was the plan made for "
                "another model (or before the model was changed)?"
            )
        for name in partition.nodes:
            if name in owner:
                where = "twice" if owner[name] == index else f"also in partition {owner[name]}"
                raise PlanError(
                    f"node {name!r} is in partition {index} ({partition.backend}) {where}; "
                    "every node belongs to exactly one partition"
                )
            owner[name] = index
    missing = [node.name or "" for node in graph if node.name not in owner]
    if missing:
        raise PlanError(
            f"the plan assigns no backend to {len(missing)} node(s): {_names(missing)}; "
            "re-create the plan for this model"
        )

    model_inputs = {v.name or "" for v in graph_inputs(model)}
    if set(plan.graph_inputs) != model_inputs:
        raise PlanError(
            f"the plan's graph inputs {_names(plan.graph_inputs)} are not the model's "
            f"({_names(sorted(model_inputs))}); the plan was made for another model"
        )
    model_outputs = [v.name or "" for v in graph.outputs]
    if set(plan.graph_outputs) != set(model_outputs):
        raise PlanError(
            f"the plan's graph outputs {_names(plan.graph_outputs)} are not the model's "
            f"({_names(model_outputs)}); the plan was made for another model"
        )

    # Values anyone may read without a partition computing them: fed by the caller, or constants.
    available = {v.name for v in graph.inputs} | set(graph.initializers)
    producer_partition: dict[str, int] = {}
    for index, partition in enumerate(plan.partitions):
        for name in partition.outputs:
            producer_partition.setdefault(name, index)
    for index, partition in enumerate(plan.partitions):
        where = f"partition {index} ({partition.backend})"
        produced: dict[str, ir.Node] = {}
        for node_name in partition.nodes:
            node = by_name[node_name]
            produced.update((v.name, node) for v in node.outputs if v.name)
        for name in partition.inputs:
            if name in produced:
                raise PlanError(
                    f"{where} declares input {name!r}, but its own node "
                    f"{_describe(produced[name])} computes it; drop it from the partition's inputs"
                )
            if name in available:
                continue
            later = producer_partition.get(name)
            hint = (
                f"partition {later} gives it, but runs later: order the partitions so that it "
                "runs first"
                if later is not None and later >= index
                else "list it in the outputs of the partition that computes it"
            )
            raise PlanError(
                f"{where} reads {name!r}, which neither a graph input nor an earlier partition "
                f"gives; {hint}"
            )
        for name in partition.outputs:
            if name not in produced:
                raise PlanError(
                    f"{where} declares output {name!r}, which none of its nodes computes; drop "
                    "it, or move the node that computes it into the partition"
                )
        available.update(partition.outputs)
    lost = [name for name in model_outputs if name not in available]
    if lost:
        raise PlanError(
            f"no partition gives graph output(s) {_names(lost)}; add them to the outputs of the "
            "partition that computes them"
        )


# ---------------------------------------------------------------------------------------------
# Cutting


def boundary(
    model: ir.Model,
    nodes: Iterable[str],
    *,
    readers: Mapping[ir.Value, Collection[ir.Node]] | None = None,
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What the nodes called ``nodes`` read from outside, and what they hand on.

    Args:
        model: the model; its nodes must be named.
        nodes: the node names.
        readers: the top-level nodes that read each value (:func:`value_readers`), when the
            caller cuts many node sets of one model; computed when not given.

    Returns:
        ``(inputs, outputs)``: value names in the order the model's nodes first read or produce
        them. Inputs are values computed by other nodes or fed by the caller (constants excluded);
        outputs are graph outputs and values read by other nodes (their bodies included). When
        nothing is handed on, the outputs are the values nobody reads.
    """
    graph = model.graph
    wanted = set(nodes)
    inside = [node for node in graph if node.name in wanted]
    members = set(inside)
    if readers is None:
        readers = value_readers(graph)
    inputs: dict[str, None] = {}
    outputs: dict[str, None] = {}
    dangling: dict[str, None] = {}
    for node in inside:
        for value in node_reads(node):
            if value.producer() in members or is_constant(value):
                continue
            inputs[value.name or ""] = None
        constant = is_constant_node(node)
        for value in node.outputs:
            read_by = readers.get(value, ())
            if value.is_graph_output() or (not constant and any(r not in members for r in read_by)):
                outputs[value.name or ""] = None
            elif not read_by:
                dangling[value.name or ""] = None
    return tuple(inputs), tuple(outputs or dangling)


def value_readers(graph: ir.Graph) -> dict[ir.Value, list[ir.Node]]:
    """The top-level nodes of ``graph`` that read each value, their bodies' reads included."""
    readers: dict[ir.Value, list[ir.Node]] = {}
    for node in graph:
        for value in node_reads(node):
            readers.setdefault(value, []).append(node)
    return readers


def cut(
    model: ir.Model,
    nodes: Iterable[str],
    *,
    inputs: Sequence[str] | None = None,
    outputs: Sequence[str] | None = None,
    value_types: ValueTypes | None = None,
    where: str | None = None,
) -> ir.Model:
    """The nodes called ``nodes`` of ``model`` as a standalone model.

    Args:
        model: the whole model; its nodes must be named. It is not changed.
        nodes: the node names.
        inputs / outputs: the boundary, when the caller fixes it (a plan's partition); None
            computes it (:func:`boundary`).
        value_types: types of the model's values by name (``ferry.graph.infer_value_types``), for
            boundary values the model declares no type for; computed when needed and not given.
        where: how error messages name the node set.

    Returns:
        A new model sharing ``model``'s weight tensors. Its graph inputs are ``inputs`` (less
        those that are initializers of ``model``, which stay initializers), plus initializers the
        caller may override (IR >= 4 models list them as inputs); its outputs are ``outputs``.

    Raises:
        PlanError: a node or value the model does not have, an input the nodes compute
            themselves, an output they do not compute, a read that is neither computed inside,
            declared as an input nor a constant, or a boundary value of unknown type.
    """
    names = tuple(nodes)
    if inputs is None or outputs is None:
        found_in, found_out = boundary(model, names)
        inputs = found_in if inputs is None else inputs
        outputs = found_out if outputs is None else outputs
    if where is None:
        where = f"the {len(names)} node(s)" + (f" starting at node {names[0]!r}" if names else "")
    return _cut(model, names, tuple(inputs), tuple(outputs), value_types, where)


def cut_partition(
    model: ir.Model,
    partition: Partition,
    *,
    value_types: ValueTypes | None = None,
    where: str | None = None,
) -> ir.Model:
    """The standalone model that runs ``partition`` of ``model`` (:func:`cut` on its boundary)."""
    if where is None:
        where = f"the {partition.backend} partition"
        if partition.nodes:
            where += f" starting at node {partition.nodes[0]!r}"
    return _cut(model, partition.nodes, partition.inputs, partition.outputs, value_types, where)


def is_constant(value: ir.Value) -> bool:
    """Whether ``value`` is known before the graph runs: an initializer, a value with a known
    constant, or the output of a constant node (:func:`is_constant_node`)."""
    if value.const_value is not None or value.is_initializer():
        return True
    producer = value.producer()
    return producer is not None and is_constant_node(producer)


#: Ops whose result differs from run to run: never constant, whatever their inputs.
_RANDOM_OPS = frozenset(
    {
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
    }
)


#: How many ops deep a constant node may compute from constants: weight chains are a few ops
#: (Reshape(Constant, Identity(Constant)), DequantizeLinear(int8 weights)); the bound keeps the
#: question cheap on deep run-time chains, which it never has to walk to their inputs.
MAX_CONSTANT_DEPTH = 16


def is_constant_node(node: ir.Node, memo: dict[ir.Node, float] | None = None) -> bool:
    """Whether ``node`` computes the same value on every run: a ``Constant``, or an ONNX op with
    no subgraph whose every input is constant, at most :data:`MAX_CONSTANT_DEPTH` ops from the
    constants (``Reshape(Constant, Identity(Constant))``: how Paddle's and other exporters store
    weights).

    Such nodes are data, not work: like weights they go with whoever reads them (placed with
    their first reader, copied into any other partition that reads them), so that an engine sees
    its weights and shape inputs as the constants they are and folds them itself.

    Args:
        node: the node.
        memo: shared between calls on one graph, to answer for all its nodes in linear time.
    """
    return _constant_height(node, {} if memo is None else memo, MAX_CONSTANT_DEPTH) <= (
        MAX_CONSTANT_DEPTH
    )


def _constant_height(node: ir.Node, memo: dict[ir.Node, float], budget: int) -> float:
    """How many ops above constants ``node`` is (0 for a Constant), or inf when it reads something
    computed at run time, or lies more than ``budget`` ops above what it would need to know.

    Only exact answers are memoized: one cut short by the budget may differ with more budget.
    """
    found = memo.get(node)
    if found is not None:
        return found
    height, exact = _height(node, memo, budget)
    if exact:
        memo[node] = height
    return height


def _height(node: ir.Node, memo: dict[ir.Node, float], budget: int) -> tuple[float, bool]:
    default_domain = node.domain in ("", "ai.onnx")
    present = [v for v in node.inputs if v is not None]
    if node.op_type == "Constant" and default_domain:
        return (0.0 if not present else math.inf), True
    if not default_domain or node.op_type in _RANDOM_OPS or subgraphs(node) or not present:
        return math.inf, True
    if budget <= 0:
        return math.inf, False
    height, exact = 1.0, True
    for value in present:
        if value.const_value is not None or value.is_initializer():
            continue
        producer = value.producer()
        if producer is None:  # a graph input: fed at run time
            return math.inf, True
        below = _constant_height(producer, memo, budget - 1)
        if below == math.inf:
            return math.inf, producer in memo  # exact when the producer's answer was
        height = max(height, below + 1)
    return height, exact


def _cut(
    model: ir.Model,
    names: Sequence[str],
    input_names: Sequence[str],
    output_names: Sequence[str],
    value_types: ValueTypes | None,
    where: str,
) -> ir.Model:
    graph = model.graph
    nodes = _nodes_in_order(graph, names, where)
    inside = set(nodes)
    values = ir.convenience.create_value_mapping(graph, include_subgraphs=False)
    overridable = model.ir_version >= _MIN_IR_VERSION

    inputs: list[ir.Value] = []
    initializers: list[ir.Value] = []
    declared: set[ir.Value] = set()
    for name in input_names:
        value = values.get(name)
        if value is None:
            raise PlanError(f"{where} declares input {name!r}, which the model has no value of")
        if value.producer() in inside:
            raise PlanError(
                f"{where} declares input {name!r}, but its own node "
                f"{_describe(value.producer())} computes it; drop it from the partition's inputs"
            )
        if value in declared:
            raise PlanError(f"{where} declares input {name!r} twice")
        declared.add(value)
        if value.is_initializer():
            initializers.append(value)  # a weight: carried, not fed...
            if not (overridable and value.is_graph_input()):
                continue  # ...unless the caller may override it
        inputs.append(value)

    # Scan what the nodes read, and what the constant nodes copied in for them read in turn.
    copied: dict[ir.Node, None] = {}
    seen: set[ir.Value] = set()
    scan = list(nodes)
    while scan:
        reader = scan.pop(0)
        for value in node_reads(reader):
            if value in seen or value in declared or value.producer() in inside:
                continue
            seen.add(value)
            producer = value.producer()
            if value.is_initializer():
                initializers.append(value)
                if overridable and value.is_graph_input():
                    inputs.append(value)  # the caller may override it: an input with a default
            elif producer is not None and is_constant_node(producer):
                if producer not in copied:
                    copied[producer] = None
                    scan.append(producer)
            elif value.const_value is not None:
                initializers.append(value)  # folded: its value is known, so it travels as a weight
            else:
                raise PlanError(
                    f"{where}: node {_describe(reader)} reads {value.name!r}, which no node of the "
                    f"partition computes and which is not among its inputs; add {value.name!r} to "
                    "the partition's inputs (and to the outputs of the partition that computes it)"
                )
    outputs: list[ir.Value] = []
    for name in output_names:
        value = values.get(name)
        if value is None:
            raise PlanError(f"{where} declares output {name!r}, which the model has no value of")
        if value.producer() not in inside:
            raise PlanError(
                f"{where} declares output {name!r}, which none of its nodes computes; drop it, "
                "or move the node that computes it into the partition"
            )
        if value in outputs:
            raise PlanError(f"{where} declares output {name!r} twice")
        outputs.append(value)

    index = {node: i for i, node in enumerate(graph)}
    view = ir.GraphView(
        inputs,
        outputs,
        nodes=[*sorted(copied, key=index.__getitem__), *nodes],
        initializers=initializers,
        doc_string=graph.doc_string,
        opset_imports=dict(graph.opset_imports),
        name=graph.name,
    )
    # Clone: new nodes and values (the source stays untouched), the same tensors (no weight copy).
    lowered = view.clone()
    for value in lowered.inputs:
        if not value.is_initializer():
            value.const_value = None  # fed at run time, whatever analysis knew of it before
    _fill_boundary_types(model, lowered, value_types, where)
    return ir.Model(
        lowered,
        ir_version=max(model.ir_version, _MIN_IR_VERSION),
        producer_name=model.producer_name,
        producer_version=model.producer_version,
        domain=model.domain,
        model_version=model.model_version,
        doc_string=model.doc_string,
        functions=[f.clone() for f in model.functions.values()],
        metadata_props=dict(model.metadata_props),
    )


def _nodes_by_name(graph: ir.Graph) -> dict[str, ir.Node]:
    by_name: dict[str, ir.Node] = {}
    for node in graph:
        if not node.name:
            raise PlanError(
                f"a {node.op_type} node has no name; plans refer to nodes by name, so name them "
                "first (ferry.load does, with onnx_ir's NameFixPass)"
            )
        if node.name in by_name:
            raise PlanError(
                f"two nodes are named {node.name!r}; plans refer to nodes by name, so names must "
                "be unique (onnx_ir's NameFixPass makes them so)"
            )
        by_name[node.name] = node
    return by_name


def _nodes_in_order(graph: ir.Graph, names: Sequence[str], where: str) -> list[ir.Node]:
    """The named nodes in the model's (topological) order."""
    wanted = set(names)
    if len(wanted) != len(names):
        twice = sorted({n for n in names if list(names).count(n) > 1})
        raise PlanError(f"{where} lists node(s) {_names(twice)} more than once")
    nodes = [node for node in graph if node.name in wanted]
    if len(nodes) != len(wanted):
        found = {node.name or "" for node in nodes}
        unknown = [n for n in names if n not in found]
        if len(nodes) > len(wanted):
            raise PlanError(f"{where}: the model has several nodes named like its nodes")
        raise PlanError(
            f"{where} names node(s) the model does not have: {_names(unknown)}; was the plan "
            "made for another model?"
        )
    return nodes


def _fill_boundary_types(
    model: ir.Model, lowered: ir.Graph, value_types: ValueTypes | None, where: str
) -> None:
    """Give every input and output of ``lowered`` a type: engines refuse untyped graph inputs."""
    untyped = [
        v for v in (*lowered.inputs, *lowered.outputs) if v.type is None and not v.is_initializer()
    ]
    if not untyped:
        return
    types = value_types if value_types is not None else infer_value_types(model)
    unknown = []
    for value in untyped:
        dtype_text, shape = types.get(value.name or "", (None, None))
        dtype = _DTYPES_BY_NAME.get(dtype_text or "")
        if dtype is None:
            unknown.append(value.name or "")
            continue
        value.dtype = dtype
        if value.shape is None and shape is not None:
            value.shape = ir.Shape(shape)
    if unknown:
        raise PlanError(
            f"{where}: the type of boundary value(s) {_names(unknown)} is unknown and shape "
            "inference cannot tell it; declare it in the model's value_info or move the boundary"
        )


def _describe(node: ir.Node | None) -> str:
    if node is None:
        return "?"
    return f"{node.name!r} ({node.op_type})"


def _names(names: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(repr(n) for n in list(names)[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
