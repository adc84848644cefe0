"""The partitioner: plans are complete, ordered, convex and honour every backend's rules.

Property tests run on random DAGs; unit tests pin the behaviours the design names (forced splits,
minimum partition size, shape chains on the fallback, readable reasons); numeric tests run the
plans through ``ferry.load`` against ONNX Runtime on the unpartitioned model, with the fake
accelerators mapped onto ONNX Runtime.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import time
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnx_ir.passes.common import NameFixPass

import models
from ferry.backends import (
    DEFAULT_MIN_PARTITION_SIZE,
    BackendBase,
    OpRule,
    PlacementReport,
    explain,
    place,
)
from ferry.errors import BackendUnavailableError, FerryError, InvalidInputError
from ferry.graph import prepare
from ferry.plan import Plan

OPSET = 17
FALLBACK = "onnxruntime"


class FakeBackend(BackendBase):
    """An accelerator that exists only as a rule table (and, optionally, an engine veto)."""

    def __init__(
        self,
        name: str,
        ops: Iterable[str] = (),
        *,
        rules: Sequence[OpRule] = (),
        veto: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self._rules = [*(OpRule(op) for op in ops), *rules]
        self.veto = dict(veto or {})
        self.validated: list[list[str]] = []

    def rules(self) -> list[OpRule]:
        return list(self._rules)

    def validate(self, model: ir.Model, nodes: Sequence[str]) -> dict[str, str]:
        self.validated.append(list(nodes))
        return {n: why for n, why in self.veto.items() if n in nodes}


def make_model(
    nodes: list[onnx.NodeProto],
    inputs: Sequence[str | tuple[str, list[int | str]]] = ("x",),
    outputs: Sequence[str] = ("y",),
    initializers: Sequence[onnx.TensorProto] = (),
    shape: list[int | str] | None = None,
) -> onnx.ModelProto:
    shape = [2, 3] if shape is None else shape
    ins = []
    for item in inputs:
        name, dims = (item, shape) if isinstance(item, str) else item
        ins.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, dims))
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
    graph = helper.make_graph(nodes, "g", ins, outs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    return model


def chain(ops: Sequence[str], names: Sequence[str] | None = None) -> onnx.ModelProto:
    """x -> ops[0] -> ops[1] -> ... -> y, unary ops, nodes named n0, n1, ..."""
    names = list(names) if names is not None else [f"n{i}" for i in range(len(ops))]
    nodes = []
    for i, op in enumerate(ops):
        src = "x" if i == 0 else f"v{i - 1}"
        dst = "y" if i == len(ops) - 1 else f"v{i}"
        nodes.append(helper.make_node(op, [src], [dst], name=names[i]))
    return make_model(nodes)


def layout(plan: Plan) -> list[tuple[str, list[str]]]:
    return [(p.backend, list(p.nodes)) for p in plan.partitions]


# -- structural checks ---------------------------------------------------------------------------


@dataclasses.dataclass
class Dag:
    names: list[str]
    preds: list[set[int]]
    reads: list[list[str]]  # value names, subgraph captures included
    produced_by: dict[str, int]


def node_dag(proto: onnx.ModelProto) -> Dag:
    """The top-level DAG of a (named) model, as the checks need it."""
    model = ir.from_proto(proto)
    NameFixPass()(model)
    nodes = list(model.graph)
    produced_by = {v.name or "": i for i, n in enumerate(nodes) for v in n.outputs}
    reads: list[list[str]] = []
    for node in nodes:
        names = [v.name or "" for v in node.inputs if v is not None]
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                for inner in ir.traversal.RecursiveGraphIterator(attr.as_graph()):
                    names += [v.name or "" for v in inner.inputs if v is not None]
        reads.append(names)
    preds = [{produced_by[v] for v in r if v in produced_by} for r in reads]
    return Dag([n.name or "" for n in nodes], preds, reads, produced_by)


def check_plan(
    proto: onnx.ModelProto, plan: Plan, tables: dict[str, FakeBackend] | None = None
) -> None:
    """Every property a plan must have, whatever the backends."""
    dag = node_dag(proto)
    index = {name: i for i, name in enumerate(dag.names)}
    graph = proto.graph
    initializers = {t.name for t in graph.initializer}
    assert plan.graph_inputs == tuple(i.name for i in graph.input if i.name not in initializers)
    assert plan.graph_outputs == tuple(o.name for o in graph.output)

    # Every node exactly once; no empty partition.
    placed = [n for p in plan.partitions for n in p.nodes]
    assert sorted(placed) == sorted(dag.names)
    assert all(p.nodes and p.outputs for p in plan.partitions)
    part_of = {n: k for k, p in enumerate(plan.partitions) for n in p.nodes}

    # Inputs available in order; complete; outputs exactly what others read or the graph gives.
    available = set(plan.graph_inputs)
    graph_outputs = set(plan.graph_outputs)
    for k, p in enumerate(plan.partitions):
        # nodes in topological order inside the partition
        positions = [index[n] for n in p.nodes]
        assert positions == sorted(positions)
        assert set(p.inputs) <= available, f"partition {k} reads {set(p.inputs) - available}"
        assert not set(p.inputs) & initializers
        constants = {v for v, i in dag.produced_by.items() if is_constant_node(proto, i)}
        assert not set(p.inputs) & constants, f"partition {k} is fed a Constant's value"
        needed = {
            v
            for n in p.nodes
            for v in dag.reads[index[n]]
            if v in dag.produced_by
            and part_of[dag.names[dag.produced_by[v]]] != k
            and not is_constant_node(proto, dag.produced_by[v])
        } | {v for n in p.nodes for v in dag.reads[index[n]] if v in plan.graph_inputs}
        assert needed <= set(p.inputs), f"partition {k} misses inputs {needed - set(p.inputs)}"
        for name in p.outputs:
            producer = dag.produced_by[name]
            assert part_of[dag.names[producer]] == k
            readers = [j for j in range(len(dag.names)) if name in dag.reads[j]]
            assert (
                name in graph_outputs
                or any(part_of[dag.names[j]] != k for j in readers)
                or not readers  # a dead partition hands on its dangling values
            )
        available |= set(p.outputs)
    assert graph_outputs <= available | initializers

    # Convexity: no path between two nodes of a partition leaves it.
    n = len(dag.names)
    anc = [0] * n
    for i in range(n):
        for p in dag.preds[i]:
            anc[i] |= anc[p] | (1 << p)
    desc = [0] * n
    for i in range(n - 1, -1, -1):
        for p in dag.preds[i]:
            desc[p] |= desc[i] | (1 << i)
    for k, p in enumerate(plan.partitions):
        members = 0
        down = up = 0
        for name in p.nodes:
            members |= 1 << index[name]
            down |= desc[index[name]]
            up |= anc[index[name]]
        assert not (down & up & ~members), f"partition {k} is not convex"

    # Rules: an accelerator only runs nodes its rules accept and its engine did not veto.
    if tables:
        model = ir.from_proto(proto)
        NameFixPass()(model)
        by_name = {node.name: node for node in model.graph}
        from ferry.backends import RuleTable

        for p in plan.partitions:
            backend = tables.get(p.backend)
            if backend is None:
                assert p.backend == FALLBACK
                continue
            table = RuleTable(backend.rules())
            for name in p.nodes:
                node = by_name[name]
                if is_constant_node(proto, index[name]):
                    continue  # data, placed with its reader
                assert table.supports(node, model.opset_imports) is True, (name, p.backend)
                assert name not in backend.veto


def is_constant_node(proto: onnx.ModelProto, i: int) -> bool:
    """A Constant, or a node computing only from initializers and constant nodes: data, placed
    with its reader and copied into other readers' partitions, never fed."""
    graph = proto.graph
    initializers = {t.name for t in graph.initializer}
    produced_by = {o: j for j, n in enumerate(graph.node) for o in n.output}
    node = graph.node[i]
    if node.op_type == "Constant":
        return not node.input
    inputs = [v for v in node.input if v]
    return bool(inputs) and all(
        v in initializers or (v in produced_by and is_constant_node(proto, produced_by[v]))
        for v in inputs
    )


# -- random DAGs ---------------------------------------------------------------------------------

UNARY = ["Relu", "Sigmoid", "Neg", "Tanh", "Abs"]
BINARY = ["Add", "Mul", "Sub", "Max"]
VARIADIC = ["Sum", "Min"]
OPS = [*UNARY, *BINARY, *VARIADIC, "Concat", "Split"]


@st.composite
def random_dags(draw: st.DrawFn, min_nodes: int = 5, max_nodes: int = 40) -> onnx.ModelProto:
    """Random graphs of [2, 3] float tensors: unary, binary, variadic and Concat -> Split pairs."""
    n_inputs = draw(st.integers(1, 3))
    pool = [f"x{i}" for i in range(n_inputs)]
    initializers = []
    if draw(st.booleans()):
        w = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
        initializers.append(numpy_helper.from_array(w, "w"))
        pool.append("w")
    produced: list[str] = []
    nodes: list[onnx.NodeProto] = []
    n_nodes = draw(st.integers(min_nodes, max_nodes))

    def operand() -> str:
        # Mostly recent values (deep graphs), sometimes any (long skips, fan-out).
        if draw(st.booleans()):
            return pool[draw(st.integers(max(0, len(pool) - 4), len(pool) - 1))]
        return pool[draw(st.integers(0, len(pool) - 1))]

    while len(nodes) < n_nodes:
        k = len(nodes)
        op = draw(st.sampled_from([*OPS, "Constant"]))
        if op == "Constant":  # data, not work: placed with its first reader, never fed
            value = numpy_helper.from_array(np.full((2, 3), 0.5 + k, dtype=np.float32), "t")
            nodes.append(helper.make_node("Constant", [], [f"v{k}"], name=f"n{k}", value=value))
            pool.append(f"v{k}")
            continue
        if op in UNARY:
            args = [operand()]
        elif op in BINARY:
            args = [operand(), operand()]
        elif op in VARIADIC:
            args = [operand() for _ in range(draw(st.integers(2, 3)))]
        elif op == "Concat":
            wide = f"c{k}"
            nodes.append(
                helper.make_node("Concat", [operand(), operand()], [wide], name=f"n{k}", axis=0)
            )
            outs = [f"v{k + 1}a", f"v{k + 1}b"]
            nodes.append(helper.make_node("Split", [wide], outs, name=f"n{k + 1}", axis=0))
            pool += outs
            produced += outs
            continue
        else:  # a lone Split: split the [2, 3] into two [1, 3] and add them back via broadcast
            a, b = f"v{k}a", f"v{k}b"
            nodes.append(helper.make_node("Split", [operand()], [a, b], name=f"n{k}", axis=0))
            nodes.append(helper.make_node("Sub", [operand(), a], [f"v{k + 1}"], name=f"n{k + 1}"))
            pool.append(f"v{k + 1}")
            produced += [a, f"v{k + 1}"]
            continue
        out = f"v{k}"
        nodes.append(helper.make_node(op, args, [out], name=f"n{k}"))
        pool.append(out)
        produced.append(out)
    extra = draw(st.lists(st.sampled_from(produced), max_size=3, unique=True))
    outputs = list(dict.fromkeys([produced[-1], *extra]))
    inputs = [f"x{i}" for i in range(n_inputs)]
    return make_model(nodes, inputs=inputs, outputs=outputs, initializers=initializers)


@st.composite
def scenarios(
    draw: st.DrawFn,
) -> tuple[onnx.ModelProto, list[FakeBackend], int, list[str]]:
    proto = draw(random_dags())
    names = [n.name for n in proto.graph.node]
    backends = [
        FakeBackend(
            "accel",
            draw(st.sets(st.sampled_from(OPS))),
            veto={n: "engine says no" for n in draw(st.sets(st.sampled_from(names), max_size=3))},
        )
    ]
    if draw(st.booleans()):
        backends.append(FakeBackend("accel2", draw(st.sets(st.sampled_from(OPS)))))
    min_size = draw(st.integers(1, 4))
    forced = draw(st.sets(st.sampled_from([*names, *OPS]), max_size=2))
    return proto, backends, min_size, sorted(forced)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_random_dags_give_complete_ordered_convex_plans(
    scenario: tuple[onnx.ModelProto, list[FakeBackend], int, list[str]],
) -> None:
    proto, backends, min_size, forced = scenario
    plan = place(proto, backends, min_partition_size=min_size, force_cpu=forced)
    check_plan(proto, plan, {b.name: b for b in backends})
    # Forced nodes (by name or op) are on the fallback; constants go with their reader.
    index = {n.name: i for i, n in enumerate(proto.graph.node)}
    for p in plan.partitions:
        for name in p.nodes:
            node = proto.graph.node[index[name]]
            if (name in forced or node.op_type in forced) and not is_constant_node(
                proto, index[name]
            ):
                assert p.backend == FALLBACK


@settings(max_examples=100, deadline=None)
@given(random_dags(), st.sets(st.sampled_from(OPS)))
def test_with_size_one_every_supported_node_is_accelerated(
    proto: onnx.ModelProto, ops: set[str]
) -> None:
    plan = place(proto, [FakeBackend("accel", ops)], min_partition_size=1)
    check_plan(proto, plan)
    index = {n.name: i for i, n in enumerate(proto.graph.node)}
    for p in plan.partitions:
        for name in p.nodes:
            node = proto.graph.node[index[name]]
            if not is_constant_node(proto, index[name]):  # data: placed with its first reader
                assert (p.backend == "accel") == (node.op_type in ops), name
    # Fallback groups are maximal in the weak sense: two fallback partitions never touch.
    fallback = [k for k, p in enumerate(plan.partitions) if p.backend == FALLBACK]
    assert all(b - a > 1 for a, b in itertools.pairwise(fallback))


@settings(max_examples=50, deadline=None)
@given(random_dags())
def test_explain_agrees_with_partition(proto: onnx.ModelProto) -> None:
    backends = [FakeBackend("accel", ["Add", "Relu", "Sum", "Concat"])]
    plan = place(proto, backends, min_partition_size=2)
    report = explain(proto, backends, min_partition_size=2)
    assert report.plan == plan
    assert [v.node for v in report.nodes] == [n.name for n in proto.graph.node]
    for i, v in enumerate(report.nodes):
        assert v.node in plan.partitions[v.partition].nodes
        assert plan.partitions[v.partition].backend == v.backend
        if is_constant_node(proto, i):
            assert v.note and not v.reasons
        elif v.backend == FALLBACK:
            assert v.reasons.get("accel"), v


# -- unit tests ----------------------------------------------------------------------------------


def test_forced_middle_node_gives_three_partitions() -> None:
    model = chain(["Relu", "Neg", "Sigmoid", "Tanh", "Abs"])
    accel = FakeBackend("accel", ["Relu", "Neg", "Sigmoid", "Tanh", "Abs"])
    for force in (["n2"], ["Sigmoid"]):
        plan = place(model, [accel], min_partition_size=1, force_cpu=force)
        assert layout(plan) == [
            ("accel", ["n0", "n1"]),
            (FALLBACK, ["n2"]),
            ("accel", ["n3", "n4"]),
        ]
        assert [(p.inputs, p.outputs) for p in plan.partitions] == [
            (("x",), ("v1",)),
            (("v1",), ("v2",)),
            (("v2",), ("y",)),
        ]
        check_plan(model, plan)
    report = explain(model, [accel], min_partition_size=1, force_cpu=["n2"])
    assert "force_cpu" in report.node("n2").reasons["accel"]


def test_without_force_one_partition_and_it_is_the_whole_graph() -> None:
    model = chain(["Relu", "Neg", "Sigmoid"])
    plan = place(model, [FakeBackend("accel", ["Relu", "Neg", "Sigmoid"])])
    assert plan == Plan.whole_graph(ir.from_proto(model), "accel")


def test_min_partition_size_drops_tiny_groups() -> None:
    model = chain(["Relu", "Softmax", "Relu", "Identity", "Relu", "Relu"])
    accel = FakeBackend("accel", ["Relu", "Identity"])
    assert layout(place(model, [accel], min_partition_size=3)) == [
        (FALLBACK, ["n0", "n1"]),
        ("accel", ["n2", "n3", "n4", "n5"]),
    ]
    # Identity does not count: the second group computes 3 nodes, not 4.
    assert layout(place(model, [accel], min_partition_size=4)) == [
        (FALLBACK, [f"n{i}" for i in range(6)])
    ]
    assert len(place(model, [accel], min_partition_size=1).partitions) == 3
    report = explain(model, [accel], min_partition_size=3)
    assert "min_partition_size=3" in report.node("n0").reasons["accel"]
    assert DEFAULT_MIN_PARTITION_SIZE == 3
    # A group that computes nothing (a lone Reshape) is never worth a boundary.
    lone = chain(["Softmax", "Identity", "Softmax"])
    assert layout(place(lone, [accel], min_partition_size=1)) == [(FALLBACK, ["n0", "n1", "n2"])]


def test_a_group_that_is_the_whole_model_is_kept_however_small() -> None:
    model = chain(["Relu"])
    plan = place(model, [FakeBackend("accel", ["Relu"])], min_partition_size=3)
    assert layout(plan) == [("accel", ["n0"])]


def shape_chain_model() -> onnx.ModelProto:
    """x[N, 2, 3] -> Relu -> Reshape(to [N, -1]) where the shape is computed from x at run time."""
    idx = numpy_helper.from_array(np.array(0, dtype=np.int64), "idx")
    axes = numpy_helper.from_array(np.array([0], dtype=np.int64), "axes")
    minus1 = numpy_helper.from_array(np.array([-1], dtype=np.int64), "minus1")
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "idx"], ["n"], name="gather", axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"], name="unsqueeze"),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], name="concat", axis=0),
        helper.make_node("Reshape", ["r", "target"], ["flat"], name="reshape"),
        helper.make_node("Sigmoid", ["flat"], ["y"], name="sigmoid"),
    ]
    return make_model(
        nodes, inputs=[("x", ["N", 2, 3])], initializers=[idx, axes, minus1], shape=["N", 2, 3]
    )


def test_shape_chains_stay_on_the_fallback() -> None:
    model = shape_chain_model()
    accel = FakeBackend(
        "accel", ["Relu", "Shape", "Gather", "Unsqueeze", "Concat", "Reshape", "Sigmoid"]
    )
    report = explain(model, [accel], min_partition_size=1)
    on = {v.node: v.backend for v in report.nodes}
    assert {n for n, b in on.items() if b == FALLBACK} == {"shape", "gather", "unsqueeze", "concat"}
    assert on["relu"] == on["reshape"] == on["sigmoid"] == "accel"
    assert "computes a shape" in report.node("gather").reasons["accel"]
    check_plan(model, report.plan, {"accel": accel})
    # A backend whose Reshape wants a constant shape leaves the Reshape to the fallback too.
    strict = FakeBackend("accel", ["Relu", "Sigmoid"], rules=[OpRule("Reshape", const_inputs=(1,))])
    report = explain(model, [strict], min_partition_size=1)
    assert report.node("reshape").backend == FALLBACK
    assert "must be a constant" in report.node("reshape").reasons["accel"]


def test_a_shape_op_whose_result_is_data_is_not_a_shape_chain() -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Cast", ["s"], ["y"], name="cast", to=TensorProto.FLOAT),
    ]
    model = make_model(nodes)
    plan = place(model, [FakeBackend("accel", ["Shape", "Cast"])], min_partition_size=1)
    assert layout(plan) == [("accel", ["shape", "cast"])]


def test_explain_reasons_are_readable() -> None:
    model = models.mlp()
    accel = FakeBackend("accel", ["Gemm", "Relu", "MatMul"])
    report = explain(model, [accel], min_partition_size=1)
    assert isinstance(report, PlacementReport)
    verdict = report.node("softmax")
    assert verdict.backend == FALLBACK and verdict.op_type == "Softmax"
    assert verdict.reasons == {"accel": "Softmax is not supported"}
    assert report.node("fc1").reasons == {} and report.node("fc1").backend == "accel"
    text = report.format()
    assert "softmax (Softmax) -> onnxruntime #1; accel: Softmax is not supported" in text
    assert str(report) == text
    with pytest.raises(KeyError, match="nope"):
        report.node("nope")


def test_boundary_tensors_and_their_bytes() -> None:
    static = chain(["Relu", "Softmax", "Relu"])  # [2, 3] float32: 24 bytes per boundary
    accel = FakeBackend("accel", ["Relu"])
    report = explain(static, [accel], min_partition_size=1)
    assert [
        (b.name, b.producer, b.consumers, b.dtype, b.shape, b.nbytes) for b in report.boundaries
    ] == [
        ("v0", 0, (1,), "float32", (2, 3), 24),
        ("v1", 1, (2,), "float32", (2, 3), 24),
    ]
    assert report.boundary_bytes == 48
    dynamic = explain(models.mlp(), [FakeBackend("accel", ["Gemm"])], min_partition_size=1)
    (b,) = dynamic.boundaries
    assert b.name == "h" and b.shape == ("batch", 8) and b.nbytes is None
    assert dynamic.boundary_bytes is None


def test_engine_veto_splits_and_regroups() -> None:
    model = chain(["Relu"] * 7)
    accel = FakeBackend("accel", ["Relu"], veto={"n3": "this Relu is special"})
    report = explain(model, [accel], min_partition_size=1)
    assert layout(report.plan) == [
        ("accel", ["n0", "n1", "n2"]),
        (FALLBACK, ["n3"]),
        ("accel", ["n4", "n5", "n6"]),
    ]
    assert report.node("n3").reasons["accel"] == "vetoed by accel: this Relu is special"
    assert accel.validated == [[f"n{i}" for i in range(7)]]
    # validate=False trusts the rules alone.
    accel.validated.clear()
    plan = place(model, [accel], min_partition_size=1, validate=False)
    assert len(plan.partitions) == 1 and not accel.validated


def test_engine_failing_to_validate_is_a_ferry_error() -> None:
    class Broken(FakeBackend):
        def validate(self, model: ir.Model, nodes: Sequence[str]) -> dict[str, str]:
            raise RuntimeError("engine crashed")

    with pytest.raises(FerryError, match="'broken' failed while validating.*engine crashed"):
        place(chain(["Relu"]), [Broken("broken", ["Relu"])])


def test_priority_order_and_the_fallback_in_the_list() -> None:
    model = chain(["Relu", "Neg", "Sigmoid", "Tanh"])
    first = FakeBackend("first", ["Relu", "Neg"])
    second = FakeBackend("second", ["Relu", "Neg", "Sigmoid", "Tanh"])
    report = explain(model, [first, second], min_partition_size=1)
    assert layout(report.plan) == [("first", ["n0", "n1"]), ("second", ["n2", "n3"])]
    assert report.node("n2").reasons == {"first": "Sigmoid is not supported"}
    # Backends after the fallback get nothing; the fallback may be given by name or object.
    from ferry.backends._onnxruntime import OnnxRuntimeBackend

    for fallback in (FALLBACK, OnnxRuntimeBackend()):
        plan = place(model, [fallback, second], min_partition_size=1)
        assert layout(plan) == [(FALLBACK, ["n0", "n1", "n2", "n3"])]
    assert place(model, "onnxruntime") == Plan.whole_graph(ir.from_proto(model))
    assert place(model, []) == Plan.whole_graph(ir.from_proto(model))


def test_two_backends_never_make_a_cycle() -> None:
    """a -> d and b -> c: first={a, c} and second={b, d} as groups would need each other first."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="a"),
        helper.make_node("Neg", ["x"], ["b"], name="b"),
        helper.make_node("Abs", ["b"], ["c"], name="c"),
        helper.make_node("Tanh", ["a"], ["d"], name="d"),
        helper.make_node("Add", ["c", "d"], ["y"], name="sum"),
    ]
    model = make_model(nodes)
    backends = [FakeBackend("first", ["Relu", "Abs"]), FakeBackend("second", ["Neg", "Tanh"])]
    plan = place(model, backends, min_partition_size=1)
    check_plan(model, plan, {b.name: b for b in backends})
    assert sorted(n for p in plan.partitions if p.backend == "first" for n in p.nodes) == ["a", "c"]


def test_subgraph_node_is_one_unit_and_its_captures_are_inputs() -> None:
    model = models.with_if()
    accel = FakeBackend("accel", ["ReduceSum", "Greater", "Mul", "Neg"])
    plan = place(model, [accel], min_partition_size=1)
    assert layout(plan) == [("accel", ["sum", "positive"]), (FALLBACK, ["branch"])]
    # x is read only inside the branches: it is still an input of the If's partition.
    assert plan.partitions[1].inputs == ("cond", "x")
    check_plan(model, plan)
    with_if = place(model, [FakeBackend("accel", ["If", "ReduceSum", "Greater"])])
    assert len(with_if.partitions) == 1


def constant_model() -> onnx.ModelProto:
    """A Constant shape read by an early fallback node and by a later accelerated Reshape."""
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [3, 2])
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Constant", [], ["target"], name="const", value=shape),
        helper.make_node("Cast", ["target"], ["tf"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["tf"], ["k"], name="reduce", keepdims=0),
        helper.make_node("Softmax", ["r"], ["s0"], name="softmax"),
        helper.make_node("Mul", ["s0", "k"], ["s"], name="scale"),
        helper.make_node("Reshape", ["s", "target"], ["flat"], name="reshape"),
        helper.make_node("Relu", ["flat"], ["y"], name="relu2"),
    ]
    return make_model(nodes)


def test_constant_nodes_join_their_first_reader_and_are_never_fed() -> None:
    model = constant_model()
    accel = FakeBackend("accel", ["Relu"], rules=[OpRule("Reshape", const_inputs=(1,))])
    report = explain(model, [accel], min_partition_size=1)
    assert layout(report.plan) == [
        ("accel", ["relu"]),
        (FALLBACK, ["const", "cast", "reduce", "softmax", "scale"]),
        ("accel", ["reshape", "relu2"]),
    ]
    # The Reshape's shape is not an input of its partition (lowering copies the Constant in),
    # and the Constant's partition does not hand it on.
    assert report.plan.partitions[2].inputs == ("s",)
    assert report.plan.partitions[1].outputs == ("s",)
    assert report.node("const").note and report.node("const").backend == FALLBACK
    check_plan(model, report.plan, {"accel": accel})


def test_a_partition_of_dead_code_still_has_outputs() -> None:
    t = numpy_helper.from_array(np.full((2, 3), 1.5, dtype=np.float32), "t")
    nodes = [
        helper.make_node("Constant", [], ["c"], name="const", value=t),
        helper.make_node("Mul", ["x", "c"], ["unused"], name="dead"),  # read by nobody
        helper.make_node("Relu", ["x"], ["y"], name="relu"),
    ]
    model = make_model(nodes)
    plan = place(model, [FakeBackend("accel", ["Mul"])], min_partition_size=1)
    assert [(p.backend, p.nodes, p.outputs) for p in plan.partitions] == [
        ("accel", ("const", "dead"), ("unused",)),
        (FALLBACK, ("relu",), ("y",)),
    ]


def test_caller_model_is_untouched_and_names_match_ferry_load() -> None:
    proto = models.mlp()
    for node in proto.graph.node:
        node.name = ""
    model = ir.from_proto(proto)
    before = onnx.printer.to_text(ir.to_proto(model))
    plan = place(model, [FakeBackend("accel", ["Gemm", "Relu"])], min_partition_size=1)
    assert onnx.printer.to_text(ir.to_proto(model)) == before
    assert all(node.name in ("", None) for node in model.graph)
    named = model.clone()
    NameFixPass()(named)
    assert sorted(n for p in plan.partitions for n in p.nodes) == sorted(
        node.name or "" for node in named.graph
    )


def test_rules_see_inferred_types_and_big_weights_stay_constant() -> None:
    weight = numpy_helper.from_array(np.ones((3, 400), dtype=np.float32), "W")  # 4.8 KB
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["m"], name="matmul"),
        helper.make_node("Relu", ["m"], ["y"], name="relu"),
    ]
    proto = make_model(nodes, initializers=[weight])
    model = ir.from_proto(proto)
    before = onnx.printer.to_text(ir.to_proto(model))
    accel = FakeBackend(
        "accel",
        rules=[
            OpRule("MatMul", const_inputs=(1,)),
            OpRule("Relu", dtypes=frozenset({"float16"})),
        ],
    )
    report = explain(model, [accel], min_partition_size=1)
    assert layout(report.plan) == [("accel", ["matmul"]), (FALLBACK, ["relu"])]
    # m has no declared type: the dtype in the reason and the boundary size come from inference.
    assert report.node("relu").reasons["accel"] == (
        "Relu: input 0 has dtype float32; supported: float16"
    )
    (boundary,) = report.boundaries
    assert (boundary.name, boundary.shape, boundary.nbytes) == ("m", (2, 400), 3200)
    assert report.plan.partitions[0].inputs == ("x",)  # the weight stays with its partition
    assert onnx.printer.to_text(ir.to_proto(model)) == before
    assert model.graph.initializers["W"].const_value is not None


def test_unsorted_graph_is_sorted_and_cycles_are_refused() -> None:
    proto = chain(["Relu", "Neg", "Sigmoid"])
    reordered = list(proto.graph.node)[::-1]
    del proto.graph.node[:]
    proto.graph.node.extend(reordered)
    plan = place(proto, [FakeBackend("accel", ["Neg"])], min_partition_size=1)
    assert layout(plan) == [(FALLBACK, ["n0"]), ("accel", ["n1"]), (FALLBACK, ["n2"])]
    cyclic = make_model(
        [
            helper.make_node("Add", ["x", "b"], ["a"], name="p"),
            helper.make_node("Relu", ["a"], ["b"], name="q"),
            helper.make_node("Relu", ["a"], ["y"], name="r"),
        ]
    )
    with pytest.raises(FerryError, match="cycle"):
        place(ir.from_proto(cyclic), ["onnxruntime"])


def test_bad_arguments() -> None:
    model = chain(["Relu"])
    with pytest.raises(InvalidInputError, match="min_partition_size"):
        place(model, [], min_partition_size=0)
    with pytest.raises(BackendUnavailableError, match="no-such-engine"):
        place(model, ["no-such-engine"])


def test_unmatched_force_cpu_entry_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    place(chain(["Relu"]), [], force_cpu=["Softmx"])
    assert "Softmx" in caplog.text


def test_plan_round_trips_through_json() -> None:
    model = chain(["Relu", "Softmax", "Relu", "Relu", "Relu"])
    plan = place(model, [FakeBackend("accel", ["Relu"])], min_partition_size=1)
    assert Plan.from_json(plan.to_json()) == plan


# -- numeric parity through the Session ----------------------------------------------------------


def ort_backend(name: str, ops: Iterable[str]) -> object:
    """An ONNX Runtime backend that claims only ``ops``: runs partitions exactly like ORT."""
    from ferry.backends._onnxruntime import OnnxRuntimeBackend

    class Restricted(OnnxRuntimeBackend):
        def rules(self) -> list[OpRule]:
            return [OpRule(op) for op in sorted(set(ops))]

        def validate(self, model: ir.Model, nodes: Sequence[str]) -> dict[str, str]:
            return {}

    backend = Restricted()
    backend.name = name
    return backend


@contextlib.contextmanager
def registered(*backends: object) -> Iterator[None]:
    import ferry.backends

    with pytest.MonkeyPatch.context() as mp:
        for backend in backends:
            mp.setitem(ferry.backends._registry._instances, backend.name, backend)  # type: ignore[attr-defined]
        yield


def run_both(proto: onnx.ModelProto, plan: Plan, feeds: dict[str, np.ndarray]) -> None:
    import ferry

    expected = ort.InferenceSession(
        proto.SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(None, feeds)
    got = ferry.load(proto, plan=plan).run(feeds)
    for output, want in zip(proto.graph.output, expected):
        np.testing.assert_allclose(got[output.name], want, rtol=1e-6, atol=1e-6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_dags(max_nodes=25), st.sets(st.sampled_from(OPS)), st.sets(st.sampled_from(OPS)))
def test_partitioned_random_dags_match_onnxruntime(
    proto: onnx.ModelProto, ops: set[str], ops2: set[str]
) -> None:
    accel, accel2 = ort_backend("accel", ops), ort_backend("accel2", ops2)
    plan = place(proto, [accel, accel2], min_partition_size=1)  # type: ignore[list-item]
    rng = np.random.default_rng(0)
    feeds = {
        i.name: rng.uniform(-1, 1, (2, 3)).astype(np.float32)
        for i in proto.graph.input
        if i.name not in {t.name for t in proto.graph.initializer}
    }
    with registered(accel, accel2):
        run_both(proto, plan, feeds)


def test_partitioned_shape_chain_and_subgraph_models_match_onnxruntime() -> None:
    accel = ort_backend("accel", ["Relu", "Reshape", "Sigmoid", "ReduceSum", "Greater"])
    # (Constant is not in the list: it goes where its first reader goes.)
    rng = np.random.default_rng(1)
    cases = [
        (shape_chain_model(), {"x": rng.standard_normal((4, 2, 3)).astype(np.float32)}),
        (constant_model(), {"x": rng.standard_normal((2, 3)).astype(np.float32)}),
        (models.with_if(), {"x": rng.standard_normal((3, 4)).astype(np.float32)}),
        (models.with_if(), {"x": -np.abs(rng.standard_normal((3, 4))).astype(np.float32)}),
    ]
    with registered(accel):
        for proto, feeds in cases:
            plan = place(proto, [accel], min_partition_size=1)  # type: ignore[list-item]
            assert len(plan.partitions) > 1
            run_both(proto, plan, feeds)


# -- the zoo -------------------------------------------------------------------------------------

#: What the fake accelerator takes in the zoo models: the heavy ops, not the odd ones.
ZOO_ACCEL_OPS = ["Conv", "Relu", "Gemm", "MatMul", "Add", "Clip", "Transpose", "Reshape", "Mul"]


@pytest.fixture(scope="module")
def zoo_models() -> dict[str, ir.Model]:
    pytest.importorskip("torch")
    from ferry import zoo

    return {name: zoo.build(name) for name in zoo.names()}


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("name", ["digits_cnn", "mlp", "mobilenet_v2", "transformer_block"])
def test_zoo_models_partition_and_match_onnxruntime(
    zoo_models: dict[str, ir.Model], name: str
) -> None:
    from ferry import zoo

    model = zoo_models[name]
    proto = ir.to_proto(model)
    accel = FakeBackend("accel", ZOO_ACCEL_OPS)
    start = time.perf_counter()
    report = explain(model, [accel], min_partition_size=1)
    elapsed = time.perf_counter() - start
    assert elapsed < 5, f"partitioning {name} took {elapsed:.1f} s"
    check_plan(proto, report.plan, {"accel": accel})
    assert "accel" in report.plan.backends
    assert place(model, [accel], min_partition_size=1) == report.plan
    if name in ("mobilenet_v2", "transformer_block"):
        assert FALLBACK in report.plan.backends  # HardSwish / Softmax, LayerNorm, Gelu

    ort_accel = ort_backend("accel", ZOO_ACCEL_OPS)
    feeds = zoo.example_inputs(name, batch=2)
    with registered(ort_accel):
        run_both(proto, report.plan, feeds)


# -- engines that need ranked inputs --------------------------------------------------------------


class RankedBackend(FakeBackend):
    """An engine whose inputs need a known rank (as OpenVINO's Parameters and TensorRT's do)."""

    ranked_inputs = True


def _rankless_model() -> onnx.ModelProto:
    """x -> Squeeze(axes: a graph input, so the rank is unknown) -> s -> Relu -> Sigmoid ->
    Reshape(to [2, 3]) -> Exp -> Neg -> y: the rank is known again after the Reshape."""
    shape = numpy_helper.from_array(np.array([2, 3], np.int64), "shape")
    nodes = [
        helper.make_node("Squeeze", ["x", "axes"], ["s"], name="squeeze"),
        helper.make_node("Relu", ["s"], ["r"], name="relu"),
        helper.make_node("Sigmoid", ["r"], ["g"], name="sig"),
        helper.make_node("Reshape", ["g", "shape"], ["f"], name="reshape"),
        helper.make_node("Exp", ["f"], ["e"], name="exp"),
        helper.make_node("Neg", ["e"], ["y"], name="neg"),
    ]
    model = make_model(nodes, inputs=[("x", [2, 1, 3])], initializers=[shape])
    model.graph.input.append(helper.make_tensor_value_info("axes", TensorProto.INT64, [1]))
    return model


def test_a_tensor_of_unknown_rank_never_crosses_into_an_engine_that_needs_ranks() -> None:
    model = _rankless_model()
    ops = ["Relu", "Sigmoid", "Reshape", "Exp", "Neg"]  # not Squeeze
    report = explain(model, [RankedBackend("ranked", ops)], min_partition_size=1)
    # Everything that reads a value of unknown rank stays with its producer; after the Reshape
    # the rank is known again and the engine takes the rest.
    assert layout(report.plan) == [
        ("onnxruntime", ["squeeze", "relu", "sig", "reshape"]),
        ("ranked", ["exp", "neg"]),
    ]
    for node in ("relu", "sig", "reshape"):
        assert "whose rank is unknown" in report.node(node).reasons["ranked"]
    # An engine that takes any rank takes them all.
    plan = place(model, [FakeBackend("any", ops)], min_partition_size=1)
    assert layout(plan) == [
        ("onnxruntime", ["squeeze"]),
        ("any", ["relu", "sig", "reshape", "exp", "neg"]),
    ]


def test_the_rank_rule_holds_for_the_final_groups_too() -> None:
    """The reader's producer is the engine's, but lands in another group: still a crossing."""
    nodes = [
        helper.make_node("Squeeze", ["x", "axes"], ["s"], name="squeeze"),  # rank unknown
        helper.make_node("Neg", ["x2"], ["b"], name="neg"),
        helper.make_node("Abs", ["b"], ["a"], name="abs"),  # not the engine's
        helper.make_node("Add", ["s", "a"], ["y"], name="add"),
    ]
    model = make_model(nodes, inputs=[("x", [2, 1, 3]), ("x2", [2, 3])])
    model.graph.input.append(helper.make_tensor_value_info("axes", TensorProto.INT64, [1]))
    # Walked in waves, {squeeze, neg} close a group before Abs runs; Add, in a group of its own,
    # would read 's' (unknown rank) from the first group.
    report = explain(
        model, [RankedBackend("ranked", ["Squeeze", "Neg", "Add"])], min_partition_size=1
    )
    assert layout(report.plan) == [("ranked", ["squeeze", "neg"]), ("onnxruntime", ["abs", "add"])]
    assert "'s', whose rank is unknown" in report.node("add").reasons["ranked"]


def test_weights_computed_from_constants_travel_with_their_reader() -> None:
    """Paddle's exporter stores weights as Reshape(Constant, Identity(Constant)) chains: data, not
    work. They go with the engine that reads them, never across a boundary as run-time tensors."""
    flat = numpy_helper.from_array(np.ones(18, np.float32), "flat")
    target = numpy_helper.from_array(np.array([2, 1, 3, 3], np.int64))
    nodes = [
        helper.make_node("Constant", [], ["target"], name="target", value=target),
        helper.make_node("Identity", ["target"], ["shape"], name="shape"),
        helper.make_node("Reshape", ["flat", "shape"], ["w"], name="weights"),
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    model = make_model(nodes, inputs=[("x", [1, 1, 5, 5])], initializers=[flat])
    plan = place(model, [FakeBackend("accel", ["Conv"])], min_partition_size=1)
    assert layout(plan) == [("accel", ["target", "shape", "weights", "conv"]), (FALLBACK, ["relu"])]
    assert plan.partitions[0].inputs == ("x",)
    # Cut alone, the Conv brings its whole weight chain and the initializer it reads.
    from ferry.plan import cut

    named = prepare(ir.from_proto(model))
    sub = cut(named, ["conv"])
    assert [n.name for n in sub.graph] == ["target", "shape", "weights", "conv"]
    assert list(sub.graph.initializers) == ["flat"] and [v.name for v in sub.graph.inputs] == ["x"]
    x = np.arange(25, dtype=np.float32).reshape(1, 1, 5, 5)
    session = ort.InferenceSession(
        ir.to_proto(sub).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    (got,) = session.run(None, {"x": x})
    assert got.shape == (1, 2, 3, 3) and got[0, 0, 0, 0] == x[0, 0, :3, :3].sum()
