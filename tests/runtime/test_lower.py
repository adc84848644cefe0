"""Lowering one partition to a standalone model, and checking plans against their model."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_ir.passes.common import NameFixPass

import models
from ferry.errors import FerryError, PlanError
from ferry.plan import Partition, Plan, boundary, check_plan, cut, cut_partition
from ferry.runtime import lower_plan


def named(proto: onnx.ModelProto) -> ir.Model:
    model = ir.from_proto(proto)
    NameFixPass()(model)
    return model


def run(model: ir.Model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


def fingerprint(model: ir.Model) -> bytes:
    return ir.to_proto(model).SerializeToString(deterministic=True)


def test_mlp_halves_are_standalone_models() -> None:
    model = named(models.mlp())
    before = fingerprint(model)
    first = cut_partition(model, Partition("onnxruntime", ("fc1", "relu"), ("x",), ("r",)))
    second = cut_partition(model, Partition("onnxruntime", ("fc2", "softmax"), ("r",), ("y",)))

    assert [v.name for v in first.graph.inputs] == ["x"]
    assert [v.name for v in first.graph.outputs] == ["r"]
    assert [n.name for n in first.graph] == ["fc1", "relu"]
    assert sorted(first.graph.initializers) == ["b1", "w1"]
    assert sorted(second.graph.initializers) == ["w2"]
    # The boundary value had no declared type in the source: filled from shape inference.
    r = second.graph.inputs[0]
    assert r.dtype == ir.DataType.FLOAT and r.shape is not None and r.shape[1] == 8
    # Weights are shared, not copied; the source model is untouched.
    assert first.graph.initializers["w1"].const_value is model.graph.initializers["w1"].const_value
    assert fingerprint(model) == before
    assert all(node.graph is model.graph for node in model.graph)
    assert first.opset_imports == model.opset_imports

    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    middle = run(first, {"x": x})["r"]
    np.testing.assert_array_equal(run(second, {"r": middle})["y"], run(model, {"x": x})["y"])


def test_nodes_follow_the_models_order_whatever_the_partition_says() -> None:
    model = named(models.mlp())
    sub = cut_partition(model, Partition("onnxruntime", ("relu", "fc1"), ("x",), ("r",)))
    assert [n.name for n in sub.graph] == ["fc1", "relu"]


def test_if_bodies_come_along_and_their_outer_reads_are_inputs() -> None:
    model = named(models.with_if())
    sub = cut_partition(model, Partition("onnxruntime", ("branch",), ("cond", "x"), ("y",)))
    # 'two' is read only inside the then-branch: it comes along as an initializer.
    assert sorted(sub.graph.initializers) == ["two"]
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(run(sub, {"cond": np.array(True), "x": x})["y"], 2 * x)
    np.testing.assert_array_equal(run(sub, {"cond": np.array(False), "x": x})["y"], -x)
    # The body's reads are not the source's any more: they point at the lowered graph's values.
    body_mul = next(
        n for n in ir.traversal.RecursiveGraphIterator(sub.graph) if n.name == "then_mul"
    )
    assert body_mul.inputs[0] is sub.graph.inputs[1]

    with pytest.raises(FerryError, match=r"node 'branch' \(If\) reads 'x'.*not among its inputs"):
        cut_partition(model, Partition("onnxruntime", ("branch",), ("cond",), ("y",)))


def test_functions_and_metadata_carry_over() -> None:
    proto = models.mlp()
    proto.metadata_props.add(key="origin", value="test")
    function = helper.make_function(
        "local",
        "Double",
        ["a"],
        ["b"],
        [helper.make_node("Add", ["a", "a"], ["b"])],
        [helper.make_opsetid("", 17)],
    )
    proto.functions.append(function)
    proto.opset_import.append(helper.make_opsetid("local", 1))
    proto.graph.node.append(helper.make_node("Double", ["y"], ["y2"], name="dbl", domain="local"))
    proto.graph.output[0].name = "y2"
    model = named(proto)
    sub = cut_partition(model, Partition("onnxruntime", ("softmax", "dbl"), ("logits",), ("y2",)))
    assert ("local", "Double", "") in sub.functions
    assert sub.functions[("local", "Double", "")] is not model.functions[("local", "Double", "")]
    assert sub.opset_imports["local"] == 1
    assert sub.metadata_props["origin"] == "test"
    logits = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
    expected = 2 * np.exp(logits) / np.exp(logits).sum()
    np.testing.assert_allclose(run(sub, {"logits": logits})["y2"], expected, rtol=1e-6)


def test_ir3_models_lower_to_ir4_without_weights_as_inputs() -> None:
    model = named(models.initializer_as_input(ir_version=3))
    sub = cut_partition(model, Partition("onnxruntime", ("add",), ("x",), ("y",)))
    assert sub.ir_version == 4
    assert [v.name for v in sub.graph.inputs] == ["x"]
    out = run(sub, {"x": np.zeros((2, 4), np.float32)})["y"]
    np.testing.assert_array_equal(out, np.full((2, 4), 10.0))


def test_overridable_weights_stay_overridable() -> None:
    model = named(models.initializer_as_input(ir_version=8))
    sub = cut_partition(model, Partition("onnxruntime", ("add",), ("x",), ("y",)))
    assert [v.name for v in sub.graph.inputs] == ["x", "bias"]
    assert "bias" in sub.graph.initializers
    x = np.zeros((2, 4), np.float32)
    np.testing.assert_array_equal(run(sub, {"x": x})["y"], np.full((2, 4), 10.0))
    np.testing.assert_array_equal(run(sub, {"x": x, "bias": np.ones(4, np.float32)})["y"], x + 1)


def test_a_weight_declared_as_input_stays_a_weight() -> None:
    model = named(models.mlp())
    sub = cut_partition(model, Partition("onnxruntime", ("fc2",), ("r", "w2"), ("logits",)))
    assert [v.name for v in sub.graph.inputs] == ["r"]
    assert list(sub.graph.initializers) == ["w2"]


def test_folded_values_become_weights() -> None:
    model = named(models.mlp())
    # Pretend an analysis folded 'r' to a known value: a reader of it needs no input then.
    known = np.full((1, 8), 0.5, np.float32)
    r = next(v for n in model.graph for v in n.outputs if v.name == "r")
    r.const_value = ir.Tensor(known, name="r")
    sub = cut_partition(model, Partition("onnxruntime", ("fc2",), (), ("logits",)))
    assert "r" in sub.graph.initializers and not sub.graph.inputs
    w2_tensor = model.graph.initializers["w2"].const_value
    assert w2_tensor is not None
    w2 = w2_tensor.numpy()
    np.testing.assert_allclose(run(sub, {})["logits"], known @ w2, rtol=1e-6)


def test_constant_nodes_of_other_partitions_are_copied_in() -> None:
    graph = helper.make_graph(
        [
            helper.make_node(
                "Constant", [], ["k"], name="k_const", value=numpy_helper.from_array(np.float32(3))
            ),
            helper.make_node("Mul", ["x", "k"], ["a"], name="mul"),
            helper.make_node("Add", ["a", "k"], ["y"], name="add"),
        ],
        "consts",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    model = named(proto)
    sub = cut_partition(model, Partition("onnxruntime", ("add",), ("a",), ("y",)))
    assert [n.name for n in sub.graph] == ["k_const", "add"]
    assert [n.name for n in model.graph] == ["k_const", "mul", "add"]  # copied, not moved
    np.testing.assert_array_equal(run(sub, {"a": np.ones(2, np.float32)})["y"], [4.0, 4.0])
    # Declared as an input instead, it is fed like any other value.
    fed = cut_partition(model, Partition("onnxruntime", ("add",), ("a", "k"), ("y",)))
    assert [v.name for v in fed.graph.inputs] == ["a", "k"]
    assert [n.name for n in fed.graph] == ["add"]


@pytest.mark.parametrize(
    ("partition", "message"),
    [
        (
            Partition("onnxruntime", ("fc1", "nope"), ("x",), ("h",)),
            r"names node\(s\) the model does not have: 'nope'",
        ),
        (
            Partition("onnxruntime", ("fc1", "fc1"), ("x",), ("h",)),
            r"lists node\(s\) 'fc1' more than once",
        ),
        (
            Partition("onnxruntime", ("fc1", "relu"), ("x", "h"), ("r",)),
            r"declares input 'h', but its own node 'fc1' \(Gemm\) computes it",
        ),
        (
            Partition("onnxruntime", ("fc1",), ("x",), ("r",)),
            r"declares output 'r', which none of its nodes computes",
        ),
        (
            Partition("onnxruntime", ("fc1",), ("x",), ("x",)),
            r"declares output 'x', which none of its nodes computes",
        ),
        (
            Partition("onnxruntime", ("relu",), ("ghost",), ("r",)),
            r"declares input 'ghost', which the model has no value of",
        ),
        (
            Partition("onnxruntime", ("relu",), ("h",), ("nothing",)),
            r"declares output 'nothing', which the model has no value of",
        ),
        (
            Partition("onnxruntime", ("relu",), (), ("r",)),
            r"the onnxruntime partition starting at node 'relu': node 'relu' \(Relu\) reads 'h'",
        ),
    ],
)
def test_bad_partitions_are_named(partition: Partition, message: str) -> None:
    with pytest.raises(FerryError, match=message):
        cut_partition(named(models.mlp()), partition)


def test_unknown_boundary_types_are_reported() -> None:
    # Shape inference cannot type the output of an op it does not know.
    graph = helper.make_graph(
        [
            helper.make_node("Mystery", ["x"], ["m"], name="mystery", domain="acme"),
            helper.make_node("Relu", ["m"], ["y"], name="relu"),
        ],
        "mystery",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    proto = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("acme", 1)]
    )
    proto.ir_version = 8
    model = named(proto)
    with pytest.raises(FerryError, match=r"type of boundary value\(s\) 'm' is unknown"):
        cut_partition(model, Partition("onnxruntime", ("relu",), ("m",), ("y",)))


def test_lower_plan_lowers_every_partition_and_checks_first() -> None:
    model = named(models.mlp())
    plan = Plan(
        (
            Partition("onnxruntime", ("fc1", "relu"), ("x",), ("r",)),
            Partition("onnxruntime", ("fc2", "softmax"), ("r",), ("y",)),
        ),
        ("x",),
        ("y",),
    )
    first, second = lower_plan(model, plan)
    assert [v.name for v in first.graph.outputs] == ["r"]
    assert [v.name for v in second.graph.inputs] == ["r"]
    check_plan(model, plan)
    swapped = Plan(plan.partitions[::-1], ("x",), ("y",))
    with pytest.raises(FerryError, match="partition 1 gives it, but runs later"):
        lower_plan(model, swapped)
    with pytest.raises(FerryError, match="graph inputs 'z' are not the model's"):
        check_plan(model, Plan(plan.partitions, ("z",), ("y",)))
    with pytest.raises(FerryError, match="graph outputs 'q' are not the model's"):
        check_plan(model, Plan(plan.partitions, ("x",), ("q",)))


def test_unnamed_or_duplicate_nodes_are_refused() -> None:
    model = ir.from_proto(models.mlp())
    plan = Plan.whole_graph(model)
    next(iter(model.graph)).name = ""
    with pytest.raises(FerryError, match="a Gemm node has no name"):
        check_plan(model, plan)
    next(iter(model.graph)).name = "relu"
    with pytest.raises(FerryError, match="two nodes are named 'relu'"):
        check_plan(model, plan)


# --------------------------------------------------------------------------------------------------
# boundary / cut: the one way every caller turns a node set into a model


def test_boundary_counts_what_bodies_read_as_reads_of_their_node() -> None:
    model = named(models.with_if())
    inputs, outputs = boundary(model, ["branch"])
    # 'x' is read only inside the branches; 'two' is a weight, carried, never fed.
    assert inputs == ("cond", "x") and outputs == ("y",)
    sub = cut(model, ["branch"])
    assert [v.name for v in sub.graph.inputs] == ["cond", "x"]


def test_boundary_hands_on_what_others_read_and_dangling_values_only_for_dead_code() -> None:
    proto = models.mlp()
    # A second reader of 'r' outside the set, and a dead-end branch off 'h'.
    proto.graph.node.append(helper.make_node("Neg", ["r"], ["n"], name="neg"))
    proto.graph.output.append(helper.make_tensor_value_info("n", TensorProto.FLOAT, None))
    proto.graph.node.append(helper.make_node("Abs", ["h"], ["unused"], name="dead"))
    model = named(proto)
    assert boundary(model, ["fc1", "relu"]) == (("x",), ("h", "r"))  # 'h' feeds the dead end
    assert boundary(model, ["fc1", "relu", "dead"]) == (("x",), ("r",))  # 'unused' is not asked
    assert boundary(model, ["dead"]) == (("h",), ("unused",))  # nothing else: its dangling value
    sub = cut(model, ["dead"])
    assert [v.name for v in sub.graph.outputs] == ["unused"]


def test_constant_nodes_are_copied_in_never_fed_nor_handed_on() -> None:
    shape = numpy_helper.from_array(np.array([2, 8], np.int64))
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["target"], name="const", value=shape),
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Reshape", ["r", "target"], ["y"], name="reshape"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
    )
    model = named(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert boundary(model, ["reshape"]) == (("r",), ("y",))  # 'target' is not fed
    assert boundary(model, ["const", "relu"]) == (("x",), ("r",))  # ...nor handed on
    sub = cut(model, ["reshape"])
    assert [n.name for n in sub.graph] == ["const", "reshape"]
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    np.testing.assert_array_equal(run(sub, {"r": x})["y"], x.reshape(2, 8))


def test_cut_checks_a_fixed_boundary() -> None:
    model = named(models.mlp())
    with pytest.raises(PlanError, match="declares output 'h', which none of its nodes computes"):
        cut(model, ["relu"], inputs=["h"], outputs=["h"])
    with pytest.raises(PlanError, match="names node.*'nope'"):
        cut(model, ["nope"])
