"""Lowering a Plan: one standalone model per partition, and the checks that a Plan fits its model.

``partition_model`` cuts one partition out of a model:

    model + Partition(nodes, inputs, outputs) -> ir.Model whose graph inputs are the partition's
    inputs, whose outputs are its outputs, and whose nodes are its nodes (in the model's order)

Weights come along by reference: the lowered model shares the source's tensors, nothing is copied,
and the source model is never changed. What a partition reads from outside must be declared in its
``inputs``, except constants, which belong to whoever reads them: initializers are carried as
initializers, ``Constant`` nodes of another partition are copied in, and values with a known
constant value become initializers. If/Loop/Scan bodies come along whole; the outer-scope values
they read follow the same rules as the values their node reads directly.

``check_plan`` checks a whole plan against its model before anything is compiled: every node is
assigned exactly once, every partition's inputs are graph inputs, constants or outputs of an earlier
partition, and every graph output is computed somewhere.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import onnx_ir as ir

from ferry.errors import FerryError
from ferry.graph import Dim, dtype_name, graph_inputs, infer_value_types
from ferry.runtime.plan import Partition, Plan

__all__ = ["ValueTypes", "check_plan", "lower_plan", "partition_model"]

#: What ``ferry.graph.infer_value_types`` gives: value name -> (numpy dtype name, shape).
ValueTypes = Mapping[str, tuple[str | None, tuple[Dim, ...] | None]]

# Below IR 4 every initializer had to be listed as a graph input; lowered models never list them.
_MIN_IR_VERSION = 4

_DTYPES_BY_NAME = {dtype_name(t): t for t in ir.DataType if t != ir.DataType.UNDEFINED}


def partition_model(
    model: ir.Model, partition: Partition, *, value_types: ValueTypes | None = None
) -> ir.Model:
    """Build the standalone model that runs ``partition`` of ``model``.

    Args:
        model: the whole model; its nodes must be named as the plan names them. It is not changed.
        partition: the partition to cut out.
        value_types: types of the model's values by name (``ferry.graph.infer_value_types``), used
            for boundary values the model declares no type for; computed when needed and not given.

    Returns:
        A new model sharing ``model``'s weight tensors. Its graph inputs are ``partition.inputs``
        (less those that are initializers of ``model``, which stay initializers), plus initializers
        the caller may override (IR >= 4 models list them as inputs); its outputs are
        ``partition.outputs``.

    Raises:
        FerryError: the partition names a node or value the model does not have, declares an input
            that it computes itself, an output that it does not compute, or reads a value that is
            neither computed by it, declared as an input, nor a constant.
    """
    where = f"the {partition.backend} partition"
    if partition.nodes:
        where += f" starting at node {partition.nodes[0]!r}"
    return _lower(model, partition, value_types, where)


def _lower(
    model: ir.Model, partition: Partition, value_types: ValueTypes | None, where: str
) -> ir.Model:
    graph = model.graph
    nodes = _partition_nodes(graph, partition, where)
    inside = set(nodes)
    values = ir.convenience.create_value_mapping(graph, include_subgraphs=False)
    overridable = model.ir_version >= _MIN_IR_VERSION

    inputs: list[ir.Value] = []
    initializers: list[ir.Value] = []
    declared: set[ir.Value] = set()
    for name in partition.inputs:
        value = values.get(name)
        if value is None:
            raise FerryError(f"{where} declares input {name!r}, which the model has no value of")
        if value.producer() in inside:
            raise FerryError(
                f"{where} declares input {name!r}, but its own node "
                f"{_describe(value.producer())} computes it; drop it from the partition's inputs"
            )
        if value in declared:
            raise FerryError(f"{where} declares input {name!r} twice")
        declared.add(value)
        if value.is_initializer():
            initializers.append(value)  # a weight: carried, not fed...
            if not (overridable and value.is_graph_input()):
                continue  # ...unless the caller may override it
        inputs.append(value)

    copied: list[ir.Node] = []
    seen: set[ir.Value] = set()
    for reader, value in _reads(graph, nodes):
        if value in seen or value in declared or value.producer() in inside:
            continue
        seen.add(value)
        producer = value.producer()
        if value.is_initializer():
            initializers.append(value)
            if overridable and value.is_graph_input():
                inputs.append(value)  # the caller may override it: keep it an input with a default
        elif producer is not None and _is_constant_node(producer):
            copied.append(producer)
        elif value.const_value is not None:
            initializers.append(value)  # folded: its value is known, so it travels as a weight
        else:
            raise FerryError(
                f"{where}: node {_describe(reader)} reads {value.name!r}, which no node of the "
                f"partition computes and which is not among its inputs; add {value.name!r} to "
                "the partition's inputs (and to the outputs of the partition that computes it)"
            )
    outputs: list[ir.Value] = []
    for name in partition.outputs:
        value = values.get(name)
        if value is None:
            raise FerryError(f"{where} declares output {name!r}, which the model has no value of")
        if value.producer() not in inside:
            raise FerryError(
                f"{where} declares output {name!r}, which none of its nodes computes; drop it, "
                "or move the node that computes it into the partition"
            )
        if value in outputs:
            raise FerryError(f"{where} declares output {name!r} twice")
        outputs.append(value)

    index = {node: i for i, node in enumerate(graph)}
    copied.sort(key=index.__getitem__)
    view = ir.GraphView(
        inputs,
        outputs,
        nodes=[*copied, *nodes],
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


def lower_plan(
    model: ir.Model, plan: Plan, *, value_types: ValueTypes | None = None
) -> list[ir.Model]:
    """Check ``plan`` against ``model`` and lower every partition (see :func:`partition_model`)."""
    check_plan(model, plan)
    types: dict[str, tuple[str | None, tuple[Dim, ...] | None]] | None = (
        dict(value_types) if value_types is not None else None
    )
    lowered = []
    for index, partition in enumerate(plan.partitions):
        if types is None and _needs_types(model, partition):
            types = infer_value_types(model)  # once for the whole plan, only when needed
        where = f"partition {index} ({partition.backend})"
        lowered.append(_lower(model, partition, types, where))
    return lowered


def check_plan(model: ir.Model, plan: Plan) -> None:
    """Check that ``plan`` can run ``model``.

    Raises:
        FerryError: naming the partition and node or value at fault when a node is unknown,
            missing from every partition or in two, a partition reads a value that no graph
            input, constant or earlier partition gives, or a graph output is computed nowhere.
    """
    graph = model.graph
    by_name = _nodes_by_name(graph)
    owner: dict[str, int] = {}
    for index, partition in enumerate(plan.partitions):
        if not partition.nodes:
            raise FerryError(f"partition {index} ({partition.backend}) has no nodes; remove it")
        unknown = [name for name in partition.nodes if name not in by_name]
        if unknown:
            raise FerryError(
                f"partition {index} ({partition.backend}) names {len(unknown)} node(s) the "
                f"model does not have: {_names(unknown)}; was the plan made for "
                "another model (or before the model was changed)?"
            )
        for name in partition.nodes:
            if name in owner:
                where = "twice" if owner[name] == index else f"also in partition {owner[name]}"
                raise FerryError(
                    f"node {name!r} is in partition {index} ({partition.backend}) {where}; "
                    "every node belongs to exactly one partition"
                )
            owner[name] = index
    missing = [node.name or "" for node in graph if node.name not in owner]
    if missing:
        raise FerryError(
            f"the plan assigns no backend to {len(missing)} node(s): {_names(missing)}; "
            "re-create the plan for this model"
        )

    model_inputs = {v.name or "" for v in graph_inputs(model)}
    if set(plan.graph_inputs) != model_inputs:
        raise FerryError(
            f"the plan's graph inputs {_names(plan.graph_inputs)} are not the model's "
            f"({_names(sorted(model_inputs))}); the plan was made for another model"
        )
    model_outputs = [v.name or "" for v in graph.outputs]
    if set(plan.graph_outputs) != set(model_outputs):
        raise FerryError(
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
                raise FerryError(
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
            raise FerryError(
                f"{where} reads {name!r}, which neither a graph input nor an earlier partition "
                f"gives; {hint}"
            )
        for name in partition.outputs:
            if name not in produced:
                raise FerryError(
                    f"{where} declares output {name!r}, which none of its nodes computes; drop "
                    "it, or move the node that computes it into the partition"
                )
        available.update(partition.outputs)
    lost = [name for name in model_outputs if name not in available]
    if lost:
        raise FerryError(
            f"no partition gives graph output(s) {_names(lost)}; add them to the outputs of the "
            "partition that computes them"
        )


def _nodes_by_name(graph: ir.Graph) -> dict[str, ir.Node]:
    by_name: dict[str, ir.Node] = {}
    for node in graph:
        if not node.name:
            raise FerryError(
                f"a {node.op_type} node has no name; plans refer to nodes by name, so name them "
                "first (ferry.load does, with onnx_ir's NameFixPass)"
            )
        if node.name in by_name:
            raise FerryError(
                f"two nodes are named {node.name!r}; plans refer to nodes by name, so names must "
                "be unique (onnx_ir's NameFixPass makes them so)"
            )
        by_name[node.name] = node
    return by_name


def _partition_nodes(graph: ir.Graph, partition: Partition, where: str) -> list[ir.Node]:
    """The partition's nodes in the model's (topological) order."""
    wanted = set(partition.nodes)
    if len(wanted) != len(partition.nodes):
        twice = sorted({n for n in partition.nodes if partition.nodes.count(n) > 1})
        raise FerryError(f"{where} lists node(s) {_names(twice)} more than once")
    nodes = [node for node in graph if node.name in wanted]
    if len(nodes) != len(wanted):
        found = {node.name or "" for node in nodes}
        unknown = [n for n in partition.nodes if n not in found]
        if len(nodes) > len(wanted):
            raise FerryError(f"{where}: the model has several nodes named like its nodes")
        raise FerryError(
            f"{where} names node(s) the model does not have: {_names(unknown)}; was the plan "
            "made for another model?"
        )
    return nodes


def _reads(graph: ir.Graph, nodes: Sequence[ir.Node]) -> Iterator[tuple[ir.Node, ir.Value]]:
    """(node, value) for every top-level value the nodes read, their subgraphs' reads included."""
    for node in nodes:
        for value in node.inputs:
            if value is not None:
                yield node, value
        for sub in _subgraphs(node):
            for inner in ir.traversal.RecursiveGraphIterator(sub):
                for value in inner.inputs:
                    # Only values of the top-level graph cross the boundary; the body's own and
                    # its nested scopes' values travel with the body.
                    if value is not None and value.graph is graph:
                        yield node, value


def _subgraphs(node: ir.Node) -> Iterator[ir.Graph]:
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            yield attr.as_graph()
        elif attr.type == ir.AttributeType.GRAPHS:
            yield from attr.as_graphs()


def _is_constant_node(node: ir.Node) -> bool:
    return node.op_type == "Constant" and node.domain in ("", "ai.onnx") and not node.inputs


def _needs_types(model: ir.Model, partition: Partition) -> bool:
    values = ir.convenience.create_value_mapping(model.graph, include_subgraphs=False)
    return any(
        (value := values.get(name)) is not None and value.type is None
        for name in (*partition.inputs, *partition.outputs)
    )


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
        raise FerryError(
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
