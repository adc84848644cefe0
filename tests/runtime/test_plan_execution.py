"""Split plans run through the Session: same numbers as ONNX Runtime on the whole model, values
moved only at boundaries and freed after their last reader, unneeded partitions skipped."""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_ir.passes.common import NameFixPass

import ferry
import models
from ferry.backends import place
from ferry.plan import Partition, Plan

RNG = np.random.default_rng(0)


# ---------------------------------------------------------------------------------------------
# Helpers: plans made by hand, independent of ferry's partitioner and lowering


def named(source: onnx.ModelProto | ir.Model) -> ir.Model:
    """The model with nodes named as ferry.load names them, so that a plan can refer to them."""
    model = ir.from_proto(source) if isinstance(source, onnx.ModelProto) else source
    NameFixPass()(model)
    return model


def _reads(model: ir.Model, node: ir.Node) -> Iterator[ir.Value]:
    """Top-level values ``node`` reads, directly or from inside its subgraphs."""
    for value in node.inputs:
        if value is not None:
            yield value
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            bodies = [attr.as_graph()]
        elif attr.type == ir.AttributeType.GRAPHS:
            bodies = list(attr.as_graphs())
        else:
            continue
        for body in bodies:
            for inner in ir.traversal.RecursiveGraphIterator(body):
                for value in inner.inputs:
                    if value is not None and value.graph is model.graph:
                        yield value


def plan_from_groups(
    model: ir.Model, groups: Sequence[Sequence[str]], backend: str = "onnxruntime"
) -> Plan:
    """A plan with one partition per group of node names; inputs and outputs worked out here."""
    by_name = {node.name: node for node in model.graph}
    chunks = [[by_name[name] for name in group] for group in groups]
    graph_outputs = [v.name or "" for v in model.graph.outputs]
    partitions = []
    for index, chunk in enumerate(chunks):
        produced = {v for node in chunk for v in node.outputs}
        inputs: list[str] = []
        for node in chunk:
            for value in _reads(model, node):
                if value in produced or value.is_initializer() or value.name in inputs:
                    continue
                inputs.append(value.name or "")
        later = {
            v.name for other in chunks[index + 1 :] for node in other for v in _reads(model, node)
        }
        outputs = [
            v.name or ""
            for node in chunk
            for v in node.outputs
            if v.name in later or v.name in graph_outputs
        ]
        partitions.append(
            Partition(backend, tuple(n.name or "" for n in chunk), tuple(inputs), tuple(outputs))
        )
    graph_inputs = tuple(v.name or "" for v in model.graph.inputs if not v.is_initializer())
    return Plan(tuple(partitions), graph_inputs, tuple(graph_outputs))


def chunk_plan(model: ir.Model, count: int) -> Plan:
    """Split the node list into ``count`` contiguous (so topologically ordered) chunks."""
    names = [node.name or "" for node in model.graph]
    bounds = [round(i * len(names) / count) for i in range(count + 1)]
    return plan_from_groups(model, [names[bounds[i] : bounds[i + 1]] for i in range(count)])


def raw_ort(model: ir.Model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    proto = ir.to_proto(model)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


def assert_close(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert list(got) == list(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        # Fusions that ORT applies across a boundary (Conv+Relu...) may round differently.
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-6, err_msg=name)


class Recorder:
    """Wraps a session's compiled partitions; records which were run and what was alive then.

    Every array a partition returns is watched through a weak reference, so the test sees exactly
    which intermediate values the session still holds when each partition starts.
    """

    def __init__(self, session: ferry.Session) -> None:
        self.calls: list[int] = []
        self.alive_at_call: list[set[str]] = []
        self.asked: list[list[str]] = []
        self._watched: list[tuple[str, weakref.ref[np.ndarray]]] = []
        session._compiled = [self._wrap(i, c) for i, c in enumerate(session._compiled)]
        session._steps = [
            step._replace(compiled=session._compiled[i]) for i, step in enumerate(session._steps)
        ]
        session._schedules.clear()

    def _wrap(self, index: int, compiled: Any) -> Any:
        recorder = self

        class Wrapped:
            def run(
                self, inputs: dict[str, np.ndarray], outputs: Sequence[str] | None = None
            ) -> dict[str, np.ndarray]:
                recorder.calls.append(index)
                recorder.asked.append(list(outputs or []))
                recorder.alive_at_call.append(
                    {name for name, ref in recorder._watched if ref() is not None}
                )
                result = compiled.run(inputs, outputs)
                # ORT may hand back views; copies make each value an object of its own.
                result = {k: np.array(v, copy=True) for k, v in result.items()}
                recorder._watched.extend((k, weakref.ref(v)) for k, v in result.items())
                return result

            def serialize(self) -> bytes:
                return b""

        return Wrapped()


# ---------------------------------------------------------------------------------------------
# Numerical parity on hand-built and zoo models


@pytest.mark.parametrize("count", [2, 3, 4])
def test_mlp_split_matches_whole_model(count: int) -> None:
    model = named(models.mlp())
    x = RNG.standard_normal((5, 16)).astype(np.float32)
    session = ferry.load(model, plan=chunk_plan(model, count))
    assert len(session.plan.partitions) == count
    assert session._single is None
    assert_close(session.run({"x": x}), raw_ort(model, {"x": x}))


def test_conv_split_matches_whole_model() -> None:
    model = named(models.conv())
    x = RNG.standard_normal((2, 3, 16, 16)).astype(np.float32)
    session = ferry.load(model, plan=chunk_plan(model, 2))
    assert_close(session.run({"x": x}), raw_ort(model, {"x": x}))


def test_if_node_with_outer_scope_reads_runs_split() -> None:
    model = named(models.with_if())
    plan = plan_from_groups(model, [["sum", "positive"], ["branch"]])
    # The If bodies read x and the weight 'two' from the outer scope: x crosses the boundary.
    assert plan.partitions[1].inputs == ("cond", "x")
    session = ferry.load(model, plan=plan)
    for sign in (1.0, -1.0):
        x = sign * np.ones((3, 4), np.float32)
        assert_close(session.run({"x": x}), raw_ort(model, {"x": x}))


def test_multiple_outputs_and_requested_subsets() -> None:
    model = named(models.two_inputs())
    plan = plan_from_groups(model, [["add", "cast"], ["greater"], ["mul"]])
    session = ferry.load(model, plan=plan)
    feeds: dict[str, np.ndarray] = {
        "a": RNG.standard_normal((2, 4)).astype(np.float32),
        "b": RNG.standard_normal((2, 4)).astype(np.float32),
        "k": np.array(3, dtype=np.int64),
    }
    want = raw_ort(model, feeds)
    assert_close(session.run(feeds), want)
    assert list(session.run(feeds, outputs=["mask"])) == ["mask"]
    np.testing.assert_array_equal(session.run(feeds, outputs="mask")["mask"], want["mask"])
    np.testing.assert_array_equal(session.run(feeds, outputs=["sum"])["sum"], want["sum"])
    got = session.run(feeds, outputs=["mask", "sum"])
    assert list(got) == ["mask", "sum"]


@pytest.fixture(scope="module")
def zoo_models() -> dict[str, ir.Model]:
    pytest.importorskip("torch")
    from ferry import zoo

    return {name: named(zoo.build(name)) for name in zoo.names()}


@pytest.mark.torch
@pytest.mark.parametrize("name", ["digits_cnn", "mlp", "mobilenet_v2", "transformer_block"])
@pytest.mark.parametrize("count", [2, 3, 4])
def test_zoo_split_matches_whole_model(
    zoo_models: dict[str, ir.Model], name: str, count: int
) -> None:
    from ferry import zoo

    model = zoo_models[name]
    feeds = zoo.example_inputs(name, batch=2)
    plan = chunk_plan(model, count)
    session = ferry.load(model, plan=plan)
    assert session.plan is plan
    assert_close(session.run(feeds), raw_ort(model, feeds))


@pytest.mark.torch
@pytest.mark.parametrize("name", ["mobilenet_v2", "transformer_block"])
def test_zoo_plan_from_the_partitioner(
    zoo_models: dict[str, ir.Model], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ferry.backends
    from ferry import zoo
    from ferry.backends import OpRule
    from ferry.backends._onnxruntime import OnnxRuntimeBackend

    class Accel(OnnxRuntimeBackend):
        """ONNX Runtime under another name, claiming only some ops: alternating partitions."""

        name = "accel"

        def rules(self) -> list[OpRule]:
            return [OpRule(op) for op in ("Conv", "MatMul", "Add", "Mul", "Relu", "Clip")]

        def validate(self, model: ir.Model, nodes: Sequence[str]) -> dict[str, str]:
            return {}

    monkeypatch.setitem(ferry.backends._registry._instances, "accel", Accel())
    model = zoo_models[name]
    plan = place(model, [Accel()], min_partition_size=1, validate=False)
    assert set(plan.backends) == {"accel", "onnxruntime"} and len(plan.partitions) > 4
    feeds = zoo.example_inputs(name, batch=2)
    session = ferry.load(model, plan=plan)
    assert_close(session.run(feeds), raw_ort(model, feeds))


# ---------------------------------------------------------------------------------------------
# Boundaries and value lifetimes


def fan_out_model() -> ir.Model:
    """x -> Relu r; r -> Neg n; r -> Exp e; (n + e) -> y, plus z = r * 2 as a second output."""
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Neg", ["r"], ["n"], name="neg"),
        helper.make_node("Exp", ["r"], ["e"], name="exp"),
        helper.make_node("Add", ["n", "e"], ["y"], name="add"),
        helper.make_node("Mul", ["x", "two"], ["z"], name="double"),
    ]
    graph = helper.make_graph(
        nodes,
        "fan_out",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 4]),
        ],
        [two],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return named(model)


def test_values_are_freed_after_their_last_reader() -> None:
    model = fan_out_model()
    plan = plan_from_groups(model, [["relu"], ["neg"], ["exp"], ["add"], ["double"]])
    session = ferry.load(model, plan=plan)
    recorder = Recorder(session)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    out = session.run({"x": x})
    assert_close(out, raw_ort(model, {"x": x}))
    assert recorder.calls == [0, 1, 2, 3, 4]
    # r is read by neg and exp: kept until exp ran, gone when add runs.
    # y is a graph output, so it survives to the end; nothing else does.
    assert recorder.alive_at_call == [set(), {"r"}, {"r", "n"}, {"n", "e"}, {"y"}]
    del out


def test_partitions_nobody_needs_are_skipped() -> None:
    model = fan_out_model()
    plan = plan_from_groups(model, [["relu"], ["neg"], ["exp"], ["add"], ["double"]])
    session = ferry.load(model, plan=plan)
    recorder = Recorder(session)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    got = session.run({"x": x}, outputs=["z"])
    np.testing.assert_array_equal(got["z"], 2 * x)
    assert recorder.calls == [4]
    recorder.calls.clear()
    session.run({"x": x}, outputs=["y"])
    assert recorder.calls == [0, 1, 2, 3]


def test_partitions_are_asked_only_for_what_is_needed() -> None:
    model = fan_out_model()
    # One partition computes r, n and z; asking only for y must not make it give z.
    plan = plan_from_groups(model, [["relu", "neg", "double"], ["exp", "add"]])
    assert plan.partitions[0].outputs == ("r", "n", "z")
    session = ferry.load(model, plan=plan)
    recorder = Recorder(session)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    session.run({"x": x}, outputs=["y"])
    assert recorder.asked == [["r", "n"], ["y"]]


def test_graph_input_feeding_several_partitions() -> None:
    model = fan_out_model()
    plan = plan_from_groups(model, [["relu", "neg", "exp", "add"], ["double"]])
    assert plan.partitions[1].inputs == ("x",)
    session = ferry.load(model, plan=plan)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    assert_close(session.run({"x": x}), raw_ort(model, {"x": x}))
    np.testing.assert_array_equal(x, x.copy())  # the caller's array is untouched


def test_graph_output_that_is_an_input_or_a_weight() -> None:
    w = numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Add", ["r", "w"], ["y"], name="add"),
        ],
        "passthrough",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [4]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [4]),
        ],
        [w],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    model = named(proto)
    session = ferry.load(model, plan=plan_from_groups(model, [["relu"], ["add"]]))
    x = np.array([-1, 2, -3, 4], np.float32)
    out = session.run({"x": x})
    assert list(out) == ["y", "x", "w"]
    np.testing.assert_array_equal(out["y"], np.maximum(x, 0) + np.arange(4))
    np.testing.assert_array_equal(out["x"], x)
    np.testing.assert_array_equal(out["w"], np.arange(4, dtype=np.float32))


def test_overridable_weight_reaches_the_partition_that_reads_it() -> None:
    bias = numpy_helper.from_array(np.full(4, 10.0, np.float32), "bias")
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Add", ["r", "bias"], ["y"], name="add"),
        ],
        "override",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info("bias", TensorProto.FLOAT, [4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [bias],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    model = named(proto)
    session = ferry.load(model, plan=plan_from_groups(model, [["relu"], ["add"]]))
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(session.run({"x": x})["y"], np.full((2, 4), 11.0))
    out = session.run({"x": x, "bias": np.zeros(4, np.float32)})["y"]
    np.testing.assert_array_equal(out, x)


def test_constant_node_read_across_a_boundary_is_copied_in() -> None:
    graph = helper.make_graph(
        [
            helper.make_node(
                "Constant",
                [],
                ["shape"],
                name="shape_const",
                value=numpy_helper.from_array(np.array([4, 2], np.int64)),
            ),
            helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape1"),
            helper.make_node("Relu", ["r"], ["t"], name="relu"),
            helper.make_node("Reshape", ["t", "shape"], ["y"], name="reshape2"),
        ],
        "constants",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    model = named(proto)
    # The hand-written plan does not declare 'shape' for the second partition: constants belong
    # to whoever reads them.
    plan = Plan(
        (
            Partition("onnxruntime", ("shape_const", "reshape1"), ("x",), ("r",)),
            Partition("onnxruntime", ("relu", "reshape2"), ("r",), ("y",)),
        ),
        ("x",),
        ("y",),
    )
    session = ferry.load(model, plan=plan)
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_array_equal(session.run({"x": x})["y"], np.maximum(x.reshape(4, 2), 0))


def test_partition_without_outputs_is_not_compiled() -> None:
    # The partitioner gives nodes whose results nobody reads a partition of their own.
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["y"], name="relu"),
            helper.make_node("Sigmoid", ["x"], ["unused"], name="dead"),
        ],
        "dead_code",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    dead = named(proto)
    session = ferry.load(dead, plan=plan_from_groups(dead, [["relu"], ["dead"]]))
    assert session.plan.partitions[1].outputs == ()
    assert session.engine_origins == ["uncached", "skipped"]
    x = np.array([-1.0, 2.0], np.float32)
    np.testing.assert_array_equal(session.run({"x": x})["y"], [0.0, 2.0])


def test_threads_reach_every_partition() -> None:
    model = named(models.mlp())
    session = ferry.load(model, plan=chunk_plan(model, 2), threads=1)
    for compiled in session._compiled:
        options = compiled.session.get_session_options()  # type: ignore[attr-defined]
        assert options.intra_op_num_threads == 1


def test_whole_graph_plan_keeps_the_fast_path(mlp_path: Any) -> None:
    session = ferry.load(mlp_path)
    (compiled,) = session._compiled
    assert session._single is compiled
    assert compiled.spec.model is session.model  # type: ignore[attr-defined]
    assert compiled.spec.source_path == mlp_path.resolve()  # type: ignore[attr-defined]
    assert session.engine_origins == ["uncached"]


def test_split_session_is_thread_safe() -> None:
    import threading

    model = fan_out_model()
    session = ferry.load(
        model, plan=plan_from_groups(model, [["relu"], ["neg", "exp"], ["add", "double"]])
    )
    xs = [RNG.standard_normal((2, 4)).astype(np.float32) for _ in range(4)]
    expected = [raw_ort(model, {"x": x}) for x in xs]
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for _ in range(30):
                got = session.run({"x": xs[i]}, outputs=["y"] if i % 2 else None)
                for name, value in got.items():
                    np.testing.assert_array_equal(value, expected[i][name])
        except BaseException as e:  # re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


# ---------------------------------------------------------------------------------------------
# Plans that do not fit the model


def _replace(plan: Plan, index: int, **changes: Any) -> Plan:
    import dataclasses

    parts = list(plan.partitions)
    parts[index] = dataclasses.replace(parts[index], **changes)
    return dataclasses.replace(plan, partitions=tuple(parts))


def _without(plan: Plan, index: int) -> Plan:
    import dataclasses

    parts = plan.partitions[:index] + plan.partitions[index + 1 :]
    return dataclasses.replace(plan, partitions=parts)


def _move_last(plan: Plan, index: int) -> Plan:
    import dataclasses

    parts = list(plan.partitions)
    parts.append(parts.pop(index))
    return dataclasses.replace(plan, partitions=tuple(parts))


# The base plan: 0 relu, 1 neg, 2 exp, 3 double, 4 add.
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda p: _replace(p, 1, nodes=("neg", "nope")),
            r"partition 1 \(onnxruntime\) names 1 node\(s\) the model does not have: 'nope'",
        ),
        (
            lambda p: _replace(p, 1, nodes=("neg", "relu")),
            r"node 'relu' is in partition 1 \(onnxruntime\) also in partition 0",
        ),
        (
            lambda p: _replace(p, 1, nodes=("neg", "neg")),
            r"node 'neg' is in partition 1 \(onnxruntime\) twice",
        ),
        (lambda p: _replace(p, 2, nodes=()), r"partition 2 \(onnxruntime\) has no nodes"),
        (
            lambda p: _without(p, 3),
            r"the plan assigns no backend to 1 node\(s\): 'double'",
        ),
        (
            lambda p: _replace(p, 0, outputs=()),
            r"partition 1 \(onnxruntime\) reads 'r', which neither a graph input nor an earlier "
            r"partition gives; list it in the outputs",
        ),
        (
            lambda p: _move_last(p, 1),
            r"partition 3 \(onnxruntime\) reads 'n'.*partition 4 gives it, but runs later",
        ),
        (lambda p: _replace(p, 3, outputs=()), r"no partition gives graph output\(s\) 'z'"),
        (
            lambda p: _replace(p, 1, inputs=("r", "n")),
            r"partition 1 \(onnxruntime\) declares input 'n', but its own node 'neg' \(Neg\) "
            r"computes it",
        ),
        (
            lambda p: _replace(p, 1, outputs=("n", "e")),
            r"partition 1 \(onnxruntime\) declares output 'e', which none of its nodes computes",
        ),
        (
            lambda p: _replace(p, 2, inputs=()),
            r"partition 2 \(onnxruntime\): node 'exp' \(Exp\) reads 'r', which no node of the "
            r"partition computes and which is not among its inputs",
        ),
        (
            lambda p: _replace(p, 2, inputs=("r", "ghost")),
            r"partition 2 \(onnxruntime\) reads 'ghost', which neither a graph input",
        ),
    ],
)
def test_bad_plans_are_refused_at_load(change: Any, message: str) -> None:
    model = fan_out_model()
    plan = change(plan_from_groups(model, [["relu"], ["neg"], ["exp"], ["double"], ["add"]]))
    with pytest.raises(ferry.FerryError, match=message):
        ferry.load(model, plan=plan)


def test_plan_for_another_model_is_refused() -> None:
    plan = chunk_plan(named(models.mlp()), 2)
    with pytest.raises(ferry.FerryError, match="does not have"):
        ferry.load(fan_out_model(), plan=plan)
